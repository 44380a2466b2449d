//! Tests of the SIGBUS guard: a fault inside a truncated mapping is an error (on the plain copy
//! and on the row cache's miss path), the handler stays installed, and a row read after the file
//! is whole again is the file's (nothing poisoned).

use super::*;
use crate::io::cache::{Policy, RowCache, gather_cached};
use std::io::Write;
use std::os::unix::fs::FileExt;

const RB: usize = 90;
const PAGE: usize = 4096;
/// Rows of a file four pages long.
const ROWS: usize = 4 * PAGE / RB;

fn row_of(id: u64) -> Vec<u8> {
    (0..RB)
        .map(|i| (id as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

fn contents() -> Vec<u8> {
    let mut v: Vec<u8> = (0..ROWS as u64).flat_map(row_of).collect();
    v.resize(4 * PAGE, 0);
    v
}

/// A file of four pages of rows, mapped.
fn mapped() -> (tempfile::NamedTempFile, memmap2::Mmap) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&contents()).unwrap();
    f.flush().unwrap();
    // SAFETY: the test owns the file; the mapping is read only through guarded copies once the
    // file is truncated.
    let map = unsafe { memmap2::Mmap::map(f.as_file()).unwrap() };
    (f, map)
}

/// A row wholly in the last page (gone once the file is cut to one page).
const LATE: u64 = (3 * PAGE / RB + 1) as u64;

#[test]
fn a_fault_in_a_truncated_mapping_is_an_error_and_the_handler_stays() {
    let (f, map) = mapped();
    f.as_file().set_len(PAGE as u64).unwrap();
    let mut out = vec![0u8; RB];
    let e = copy_rows(&map, RB, &[LATE], &mut out).unwrap_err();
    assert!(e.to_string().contains(&format!("row {LATE}")), "{e}");
    assert!(
        in_place(),
        "libple's SIGBUS handler is the process's after a fault"
    );
    copy_rows(&map, RB, &[1], &mut out).unwrap();
    assert_eq!(out, row_of(1));
}

#[test]
fn a_cache_miss_from_a_truncated_mapping_is_an_error_and_poisons_nothing() {
    let (f, map) = mapped();
    let cache = RowCache::with_policy(1 << 20, RB, Policy::S3Fifo).unwrap();
    let ids = [1u64, LATE, 2];
    let mut out = vec![0u8; ids.len() * RB];
    f.as_file().set_len(PAGE as u64).unwrap();
    let e = gather_cached(&cache, &map, &ids, &mut out, None).unwrap_err();
    assert!(
        e.to_string().contains("SIGBUS") || e.to_string().contains("mapped"),
        "{e}"
    );
    // the file whole again: every row is the file's, none a cached copy of a faulted read
    f.as_file().write_all_at(&contents(), 0).unwrap();
    let mut out = vec![0u8; ids.len() * RB];
    gather_cached(&cache, &map, &ids, &mut out, None).unwrap();
    let want: Vec<u8> = ids.iter().flat_map(|&i| row_of(i)).collect();
    assert_eq!(out, want);
    // and again, from the cache
    let g = gather_cached(&cache, &map, &ids, &mut out, None).unwrap();
    assert_eq!(g.hits, ids.len() as u64);
    assert_eq!(out, want);
}

#[test]
fn a_big_pooled_cached_gather_over_a_truncated_mapping_is_an_error() {
    let (f, map) = mapped();
    let cache = RowCache::with_policy(1 << 20, RB, Policy::Sieve).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let ids: Vec<u64> = (0..20_000u64).map(|i| i % ROWS as u64).collect();
    let mut out = vec![0u8; ids.len() * RB];
    f.as_file().set_len(PAGE as u64).unwrap();
    assert!(gather_cached(&cache, &map, &ids, &mut out, Some(&pool)).is_err());
    assert!(in_place());
}

#[test]
fn a_table_row_the_file_lost_is_an_error_not_a_crash() {
    // Table::row is the public way to read one row: through the guard (it was a plain slice of
    // the mapping, which a truncated file turned into a SIGBUS in the reading thread)
    use crate::format::table::{Table, TableOpenOptions};
    use crate::model::RowFormat;
    use crate::testkit::synth::{expected_row, small_config, write_table};
    let d = tempfile::tempdir().unwrap();
    let meta = write_table(d.path(), RowFormat::Nvfp4, &small_config(1000, 4), 3).unwrap();
    let t = Table::open(d.path(), &TableOpenOptions::default()).unwrap();
    let last = meta.total_rows - 1;
    assert_eq!(
        t.row(last).unwrap(),
        expected_row(3, RowFormat::Nvfp4, last)
    );
    let rows = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join(crate::format::table::ROWS_FILE))
        .unwrap();
    rows.set_len(PAGE as u64).unwrap();
    let e = t.row(last).unwrap_err();
    assert!(e.to_string().contains(&format!("row {last}")), "{e}");
    assert_eq!(t.row(0).unwrap(), expected_row(3, RowFormat::Nvfp4, 0));
}
