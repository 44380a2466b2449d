//! The step pipeline: submit → (worker) hash, prefetch, gather, copy → done = seq → wait (SPEC §7–§8).

use crate::error::{Error, Result};
use crate::ffi::{self, ple_options, ple_stats, ple_table_info};
use std::ffi::{CStr, c_void};
use std::path::{Path, PathBuf};

/// Open options (the safe twin of `ple_options`).
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub max_tokens_per_step: u32,
    pub max_in_flight: u32,
    pub num_threads: u32,
    pub prefetch_policy: i32,
    pub prefetch_min_rows: u32,
    pub ring_full_policy: i32,
    pub wait_timeout_us: u64,
    pub history_window: u32,
    pub cuda_device: i32,
    pub wait_mode: i32,
    pub config_json_path: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            max_tokens_per_step: 8192,
            max_in_flight: 2,
            num_threads: 0,
            prefetch_policy: ffi::PLE_PREFETCH_AUTO,
            prefetch_min_rows: 512,
            ring_full_policy: ffi::PLE_RING_WAIT,
            wait_timeout_us: 300_000_000,
            history_window: 64,
            cuda_device: -1,
            wait_mode: ffi::PLE_WAIT_AUTO,
            config_json_path: None,
            checkpoint_dir: None,
        }
    }
}

impl OpenOptions {
    /// The C struct with these values (paths are not representable and come out NULL).
    pub fn to_c(&self) -> ple_options {
        ple_options {
            struct_size: std::mem::size_of::<ple_options>(),
            max_tokens_per_step: self.max_tokens_per_step,
            max_in_flight: self.max_in_flight,
            num_threads: self.num_threads,
            prefetch_policy: self.prefetch_policy,
            prefetch_min_rows: self.prefetch_min_rows,
            ring_full_policy: self.ring_full_policy,
            wait_timeout_us: self.wait_timeout_us,
            history_window: self.history_window,
            cuda_device: self.cuda_device,
            wait_mode: self.wait_mode,
            config_json_path: std::ptr::null(),
            checkpoint_dir: std::ptr::null(),
        }
    }

    /// Validates and converts the C struct.
    ///
    /// # Safety
    /// The path pointers, when not NULL, must be NUL-terminated strings.
    pub unsafe fn from_c(c: &ple_options) -> Result<OpenOptions> {
        let path = |p: *const std::ffi::c_char, what: &str| -> Result<Option<PathBuf>> {
            if p.is_null() {
                return Ok(None);
            }
            let s = unsafe { CStr::from_ptr(p) }
                .to_str()
                .map_err(|_| Error::InvalidArgument(format!("options.{what} is not UTF-8")))?;
            Ok(Some(PathBuf::from(s)))
        };
        let o = OpenOptions {
            max_tokens_per_step: c.max_tokens_per_step,
            max_in_flight: c.max_in_flight,
            num_threads: c.num_threads,
            prefetch_policy: c.prefetch_policy,
            prefetch_min_rows: c.prefetch_min_rows,
            ring_full_policy: c.ring_full_policy,
            wait_timeout_us: c.wait_timeout_us,
            history_window: c.history_window,
            cuda_device: c.cuda_device,
            wait_mode: c.wait_mode,
            config_json_path: path(c.config_json_path, "config_json_path")?,
            checkpoint_dir: path(c.checkpoint_dir, "checkpoint_dir")?,
        };
        o.validate()?;
        Ok(o)
    }

    /// Range checks of every field.
    pub fn validate(&self) -> Result<()> {
        if self.max_tokens_per_step == 0 || self.max_tokens_per_step > 1 << 20 {
            return crate::invalid!(
                "options.max_tokens_per_step {} not in [1, 1048576]",
                self.max_tokens_per_step
            );
        }
        if self.max_in_flight == 0 || self.max_in_flight > 64 {
            return crate::invalid!(
                "options.max_in_flight {} not in [1, 64]",
                self.max_in_flight
            );
        }
        if self.num_threads > 1024 {
            return crate::invalid!("options.num_threads {} > 1024", self.num_threads);
        }
        if !(0..=2).contains(&self.prefetch_policy) {
            return crate::invalid!(
                "options.prefetch_policy {} is not a PLE_PREFETCH_* value",
                self.prefetch_policy
            );
        }
        if !(0..=1).contains(&self.ring_full_policy) {
            return crate::invalid!(
                "options.ring_full_policy {} is not a PLE_RING_* value",
                self.ring_full_policy
            );
        }
        if self.wait_timeout_us == 0 {
            return crate::invalid!("options.wait_timeout_us is 0");
        }
        if self.history_window < 2 || self.history_window > 1 << 20 {
            return crate::invalid!(
                "options.history_window {} not in [2, 1048576]",
                self.history_window
            );
        }
        if self.cuda_device < -1 {
            return crate::invalid!(
                "options.cuda_device {} (use -1 for CPU only)",
                self.cuda_device
            );
        }
        if !(0..=3).contains(&self.wait_mode) {
            return crate::invalid!(
                "options.wait_mode {} is not a PLE_WAIT_* value",
                self.wait_mode
            );
        }
        Ok(())
    }
}

/// An open table with its step pipeline (what a `ple_handle` holds).
pub struct Pipeline {
    #[allow(dead_code)]
    table: crate::table::Table,
}

impl Pipeline {
    pub fn open(dir: &Path, opts: OpenOptions) -> Result<Pipeline> {
        let topts = crate::table::TableOpenOptions {
            config_json_path: opts.config_json_path.clone(),
            checkpoint_dir: opts.checkpoint_dir.clone(),
        };
        let table = crate::table::Table::open(dir, &topts)?;
        Ok(Pipeline { table })
    }
    pub fn ngram_size(&self) -> u32 {
        3
    }
    pub fn num_heads(&self) -> usize {
        16
    }
    pub fn table_info(&self) -> ple_table_info {
        crate::table::table_info(&self.table)
    }
    pub fn stats(&self) -> ple_stats {
        unimplemented!()
    }
    pub fn submit(&self, _b: &crate::context::Batch, _seq: u64) -> Result<()> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn wait(&self, _seq: u64, _timeout_us: u64) -> Result<()> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn packed_rows(&self, _seq: u64) -> Result<(*const u8, u32)> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn release_step(&self, _seq: u64) -> Result<()> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn dequant_cpu(
        &self,
        _seq: u64,
        _out: *mut u8,
        _dtype: i32,
        _stride: usize,
        _flags: u32,
    ) -> Result<()> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn dequant_fuse(
        &self,
        _stream: *mut c_void,
        _seq: u64,
        _out: u64,
        _dtype: i32,
        _stride: usize,
        _flags: u32,
    ) -> Result<()> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn ngram_ids(&self, _b: &crate::context::Batch, _out: &mut [i64]) -> Result<()> {
        Err(Error::Unsupported("not implemented yet".into()))
    }
    pub fn release_request(&self, _id: u64) {}
    /// Stops the worker; later waits fail with `Error::State`.
    pub fn shutdown(&self) {}
}
