//! Read-ahead through the pipeline: the rows of steps are the generated rows with and without
//! it, tracked history is unchanged, the queue drops its oldest rows beyond its bound, the
//! counters add up, shards read only their heads' rows, bad input is an error.

use super::*;
use crate::lookup::context::Batch;
use crate::shard::Shard;
use std::time::Duration;

const IDLE: Duration = Duration::from_secs(20);

/// The handles read-ahead serves: DIRECT with a cache (where the temp dir allows direct I/O),
/// MMAP with a cache, MMAP without one.
fn handles(dir: &Path) -> Vec<(&'static str, Pipeline)> {
    let mut v = Vec::new();
    match open_with(dir, |o| {
        o.io_mode = IoMode::Direct;
        o.cache_bytes = 8 << 20;
    }) {
        Ok(p) => v.push(("direct+cache", p)),
        Err(Error::Unsupported(m)) => eprintln!("(no direct I/O on the temp dir: {m})"),
        Err(e) => panic!("{e}"),
    }
    let mmap = |cache_bytes| {
        open_with(dir, |o| {
            o.io_mode = IoMode::Mmap;
            o.cache_bytes = cache_bytes;
        })
        .unwrap()
    };
    v.push(("mmap+cache", mmap(8 << 20)));
    v.push(("mmap", mmap(0)));
    v
}

fn balanced(c: &crate::stats::Counters) -> bool {
    c.ahead_asked == c.ahead_read + c.ahead_dropped + c.ahead_cached
}

#[test]
fn rows_are_the_generated_rows_with_read_ahead_and_the_counters_add_up() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    for (name, p) in handles(d.path()) {
        let mut asked = 0u64;
        let mut x = 5u64;
        for seq in 1..=24u64 {
            x = splitmix64(x);
            let n = 1 + (x % 200) as usize;
            let st = Step::new(x, n);
            // every other step read ahead: the rows must be the same either way
            if seq % 2 == 0 {
                p.prefetch_ahead(&st.batch()).unwrap();
                asked += (n * 16) as u64;
                assert!(p.wait_ahead_idle(IDLE), "{name}: queue drained");
            }
            step(&p, seq, &st, format).unwrap();
        }
        let c = p.counters();
        assert_eq!(c.ahead_asked, asked, "{name}: {c:?}");
        assert!(balanced(&c), "{name}: {c:?}");
        assert_eq!(c.ahead_dropped, 0, "{name}: {c:?}");
        if name != "mmap" {
            // each row read ahead went into the roomy cache and was then a hit of its step
            assert!(c.ahead_read > 0, "{name}: {c:?}");
            assert_eq!(c.ahead_hits, c.ahead_read, "{name}: {c:?}");
            assert!(c.cache_hits >= c.ahead_hits, "{name}: {c:?}");
            let rate = c.overall_hit_rate();
            assert!(rate > 0.0 && rate <= 1.0, "{name}: {rate}");
        } else {
            assert_eq!(
                c.ahead_hits, 0,
                "{name}: no row cache, no row-cache hits: {c:?}"
            );
        }
    }
}

#[test]
fn a_step_read_ahead_misses_nothing_in_the_cache() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    let p = open_with(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 8 << 20;
    })
    .unwrap();
    for seq in 1..=8u64 {
        let st = Step::new(seq * 31, 100);
        p.prefetch_ahead(&st.batch()).unwrap();
        assert!(p.wait_ahead_idle(IDLE));
        step(&p, seq, &st, format).unwrap();
    }
    let c = p.counters();
    assert_eq!(c.cache_misses, 0, "every row was read ahead: {c:?}");
    assert_eq!(c.cache_hits, 8 * 100 * 16, "{c:?}");
    assert_eq!(c.ahead_hits, c.ahead_read, "{c:?}");
    assert!(balanced(&c), "{c:?}");
}

#[test]
fn a_row_read_ahead_is_an_ahead_hit_once_and_a_steps_own_miss_never() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    let p = open_with(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 8 << 20;
    })
    .unwrap();
    let st = Step::new(41, 10);
    p.prefetch_ahead(&st.batch()).unwrap();
    assert!(p.wait_ahead_idle(IDLE));
    let rows = 10 * 16;
    let read = p.counters().ahead_read;
    assert_eq!(
        read + p.counters().ahead_cached,
        rows,
        "(a row twice in the step is read once)"
    );
    // the first step with those rows counts each row read ahead once, later ones none
    step(&p, 1, &st, format).unwrap();
    let c = p.counters();
    assert_eq!((c.cache_hits, c.ahead_hits), (rows, read), "{c:?}");
    step(&p, 2, &st, format).unwrap();
    step(&p, 3, &st, format).unwrap();
    let c = p.counters();
    assert_eq!((c.cache_hits, c.ahead_hits), (3 * rows, read), "{c:?}");
    // a step's own misses, inserted by it and hit by the next, are not ahead hits
    let other = Step::new(4242, 10);
    step(&p, 4, &other, format).unwrap();
    step(&p, 5, &other, format).unwrap();
    let c = p.counters();
    assert!(c.cache_hits > 3 * rows, "{c:?}");
    assert_eq!(c.ahead_hits, read, "{c:?}");
    assert!(balanced(&c), "{c:?}");
}

#[test]
fn tracked_read_ahead_changes_no_history() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    for (name, p) in handles(d.path()) {
        fn tracked(st: &Step) -> Batch<'_> {
            Batch {
                context: None,
                ..st.batch()
            }
        }
        // history: a first tracked step per request
        let mut first = Step::new(11, 6);
        first.positions = vec![0; 6];
        p.submit(&tracked(&first), 1).unwrap();
        p.wait(1, 0).unwrap();
        p.release_step(1).unwrap();
        let mut next = Step::new(12, 6);
        next.positions = vec![1; 6];
        let mut before = vec![0i64; 6 * 16];
        p.ngram_ids(&tracked(&next), &mut before).unwrap();
        p.prefetch_ahead(&tracked(&next)).unwrap();
        p.prefetch_ahead(&tracked(&next)).unwrap();
        assert!(p.wait_ahead_idle(IDLE));
        let mut after = vec![0i64; 6 * 16];
        p.ngram_ids(&tracked(&next), &mut after).unwrap();
        assert_eq!(before, after, "{name}: history unchanged by read-ahead");
        // the tracked step gives the rows of the ids computed before the read-ahead
        p.submit(&tracked(&next), 2).unwrap();
        p.wait(2, 0).unwrap();
        let rb = format.row_bytes(160);
        let (ptr, n) = p.packed_rows(2).unwrap();
        assert_eq!(n, 6);
        // SAFETY: a Ready step's staging holds its rows until it is released below.
        let rows = unsafe { std::slice::from_raw_parts(ptr, before.len() * rb) };
        for (i, &id) in before.iter().enumerate() {
            assert_eq!(
                &rows[i * rb..(i + 1) * rb],
                &synth::expected_row(SEED, format, id as u64)[..],
                "{name}: row {i}"
            );
        }
        p.release_step(2).unwrap();
        let c = p.counters();
        assert_eq!(c.ahead_asked, 2 * 6 * 16, "{name}: {c:?}");
        assert!(balanced(&c), "{name}: {c:?}");
    }
}

#[test]
fn the_queue_drops_its_oldest_rows_beyond_its_bound() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    let p = open_with(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 8 << 20;
        o.ahead_max_rows = 32;
    })
    .unwrap();
    // a slow step holds the reader back (submitted steps go first) while three batches of 16
    // rows are asked: the first is dropped
    p.hooks()
        .delay_us
        .store(300_000, std::sync::atomic::Ordering::SeqCst);
    let slow = Step::new(1, 1);
    p.submit(&slow.batch(), 1).unwrap();
    let asked: Vec<Step> = (0..3).map(|i| Step::new(100 + i, 1)).collect();
    for st in &asked {
        p.prefetch_ahead(&st.batch()).unwrap();
    }
    let c = p.counters();
    assert_eq!(
        c.ahead_read + c.ahead_cached,
        0,
        "nothing read before the step: {c:?}"
    );
    assert_eq!(c.ahead_dropped, 16, "{c:?}");
    p.wait(1, 0).unwrap();
    p.release_step(1).unwrap();
    p.hooks()
        .delay_us
        .store(0, std::sync::atomic::Ordering::SeqCst);
    assert!(p.wait_ahead_idle(IDLE));
    let c = p.counters();
    assert_eq!(c.ahead_asked, 48, "{c:?}");
    assert_eq!(c.ahead_dropped, 16, "{c:?}");
    assert_eq!(c.ahead_read + c.ahead_cached, 32, "{c:?}");
    let cache = p.row_cache().unwrap();
    let ids = |st: &Step| row_ids(&p, st);
    assert!(
        ids(&asked[0]).iter().all(|&i| !cache.contains(i)),
        "oldest dropped"
    );
    for st in &asked[1..] {
        assert!(ids(st).iter().all(|&i| cache.contains(i)), "newest read");
    }
}

#[test]
fn a_shard_reads_ahead_only_its_heads_rows() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    let p = open_with(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 8 << 20;
        o.shard = Shard { index: 1, count: 4 };
    })
    .unwrap();
    let st = Step::new(77, 50);
    p.prefetch_ahead(&st.batch()).unwrap();
    assert!(p.wait_ahead_idle(IDLE));
    let whole = row_ids(&p, &st);
    let cache = p.row_cache().unwrap();
    for (i, &id) in whole.iter().enumerate() {
        // shard 1 of 4: heads 1, 5, 9, 13
        let mine = i % 4 == 1;
        assert_eq!(cache.contains(id), mine, "row {i} (head {})", i % 16);
    }
    p.submit(&st.batch(), 1).unwrap();
    p.wait(1, 0).unwrap();
    p.release_step(1).unwrap();
    let c = p.counters();
    assert_eq!(c.ahead_asked, 50 * 4, "{c:?}");
    assert_eq!(c.cache_misses, 0, "{c:?}");
    assert!(balanced(&c), "{c:?}");
}

#[test]
fn direct_without_a_cache_drops_every_row_and_bad_input_is_an_error() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    let st = Step::new(3, 4);
    if let Ok(p) = open_with(d.path(), |o| {
        o.io_mode = IoMode::Direct;
        o.cache_bytes = 0;
    }) {
        p.prefetch_ahead(&st.batch()).unwrap();
        let c = p.counters();
        assert_eq!((c.ahead_asked, c.ahead_dropped), (64, 64), "{c:?}");
        step(&p, 1, &st, format).unwrap();
    }
    let p = open(d.path(), IoMode::Mmap, false).unwrap();
    let mut bad = Step::new(4, 4);
    bad.ctx.pop();
    assert!(matches!(
        p.prefetch_ahead(&bad.batch()),
        Err(Error::InvalidArgument(_))
    ));
    let mut bad = Step::new(4, 4);
    bad.tokens[2] = -1;
    assert!(p.prefetch_ahead(&bad.batch()).is_err());
    assert_eq!(p.counters().ahead_asked, 0);
    p.shutdown();
    assert!(matches!(
        p.prefetch_ahead(&st.batch()),
        Err(Error::State(_))
    ));
}

/// A handle whose read-ahead reader stands in for a slow device: `us` per row read.
fn slow_reader(dir: &Path, us: u64) -> Pipeline {
    let p = open_with(dir, |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 8 << 20;
    })
    .unwrap();
    p.ahead_test()
        .delay_per_row_us
        .store(us, std::sync::atomic::Ordering::SeqCst);
    p
}

#[test]
fn on_a_slow_device_the_reader_reads_a_few_rows_per_batch() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    // 500 µs per read, no latency: 4 rows take 2 ms, over the 1 ms a batch may add to the
    // device's latency, so the reader keeps to the fewest rows, or twice that as it probes (the
    // fastest batch, 4 rows, is taken for the latency)
    let p = slow_reader(d.path(), 500);
    let st = Step::new(77, 6);
    p.prefetch_ahead(&st.batch()).unwrap();
    assert!(p.wait_ahead_idle(IDLE));
    let log = crate::sync::lock(&p.ahead_test().batches).clone();
    let rows: Vec<usize> = log.iter().map(|b| b.rows).collect();
    assert_eq!(rows.iter().sum::<usize>(), 6 * 16, "{rows:?}");
    let min = super::super::ahead::AHEAD_MIN_ROWS_FOR_TESTS;
    // (a batch slowed by a loaded machine is taken for the device's latency, after which the
    // sizer may probe one size higher once: seen as 4, 8, 16, 4, 8, … while the suite ran)
    let few = rows.iter().filter(|&&n| n <= 2 * min).count();
    assert!(
        rows.iter().all(|&n| n <= 4 * min) && few * 4 >= rows.len() * 3,
        "{rows:?}"
    );
    let c = p.counters();
    assert_eq!(c.ahead_read, 96, "{c:?}");
    assert!(balanced(&c), "{c:?}");
    // the rows read ahead are the table's, and the step finds them all in the cache
    step(&p, 1, &st, format).unwrap();
    let c = p.counters();
    assert_eq!((c.cache_misses, c.ahead_hits), (0, 96), "{c:?}");
}

/// Whether batch `b` was in flight when step `seq` was submitted.
fn in_flight_at(b: &super::super::ahead::BatchLog, seq: u64) -> bool {
    b.submitted_before < seq && b.submitted_after >= seq
}

/// The batches of `log` a step was submitted during.
fn batches_a_step_came_during(log: &[super::super::ahead::BatchLog]) -> u64 {
    log.iter()
        .filter(|b| b.submitted_after != b.submitted_before)
        .count() as u64
}

#[test]
fn a_step_submitted_while_a_slow_read_ahead_runs_is_behind_at_most_one_short_batch() {
    let format = RowFormat::Nvfp4;
    let d = temp_table(format);
    // 2 ms per read: 256 rows ahead are ~0.5 s of reads, 8 to 16 ms per batch of 4 to 8
    let p = slow_reader(d.path(), 2000);
    p.prefetch_ahead(&Step::new(91, 16).batch()).unwrap();
    let steps = 12u64;
    for seq in 1..=steps {
        std::thread::sleep(Duration::from_millis(3));
        step(&p, seq, &Step::new(1000 + seq, 2), format).unwrap();
    }
    assert!(p.wait_ahead_idle(IDLE));
    let log = crate::sync::lock(&p.ahead_test().batches).clone();
    assert!(log.len() >= 2, "the reader ran beside the steps: {log:?}");
    let min = super::super::ahead::AHEAD_MIN_ROWS_FOR_TESTS;
    assert!(
        log.iter().all(|b| b.rows <= 2 * min),
        "short batches: {log:?}"
    );
    for seq in 1..=steps {
        // the batches step `seq` was behind: in flight when it was submitted, or begun while it
        // was submitted and not done (a step found pending holds the next batch back)
        let behind: Vec<_> = log
            .iter()
            .filter(|b| {
                let begun = b.submitted_before >= seq && b.done_before < seq;
                in_flight_at(b, seq) || begun
            })
            .collect();
        assert!(behind.len() <= 1, "step {seq} behind {behind:?}");
    }
    let c = p.counters();
    // every batch a step was submitted during, and no other, is a collision
    let during = batches_a_step_came_during(&log);
    assert!(during > 0, "some steps came during a batch: {log:?}");
    assert_eq!(c.ahead_collisions, during, "{log:?}");
    assert_eq!(c.ahead_asked, 256, "{c:?}");
    assert!(balanced(&c), "{c:?}");
}
