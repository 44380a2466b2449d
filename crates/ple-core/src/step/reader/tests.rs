//! The [`Reader`] driven directly, with no worker thread and no ring: the rows it reads are the
//! generated ones (`synth::expected_row`, a pure function of the row id), in every I/O mode the
//! machine allows, with and without the row cache.

use super::*;
use crate::model::{RowFormat, splitmix64};
use crate::synth;

const SEED: u64 = 11;

fn reader(dir: &std::path::Path, f: impl FnOnce(&mut OpenOptions)) -> Result<Reader> {
    let mut o = OpenOptions {
        num_threads: 2,
        ..OpenOptions::default()
    };
    f(&mut o);
    let table = Table::open(dir, &Default::default())?;
    let mut r = Reader::open(table, &o)?;
    r.open_cache()?;
    r.start_pool()?;
    Ok(r)
}

/// A small generated table of `format` (`ngram_vocab_size_base` 2,000, 4 shards) in a fresh
/// directory.
fn table(format: RowFormat) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    synth::write_table(d.path(), format, &synth::small_config(2000, 4), SEED).unwrap();
    d
}

/// `n` tokens with their stateless contexts, from `seed`.
fn step(seed: u64, n: usize) -> (Vec<i32>, Vec<i32>) {
    let mut x = seed;
    let mut tok = || {
        x = splitmix64(x);
        (x % 248_000) as i32
    };
    let tokens = (0..n).map(|_| tok()).collect();
    let ctx = (0..2 * n).map(|_| tok()).collect();
    (tokens, ctx)
}

/// Reads a step of `n` tokens with `r` and checks its ids (against the per-token hash) and every
/// row (against the generator). Returns the record.
fn read_and_check(r: &Reader, s: &mut ReadScratch, seed: u64, n: usize) -> StepRecord {
    let (tokens, ctx) = step(seed, n);
    let rb = r.table().row_bytes();
    let mut out = vec![0u8; n * 16 * rb];
    let rec = r.read_step(&tokens, &ctx, &mut out, s, &|| false).unwrap();
    let seen = s.ids.clone();
    let mut want = vec![0u64; 16];
    for (i, &t) in tokens.iter().enumerate() {
        r.hasher.ids(t, &ctx[i * 2..(i + 1) * 2], &mut want);
        assert_eq!(&seen[i * 16..(i + 1) * 16], &want[..], "token {i}'s ids");
    }
    let format = r.table().format();
    for (i, &id) in seen.iter().enumerate() {
        assert_eq!(
            &out[i * rb..(i + 1) * rb],
            &synth::expected_row(SEED, format, id)[..],
            "row {id}"
        );
    }
    assert_eq!((rec.tokens, rec.rows), (n as u64, (n * 16) as u64));
    rec
}

#[test]
fn a_reader_without_a_worker_reads_the_generated_rows() {
    for format in [RowFormat::Nvfp4, RowFormat::Fp8] {
        let d = table(format);
        for cache in [0, 64 << 20] {
            let r = reader(d.path(), |o| {
                o.io_mode = IoMode::Mmap;
                o.cache_bytes = cache;
            })
            .unwrap();
            assert_eq!(r.io_info().mode, IoMode::Mmap);
            let mut s = ReadScratch::default();
            for (seed, n) in [(1, 1), (2, 8), (3, 300)] {
                let mut rec = read_and_check(&r, &mut s, seed, n);
                r.finish_step(&mut s, &mut rec, &Stats::default());
            }
            if cache > 0 {
                // the same step again: every row is a hit
                let rec = read_and_check(&r, &mut s, 2, 8);
                assert_eq!((rec.cache_hits, rec.cache_misses), (8 * 16, 0));
            }
        }
        match reader(d.path(), |o| o.io_mode = IoMode::Direct) {
            Ok(r) => {
                let mut s = ReadScratch::default();
                read_and_check(&r, &mut s, 4, 8);
            }
            Err(e) => eprintln!("(no DIRECT reads here: {e})"),
        }
    }
}

#[test]
fn read_step_checks_its_buffer_and_stops_when_cancelled() {
    let d = table(RowFormat::Fp8);
    let r = reader(d.path(), |o| o.io_mode = IoMode::Mmap).unwrap();
    let mut s = ReadScratch::default();
    let (tokens, ctx) = step(5, 2);
    let rb = r.table().row_bytes();
    let mut small = vec![0u8; 2 * 16 * rb - 1];
    let e = r
        .read_step(&tokens, &ctx, &mut small, &mut s, &|| false)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let mut out = vec![0u8; 2 * 16 * rb];
    let e = r
        .read_step(&tokens, &ctx, &mut out, &mut s, &|| true)
        .unwrap_err();
    assert!(e.to_string().contains("closed while the step ran"), "{e}");
}

#[test]
fn big_steps_are_read_alone_only_where_lookups_measured_cheaper_on_the_worker() {
    let d = table(RowFormat::Nvfp4);
    let big = crate::io::mmap::gather::PARALLEL_MIN_ROWS;
    // MMAP gathers big steps on the pool, with or without a cache; small ones on the worker
    for cache in [0, 16 << 20] {
        let r = reader(d.path(), |o| {
            o.io_mode = IoMode::Mmap;
            o.cache_bytes = cache;
        })
        .unwrap();
        assert!(
            r.reads_alone(big - 1) && !r.reads_alone(big),
            "cache {cache}"
        );
    }
    // a one-thread pool splits nothing
    let r = reader(d.path(), |o| {
        o.io_mode = IoMode::Mmap;
        o.num_threads = 1;
    })
    .unwrap();
    assert!(r.reads_alone(big) && r.reads_alone(1 << 20));
    // DIRECT with a cache: the way its lookups measured cheaper (none yet: the pool first)
    let r = match reader(d.path(), |o| {
        o.io_mode = IoMode::Direct;
        o.cache_bytes = 16 << 20;
    }) {
        Ok(r) => r,
        Err(e) => return eprintln!("(no DIRECT reads here: {e})"),
    };
    assert!(!r.reads_alone(big));
    let us = std::time::Duration::from_micros;
    r.placement.record(big, true, us(40));
    r.placement.record(big, false, us(10));
    assert!(r.reads_alone(big) && r.reads_alone(big + 1));
    assert!(!r.reads_alone(8 * big), "another size class, not measured");
    for _ in 0..40 {
        r.placement.record(big, false, us(200));
    }
    assert!(!r.reads_alone(big), "the worker alone grew dearer");
    // DIRECT without a cache: its reads are the direct reader's alone
    let r = reader(d.path(), |o| {
        o.io_mode = IoMode::Direct;
        o.cache_bytes = 0;
    })
    .unwrap();
    assert!(r.reads_alone(big) && r.reads_alone(1 << 20));
}
