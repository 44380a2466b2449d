// The counters of a handle, declared once, in the order of the C struct `ple_counters` (after its
// `struct_size`). `stats.rs` expands this list into `Stats` (an atomic per `sum` counter),
// `Counters` (every counter, u64), `Stats::snapshot` and `Counters::delta`; ple-capi's build.rs
// reads this file as text and generates the C struct and `counters_to_c` from it. So: one doc
// line or more, then `KIND NAME,` (or `process NAME = FN,`) on a line of its own. New counters go
// at the end (the C struct is versioned by `struct_size`).
//
// KIND is how the counter accumulates:
// - `sum`: an atomic of the handle, only ever added to; a delta is the difference.
// - `demand`: measured when the counters are read (0 in `Stats::snapshot`; the pipeline fills
//   it); a delta keeps the later value.
// - `process`: process-wide, read from `FN()` at the snapshot; a delta is the difference.
counters! {
    /// Prefill steps completed (a step is prefill when some request's span in it has more than
    /// 8 tokens, so speculative verification of up to 8 tokens per request counts as decode).
    sum prefill_steps,
    /// Decode steps completed.
    sum decode_steps,
    /// Tokens of the prefill steps.
    sum prefill_tokens,
    /// Tokens of the decode steps.
    sum decode_tokens,
    /// Rows gathered by the prefill steps.
    sum prefill_rows,
    /// Rows gathered by the decode steps.
    sum decode_rows,
    /// Distinct 4 KiB pages of the row file the steps' rows touched (per step, summed).
    sum unique_pages,
    /// Pages covered by the steps' prefetch (WILLNEED) ranges.
    sum pages_prefetched,
    /// Steps that issued a prefetch.
    sum prefetch_steps,
    /// Major page faults taken while gathering, on the threads that gather (getrusage
    /// RUSAGE_THREAD; other threads of the process are not counted).
    sum major_faults,
    /// Minor page faults taken while gathering, counted as `major_faults` is.
    sum minor_faults,
    /// Bytes read from storage: DIRECT, the bytes of its reads; MMAP, what the gathering threads
    /// caused to be read (`/proc/thread-self/io` read_bytes; 0 without task I/O accounting).
    sum storage_read_bytes,
    /// Nanoseconds spent hashing tokens to row ids, summed over steps.
    sum hash_ns,
    /// Nanoseconds spent issuing prefetches, summed over steps.
    sum prefetch_ns,
    /// Nanoseconds spent gathering rows, summed over steps.
    sum gather_ns,
    /// Nanoseconds spent copying rows host to device, summed over steps (0 on a CPU-only handle).
    sum copy_ns,
    /// Nanoseconds callers spent blocked in waits (`ple_wait`, host waits, a full ring's wait).
    sum wait_ns,
    /// Submit-to-done nanoseconds of the prefill steps, summed.
    sum prefill_step_ns,
    /// Submit-to-done nanoseconds of the decode steps, summed.
    sum decode_step_ns,
    /// Waits that ran past their timeout.
    sum timeouts,
    /// Steps that failed.
    sum failed_steps,
    /// Table pages resident in the page cache (mincore), measured by `ple_stats_residency` (0 from
    /// `ple_stats`, which stays cheap enough to read every step).
    demand resident_pages,
    /// Pages of the table, counted when the counters are read.
    demand table_pages,
    /// MemAvailable of /proc/meminfo in bytes, read by `ple_stats_residency` (0 from
    /// `ple_stats`).
    demand mem_available_bytes,
    /// Nanoseconds steps spent between submit and the worker starting them, summed: queueing
    /// behind earlier steps and the worker's wake-up (part of the submit-to-done times).
    sum queue_ns,
    /// Step rows copied from the row cache (0 without a cache).
    sum cache_hits,
    /// Step rows read from the table on a row-cache miss (0 without a cache); `cache_hits +
    /// cache_misses` = the rows of the steps gathered through the cache.
    sum cache_misses,
    /// Rows the row cache holds × bytes per row (row, index and policy overhead), at most
    /// `cache_bytes`; measured when the counters are read.
    demand cache_bytes_used,
    /// Requests sent to storage: DIRECT, the merged `O_DIRECT` reads (whose bytes
    /// `storage_read_bytes` counts); MMAP, the WILLNEED calls plus the major faults.
    sum storage_reads,
    /// Read-ahead (`ple_prefetch_ahead`): rows asked. Once its queue is drained, `ahead_asked =
    /// ahead_read + ahead_dropped + ahead_cached`.
    sum ahead_asked,
    /// Read-ahead rows read into the row cache (or the page cache).
    sum ahead_read,
    /// Read-ahead rows dropped: beyond `ahead_max_rows`, a failed read, the handle closing, or
    /// DIRECT mode without a row cache.
    sum ahead_dropped,
    /// Read-ahead rows found already cached when their turn came.
    sum ahead_cached,
    /// Step rows found in the row cache that a read-ahead had brought in, each at its first hit
    /// (part of `cache_hits`; a row evicted before any step found it counts none).
    sum ahead_hits,
    /// Process-wide, since start: handles whose close did not wait for their worker (a read
    /// stalled on the device past 30 ms) and went to a reaper thread, which frees the handle's
    /// ring, buffers and descriptors once the kernel completes the reads.
    process abandoned_handles = crate::step::reaper::abandoned_handles,
    /// Process-wide, since start: the abandoned handles the reaper has freed
    /// (`abandoned_handles - reaped_handles` are still held by stalled reads).
    process reaped_handles = crate::step::reaper::reaped_handles,
    /// MMAP with `resident_bytes_max`: bytes of the table dropped from the page cache to keep
    /// within the cap.
    sum resident_dropped_bytes,
    /// Read-ahead batches during whose reads a step was submitted: each such step found the
    /// read-ahead reader busy (at most one batch of reads ahead of it).
    sum ahead_collisions,
}
