//! The gather through the row cache (the seam a direct-read mode takes over for its misses).

use super::RowCache;
use super::placement::Placement;
use crate::error::Result;
use crate::io::mmap::gather::runs_on_pool;
use crate::stats::{IoDelta, measure};
use crate::sync;
use std::sync::Mutex;
use std::time::Instant;

/// How many rows ahead a batch hints the cache's memory for ([`RowCache::hint`]).
const PREFETCH_AHEAD: usize = 6;

/// What [`gather_cached`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct CachedGather {
    /// Faults and storage bytes of the pool threads (the calling thread's are not measured).
    pub io: IoDelta,
    /// Rows copied from the cache, and rows read from `src` (and inserted).
    pub hits: u64,
    pub misses: u64,
}

/// Gathers `ids` into `out` (laid out as [`gather`](crate::io::mmap::gather::gather)) through `cache`:
/// a cached row is copied from the cache, any other from `src` (the mapped row file, read only
/// through [`guard::copy_rows`](crate::io::mmap::guard::copy_rows), so a SIGBUS is an `Error::Io` and
/// nothing is inserted for the row that faulted) and then inserted. Big sets run on `pool` in
/// chunks, as the plain gather does; the first chunk's error is returned.
pub fn gather_cached(
    cache: &RowCache,
    src: &[u8],
    ids: &[u64],
    out: &mut [u8],
    pool: Option<&rayon::ThreadPool>,
) -> Result<CachedGather> {
    let rb = cache.row_bytes();
    if out.len() < ids.len() * rb {
        return crate::invalid!(
            "staging holds {} bytes, {} rows of {rb} need {}",
            out.len(),
            ids.len(),
            ids.len() * rb
        );
    }
    crate::io::mmap::gather::check_ids(ids, (src.len() / rb) as u64)?;
    let out = &mut out[..ids.len() * rb];
    let run = |ids: &[u64], out: &mut [u8]| -> Result<u64> {
        // the first fault ends the copying: later misses are left unfilled and uninserted
        let mut fault = None;
        let hits = cache.lookup_batch(ids, out, |i, o| {
            if fault.is_some() {
                return;
            }
            let r = ids[i];
            if let Some(&next) = ids.get(i + PREFETCH_AHEAD) {
                cache.hint(next, true);
            }
            match crate::io::mmap::guard::copy_rows(src, rb, &[r], o) {
                Ok(()) => cache.insert(r, o),
                Err(e) => fault = Some(e),
            }
        });
        match fault {
            Some(e) => Err(e),
            None => Ok(hits),
        }
    };
    let mut g = CachedGather::default();
    match pool {
        Some(pool) if crate::io::mmap::gather::runs_on_pool(ids.len(), pool) => {
            let chunk = crate::io::mmap::gather::pool_chunk(ids.len(), pool);
            let acc = Mutex::new((CachedGather::default(), None));
            pool.in_place_scope(|s| {
                for (o, i) in out.chunks_mut(chunk * rb).zip(ids.chunks(chunk)) {
                    let acc = &acc;
                    let run = &run;
                    s.spawn(move |_| {
                        let (r, d) = measure(false, || run(i, o));
                        let mut a = sync::lock(acc);
                        a.0.io.add(d);
                        match r {
                            Ok(hits) => a.0.hits += hits,
                            Err(e) => {
                                a.1.get_or_insert(e);
                            }
                        }
                    });
                }
            });
            let (a, err) = sync::into_inner(acc);
            if let Some(e) = err {
                return Err(e);
            }
            g = a;
        }
        _ => g.hits = run(ids, out)?,
    }
    g.misses = ids.len() as u64 - g.hits;
    cache.record(g.hits, g.misses);
    Ok(g)
}

/// Reusable buffers of [`read_through`] (kept by the worker between steps).
#[derive(Debug, Default)]
pub struct ReadThroughScratch {
    miss_ids: Vec<u64>,
    miss_pos: Vec<usize>,
    miss_rows: Vec<u8>,
}

/// Looks `ids` up in `cache`, copying each hit into its row of `out`; appends the positions (in
/// `ids`, offset by `first`) of the misses to `miss_pos`.
fn lookups(cache: &RowCache, ids: &[u64], out: &mut [u8], first: usize, miss_pos: &mut Vec<usize>) {
    cache.lookup_batch(ids, out, |i, _| miss_pos.push(first + i));
}

/// Where [`read_through`]'s lookups of a big set run.
#[derive(Clone, Copy)]
pub enum Lookups<'a> {
    /// On the calling thread.
    Here,
    /// Split over the pool in chunks, as the plain gather does.
    Pool(&'a rayon::ThreadPool),
    /// Where `Placement` measured them cheaper (and the time recorded there).
    Measured(&'a rayon::ThreadPool, &'a Placement),
}

/// Fills `out` with rows `ids` (laid out as [`gather`](crate::io::mmap::gather::gather)) through
/// `cache`: cached rows are copied from it (where `lookups` says, for a big set); the others are
/// read together by `read_misses` (ids, their output buffer), copied into place and inserted.
/// Returns what `read_misses` returned (None when every row was cached) and the hit count;
/// misses = `ids.len()` - hits.
pub fn read_through<R>(
    cache: &RowCache,
    ids: &[u64],
    out: &mut [u8],
    scratch: &mut ReadThroughScratch,
    lookups_on: Lookups,
    read_misses: impl FnOnce(&[u64], &mut [u8]) -> Result<R>,
) -> Result<(Option<R>, u64)> {
    let rb = cache.row_bytes();
    if out.len() < ids.len() * rb {
        return crate::invalid!("staging too small for {} rows of {rb} bytes", ids.len());
    }
    let s = scratch;
    s.miss_ids.clear();
    s.miss_pos.clear();
    let out = &mut out[..ids.len() * rb];
    let pool = match lookups_on {
        Lookups::Here => None,
        Lookups::Pool(pool) => Some(pool).filter(|p| runs_on_pool(ids.len(), p)),
        Lookups::Measured(pool, pl) => Some(pool).filter(|p| pl.choose(ids.len(), p)),
    };
    let t0 = Instant::now();
    match pool {
        Some(pool) => {
            let chunk = crate::io::mmap::gather::pool_chunk(ids.len(), pool);
            // each chunk's misses in its own list, joined in chunk order
            let mut parts: Vec<Vec<usize>> = vec![Vec::new(); ids.len().div_ceil(chunk)];
            pool.in_place_scope(|sc| {
                let chunks = out.chunks_mut(chunk * rb).zip(ids.chunks(chunk));
                for (k, ((o, i), part)) in chunks.zip(parts.iter_mut()).enumerate() {
                    sc.spawn(move |_| lookups(cache, i, o, k * chunk, part));
                }
            });
            parts.iter().for_each(|p| s.miss_pos.extend_from_slice(p));
        }
        None => lookups(cache, ids, out, 0, &mut s.miss_pos),
    }
    if let Lookups::Measured(_, pl) = lookups_on {
        pl.record(ids.len(), pool.is_some(), t0.elapsed());
    }
    s.miss_ids.extend(s.miss_pos.iter().map(|&i| ids[i]));
    let hits = (ids.len() - s.miss_ids.len()) as u64;
    cache.record(hits, s.miss_ids.len() as u64);
    if s.miss_ids.is_empty() {
        return Ok((None, hits));
    }
    s.miss_rows.resize(s.miss_ids.len() * rb, 0);
    let r = read_misses(&s.miss_ids, &mut s.miss_rows)?;
    for (k, ((&id, &i), row)) in (s.miss_ids.iter())
        .zip(&s.miss_pos)
        .zip(s.miss_rows.chunks_exact(rb))
        .enumerate()
    {
        if let Some(&next) = s.miss_ids.get(k + PREFETCH_AHEAD) {
            cache.hint(next, true);
        }
        if let Some(&next) = s.miss_ids.get(k + PREFETCH_AHEAD / 2) {
            cache.hint_victim(next);
        }
        out[i * rb..(i + 1) * rb].copy_from_slice(row);
        cache.insert(id, row);
    }
    Ok((Some(r), hits))
}
