//! The packer: checkpoint shards → one row-addressable file + JSON metadata (SPEC §4–§6).

use crate::error::{Error, Result};
use crate::ffi::ple_pack_options;
use std::path::Path;

/// Packing options (the safe twin of `ple_pack_options`).
#[derive(Clone, Debug)]
pub struct PackOptions {
    pub force: bool,
    pub buffer_bytes: usize,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            force: false,
            buffer_bytes: 8 << 20,
        }
    }
}

impl PackOptions {
    pub fn to_c(&self) -> ple_pack_options {
        ple_pack_options {
            struct_size: std::mem::size_of::<ple_pack_options>(),
            force: self.force as i32,
            buffer_bytes: self.buffer_bytes as u64,
        }
    }
    pub fn from_c(c: &ple_pack_options) -> Result<PackOptions> {
        if c.buffer_bytes < 4096 || c.buffer_bytes > (1 << 30) {
            return crate::invalid!(
                "options.buffer_bytes {} not in [4096, 1 GiB]",
                c.buffer_bytes
            );
        }
        Ok(PackOptions {
            force: c.force != 0,
            buffer_bytes: c.buffer_bytes as usize,
        })
    }
}

/// What a pack did.
#[derive(Clone, Debug, Default)]
pub struct PackReport {
    pub bytes_written: u64,
    pub reused: bool,
}

/// Packs `checkpoint` into `out`. `progress(done, total)` returns false to cancel.
pub fn pack(
    checkpoint: &Path,
    out: &Path,
    _opts: &PackOptions,
    _progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<PackReport> {
    Err(Error::Unsupported(format!(
        "packing {} into {} is not implemented yet",
        checkpoint.display(),
        out.display()
    )))
}
