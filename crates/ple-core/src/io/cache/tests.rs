//! Tests of the row cache: rows always those of the table, never a row of another id, counters
//! that add up, bounded memory, concurrency, and scan resistance against an exact LRU.

use super::*;
use std::collections::{HashMap, VecDeque};

const POLICIES: [Policy; 2] = [Policy::S3Fifo, Policy::Sieve];

/// Row `id` of a table whose every row encodes its own id: the id's 8 bytes, then bytes that
/// depend on the id and the position.
fn row_of(id: u64, rb: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..rb)
        .map(|i| (mix(id ^ (i as u64) << 40) >> 56) as u8)
        .collect();
    let n = rb.min(8);
    v[..n].copy_from_slice(&id.to_le_bytes()[..n]);
    v
}

/// A skewed random id in `[0, n)`: most draws from a small hot set.
fn skewed(r: &mut u64, n: u64) -> u64 {
    *r = mix(*r);
    let x = *r;
    match x % 4 {
        0 => (x >> 8) % n,
        _ => (x >> 8) % (n / 20).max(1),
    }
}

/// A cache holding about `rows` rows of `rb` bytes.
fn cache_of(rows: usize, rb: usize, p: Policy) -> RowCache {
    let shards = if rows < 64 { 1 } else { MAX_SHARDS };
    let fixed =
        shards * (std::mem::size_of::<Padded>() + SHARD_ROUNDING) + std::mem::size_of::<RowCache>();
    let bytes = (rows as f64 * RowCache::row_cost(rb, p)).ceil() as u64 + fixed as u64 + 1;
    RowCache::with_policy(bytes, rb, p).unwrap()
}

#[test]
fn rows_through_the_cache_are_the_tables_under_heavy_eviction() {
    for p in POLICIES {
        for (rows, rb) in [(1usize, 90usize), (3, 90), (5, 160), (200, 90), (5000, 7)] {
            let c = cache_of(rows, rb, p);
            if rows < 64 {
                assert_eq!(c.capacity_rows(), rows, "{p:?}");
            } else {
                assert!(
                    c.capacity_rows() * 100 >= rows * 95,
                    "{p:?} {rows}: {}",
                    c.capacity_rows()
                );
            }
            let n = 20_000u64;
            let mut r = rows as u64;
            let mut dst = vec![0u8; rb];
            let (mut hits, mut lookups) = (0u64, 0u64);
            for _ in 0..30_000 {
                let id = skewed(&mut r, n);
                lookups += 1;
                if c.lookup(id, &mut dst) {
                    hits += 1;
                    assert_eq!(dst, row_of(id, rb), "{p:?} cap {rows}: row {id}");
                } else {
                    c.insert(id, &row_of(id, rb));
                }
            }
            let k = c.counters();
            assert_eq!(k.inserts, lookups - hits, "every miss inserted once");
            assert_eq!(k.inserts - k.evictions, k.rows);
            assert!(k.rows as usize <= c.capacity_rows());
            if rows < 64 {
                assert_eq!(k.rows as usize, rows, "full after 30,000 lookups");
            }
            assert!(k.evictions > 0);
            if rows >= 200 {
                assert!(
                    hits > lookups / 10,
                    "{p:?} {rows}: skewed traffic hits ({hits})"
                );
            }
        }
    }
}

#[test]
fn never_a_row_of_another_id() {
    // one- and two-row caches: every id competes for the same slots
    for p in POLICIES {
        for rows in [1usize, 2] {
            let rb = 16;
            let c = cache_of(rows, rb, p);
            let mut dst = vec![0u8; rb];
            let mut r = 7u64;
            for i in 0..50_000u64 {
                r = mix(r);
                let id = r % 64;
                if c.lookup(id, &mut dst) {
                    let got = u64::from_le_bytes(dst[..8].try_into().unwrap());
                    assert_eq!(got, id, "{p:?}: lookup {i} returned row {got} for id {id}");
                } else {
                    c.insert(id, &row_of(id, rb));
                }
            }
            // a row inserted is then found (the slot it took is its own)
            c.insert(1000, &row_of(1000, rb));
            assert!(c.lookup(1000, &mut dst));
            assert_eq!(dst, row_of(1000, rb));
        }
    }
}

#[test]
fn ids_beyond_the_header_are_not_cached() {
    let c = RowCache::new(1 << 20, 8).unwrap();
    let mut d = [0u8; 8];
    c.insert(MAX_ROW_ID, &[1; 8]);
    assert!(!c.lookup(MAX_ROW_ID, &mut d));
    assert_eq!(c.counters().rows, 0);
    assert_eq!(c.counters().inserts, 0);
}

#[test]
fn memory_is_bounded_by_cache_bytes() {
    for p in POLICIES {
        for bytes in [200u64, 4096, 100_000, 3 << 20, 64 << 20] {
            for rb in [90usize, 160, 320] {
                let c = match RowCache::with_policy(bytes, rb, p) {
                    Ok(c) => c,
                    Err(e) => {
                        assert!(bytes < 1000, "{bytes}: {e}");
                        assert!(e.to_string().contains("holds no row"), "{e}");
                        continue;
                    }
                };
                assert!(
                    c.allocated_bytes() <= bytes,
                    "{p:?} {bytes} {rb}: {}",
                    c.allocated_bytes()
                );
                let model = c.capacity_rows() as f64 * c.bytes_per_row();
                assert!(model <= bytes as f64);
                if bytes >= 3 << 20 {
                    // nearly all of the budget holds rows
                    assert!(model > 0.95 * bytes as f64, "{p:?} {bytes} {rb}: {model}");
                }
            }
        }
    }
    assert!(RowCache::new(50, 90).is_err());
    assert!(RowCache::new(1 << 20, 0).is_err());
}

#[test]
fn concurrent_lookups_and_inserts_from_many_threads() {
    // 3,000 rows over many shards, and 40 rows in one shard: lookups there race writers all
    // the time (the seqlock's retries and its locked fallback)
    for (cap, ids) in [(3000usize, 50_000u64), (40, 400)] {
        for p in POLICIES {
            let rb = 90;
            let c = cache_of(cap, rb, p);
            let threads = 8u64;
            let per = 40_000u64;
            let hits: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let c = &c;
                        s.spawn(move || {
                            let mut r = t + 1;
                            let mut dst = vec![0u8; rb];
                            let mut hits = 0;
                            for _ in 0..per {
                                let id = skewed(&mut r, ids);
                                if c.lookup(id, &mut dst) {
                                    assert_eq!(dst, row_of(id, rb), "{p:?} row {id}");
                                    hits += 1;
                                } else {
                                    c.insert(id, &row_of(id, rb));
                                }
                            }
                            hits
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            });
            let k = c.counters();
            // a miss inserts unless another thread inserted the same row first
            assert!(k.inserts <= threads * per - hits && k.inserts > 0);
            assert!(hits > 0, "{p:?} cap {cap}: no hits");
            assert_eq!(k.inserts - k.evictions, k.rows);
            assert_eq!(c.num_shards() > 1, cap >= 64);
            check_consistent(&c);
        }
    }
}

fn lru_hits(seq: &[u64], cap: usize) -> Vec<bool> {
    let mut q: VecDeque<u64> = VecDeque::new();
    let mut pos: HashMap<u64, ()> = HashMap::new();
    seq.iter()
        .map(|&id| {
            let hit = pos.contains_key(&id);
            if hit {
                let i = q.iter().position(|&x| x == id).unwrap();
                q.remove(i);
            } else if q.len() == cap {
                pos.remove(&q.pop_back().unwrap());
            }
            q.push_front(id);
            pos.insert(id, ());
            hit
        })
        .collect()
}

#[test]
fn s3fifo_keeps_a_hot_set_through_a_long_scan_where_lru_loses_it() {
    let rb = 16;
    let bytes = 1000.0 * RowCache::row_cost(rb, Policy::S3Fifo);
    let c = RowCache::with_policy(bytes as u64, rb, Policy::S3Fifo).unwrap();
    assert!((900..=1000).contains(&c.capacity_rows()));
    // warm: a hot set of 500 rows, each used a few times
    let mut seq = Vec::new();
    for _ in 0..3 {
        seq.extend(0..500u64);
    }
    let warm = seq.len();
    // then one hot access per 4 fresh rows (a prefill of new text between decode steps)
    let mut fresh = 1_000_000u64;
    for round in 0..20_000u64 {
        seq.push(round % 500);
        for _ in 0..4 {
            seq.push(fresh);
            fresh += 1;
        }
    }
    let mut dst = vec![0u8; rb];
    let mut hot = (0u64, 0u64);
    for (i, &id) in seq.iter().enumerate() {
        let hit = c.lookup(id, &mut dst);
        if !hit {
            c.insert(id, &row_of(id, rb));
        }
        if i >= warm && id < 500 {
            hot.0 += hit as u64;
            hot.1 += 1;
        }
    }
    let lru = lru_hits(&seq, c.capacity_rows());
    let lru_hot = seq
        .iter()
        .zip(&lru)
        .skip(warm)
        .filter(|(id, h)| **id < 500 && **h)
        .count() as u64;
    assert!(
        hot.0 * 10 > hot.1 * 9,
        "S3-FIFO hot hits {} of {}",
        hot.0,
        hot.1
    );
    assert!(lru_hot * 10 < hot.1, "LRU hot hits {lru_hot} of {}", hot.1);
}

/// Every shard's structures agree: each filled slot is indexed once under its own id, the index
/// holds nothing else, and the queues together link every filled slot exactly once.
fn check_consistent(c: &RowCache) {
    for p in c.shards.iter() {
        let sh = &p.0;
        let s = sh.lock();
        let entries = (sh.index.iter())
            .filter(|e| e.load(Relaxed) != NO_ENTRY)
            .count();
        assert_eq!(entries, s.fresh, "index entries = filled slots");
        for slot in 0..s.fresh as u32 {
            let id = sh.header(slot) >> 8;
            assert_eq!(
                sh.find(id, mix(id)).map(|x| x.1),
                Some(slot),
                "slot {slot} indexed"
            );
        }
        let queues: Vec<Fifo> = match &s.q {
            Queues::S3Fifo { small, main, .. } => vec![*small, *main],
            Queues::Sieve { fifo, .. } => vec![*fifo],
        };
        let mut seen = vec![false; sh.cap];
        for f in queues {
            let (mut n, mut cur, mut last) = (0, f.oldest, NIL);
            while cur != NIL {
                assert!(!seen[cur as usize], "slot {cur} linked twice");
                seen[cur as usize] = true;
                (last, cur) = (cur, s.next[cur as usize]);
                n += 1;
            }
            assert_eq!((n, last), (f.len, f.newest), "queue length and newest");
        }
        assert_eq!(seen.iter().filter(|&&x| x).count(), s.fresh);
    }
}

#[test]
fn index_and_queues_stay_consistent_under_eviction() {
    for p in POLICIES {
        for rows in [1usize, 2, 7, 300] {
            let c = cache_of(rows, 8, p);
            let mut r = 11u64;
            let mut dst = [0u8; 8];
            for i in 0..20_000 {
                let id = skewed(&mut r, 3000);
                if !c.lookup(id, &mut dst) {
                    c.insert(id, &row_of(id, 8));
                }
                if i % 997 == 0 {
                    check_consistent(&c);
                }
            }
            check_consistent(&c);
        }
    }
}

#[test]
fn batched_lookups_race_an_evicting_writer_and_never_copy_a_wrong_row() {
    // readers look batches up (duplicates included) while a writer inserts new rows without
    // pause, evicting others: every row a batch reports as a hit is the table's row of its id,
    // every other row is reported once, in order
    for (cap, ids) in [(2usize, 6u64), (40, 200), (3000, 20_000)] {
        for p in POLICIES {
            let rb = 90;
            let c = cache_of(cap, rb, p);
            let stop = std::sync::atomic::AtomicBool::new(false);
            let hits: u64 = std::thread::scope(|s| {
                s.spawn(|| {
                    let mut r = 99u64;
                    while !stop.load(Relaxed) {
                        let id = skewed(&mut r, ids);
                        c.insert(id, &row_of(id, rb));
                    }
                });
                let readers: Vec<_> = (0..3u64)
                    .map(|t| {
                        let c = &c;
                        s.spawn(move || {
                            let mut r = t + 1;
                            let mut hits = 0;
                            for round in 0..20_000 {
                                let n = 1 + (mix(r) % 70) as usize;
                                let batch: Vec<u64> = (0..n).map(|_| skewed(&mut r, ids)).collect();
                                let mut out = vec![0xEEu8; n * rb];
                                let mut missed = vec![false; n];
                                let mut last = None;
                                let h = c.lookup_batch(&batch, &mut out, |i, _| {
                                    assert!(last < Some(i), "misses in order, once each");
                                    last = Some(i);
                                    missed[i] = true;
                                });
                                assert_eq!(h, missed.iter().filter(|m| !**m).count() as u64);
                                for (i, (&id, o)) in batch.iter().zip(out.chunks(rb)).enumerate() {
                                    if !missed[i] {
                                        assert_eq!(
                                            o,
                                            row_of(id, rb),
                                            "{p:?} round {round}: row {id}"
                                        );
                                    }
                                }
                                hits += h;
                            }
                            hits
                        })
                    })
                    .collect();
                // the writer stops even if a reader failed (then the test fails, not hangs)
                let done: Vec<_> = readers.into_iter().map(|h| h.join()).collect();
                stop.store(true, Relaxed);
                done.into_iter().map(|h| h.unwrap()).sum()
            });
            assert!(hits > 0, "{p:?} cap {cap}: no hits");
            check_consistent(&c);
        }
    }
}

proptest::proptest! {
    /// On one thread a batch finds exactly the rows one-at-a-time lookups find, copies the
    /// table's rows, and reports the others as misses (in order).
    #[test]
    fn a_batch_finds_what_single_lookups_find(
        inserted in proptest::collection::vec(0u64..400, 0..600),
        batch in proptest::collection::vec(0u64..500, 0..100),
        cap in 1usize..300,
        sieve: bool,
    ) {
        let p = if sieve { Policy::Sieve } else { Policy::S3Fifo };
        let rb = 20;
        let c = cache_of(cap, rb, p);
        for &id in &inserted {
            c.insert(id, &row_of(id, rb));
        }
        let mut out = vec![0u8; batch.len() * rb];
        let mut missed = Vec::new();
        let hits = c.lookup_batch(&batch, &mut out, |i, _| missed.push(i));
        let mut dst = vec![0u8; rb];
        let want: Vec<usize> = (0..batch.len()).filter(|&i| !c.lookup(batch[i], &mut dst)).collect();
        proptest::prop_assert_eq!(&missed, &want);
        proptest::prop_assert_eq!(hits as usize, batch.len() - want.len());
        for (i, (&id, o)) in batch.iter().zip(out.chunks(rb)).enumerate() {
            if !want.contains(&i) {
                proptest::prop_assert_eq!(o, &row_of(id, rb)[..]);
            }
        }
    }
}

#[test]
fn a_row_admitted_ahead_counts_at_its_first_hit_only_and_keeps_its_policy() {
    let rb = 90;
    for policy in [Policy::S3Fifo, Policy::Sieve] {
        let c = cache_of(4096, rb, policy);
        let mut out = vec![0u8; rb];
        for id in 0..100u64 {
            c.admit(id, &row_of(id, rb));
        }
        for id in 100..200u64 {
            c.insert(id, &row_of(id, rb));
        }
        // admitting a row already cached does not flag it
        c.admit(150, &row_of(150, rb));
        assert_eq!(c.take_ahead_hits(), 0);
        // single lookups and batched ones: the 50 admitted rows among 0..150 count once
        for id in 0..50u64 {
            assert!(c.lookup(id, &mut out));
            assert_eq!(out, row_of(id, rb));
        }
        let ids: Vec<u64> = (0..150).chain(150..200).collect();
        let mut rows = vec![0u8; ids.len() * rb];
        let hits = c.lookup_batch(&ids, &mut rows, |_, _| {});
        assert_eq!(hits, 200, "{policy:?}");
        for (k, &id) in ids.iter().enumerate() {
            assert_eq!(
                &rows[k * rb..(k + 1) * rb],
                &row_of(id, rb)[..],
                "{policy:?}"
            );
        }
        assert_eq!(c.take_ahead_hits(), 100, "{policy:?}");
        c.lookup_batch(&ids, &mut rows, |_, _| {});
        assert_eq!(c.take_ahead_hits(), 0, "{policy:?}: counted once");
        check_consistent(&c);
    }
}

#[test]
fn the_ahead_flag_leaves_eviction_as_it_was() {
    // the same sequence of inserts and lookups, once with every insert an admission: the
    // same rows stay cached
    let rb = 90;
    for policy in [Policy::S3Fifo, Policy::Sieve] {
        let (plain, flagged) = (cache_of(512, rb, policy), cache_of(512, rb, policy));
        let mut r = 7u64;
        let mut out = vec![0u8; rb];
        for _ in 0..20_000 {
            let id = skewed(&mut r, 4000);
            let (a, b) = (plain.lookup(id, &mut out), flagged.lookup(id, &mut out));
            assert_eq!(a, b, "{policy:?}: row {id}");
            if !a {
                plain.insert(id, &row_of(id, rb));
                flagged.admit(id, &row_of(id, rb));
            }
        }
        assert_eq!(plain.counters().rows, flagged.counters().rows);
        assert!(flagged.take_ahead_hits() > 0);
        check_consistent(&flagged);
    }
}

mod gather;
