//! The MMAP residency cap (`resident_bytes_max`) through the pipeline: with the cap far below the
//! table, random steps still give the generated rows, the table's page-cache residency (measured
//! with `mincore`, independently of the cap's own bookkeeping) stays within the cap plus one
//! step's chunks, and the dropped bytes are counted.

use super::*;
use crate::io::mmap::residency::CHUNK_BYTES;

#[test]
fn residency_stays_within_the_cap_and_rows_stay_right() {
    let format = RowFormat::Nvfp4;
    // about 100 MB of rows
    let d = make_table(format, 70_000);
    let rows = d.path().join("table.rows");
    let table_bytes = std::fs::metadata(&rows).unwrap().len();
    // written back, as a packed table is (`ple pack` syncs): dirty pages cannot be dropped
    std::fs::File::open(&rows).unwrap().sync_all().unwrap();
    assert!(table_bytes > 5 * CHUNK_BYTES as u64, "{table_bytes}");
    let cap = 2 * CHUNK_BYTES as u64;
    let p = open(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 0;
        o.prefetch_policy = PrefetchPolicy::Never;
        o.resident_bytes_max = cap;
    });
    let mut rng = Rng(7);
    let mut peak = 0u64;
    for seq in 1..=40u64 {
        let b = random_batch(&mut rng, 2, 2);
        let ids = ids_of(&p, &b);
        p.submit(&b.view(), seq).unwrap();
        p.wait(seq, 0).unwrap();
        check_rows(&p, seq, &ids, format);
        p.release_step(seq).unwrap();
        // the cap trims after publishing: the counters wait for the step's accounting
        let s = p.stats();
        peak = peak.max(s.resident_pages * 4096);
        let rb = format.row_bytes(160) as u64;
        let distinct: std::collections::BTreeSet<u64> = ids
            .iter()
            .flat_map(|&r| [r as u64 * rb / 4096, (r as u64 * rb + rb - 1) / 4096])
            .collect();
        let bound = cap + distinct.len() as u64 * 4096;
        assert!(
            s.resident_pages * 4096 <= bound,
            "step {seq}: {} bytes resident, cap {cap}, bound {bound}",
            s.resident_pages * 4096
        );
    }
    let c = p.counters();
    assert!(c.resident_dropped_bytes > 0, "nothing was dropped");
    eprintln!(
        "residency cap {cap}: peak {peak} of {table_bytes} bytes, {} dropped",
        c.resident_dropped_bytes
    );
}

/// The trims run on the `ple-trim` thread, never on the worker (the step after an over-cap step
/// includes no trim), and under a stream of steps the table's residency (`mincore`, not the
/// cap's bookkeeping) stays within the cap plus its margin; the close joins the thread within
/// the close bound.
#[test]
fn trims_run_off_the_worker_and_residency_stays_within_the_margin() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 70_000);
    let rows = d.path().join("table.rows");
    std::fs::File::open(&rows).unwrap().sync_all().unwrap();
    let cap = 16 * CHUNK_BYTES as u64;
    let p = open(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.cache_bytes = 0;
        o.prefetch_policy = PrefetchPolicy::Never;
        o.resident_bytes_max = cap;
    });
    let margin_pages = (cap / 4096) as f64 * crate::io::mmap::residency::MARGIN;
    let bound = cap + margin_pages as u64 * 4096;
    let mut rng = Rng(11);
    let mut peak = 0u64;
    for seq in 1..=150u64 {
        let b = random_batch(&mut rng, 2, 2);
        let ids = ids_of(&p, &b);
        p.submit(&b.view(), seq).unwrap();
        p.wait(seq, 0).unwrap();
        check_rows(&p, seq, &ids, format);
        p.release_step(seq).unwrap();
        let s = p.stats();
        peak = peak.max(s.resident_pages * 4096);
        assert!(
            s.resident_pages * 4096 <= bound,
            "step {seq}: {} bytes resident, cap {cap}, bound {bound}",
            s.resident_pages * 4096
        );
    }
    // a pass may still commit: read the counter between two equal totals of the cap
    let (t, c) = loop {
        let t = p.sh.reader.trim_counts().unwrap();
        let c = p.counters();
        if p.sh.reader.trim_counts().unwrap().dropped_bytes == t.dropped_bytes {
            break (t, c);
        }
    };
    eprintln!(
        "cap {cap}: peak {peak}, {} dropped, {t:?}",
        c.resident_dropped_bytes
    );
    assert_eq!(t.reader_trims, 0, "a trim ran on the worker: {t:?}");
    // the table (resident at open) is trimmed once, then the steps' pages: more passes follow
    assert!(t.thread_passes >= 2, "{t:?}");
    assert!(c.resident_dropped_bytes > 0);
    // the counter and the cap's own total add the same commits
    assert_eq!(c.resident_dropped_bytes, t.dropped_bytes);
    let t0 = std::time::Instant::now();
    drop(p);
    let took = t0.elapsed();
    assert!(
        took < std::time::Duration::from_millis(100),
        "close took {took:?}"
    );
}
