//! Counters of a handle (rows, pages, faults, bytes read, residency, time per stage; prefill and
//! decode apart) and the OS probes behind them.
//!
//! Every counter is an atomic updated by the worker (or by waiters) and read without locks by
//! `ple_stats`. Definitions:
//! - **prefill vs decode**: a step is *prefill* when some request's span in it carries more than
//!   [`DECODE_MAX_SPAN`] (8) tokens; otherwise it is *decode*. So plain decode (1 token per
//!   request) and speculative verification of up to 8 tokens per request count as decode, and a
//!   prompt chunk counts as prefill. Steps, tokens, rows and submit→done latency are split by it.
//! - **unique pages**: distinct 4 KiB pages of the row file touched by the step's rows (a row's first
//!   and last page), summed over steps. **pages prefetched**: pages covered by the WILLNEED ranges.
//! - **faults**: `getrusage(RUSAGE_THREAD)` deltas measured on the thread that does the work: each
//!   pool thread around each gather chunk it runs; the worker thread, for the small steps it
//!   gathers itself, from the end of its previous such gather to the end of this one (one syscall
//!   per step; the worker does nothing else that faults in between). Summed. Faults of other
//!   threads of the process are never counted.
//! - **storage reads**: requests sent to storage. DIRECT: the merged `O_DIRECT` reads issued.
//!   MMAP: the prefetch reads or WILLNEED calls issued plus the major faults (each a synchronous
//!   read).
//! - **storage read bytes**: DIRECT: the bytes of the `O_DIRECT` reads issued. MMAP: `read_bytes`
//!   of `/proc/thread-self/io` on the same threads. A thread's count can only grow through a major
//!   fault or a prefetch it issued, so it is re-read (and the delta since that thread's last
//!   reading added) only after a piece of work that took a major fault or issued a prefetch; other
//!   steps cost no /proc read. Zero where the kernel lacks task I/O accounting.
//! - **times**: nanoseconds per stage summed over steps (hash, prefetch, gather, copy — copy is the
//!   host→device copy, 0 on a CPU-only handle), `wait_ns` is time callers spent blocked in waits
//!   (including the ring wait of `submit`), and `*_step_ns` is submit→done latency.
//! - **residency / MemAvailable**: measured at the `ple_stats` call (mincore over the mapping,
//!   /proc/meminfo).

use crate::sys::parse_read_bytes;
pub use crate::sys::{
    mem_available_bytes, mem_total_bytes, os_page_size, process_read_bytes, residency,
    thread_faults,
};
use std::cell::{Cell, RefCell};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A span longer than this makes its step a prefill step (see the module doc).
pub const DECODE_MAX_SPAN: usize = 8;

/// Cumulative counters of one handle.
#[derive(Default, Debug)]
pub struct Stats {
    pub prefill_steps: AtomicU64,
    pub decode_steps: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub prefill_rows: AtomicU64,
    pub decode_rows: AtomicU64,
    pub unique_pages: AtomicU64,
    pub pages_prefetched: AtomicU64,
    pub prefetch_steps: AtomicU64,
    pub major_faults: AtomicU64,
    pub minor_faults: AtomicU64,
    pub storage_read_bytes: AtomicU64,
    pub hash_ns: AtomicU64,
    pub prefetch_ns: AtomicU64,
    pub gather_ns: AtomicU64,
    pub queue_ns: AtomicU64,
    pub copy_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub prefill_step_ns: AtomicU64,
    pub decode_step_ns: AtomicU64,
    pub timeouts: AtomicU64,
    pub failed_steps: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub storage_reads: AtomicU64,
    pub ahead_asked: AtomicU64,
    pub ahead_read: AtomicU64,
    pub ahead_dropped: AtomicU64,
    pub ahead_cached: AtomicU64,
    pub ahead_hits: AtomicU64,
    pub resident_dropped_bytes: AtomicU64,
}

/// What one completed step adds to the counters.
#[derive(Default, Debug, Clone, Copy)]
pub struct StepRecord {
    pub prefill: bool,
    pub tokens: u64,
    pub rows: u64,
    pub unique_pages: u64,
    pub pages_prefetched: u64,
    pub prefetched: bool,
    pub io: IoDelta,
    pub hash_ns: u64,
    pub prefetch_ns: u64,
    pub gather_ns: u64,
    pub copy_ns: u64,
    pub step_ns: u64,
    /// Submit → the worker starting the step.
    pub queue_ns: u64,
    /// Rows copied from the row cache, and rows read from the table (handles with a cache).
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Storage requests the step issued itself (DIRECT reads; MMAP: WILLNEED calls).
    pub storage_reads: u64,
}

/// Faults and storage bytes attributed to a piece of work.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDelta {
    pub minor_faults: u64,
    pub major_faults: u64,
    pub read_bytes: u64,
}

impl IoDelta {
    pub fn add(&mut self, o: IoDelta) {
        self.minor_faults += o.minor_faults;
        self.major_faults += o.major_faults;
        self.read_bytes += o.read_bytes;
    }
}

impl Stats {
    /// Adds a completed step.
    /// Adds bytes the residency cap dropped from the page cache.
    pub fn add_resident_dropped(&self, n: u64) {
        self.resident_dropped_bytes.fetch_add(n, Relaxed);
    }

    pub fn record_step(&self, r: &StepRecord) {
        let (steps, tokens, rows, ns) = if r.prefill {
            (
                &self.prefill_steps,
                &self.prefill_tokens,
                &self.prefill_rows,
                &self.prefill_step_ns,
            )
        } else {
            (
                &self.decode_steps,
                &self.decode_tokens,
                &self.decode_rows,
                &self.decode_step_ns,
            )
        };
        steps.fetch_add(1, Relaxed);
        tokens.fetch_add(r.tokens, Relaxed);
        rows.fetch_add(r.rows, Relaxed);
        ns.fetch_add(r.step_ns, Relaxed);
        self.unique_pages.fetch_add(r.unique_pages, Relaxed);
        self.pages_prefetched.fetch_add(r.pages_prefetched, Relaxed);
        if r.prefetched {
            self.prefetch_steps.fetch_add(1, Relaxed);
        }
        self.minor_faults.fetch_add(r.io.minor_faults, Relaxed);
        self.major_faults.fetch_add(r.io.major_faults, Relaxed);
        self.storage_read_bytes.fetch_add(r.io.read_bytes, Relaxed);
        self.hash_ns.fetch_add(r.hash_ns, Relaxed);
        self.prefetch_ns.fetch_add(r.prefetch_ns, Relaxed);
        self.gather_ns.fetch_add(r.gather_ns, Relaxed);
        self.queue_ns.fetch_add(r.queue_ns, Relaxed);
        self.storage_reads
            .fetch_add(r.storage_reads + r.io.major_faults, Relaxed);
        self.copy_ns.fetch_add(r.copy_ns, Relaxed);
        self.cache_hits.fetch_add(r.cache_hits, Relaxed);
        self.cache_misses.fetch_add(r.cache_misses, Relaxed);
    }

    /// The counters now (the on-demand fields are 0; the pipeline fills them).
    pub fn snapshot(&self) -> Counters {
        let g = |a: &AtomicU64| a.load(Relaxed);
        Counters {
            prefill_steps: g(&self.prefill_steps),
            decode_steps: g(&self.decode_steps),
            prefill_tokens: g(&self.prefill_tokens),
            decode_tokens: g(&self.decode_tokens),
            prefill_rows: g(&self.prefill_rows),
            decode_rows: g(&self.decode_rows),
            unique_pages: g(&self.unique_pages),
            pages_prefetched: g(&self.pages_prefetched),
            prefetch_steps: g(&self.prefetch_steps),
            major_faults: g(&self.major_faults),
            minor_faults: g(&self.minor_faults),
            storage_read_bytes: g(&self.storage_read_bytes),
            hash_ns: g(&self.hash_ns),
            prefetch_ns: g(&self.prefetch_ns),
            gather_ns: g(&self.gather_ns),
            copy_ns: g(&self.copy_ns),
            wait_ns: g(&self.wait_ns),
            prefill_step_ns: g(&self.prefill_step_ns),
            decode_step_ns: g(&self.decode_step_ns),
            timeouts: g(&self.timeouts),
            failed_steps: g(&self.failed_steps),
            resident_pages: 0,
            table_pages: 0,
            mem_available_bytes: 0,
            queue_ns: g(&self.queue_ns),
            cache_hits: g(&self.cache_hits),
            cache_misses: g(&self.cache_misses),
            cache_bytes_used: 0,
            storage_reads: g(&self.storage_reads),
            ahead_asked: g(&self.ahead_asked),
            ahead_read: g(&self.ahead_read),
            ahead_dropped: g(&self.ahead_dropped),
            ahead_cached: g(&self.ahead_cached),
            ahead_hits: g(&self.ahead_hits),
            resident_dropped_bytes: g(&self.resident_dropped_bytes),
        }
    }
}

/// A snapshot of a handle's counters (see the module doc for each definition). Times are
/// nanoseconds, summed over steps; `resident_pages`, `table_pages` and `mem_available_bytes` are
/// measured when the snapshot is taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub prefill_steps: u64,
    pub decode_steps: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub prefill_rows: u64,
    pub decode_rows: u64,
    pub unique_pages: u64,
    pub pages_prefetched: u64,
    pub prefetch_steps: u64,
    pub major_faults: u64,
    pub minor_faults: u64,
    pub storage_read_bytes: u64,
    pub hash_ns: u64,
    pub prefetch_ns: u64,
    pub gather_ns: u64,
    pub copy_ns: u64,
    pub wait_ns: u64,
    pub prefill_step_ns: u64,
    pub decode_step_ns: u64,
    pub timeouts: u64,
    pub failed_steps: u64,
    pub resident_pages: u64,
    pub table_pages: u64,
    pub mem_available_bytes: u64,
    pub queue_ns: u64,
    /// Rows of steps copied from the row cache, and rows read from the table on a miss (both 0
    /// without a cache); `cache_hits + cache_misses` = the rows of the steps gathered with it.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Rows held by the cache × bytes per row (row + index and policy overhead), ≤ `cache_bytes`.
    pub cache_bytes_used: u64,
    /// Storage requests issued: DIRECT read requests (after merging); MMAP: WILLNEED calls plus
    /// major faults.
    pub storage_reads: u64,
    /// Read-ahead (`Pipeline::prefetch_ahead`): rows asked; read into the cache; dropped (the
    /// queue's bound, a failed read, the handle closing, or DIRECT without a row cache);
    /// already cached when their turn came. Once the queue is drained `ahead_asked =
    /// ahead_read + ahead_dropped + ahead_cached`.
    pub ahead_asked: u64,
    pub ahead_read: u64,
    pub ahead_dropped: u64,
    pub ahead_cached: u64,
    /// Step rows found in the row cache that a read-ahead had admitted (part of `cache_hits`).
    pub ahead_hits: u64,
    /// MMAP with `resident_bytes_max`: bytes of the table dropped from the page cache to keep
    /// within the cap.
    pub resident_dropped_bytes: u64,
}

impl Counters {
    /// Hits over all row lookups across tiers (FBGEMM #5777's overall hit rate): the steps'
    /// rows served by the row cache over all the steps' rows (0 with no rows).
    pub fn overall_hit_rate(&self) -> f64 {
        let rows = self.prefill_rows + self.decode_rows;
        if rows == 0 {
            0.0
        } else {
            self.cache_hits as f64 / rows as f64
        }
    }
}

/// Nanoseconds of a duration, saturating.
pub fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

thread_local! {
    /// This thread's `/proc/thread-self/io`, opened on first use (None: not available).
    static THREAD_IO: RefCell<Option<Option<File>>> = const { RefCell::new(None) };
    /// `read_bytes` at this thread's last reading.
    static LAST_READ_BYTES: Cell<Option<u64>> = const { Cell::new(None) };
}

/// `read_bytes` of the calling thread (`/proc/thread-self/io`), or None where unavailable.
pub fn thread_read_bytes() -> Option<u64> {
    THREAD_IO.with(|io| {
        let mut io = io.borrow_mut();
        let f = io.get_or_insert_with(|| File::open("/proc/thread-self/io").ok());
        let f = f.as_ref()?;
        let mut buf = [0u8; 512];
        let n = f.read_at(&mut buf, 0).ok()?;
        parse_read_bytes(std::str::from_utf8(&buf[..n]).ok()?)
    })
}

/// Storage bytes this thread read since its previous call (the first call sets the baseline and
/// returns 0). Call it at thread start, and after any work that may have read storage.
pub fn thread_read_bytes_delta() -> u64 {
    let Some(now) = thread_read_bytes() else {
        return 0;
    };
    LAST_READ_BYTES.with(|last| {
        let d = last.get().map_or(0, |l| now.saturating_sub(l));
        last.set(Some(now));
        d
    })
}

/// Closes this thread's `/proc/thread-self/io` (call before a thread exits, so no fd outlives it).
pub fn close_thread_io() {
    let _ = THREAD_IO.try_with(|io| io.borrow_mut().take());
}

/// Measures the faults and storage reads of `f` on the calling thread.
pub fn measure<R>(read_io: bool, f: impl FnOnce() -> R) -> (R, IoDelta) {
    let (mi0, ma0) = thread_faults();
    let r = f();
    let (mi1, ma1) = thread_faults();
    let mut d = IoDelta {
        minor_faults: mi1.saturating_sub(mi0),
        major_faults: ma1.saturating_sub(ma0),
        read_bytes: 0,
    };
    if read_io || d.major_faults > 0 {
        d.read_bytes = thread_read_bytes_delta();
    }
    (r, d)
}

thread_local! {
    /// (minor, major) faults of this thread at its last [`thread_io_since_last`].
    static LAST_FAULTS: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Faults (and, when some were major, storage reads) of the calling thread since its previous
/// call — one `getrusage`. The first call on a thread sets the baseline and returns nothing. The
/// worker calls it once per step, after publishing, so the count costs the step no latency.
pub fn thread_io_since_last() -> IoDelta {
    let (mi1, ma1) = thread_faults();
    let Some((mi0, ma0)) = LAST_FAULTS.with(|l| l.replace(Some((mi1, ma1)))) else {
        return IoDelta::default();
    };
    let mut d = IoDelta {
        minor_faults: mi1.saturating_sub(mi0),
        major_faults: ma1.saturating_sub(ma0),
        read_bytes: 0,
    };
    if d.major_faults > 0 {
        d.read_bytes = thread_read_bytes_delta();
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_read_something_sane() {
        assert!(mem_available_bytes() > 0);
        // touching fresh anonymous pages takes minor faults on this thread
        // SAFETY: a private anonymous mapping of `len` bytes, written within bounds and unmapped
        // by this block; nothing else refers to it.
        let (_, d) = measure(false, || unsafe {
            let len = 1 << 20;
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
            for i in (0..len).step_by(4096) {
                std::ptr::write_volatile(p.add(i), 1);
            }
            libc::munmap(p as *mut libc::c_void, len);
        });
        assert!(d.minor_faults > 0, "{d:?}");
        if std::path::Path::new("/proc/thread-self/io").exists() {
            assert!(thread_read_bytes().is_some());
            // the first call sets the baseline
            assert_eq!(thread_read_bytes_delta(), 0);
        }
        assert_eq!(parse_read_bytes("rchar: 1\nread_bytes: 4096\n"), Some(4096));
        let v = vec![1u8; 3 * os_page_size()];
        let (r, t) = residency(&v[..os_page_size()]);
        assert!(r <= t);
    }

    #[test]
    fn record_splits_prefill_and_decode() {
        let s = Stats::default();
        s.record_step(&StepRecord {
            prefill: true,
            tokens: 10,
            rows: 160,
            ..Default::default()
        });
        s.record_step(&StepRecord {
            prefill: false,
            tokens: 2,
            rows: 32,
            prefetched: true,
            pages_prefetched: 5,
            ..Default::default()
        });
        let c = s.snapshot();
        assert_eq!((c.prefill_steps, c.decode_steps), (1, 1));
        assert_eq!((c.prefill_tokens, c.decode_tokens), (10, 2));
        assert_eq!((c.prefill_rows, c.decode_rows), (160, 32));
        assert_eq!((c.prefetch_steps, c.pages_prefetched), (1, 5));
    }
}
