//! Every backend against the file's own bytes, and the cache wrapper against its source.

use super::*;
use crate::io::cache::{Lookups, ReadThroughScratch, RowCache};

const RB: usize = 160;
const ROWS: u64 = 5_000;

fn row_byte(r: u64, j: usize) -> u8 {
    (r as usize * 7 + j * 13 % 251) as u8
}

/// A row file of `ROWS` rows on the disk (not /tmp: tmpfs refuses direct I/O).
fn row_file() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let d = tempfile::Builder::new()
        .prefix("ple-source")
        .tempdir_in(std::env::current_dir().ok()?)
        .ok()?;
    let p = d.path().join("rows");
    let bytes: Vec<u8> = (0..ROWS)
        .flat_map(|r| (0..RB).map(move |j| row_byte(r, j)))
        .collect();
    std::fs::write(&p, bytes).ok()?;
    Some((d, p))
}

fn expected(ids: &[u64]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&r| (0..RB).map(move |j| row_byte(r, j)))
        .collect()
}

fn ids() -> Vec<u64> {
    (0..300u64).map(|i| i * 4_999 % ROWS).collect()
}

/// Every backend this machine allows, behind the trait.
fn sources(p: &std::path::Path) -> Vec<Box<dyn RowSource>> {
    let mut v: Vec<Box<dyn RowSource>> = vec![Box::new(PreadRows::open(p, RB).expect("open"))];
    if let Some(b) = crate::io::mmap::buffered::BufferedReader::open(p, RB) {
        v.push(Box::new(b));
    }
    for pread in [false, true] {
        if let Ok(d) = crate::io::direct::DirectReader::open(p, RB, pread) {
            v.push(Box::new(d));
        }
    }
    v
}

#[test]
fn every_backend_reads_the_rows_of_the_file() {
    let Some((_d, p)) = row_file() else { return };
    let ids = ids();
    for mut s in sources(&p) {
        let mut out = vec![0u8; ids.len() * RB];
        let r = s.read(&ids, &mut out).expect("read");
        assert!(out == expected(&ids), "{}", s.name());
        assert!(r.reads >= 1 && r.bytes >= RB as u64, "{}: {r:?}", s.name());
        assert_eq!(r.hits, 0);
        // a row past the end fails with an error naming it, and the source reads on
        let mut one = vec![0u8; RB];
        let e = s.read(&[ROWS + 10], &mut one).expect_err("past the end");
        assert!(
            e.to_string().contains(&(ROWS + 10).to_string()) || s.name() != "pread",
            "{e}"
        );
        s.read(&ids[..1], &mut one).expect("reads after an error");
        assert!(one == expected(&ids[..1]), "{}", s.name());
    }
}

#[test]
fn the_cache_in_front_reads_only_its_misses() {
    let Some((_d, p)) = row_file() else { return };
    let ids = ids();
    for mut s in sources(&p) {
        let cache = RowCache::new(16 << 20, RB).expect("cache");
        let mut scratch = ReadThroughScratch::default();
        let mut out = vec![0u8; ids.len() * RB];
        let mut c = Cached::new(&cache, &mut s, &mut scratch, Lookups::Here);
        let first = c.read(&ids, &mut out).expect("read");
        assert!(out == expected(&ids), "{}", c.name());
        assert_eq!(first.hits, 0);
        out.fill(0);
        let again = c.read(&ids, &mut out).expect("read");
        assert!(out == expected(&ids), "cached rows, {}", c.name());
        assert_eq!(again.hits, ids.len() as u64);
        assert_eq!((again.reads, again.bytes), (0, 0), "nothing read");
        // half new rows: only those reach the source
        let mixed: Vec<u64> = ids[..100]
            .iter()
            .copied()
            .chain((0..100u64).map(|i| (i * 31 + 7) % ROWS))
            .filter(|r| !ids[100..].contains(r))
            .collect();
        let fresh = mixed[100..].iter().filter(|r| !ids.contains(r)).count() as u64;
        let mut out = vec![0u8; mixed.len() * RB];
        let r = c.read(&mixed, &mut out).expect("read");
        assert!(out == expected(&mixed));
        assert_eq!(r.hits, mixed.len() as u64 - fresh);
    }
}

#[test]
fn a_hint_brings_the_rows_pages_into_the_page_cache() {
    let Some((_d, p)) = row_file() else { return };
    let f = std::fs::File::open(&p).expect("open");
    f.sync_all().expect("fsync");
    // SAFETY: the file is not changed while mapped (this test owns it).
    let map = unsafe { memmap2::Mmap::map(&f) }.expect("map");
    use std::os::fd::AsRawFd;
    let ps = crate::sys::os_page_size();
    let ids = [7u64, 8, 3_000, 4_999];
    let page_of = |r: u64| (r as usize * RB) / ps * ps;
    let resident = |r: u64| crate::sys::any_resident(&map[page_of(r)..page_of(r) + 1]);
    let mut backends: Vec<Box<dyn RowSource>> = vec![Box::new(PreadRows::open(&p, RB).unwrap())];
    if let Some(b) = crate::io::mmap::buffered::BufferedReader::open(&p, RB) {
        backends.push(Box::new(b));
    }
    for mut s in backends {
        crate::sys::drop_cached(&map, f.as_raw_fd(), 0, map.len()).expect("drop");
        if ids.iter().any(|&r| resident(r)) {
            eprintln!("(the page cache keeps the file's pages here: hint not checked)");
            return;
        }
        s.hint(&ids).expect("hint");
        let t0 = std::time::Instant::now();
        while !ids.iter().all(|&r| resident(r)) && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(
            ids.iter().all(|&r| resident(r)),
            "{}: hinted pages cached",
            s.name()
        );
        // and only those: a page no hinted row touches stays out
        assert!(!resident(1_500), "{}", s.name());
    }
}
