//! Counters of a handle (rows, pages, faults, bytes read, residency, time per stage; prefill and
//! decode apart) and the OS probes behind them.
//!
//! The counters are declared once, in `stats/counter_list.rs` (name, doc, and how each
//! accumulates); [`Stats`], [`Counters`] and the C struct `ple_counters` are generated from it.
//! Every `sum` counter is an atomic updated by the worker (or by waiters) and read without locks
//! by `ple_stats`. Definitions:
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

/// Expands the counter list (`stats/counter_list.rs`) into [`Stats`], [`Counters`],
/// [`Stats::snapshot`], [`Counters::delta`] and [`Counters::fields`].
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $kind:ident $name:ident $(= $src:path)?,)*) => {
        counters!(@stats [] $($kind $name,)*);

        /// A snapshot of a handle's counters (see the module doc for the definitions), one field
        /// per counter of `stats/counter_list.rs`, in the C struct's order.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Stats {
            /// The counters now (the `demand` ones are 0; the pipeline fills them).
            pub fn snapshot(&self) -> Counters {
                Counters { $($name: counters!(@load self $kind $name $($src)?),)* }
            }
        }

        impl Counters {
            /// Every counter's name, in field order.
            pub const NAMES: [&'static str; [$(stringify!($name)),*].len()] =
                [$(stringify!($name)),*];

            /// What happened between the snapshots `before` and `self` (taken later): the
            /// difference of each `sum` and `process` counter (saturating), and `self`'s value of
            /// each `demand` counter.
            pub fn delta(&self, before: &Counters) -> Counters {
                Counters { $($name: counters!(@delta self before $kind $name),)* }
            }

            /// `(name, value)` of every counter, in field order.
            pub fn fields(&self) -> [(&'static str, u64); Self::NAMES.len()] {
                [$((stringify!($name), self.$name)),*]
            }

            /// The counters with these values, in field order (the inverse of [`Self::fields`]).
            pub fn from_values(values: [u64; Self::NAMES.len()]) -> Counters {
                let [$($name),*] = values;
                Counters { $($name),* }
            }
        }
    };
    // `Stats` holds an atomic for each `sum` counter only (a tt-muncher, to skip the others).
    (@stats [$($acc:tt)*]) => {
        /// Cumulative counters of one handle: an atomic per `sum` counter of
        /// `stats/counter_list.rs` (each documented on [`Counters`]).
        #[derive(Default, Debug)]
        pub struct Stats { $($acc)* }
    };
    (@stats [$($acc:tt)*] sum $name:ident, $($rest:tt)*) => {
        counters!(@stats [$($acc)*
            #[doc = concat!("See [`Counters::", stringify!($name), "`].")]
            pub $name: AtomicU64,
        ] $($rest)*);
    };
    (@stats [$($acc:tt)*] $kind:ident $name:ident, $($rest:tt)*) => {
        counters!(@stats [$($acc)*] $($rest)*);
    };
    (@load $s:ident sum $name:ident) => { $s.$name.load(Relaxed) };
    (@load $s:ident demand $name:ident) => { 0 };
    (@load $s:ident process $name:ident $src:path) => { $src() };
    (@delta $b:ident $a:ident demand $name:ident) => { $b.$name };
    (@delta $b:ident $a:ident $kind:ident $name:ident) => { $b.$name.saturating_sub($a.$name) };
}

include!("stats/counter_list.rs");

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
    /// Adds bytes the residency cap dropped from the page cache.
    pub fn add_resident_dropped(&self, n: u64) {
        self.resident_dropped_bytes.fetch_add(n, Relaxed);
    }

    /// Adds a completed step.
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
    fn delta_subtracts_sums_and_keeps_demand_values() {
        let before = Counters {
            gather_ns: 5,
            resident_pages: 7,
            abandoned_handles: 1,
            timeouts: 3,
            ..Default::default()
        };
        let after = Counters {
            gather_ns: 12,
            resident_pages: 2,
            abandoned_handles: 4,
            decode_rows: 9,
            timeouts: 3,
            ..Default::default()
        };
        let expect = Counters {
            gather_ns: 7,
            resident_pages: 2,
            abandoned_handles: 3,
            decode_rows: 9,
            ..Default::default()
        };
        assert_eq!(after.delta(&before), expect);
        // a counter that went down (a reset) saturates at 0 instead of wrapping
        assert_eq!(before.delta(&after).gather_ns, 0);
    }

    #[test]
    fn names_fields_and_values_cover_every_counter_once() {
        // every field of `Counters` is a u64 counter named in the list
        assert_eq!(Counters::NAMES.len() * 8, std::mem::size_of::<Counters>());
        let mut names = Counters::NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Counters::NAMES.len());
        let values = std::array::from_fn(|i| 100 + i as u64);
        let c = Counters::from_values(values);
        assert_eq!(c.prefill_steps, 100);
        assert_eq!(c.ahead_collisions, 100 + Counters::NAMES.len() as u64 - 1);
        for (i, (name, v)) in c.fields().into_iter().enumerate() {
            assert_eq!((name, v), (Counters::NAMES[i], values[i]));
        }
        // the snapshot reads the process-wide counters
        let s = Stats::default().snapshot();
        assert!(s.reaped_handles <= crate::step::reaper::reaped_handles());
        assert_eq!((s.resident_pages, s.cache_bytes_used), (0, 0));
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
