//! The I/O plan of a handle, resolved once at open ([`IoPlan::resolve`]) and nowhere else: the
//! mode (MMAP or DIRECT, AUTO resolved), DIRECT's backend (io_uring or a pread pool), MMAP's cold
//! read, the row cache's size (AUTO resolved), the residency cap, and the backend read-ahead
//! opens for its own thread. The rest of `step/` reads the plan; `ple_info` reports it
//! ([`IoInfo`]). As KvikIO's compat mode: AUTO is decided once, the fallbacks logged once.

use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::io::direct::{Backend, DirectReader};
use crate::io::mmap::buffered::BufferedReader;
use crate::io::mmap::residency::ResidencyCap;
use crate::io::source::{PreadRows, RowSource};
use crate::stats;
use crate::step::options::{CACHE_AUTO, ColdReads, IoMode, OpenOptions, PrefetchPolicy};
use std::sync::Mutex;

/// The I/O mode a handle runs with (AUTO resolved) and how its reads are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoInfo {
    /// `IoMode::Mmap` or `IoMode::Direct`.
    pub mode: IoMode,
    /// DIRECT's backend; None in MMAP mode.
    pub backend: Option<Backend>,
    /// Bytes of the row cache (`cache_bytes`, AUTO resolved; 0: none).
    pub cache_bytes: u64,
}

/// A handle's I/O plan (see the module doc), with the readers it opened.
pub(super) struct IoPlan {
    /// DIRECT mode's reader (None: MMAP mode).
    pub(super) direct: Option<DirectReader>,
    /// MMAP mode: how a small cold step reads its rows.
    pub(super) cold: ColdRead,
    /// The row cache's bytes (AUTO resolved for the mode; 0: none).
    pub(super) cache_bytes: u64,
    /// Whether `cache_bytes` came from AUTO (a cache AUTO cannot allocate is then left out).
    pub(super) cache_auto: bool,
    /// MMAP with `resident_bytes_max`: the table's residency cap.
    pub(super) residency: Option<ResidencyCap>,
    /// What read-ahead's thread opens for itself.
    pub(super) ahead: AheadSource,
}

impl IoPlan {
    /// The plan of `table` for `opts` (`io_mode`, `force_pread`, `sigbus_handler`,
    /// `cold_reads`, `prefetch_policy`, `cache_bytes`, `resident_bytes_max`).
    pub(super) fn resolve(table: &Table, opts: &OpenOptions) -> Result<IoPlan> {
        let direct = open_direct(table, opts)?;
        let cold = ColdRead::open(table, opts, direct.is_some());
        // MMAP only: DIRECT reads bypass the page cache
        let residency = (opts.resident_bytes_max > 0 && direct.is_none())
            .then(|| ResidencyCap::new(table.bytes(), opts.resident_bytes_max));
        let ahead = AheadSource {
            direct: direct.is_some(),
            force_pread: opts.force_pread,
        };
        Ok(IoPlan {
            cache_bytes: opts.cache_bytes_for(direct.is_some()),
            cache_auto: opts.cache_bytes == CACHE_AUTO,
            direct,
            cold,
            residency,
            ahead,
        })
    }
}

/// MMAP mode's cold read: how a small step whose pages are not cached reads its rows (see
/// [`ColdReads`]).
pub(super) enum ColdRead {
    /// Sector reads (`O_DIRECT`, io_uring), past the page cache.
    Direct(Mutex<DirectReader>),
    /// Buffered io_uring reads through the page cache.
    Buffered(Mutex<BufferedReader>),
    /// WILLNEED and the gather (also DIRECT mode and PREFETCH_NEVER, which have no use for one).
    None,
}

impl ColdRead {
    /// The cold read `opts.cold_reads` asks for, falling back where the kernel refuses it:
    /// sector reads need `O_DIRECT` and io_uring (never a pread pool), buffered reads io_uring.
    fn open(table: &Table, opts: &OpenOptions, direct_mode: bool) -> ColdRead {
        if direct_mode || opts.prefetch_policy == PrefetchPolicy::Never {
            return ColdRead::None;
        }
        if opts.cold_reads == ColdReads::Direct {
            match DirectReader::open_uring_only(table.rows_path(), table.row_bytes()) {
                Ok(d) => return ColdRead::Direct(Mutex::new(d)),
                Err(e) => log::info!("MMAP cold reads: buffered ({e})"),
            }
        }
        if opts.cold_reads != ColdReads::Willneed {
            if let Some(u) = BufferedReader::open(table.rows_path(), table.row_bytes()) {
                return ColdRead::Buffered(Mutex::new(u));
            }
        }
        ColdRead::None
    }
}

/// The backend read-ahead's thread opens, on its first batch (descriptors of its own, never
/// the worker's): DIRECT mode's reader where the handle reads DIRECT, else buffered io_uring
/// reads through the page cache, else a `pread` per row.
#[derive(Clone, Copy, Debug)]
pub(super) struct AheadSource {
    direct: bool,
    force_pread: bool,
}

impl AheadSource {
    /// Opens the backend for rows of `table`.
    pub(super) fn open(self, table: &Table) -> Result<Box<dyn RowSource + Send>> {
        let (path, rb) = (table.rows_path(), table.row_bytes());
        if self.direct {
            match DirectReader::open(path, rb, self.force_pread) {
                Ok(d) => return Ok(Box::new(d)),
                Err(e) => log::info!("read-ahead: buffered reads ({e})"),
            }
        }
        if let Some(u) = BufferedReader::open(path, rb) {
            return Ok(Box::new(u));
        }
        // (a descriptor of its own on the table's open file: the path may be gone by now)
        let file = table
            .file()
            .try_clone()
            .map_err(|e| Error::io("duplicating the row file's descriptor", e))?;
        Ok(Box::new(PreadRows::new(file, rb)))
    }
}

/// Opens the DIRECT reader `opts.io_mode` asks for: MMAP → none; DIRECT → the reader or its
/// error (`Unsupported` on tmpfs); AUTO → the reader when the row file is larger than the
/// machine's memory and direct I/O works on it, else none. Without the SIGBUS handler
/// (`opts.sigbus_handler` false) only DIRECT can read: AUTO opens it, MMAP is `Unsupported`.
fn open_direct(table: &Table, opts: &OpenOptions) -> Result<Option<DirectReader>> {
    let open = || DirectReader::open(table.rows_path(), table.row_bytes(), opts.force_pread);
    if !opts.sigbus_handler {
        const WHY: &str = "options.sigbus_handler is 0, and only DIRECT mode reads rows without \
                           libple's SIGBUS handler (MMAP copies them from the mapping)";
        return match opts.io_mode {
            IoMode::Mmap => Err(Error::Unsupported(format!(
                "io_mode MMAP: {WHY}; open with io_mode DIRECT or AUTO, or allow the handler"
            ))),
            IoMode::Direct | IoMode::Auto => match open() {
                Ok(r) => Ok(Some(r)),
                Err(Error::Unsupported(m)) => Err(Error::Unsupported(format!("{m}; {WHY}"))),
                Err(e) => Err(e),
            },
        };
    }
    match opts.io_mode {
        IoMode::Mmap => Ok(None),
        IoMode::Direct => open().map(Some),
        IoMode::Auto => {
            let mem = stats::mem_total_bytes();
            if mem == 0 || (table.bytes().len() as u64) <= mem {
                return Ok(None);
            }
            match open() {
                Ok(r) => Ok(Some(r)),
                Err(e) => {
                    log::info!("AUTO io mode: MMAP ({e})");
                    Ok(None)
                }
            }
        }
    }
}
