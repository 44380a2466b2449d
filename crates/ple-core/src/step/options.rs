//! Options of a handle, typed: the C API converts `ple_options` into [`OpenOptions`] once.

use crate::error::{Error, Result};
use crate::shard::Shard;
use std::path::PathBuf;

pub use crate::dequant::gpu::WaitMode;

/// Largest `max_tokens_per_step`.
pub const MAX_TOKENS_PER_STEP_MAX: u32 = 1 << 20;
/// Largest `max_in_flight` (ring slots).
pub const MAX_IN_FLIGHT_MAX: u32 = 64;
/// Largest `num_threads`.
pub const NUM_THREADS_MAX: u32 = 1024;
/// Smallest `history_window`.
pub const HISTORY_WINDOW_MIN: u32 = 2;
/// Largest `history_window`.
pub const HISTORY_WINDOW_MAX: u32 = 1 << 20;
/// Largest `cache_bytes` (other than [`CACHE_AUTO`]).
pub const MAX_CACHE_BYTES: u64 = 1 << 40;
/// `cache_bytes` default: a row cache of [`AUTO_CACHE_BYTES`] (at most an eighth of the memory
/// available at open) for handles that run DIRECT, none for MMAP (the page cache serves warm
/// rows there).
pub const CACHE_AUTO: u64 = u64::MAX;
/// The row cache AUTO gives a DIRECT handle: at 256 MiB the steady benchmark's hit rate is within
/// 3 points of 1 GiB's (docs/PERFORMANCE-LOG.md, "Row cache"), and a DIRECT handle's resident
/// memory stays under 300 MiB.
pub const AUTO_CACHE_BYTES: u64 = 256 << 20;

/// When a step's pages are advised to the kernel (`MADV_WILLNEED`) before the gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PrefetchPolicy {
    /// Steps of at least `prefetch_min_rows` rows (default 1: every step, decode included), unless
    /// a residency sample finds them cached.
    #[default]
    Auto,
    /// Every step.
    Always,
    /// Never.
    Never,
}

/// How a handle reads rows from storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// DIRECT when the table is larger than the machine's memory (it cannot stay cached) and
    /// direct I/O works on its file; MMAP otherwise.
    #[default]
    Auto,
    /// Gather from the read-only mapping through the page cache (prefetch advice before).
    Mmap,
    /// `O_DIRECT` reads of exactly the rows' blocks (`io::direct`); `Error::Unsupported` at open
    /// where the file system refuses direct I/O.
    Direct,
}

/// What `submit` does when the ring slot it needs still holds an unconsumed step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RingFullPolicy {
    /// Wait for the slot to be consumed (up to `wait_timeout_us`).
    #[default]
    Wait,
    /// Fail at once with `Error::State`.
    Error,
}

/// Options of [`Pipeline::open`](crate::step::Pipeline::open) (`ple_options` in C; defaults as
/// `ple_options_default`).
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub max_tokens_per_step: u32,
    pub max_in_flight: u32,
    pub num_threads: u32,
    pub prefetch_policy: PrefetchPolicy,
    pub prefetch_min_rows: u32,
    pub ring_full_policy: RingFullPolicy,
    pub wait_timeout_us: u64,
    pub history_window: u32,
    pub cuda_device: i32,
    pub wait_mode: WaitMode,
    pub config_json_path: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
    /// Bytes for the row cache ([`RowCache`](crate::io::cache::RowCache)), allocated at open;
    /// 0 = no cache, [`CACHE_AUTO`] (the default) = by I/O mode ([`OpenOptions::cache_bytes_for`]).
    /// Rows of cached steps are copied from it; misses are read from the table.
    pub cache_bytes: u64,
    pub io_mode: IoMode,
    /// DIRECT: issue reads on the `pread` pool even where io_uring works (tests; the environment
    /// variable `PLE_IO_FORCE_PREAD` does the same for any handle).
    pub force_pread: bool,
    /// MMAP: how a cold prefetching step of at most [`COLD_READ_MAX_ROWS`] rows (decode steps)
    /// reads its rows (bigger steps always advise WILLNEED while the pool gathers).
    pub cold_reads: ColdReads,
    /// The head shard the handle serves (`crate::shard`; default the whole table): it hashes,
    /// reads, caches and counts only its heads' rows, and its outputs hold -0.0 in the other
    /// heads' columns.
    pub shard: Shard,
    /// Most rows queued for read-ahead (`Pipeline::prefetch_ahead`); beyond it the oldest are
    /// dropped. 0 (the default) = the row cache's capacity in rows, or without a cache 2^18.
    pub ahead_max_rows: u64,
    /// MMAP: the most bytes of the table the page cache holds for this handle (0, the default:
    /// no cap). Above it the least recently used 2 MiB chunks are dropped after a step
    /// (`io::residency`). Ignored in DIRECT mode, which reads past the page cache.
    pub resident_bytes_max: u64,
    /// Whether the handle may install libple's process-wide SIGBUS handler (`io::mmap::guard`),
    /// which MMAP mode needs to turn a fault of the mapping (a truncated file, a failed device
    /// read) into an error instead of a crash (default true; it goes in at the first copy from
    /// a mapping). false: the handle never copies from the mapping, so libple touches no signal
    /// disposition for it: AUTO opens DIRECT, and MMAP (or AUTO where direct I/O is refused) is
    /// `Error::Unsupported`.
    pub sigbus_handler: bool,
}

/// MMAP: the most rows of a step that [`ColdReads::Direct`] or [`ColdReads::Buffered`] reads
/// (256 decode requests of one token); bigger steps advise WILLNEED while the pool gathers.
pub const COLD_READ_MAX_ROWS: usize = 4096;

/// MMAP: how a cold prefetching step of at most [`COLD_READ_MAX_ROWS`] rows reads its rows; each
/// falls back to the next where the kernel refuses it (O_DIRECT, then io_uring).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ColdReads {
    /// The default: the rows' sectors read `O_DIRECT` through io_uring into the slot (as DIRECT
    /// mode reads them), then, when the worker is next idle (or before a later step once enough
    /// wait), WILLNEED for their pages, so the page cache warms as it would have.
    #[default]
    Direct,
    /// Buffered io_uring reads of the rows through the page cache into the slot.
    Buffered,
    /// WILLNEED for the pages, then a gather from the mapping.
    Willneed,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            max_tokens_per_step: 8192,
            max_in_flight: 2,
            num_threads: 0,
            prefetch_policy: PrefetchPolicy::Auto,
            prefetch_min_rows: 1,
            ring_full_policy: RingFullPolicy::Wait,
            wait_timeout_us: 300_000_000,
            history_window: 64,
            cuda_device: -1,
            wait_mode: WaitMode::Auto,
            config_json_path: None,
            checkpoint_dir: None,
            cache_bytes: CACHE_AUTO,
            io_mode: IoMode::Auto,
            force_pread: false,
            cold_reads: ColdReads::Direct,
            shard: Shard::WHOLE,
            ahead_max_rows: 0,
            resident_bytes_max: 0,
            sigbus_handler: true,
        }
    }
}

impl OpenOptions {
    /// Range checks of every field.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_TOKENS_PER_STEP_MAX).contains(&self.max_tokens_per_step) {
            return crate::invalid!(
                "options.max_tokens_per_step {} not in [1, {MAX_TOKENS_PER_STEP_MAX}]",
                self.max_tokens_per_step
            );
        }
        if !(1..=MAX_IN_FLIGHT_MAX).contains(&self.max_in_flight) {
            return crate::invalid!(
                "options.max_in_flight {} not in [1, {MAX_IN_FLIGHT_MAX}]",
                self.max_in_flight
            );
        }
        if self.num_threads > NUM_THREADS_MAX {
            return crate::invalid!(
                "options.num_threads {} > {NUM_THREADS_MAX}",
                self.num_threads
            );
        }
        if self.wait_timeout_us == 0 {
            return crate::invalid!("options.wait_timeout_us is 0");
        }
        if !(HISTORY_WINDOW_MIN..=HISTORY_WINDOW_MAX).contains(&self.history_window) {
            return crate::invalid!(
                "options.history_window {} not in [{HISTORY_WINDOW_MIN}, {HISTORY_WINDOW_MAX}]",
                self.history_window
            );
        }
        if self.cache_bytes > MAX_CACHE_BYTES && self.cache_bytes != CACHE_AUTO {
            return crate::invalid!(
                "options.cache_bytes {} > {MAX_CACHE_BYTES} (1 TiB)",
                self.cache_bytes
            );
        }
        if let Err(Error::InvalidArgument(m)) = Shard::new(self.shard.index, self.shard.count) {
            return crate::invalid!("options.{m}");
        }
        if self.cuda_device < -1 {
            return crate::invalid!(
                "options.cuda_device {} (use -1 for CPU only)",
                self.cuda_device
            );
        }
        Ok(())
    }

    /// The row cache's bytes for a handle that runs DIRECT (`direct`) or MMAP: `cache_bytes`, or
    /// for [`CACHE_AUTO`] the smaller of [`AUTO_CACHE_BYTES`] and an eighth of the memory headroom
    /// (DIRECT), 0 (MMAP).
    pub fn cache_bytes_for(&self, direct: bool) -> u64 {
        match self.cache_bytes {
            CACHE_AUTO if direct => {
                memory_headroom().map_or(AUTO_CACHE_BYTES, |m| AUTO_CACHE_BYTES.min(m / 8))
            }
            CACHE_AUTO => 0,
            b => b,
        }
    }

    /// Bytes of one staging slot (`max_tokens_per_step × heads × row_bytes`, `heads` the rows
    /// per token of the handle's shard), after checking that
    /// all `max_in_flight` slots fit in the memory the machine can give ([`memory_headroom`]):
    /// otherwise `Error::OutOfMemory` naming the bytes needed, before anything is allocated.
    pub fn check_staging_fits(&self, row_bytes: usize, heads: usize) -> Result<usize> {
        let slot = (self.max_tokens_per_step as u64)
            .checked_mul(heads as u64)
            .and_then(|x| x.checked_mul(row_bytes as u64));
        let total = slot.and_then(|s| s.checked_mul(self.max_in_flight as u64));
        let (Some(slot), Some(total)) = (slot, total) else {
            return Err(Error::OutOfMemory(format!(
                "staging of max_in_flight {} × max_tokens_per_step {} × {heads} rows × \
                 {row_bytes} bytes overflows",
                self.max_in_flight, self.max_tokens_per_step
            )));
        };
        if let Some(avail) = memory_headroom() {
            if total > avail {
                return Err(Error::OutOfMemory(format!(
                    "staging needs {total} bytes (max_in_flight {} × max_tokens_per_step {} × \
                     {heads} rows × {row_bytes} bytes), more than the {avail} bytes available \
                     (MemAvailable, or the cgroup's memory.max headroom); lower \
                     max_tokens_per_step or max_in_flight",
                    self.max_in_flight, self.max_tokens_per_step
                )));
            }
        }
        usize::try_from(slot)
            .map_err(|_| Error::OutOfMemory(format!("staging slot of {slot} bytes")))
    }
}

pub use super::headroom::memory_headroom;
