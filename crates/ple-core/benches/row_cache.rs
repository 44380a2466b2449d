//! The row cache's hit path against the copy it replaces: one decode step of 64 tokens (1,024
//! rows of 90 bytes, all cached) looked up in a 64 MiB S3-FIFO cache, beside the same rows
//! copied from a plain byte table in memory (MMAP's warm gather, without the page tables), on one
//! thread; and the lookups eight times over on two threads at once (rows shared between them).
//! Its miss path: a cold decode step of 128 rows, none cached, through a full 256 MiB cache (each
//! insert evicts), by `read_through` (which prefetches the cache's memory a few rows ahead)
//! beside the same lookups and inserts one row after another.
//! `cargo bench --bench row_cache` (add `-- --quick` for a short run).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ple_core::io::cache::{Pages, Policy, RowCache};
use ple_core::io::mmap::gather::gather_serial;
use ple_core::model::splitmix64;
use std::hint::black_box;

const RB: usize = 90;
const TABLE_ROWS: u64 = 4_000_000;
const STEP_ROWS: usize = 1024;

fn bench(c: &mut Criterion) {
    let table: Vec<u8> = (0..TABLE_ROWS as usize * RB)
        .map(|i| splitmix64(i as u64) as u8)
        .collect();
    // the cache full of other rows, then the step's rows inserted and hit once
    let filled = |pages| {
        let cache = RowCache::with_pages(64 << 20, RB, Policy::default(), pages).unwrap();
        for i in 0..cache.capacity_rows() as u64 {
            let id = splitmix64(i ^ 0xABCD) % TABLE_ROWS;
            cache.insert(id, &table[id as usize * RB..][..RB]);
        }
        cache
    };
    let (cache, base) = (filled(Pages::Huge), filled(Pages::Base));
    let mut row = vec![0u8; RB];
    let ids: Vec<u64> = (0..STEP_ROWS as u64)
        .map(|i| splitmix64(i) % TABLE_ROWS)
        .collect();
    for &id in &ids {
        if !cache.lookup(id, &mut row) {
            cache.insert(id, &table[id as usize * RB..][..RB]);
        }
    }
    side_by_side(&cache, &base, &table);
    let mut out = vec![0u8; STEP_ROWS * RB];
    let mut g = c.benchmark_group("decode step of 64 tokens, all rows cached");
    g.throughput(Throughput::Elements(STEP_ROWS as u64));
    g.bench_function("row cache lookups", |b| {
        b.iter(|| {
            let mut hits = 0;
            for (o, &id) in out.chunks_exact_mut(RB).zip(&ids) {
                hits += cache.lookup(black_box(id), o) as usize;
            }
            assert_eq!(hits, STEP_ROWS);
        })
    });
    g.bench_function("row cache lookup_batch", |b| {
        b.iter(|| {
            let hits = cache.lookup_batch(black_box(&ids), &mut out, |_, _| ());
            assert_eq!(hits, STEP_ROWS as u64);
        })
    });
    // the same lookups split over two threads (shards shared between them)
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    g.bench_function("row cache lookups, two threads", |b| {
        use rayon::prelude::*;
        b.iter(|| {
            pool.install(|| {
                out.par_chunks_mut(STEP_ROWS / 2 * RB)
                    .zip(ids.par_chunks(STEP_ROWS / 2))
                    .for_each(|(out, ids)| {
                        for _ in 0..8 {
                            for (o, &id) in out.chunks_exact_mut(RB).zip(ids) {
                                assert!(cache.lookup(black_box(id), o));
                            }
                        }
                    })
            })
        })
    });
    g.bench_function("copy from the table in memory", |b| {
        b.iter(|| gather_serial(black_box(&table), RB, &ids, &mut out).unwrap())
    });
    g.finish();
    misses(c);
}

/// ns per row of the ways of copying the same rows, timed in alternating rounds (a shared
/// machine's drift hits all alike): lookups one at a time, the same with the index line of the
/// row 6 ahead prefetched (what `read_through` did before `lookup_batch`), `lookup_batch` (what a
/// step does now), `lookup_batch` on a cache of base pages (`base`: without the huge-page
/// advice), and the copy from the table (MMAP's warm gather; the table is a heap vector, which
/// gets base pages). Steps of `rows` rows, cached (each cache is 64 MiB): "hot", the same step
/// again and again (its lines stay in the CPU's caches); "cold lines", each step another of 256
/// (262,144 rows: its lines come from memory, as a real step's do).
fn side_by_side(cache: &RowCache, base: &RowCache, table: &[u8]) {
    use std::time::Instant;
    println!(
        "hit path vs mapped copy, ns per row (median of 15 alternating rounds; min in brackets); the cache's huge pages: {} MiB of 64:",
        cache.huge_page_bytes().unwrap_or(0) >> 20
    );
    for (rows, steps) in [(128usize, 1usize), (1024, 1), (128, 2048), (1024, 256)] {
        let all: Vec<Vec<u64>> = (0..steps as u64)
            .map(|s| {
                (0..rows as u64)
                    .map(|i| splitmix64(i ^ (s << 32) ^ 0x5EED) % TABLE_ROWS)
                    .collect()
            })
            .collect();
        let mut row = vec![0u8; RB];
        for c in [cache, base] {
            for ids in &all {
                for &id in ids {
                    if !c.lookup(id, &mut row) {
                        c.insert(id, &table[id as usize * RB..][..RB]);
                    }
                }
            }
        }
        let mut out = vec![0u8; rows * RB];
        // each round times `reps` steps of each way
        let reps = (256 * 1024 / rows).max(steps);
        let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        let mut missed = 0u64;
        for _ in 0..15 {
            for (w, t) in t.iter_mut().enumerate() {
                let t0 = Instant::now();
                for r in 0..reps {
                    let ids = &all[r % steps];
                    match w {
                        0 => {
                            for (o, &id) in out.chunks_exact_mut(RB).zip(ids) {
                                missed += !cache.lookup(black_box(id), o) as u64;
                            }
                        }
                        1 => {
                            // the lookups before lookup_batch: each with the index line of the
                            // row 6 ahead prefetched
                            for (i, (o, &id)) in out.chunks_exact_mut(RB).zip(ids).enumerate() {
                                if let Some(&next) = ids.get(i + 6) {
                                    cache.hint(next, false);
                                }
                                missed += !cache.lookup(black_box(id), o) as u64;
                            }
                        }
                        2 | 3 => {
                            let c = if w == 2 { cache } else { base };
                            let h = c.lookup_batch(black_box(ids), &mut out, |_, _| ());
                            missed += rows as u64 - h;
                        }
                        _ => gather_serial(black_box(table), RB, ids, &mut out).unwrap(),
                    }
                }
                t.push(t0.elapsed().as_nanos() as f64 / (reps * rows) as f64);
            }
        }
        let fig = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            format!("{:.1} [{:.1}]", v[v.len() / 2], v[0])
        };
        let [a, p, b, s, m] = &mut t;
        let (a, p, b, s, m) = (fig(a), fig(p), fig(b), fig(s), fig(m));
        let what = if steps == 1 { "hot" } else { "cold lines" };
        println!(
            "  steps of {rows:>4} rows, {what:<10}: lookup {a} | lookup, index prefetched 6 ahead {p} | lookup_batch {b} | lookup_batch, base pages {s} | mapped copy {m}{}",
            if missed > 0 {
                format!(" ({missed} lookups missed)")
            } else {
                String::new()
            }
        );
    }
}

fn misses(c: &mut Criterion) {
    const N: usize = 128;
    let cache = RowCache::new(256 << 20, RB).unwrap();
    let fill = |id: u64, o: &mut [u8]| o.fill(id as u8);
    let mut row = vec![0u8; RB];
    for i in 0..cache.capacity_rows() as u64 * 2 {
        fill(i, &mut row);
        cache.insert(splitmix64(i) % (1 << 40), &row);
    }
    // every step's rows are new: ids never used before (a counter above the fill's ids; the
    // cache hashes ids, so consecutive ones land anywhere)
    let mut k = 1u64 << 41;
    let mut step = || -> Vec<u64> {
        (0..N)
            .map(|_| {
                k += 1;
                k
            })
            .collect()
    };
    let mut out = vec![0u8; N * RB];
    let mut scratch = ple_core::io::cache::ReadThroughScratch::default();
    let mut g = c.benchmark_group("cold decode step of 128 rows, none cached, cache full");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("read_through (prefetching)", |b| {
        b.iter(|| {
            let ids = step();
            let (_, hits) = ple_core::io::cache::read_through(
                &cache,
                &ids,
                &mut out,
                &mut scratch,
                ple_core::io::cache::Lookups::Here,
                |m, o| {
                    for (o, &id) in o.chunks_exact_mut(RB).zip(m) {
                        fill(id, o);
                    }
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(hits, 0);
        })
    });
    g.bench_function("lookup then insert, row by row", |b| {
        b.iter(|| {
            let ids = step();
            for (o, &id) in out.chunks_exact_mut(RB).zip(&ids) {
                assert!(!cache.lookup(black_box(id), o));
            }
            for (o, &id) in out.chunks_exact_mut(RB).zip(&ids) {
                fill(id, o);
                cache.insert(id, o);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
