//! The row gather: rows of the mapped table → a staging buffer laid out exactly
//! `[tokens][16][row_bytes]` — row `i` of the id list lands at byte `i * row_bytes`, so token `t`'s
//! 16 rows start at `t * 16 * row_bytes`. No padding, no other stride.

use crate::error::{Error, Result};
use crate::io::mmap::advice::{PAGE_SHIFT, PageRange, PageSet};
use crate::io::mmap::guard;
use crate::stats::{IoDelta, measure};
use crate::sync;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Steps with fewer rows than this are gathered on the calling thread (the pool costs more than
/// it saves for a decode step).
pub const PARALLEL_MIN_ROWS: usize = 1024;

/// Gathers `ids` from `src` (the row file, rows of `row_bytes`) into `out` on the calling thread,
/// guarded against SIGBUS ([`guard::copy_rows`]: a truncated or failing file is an `Error::Io`).
/// The ids must have been checked against the table size (see [`check_ids`]).
pub fn gather_serial(src: &[u8], row_bytes: usize, ids: &[u64], out: &mut [u8]) -> Result<()> {
    guard::copy_rows(src, row_bytes, ids, &mut out[..ids.len() * row_bytes])
}

/// The first error of parallel tasks.
fn keep_first(slot: &Mutex<Option<Error>>, r: Result<()>) {
    if let Err(e) = r {
        sync::lock(slot).get_or_insert(e);
    }
}

/// Fails if any id is outside the table's `total_rows`.
pub fn check_ids(ids: &[u64], total_rows: u64) -> Result<()> {
    if let Some((i, &r)) = ids.iter().enumerate().find(|&(_, &r)| r >= total_rows) {
        return Err(Error::Format(format!(
            "row id {r} (entry {i}) is outside the table's {total_rows} rows"
        )));
    }
    Ok(())
}

/// Gathers `ids` into `out` (`out.len() >= ids.len() * row_bytes`), in parallel on `pool` for big
/// sets. Returns the faults and storage reads of the pool threads that did part of it; the
/// calling thread's own are not measured here (a small set is gathered on the calling thread
/// with no system call: the worker counts its thread's faults once per step, after publishing).
pub fn gather(
    src: &[u8],
    row_bytes: usize,
    ids: &[u64],
    out: &mut [u8],
    pool: Option<&rayon::ThreadPool>,
) -> Result<IoDelta> {
    Ok(gather_with(src, row_bytes, ids, out, pool, || ())?.0)
}

/// Whether [`gather`] of `rows` rows runs on `pool` (else on the calling thread).
pub fn runs_on_pool(rows: usize, pool: &rayon::ThreadPool) -> bool {
    rows >= PARALLEL_MIN_ROWS && pool.current_num_threads() > 1
}

/// Rows per task when `rows` rows are split over `pool` (four tasks a thread, at least 256 rows
/// each): the chunking of every pooled gather.
pub fn pool_chunk(rows: usize, pool: &rayon::ThreadPool) -> usize {
    (rows / (pool.current_num_threads() * 4)).max(256)
}

/// [`gather`], running `side` on the calling thread meanwhile: while the pool gathers a big set,
/// the calling thread (otherwise idle) does `side`; a small set is gathered first, then `side`
/// runs. Returns the pool threads' faults and `side`'s result.
pub fn gather_with<T>(
    src: &[u8],
    row_bytes: usize,
    ids: &[u64],
    out: &mut [u8],
    pool: Option<&rayon::ThreadPool>,
    side: impl FnOnce() -> T,
) -> Result<(IoDelta, T)> {
    if out.len() < ids.len() * row_bytes {
        return crate::invalid!(
            "staging holds {} bytes, {} rows of {row_bytes} need {}",
            out.len(),
            ids.len(),
            ids.len() * row_bytes
        );
    }
    check_ids(ids, (src.len() / row_bytes.max(1)) as u64)?;
    let out = &mut out[..ids.len() * row_bytes];
    match pool {
        Some(pool) if runs_on_pool(ids.len(), pool) => {
            let chunk = pool_chunk(ids.len(), pool);
            let io = Mutex::new(IoDelta::default());
            let err = Mutex::new(None);
            let r = pool.in_place_scope(|s| {
                for (o, i) in out.chunks_mut(chunk * row_bytes).zip(ids.chunks(chunk)) {
                    let (io, err) = (&io, &err);
                    s.spawn(move |_| {
                        let (r, d) = measure(false, || gather_serial(src, row_bytes, i, o));
                        keep_first(err, r);
                        sync::lock(io).add(d);
                    });
                }
                side()
            });
            if let Some(e) = sync::into_inner(err) {
                return Err(e);
            }
            Ok((sync::into_inner(io), r))
        }
        _ => {
            gather_serial(src, row_bytes, ids, out)?;
            Ok((IoDelta::default(), side()))
        }
    }
}

/// The output of an overlapped gather: where each task writes is disjoint (a permutation of rows).
#[derive(Clone, Copy)]
struct OutPtr(*mut u8);
// SAFETY: tasks write disjoint rows of the buffer, and the scope ends before the buffer is used.
unsafe impl Send for OutPtr {}
// SAFETY: as above: no two tasks touch the same bytes through it.
unsafe impl Sync for OutPtr {}

/// Rows per gather task of the overlapped gather.
const OVERLAP_TASK_ROWS: usize = 512;
/// Pages per prefetch part of the overlapped gather (at most [`MAX_PARTS`] parts).
const PAGES_PER_PART: usize = 1024;
const MAX_PARTS: usize = 16;

/// What [`gather_overlapped`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct OverlapReport {
    /// Faults and storage bytes of the gather tasks (pool threads).
    pub gather_io: IoDelta,
    /// Faults and storage bytes of the issuing calls (calling thread).
    pub issue_io: IoDelta,
    /// Pages the issuing calls covered.
    pub pages_issued: u64,
    /// Time spent in the issuing calls.
    pub issue_time: Duration,
}

/// Prefetch and gather, overlapped: the page set's ranges are split into parts of about
/// 1,024 pages; the calling thread issues part `k` (`issue(ranges)`, e.g. WILLNEED) and hands the
/// rows whose last page lies in part `k` to the pool, then issues part `k + 1` while the pool
/// gathers part `k` (touching pages still in flight sleeps on their I/O). The device sees every
/// page requested early, and the gather (its page faults included) hides behind the issuing.
/// `ids` must be in range ([`check_ids`]); `out` receives `[ids.len()][row_bytes]` as [`gather`].
pub fn gather_overlapped(
    src: &[u8],
    row_bytes: usize,
    ids: &[u64],
    out: &mut [u8],
    pool: &rayon::ThreadPool,
    pages: &PageSet,
    mut issue: impl FnMut(&[PageRange]) -> Result<(u64, IoDelta)>,
) -> Result<OverlapReport> {
    if out.len() < ids.len() * row_bytes {
        return crate::invalid!("staging too small for {} rows", ids.len());
    }
    check_ids(ids, (src.len() / row_bytes.max(1)) as u64)?;
    let mut rep = OverlapReport::default();
    // split the ranges into parts of about PAGES_PER_PART pages
    let parts = (pages.len() / PAGES_PER_PART).clamp(1, MAX_PARTS);
    let per_part = pages.len().div_ceil(parts).max(1);
    let mut bounds = vec![0usize]; // range index where each part starts
    let mut acc = 0usize;
    for (i, r) in pages.ranges.iter().enumerate() {
        if acc >= per_part * bounds.len() && i > *bounds.last().unwrap() {
            bounds.push(i);
        }
        acc += r.count as usize;
    }
    bounds.push(pages.ranges.len());
    let nparts = bounds.len() - 1;
    // first page of each part (parts 1..), to bucket rows by their last page
    let first_pages: Vec<u64> = bounds[1..nparts]
        .iter()
        .map(|&b| pages.ranges[b].first)
        .collect();
    let mut buckets: Vec<Vec<u32>> = vec![Vec::new(); nparts];
    let rb = row_bytes as u64;
    for (i, &r) in ids.iter().enumerate() {
        let last = (r * rb + rb - 1) >> PAGE_SHIFT;
        let part = first_pages.partition_point(|&p| p <= last);
        buckets[part].push(i as u32);
    }
    let outp = OutPtr(out.as_mut_ptr());
    let io = Mutex::new(IoDelta::default());
    let task_err = Mutex::new(None);
    let mut err = None;
    pool.in_place_scope(|s| {
        for (k, bucket) in buckets.iter().enumerate() {
            if err.is_none() {
                let t = Instant::now();
                match issue(&pages.ranges[bounds[k]..bounds[k + 1]]) {
                    Ok((n, d)) => {
                        rep.pages_issued += n;
                        rep.issue_io.add(d);
                    }
                    Err(e) => err = Some(e),
                }
                rep.issue_time += t.elapsed();
            }
            for chunk in bucket.chunks(OVERLAP_TASK_ROWS) {
                let (io, task_err) = (&io, &task_err);
                s.spawn(move |_| {
                    let o = outp;
                    let (r, d) = measure(false, || {
                        for &i in chunk {
                            let i = i as usize;
                            // SAFETY: row `i` of `out` is in bounds (checked above) and written by
                            // this task only (each index is in exactly one bucket and chunk), so
                            // this is the only reference to those bytes while the task runs.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(o.0.add(i * row_bytes), row_bytes)
                            };
                            guard::copy_rows(src, row_bytes, &ids[i..i + 1], dst)?;
                        }
                        Ok(())
                    });
                    keep_first(task_err, r);
                    sync::lock(io).add(d);
                });
            }
        }
    });
    if let Some(e) = err.or(sync::into_inner(task_err)) {
        return Err(e);
    }
    rep.gather_io = *sync::lock(&io);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_rows_in_order_no_stride() {
        for rb in [90usize, 160, 320, 7] {
            let src: Vec<u8> = (0..rb * 1000).map(|i| (i * 31 % 251) as u8).collect();
            let ids: Vec<u64> = (0..3000u64).map(|i| (i * 613) % 1000).collect();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap();
            for p in [None, Some(&pool)] {
                let mut out = vec![0u8; ids.len() * rb + 5];
                gather(&src, rb, &ids, &mut out, p).unwrap();
                for (i, &r) in ids.iter().enumerate() {
                    let r = r as usize;
                    assert_eq!(&out[i * rb..(i + 1) * rb], &src[r * rb..(r + 1) * rb]);
                }
                assert_eq!(&out[ids.len() * rb..], &[0u8; 5]);
            }
        }
    }

    #[test]
    fn overlapped_gather_fills_every_row_and_issues_every_range() {
        let rb = 90usize;
        let rows = 200_000usize;
        let src: Vec<u8> = (0..rb * rows).map(|i| (i * 7 % 253) as u8).collect();
        let ids: Vec<u64> = (0..20_000u64)
            .map(|i| crate::model::splitmix64(i) % rows as u64)
            .collect();
        let pages = PageSet::from_rows(&ids, rb);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut out = vec![0u8; ids.len() * rb];
        let mut issued = Vec::new();
        let rep = gather_overlapped(&src, rb, &ids, &mut out, &pool, &pages, |r| {
            issued.extend_from_slice(r);
            Ok((r.iter().map(|x| x.count).sum(), IoDelta::default()))
        })
        .unwrap();
        assert_eq!(issued, pages.ranges, "every range issued once, in order");
        assert_eq!(rep.pages_issued as usize, pages.len());
        for (i, &r) in ids.iter().enumerate() {
            let r = r as usize;
            assert_eq!(
                &out[i * rb..(i + 1) * rb],
                &src[r * rb..(r + 1) * rb],
                "row {i}"
            );
        }
    }

    #[test]
    fn bad_ids_and_short_staging_are_errors() {
        let src = vec![0u8; 900];
        let mut out = vec![0u8; 180];
        let e = gather(&src, 90, &[1, 10], &mut out, None).unwrap_err();
        assert!(e.to_string().contains("row id 10"), "{e}");
        let e = gather(&src, 90, &[1, 2, 3], &mut out, None).unwrap_err();
        assert!(e.to_string().contains("staging"), "{e}");
    }
}
