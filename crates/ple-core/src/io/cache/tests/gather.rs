//! The gather and the read-through against the plain gather and a single thread.

use super::*;

#[test]
fn gather_cached_equals_the_plain_gather_and_counts_every_row() {
    let rb = 90usize;
    let rows = 5000usize;
    let src: Vec<u8> = (0..rows as u64).flat_map(|i| row_of(i, rb)).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for cap in [4usize, 700] {
        let c = cache_of(cap, rb, Policy::S3Fifo);
        let mut r = 3u64;
        let mut total = 0u64;
        for step in 0..40 {
            let n = if step % 5 == 0 { 3000 } else { 64 };
            let ids: Vec<u64> = (0..n).map(|_| skewed(&mut r, rows as u64)).collect();
            let mut out = vec![0u8; n * rb];
            let g = gather_cached(&c, &src, &ids, &mut out, Some(&pool)).unwrap();
            let mut want = vec![0u8; n * rb];
            crate::io::mmap::gather::gather(&src, rb, &ids, &mut want, None).unwrap();
            assert!(
                out == want,
                "cap {cap} step {step}: rows differ from the table's"
            );
            assert_eq!(g.hits + g.misses, n as u64);
            total += n as u64;
        }
        let k = c.counters();
        assert_eq!(k.hits + k.misses, total);
    }
    let c = cache_of(4, rb, Policy::S3Fifo);
    let mut out = vec![0u8; 2 * rb];
    let e = gather_cached(&c, &src, &[1, rows as u64], &mut out, None).unwrap_err();
    assert!(e.to_string().contains("outside"), "{e}");
}

#[test]
fn read_through_on_a_pool_reads_the_same_misses_as_on_one_thread() {
    // two caches fed the same steps, one looking up on a pool (big steps run in chunks), one on
    // the calling thread: the same rows (the table's), the same misses in the same order
    let rb = 90usize;
    let rows = 5000u64;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for cap in [4usize, 700] {
        let (a, b) = (
            cache_of(cap, rb, Policy::S3Fifo),
            cache_of(cap, rb, Policy::S3Fifo),
        );
        let (mut sa, mut sb) = (ReadThroughScratch::default(), ReadThroughScratch::default());
        let mut r = 5u64;
        for step in 0..30 {
            let n = if step % 3 == 0 { 3000 } else { 64 };
            let ids: Vec<u64> = (0..n).map(|_| skewed(&mut r, rows)).collect();
            let run = |c: &RowCache, s: &mut ReadThroughScratch, pool| {
                let mut out = vec![0u8; n * rb];
                let (misses, hits) = read_through(c, &ids, &mut out, s, pool, |m, o| {
                    for (o, &id) in o.chunks_exact_mut(rb).zip(m) {
                        o.copy_from_slice(&row_of(id, rb));
                    }
                    Ok(m.to_vec())
                })
                .unwrap();
                let misses = misses.unwrap_or_default();
                assert_eq!(hits + misses.len() as u64, n as u64);
                (out, misses)
            };
            let (oa, ma) = run(&a, &mut sa, Lookups::Pool(&pool));
            let (ob, mb) = run(&b, &mut sb, Lookups::Here);
            let want: Vec<u8> = ids.iter().flat_map(|&id| row_of(id, rb)).collect();
            assert!(
                oa == want && ob == want,
                "cap {cap} step {step}: not the table's rows"
            );
            assert_eq!(ma, mb, "cap {cap} step {step}: the misses differ");
        }
    }
}

#[test]
fn measured_lookups_try_both_ways_and_read_the_same_rows() {
    // big steps through a cache whose lookups go where `Placement` measured them cheaper: both
    // ways get measured, and every step's rows are the table's with the same misses as lookups
    // on one thread
    let (rb, rows) = (90usize, 5000u64);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let pl = Placement::default();
    let (a, b) = (
        cache_of(700, rb, Policy::S3Fifo),
        cache_of(700, rb, Policy::S3Fifo),
    );
    let (mut sa, mut sb) = (ReadThroughScratch::default(), ReadThroughScratch::default());
    let mut r = 9u64;
    for step in 0..12 {
        let n = 2048;
        let ids: Vec<u64> = (0..n).map(|_| skewed(&mut r, rows)).collect();
        let want: Vec<u8> = ids.iter().flat_map(|&id| row_of(id, rb)).collect();
        let mut misses = Vec::new();
        for (c, s, on) in [
            (&a, &mut sa, Lookups::Measured(&pool, &pl)),
            (&b, &mut sb, Lookups::Here),
        ] {
            let mut out = vec![0u8; n * rb];
            let (m, _) = read_through(c, &ids, &mut out, s, on, |m, o| {
                for (o, &id) in o.chunks_exact_mut(rb).zip(m) {
                    o.copy_from_slice(&row_of(id, rb));
                }
                Ok(m.to_vec())
            })
            .unwrap();
            assert!(out == want, "step {step}: not the table's rows");
            misses.push(m.unwrap_or_default());
        }
        assert_eq!(misses[0], misses[1], "step {step}: the misses differ");
    }
    let (here, pooled) = pl.figures(2048);
    assert!(
        here > 0 && pooled > 0,
        "both ways measured: {here} {pooled}"
    );
}
