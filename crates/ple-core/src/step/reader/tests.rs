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
    r.open_cache(&o)?;
    r.start_pool()?;
    Ok(r)
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
        let d = tempfile::tempdir().unwrap();
        synth::write_table(d.path(), format, &synth::small_config(2000, 4), SEED).unwrap();
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
    let d = tempfile::tempdir().unwrap();
    synth::write_table(
        d.path(),
        RowFormat::Fp8,
        &synth::small_config(2000, 4),
        SEED,
    )
    .unwrap();
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
