//! The I/O modes through the whole pipeline: DIRECT (io_uring and the pread pool) and MMAP give
//! the generated rows (`synth::expected_row`, a pure function of the row id); storage failures
//! fail only the steps they touch.

use crate::error::Error;
use crate::io::direct::Backend;
use crate::model::{RowFormat, splitmix64};
use crate::step::{IoMode, OpenOptions, Pipeline};
use crate::synth;
use crate::testkit::step::Step;
use std::path::Path;

const SEED: u64 = 7;

fn table_in(dir: &Path, format: RowFormat) {
    synth::write_table(dir, format, &synth::small_config(2000, 4), SEED).unwrap();
}

/// A temporary directory holding a table ([`table_in`]).
fn temp_table(format: RowFormat) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    table_in(d.path(), format);
    d
}

fn open(dir: &Path, mode: IoMode, force_pread: bool) -> crate::error::Result<Pipeline> {
    open_with(dir, |o| {
        o.io_mode = mode;
        o.force_pread = force_pread;
    })
}

fn open_with(dir: &Path, f: impl FnOnce(&mut OpenOptions)) -> crate::error::Result<Pipeline> {
    let mut o = OpenOptions {
        max_tokens_per_step: 256,
        num_threads: 2,
        wait_timeout_us: 20_000_000,
        ..OpenOptions::default()
    };
    f(&mut o);
    Pipeline::open(dir, o)
}

fn row_ids(p: &Pipeline, st: &Step) -> Vec<u64> {
    let mut ids = vec![0i64; st.tokens.len() * 16];
    p.ngram_ids(&st.batch(), &mut ids).unwrap();
    ids.into_iter().map(|i| i as u64).collect()
}

/// Submits `st` as `seq`; on success checks every row against the generator.
fn step(p: &Pipeline, seq: u64, st: &Step, format: RowFormat) -> crate::error::Result<()> {
    p.submit(&st.batch(), seq).unwrap();
    let r = p.wait(seq, 0);
    if r.is_ok() {
        let ids = row_ids(p, st);
        let rb = format.row_bytes(160);
        let (ptr, n) = p.packed_rows(seq).unwrap();
        assert_eq!(n as usize * 16, ids.len());
        // SAFETY: a Ready step's staging holds `n * 16` rows until it is released below.
        let rows = unsafe { std::slice::from_raw_parts(ptr, ids.len() * rb) };
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(
                &rows[i * rb..(i + 1) * rb],
                &synth::expected_row(SEED, format, id)[..],
                "step {seq} row {id}"
            );
        }
    }
    p.release_step(seq).unwrap();
    r
}

#[test]
fn direct_and_mmap_give_the_generated_rows() {
    for format in [RowFormat::Nvfp4, RowFormat::Fp8, RowFormat::Bf16] {
        let d = temp_table(format);
        let mmap = open(d.path(), IoMode::Mmap, false).unwrap();
        assert_eq!(mmap.io_info().mode, IoMode::Mmap);
        let direct = match open(d.path(), IoMode::Direct, false) {
            Ok(p) => p,
            Err(Error::Unsupported(m)) => {
                eprintln!("(no direct I/O on the temp dir: {m})");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let pread = open(d.path(), IoMode::Direct, true).unwrap();
        assert_eq!(pread.io_info().backend, Some(Backend::PreadPool));
        assert_eq!(direct.io_info().mode, IoMode::Direct);
        for (k, n) in [1usize, 8, 64, 256, 3, 17].into_iter().enumerate() {
            let st = Step::new(k as u64 * 31 + 1, n);
            for p in [&mmap, &direct, &pread] {
                step(p, k as u64 + 1, &st, format).unwrap();
            }
        }
        let c = direct.counters();
        assert!(c.storage_reads > 0, "{c:?}");
        // every read is whole aligned blocks, and no more than two blocks per row
        let a = 512;
        assert_eq!(c.storage_read_bytes % a, 0);
        let rows = c.decode_rows + c.prefill_rows;
        assert!(c.storage_read_bytes <= rows * 2 * 4096, "{c:?}");
    }
}

#[test]
fn truncated_row_file_fails_only_the_steps_it_touches() {
    let format = RowFormat::Nvfp4;
    for (mode, pread) in [
        (IoMode::Mmap, false),
        (IoMode::Direct, false),
        (IoMode::Direct, true),
    ] {
        let d = temp_table(format);
        let p = match open(d.path(), mode, pread) {
            Ok(p) => p,
            Err(Error::Unsupported(_)) => return,
            Err(e) => panic!("{e}"),
        };
        truncate_and_check(&p, d.path(), format, 0);
    }
}

/// Cuts the row file under `p` into its last head's rows: single-token steps that read past the
/// cut fail with `Error::Io` naming the row, the others give the generated rows (steps from
/// `seq0 + 1`).
fn truncate_and_check(p: &Pipeline, dir: &Path, format: RowFormat, seq0: u64) {
    {
        let rows_path = dir.join(crate::format::table::ROWS_FILE);
        let len = std::fs::metadata(&rows_path).unwrap().len();
        // (each head's rows are a region of the file: cut into the last head's, so that some
        // single-token steps read past the end and others do not)
        let cut = len - len / 100;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&rows_path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let (mut failed, mut ok) = (0, 0);
        for k in 0..300u64 {
            let st = Step::new(k + 1000, 1);
            let past = row_ids(p, &st).iter().any(|&r| (r + 1) * 90 > cut);
            match step(p, seq0 + k + 1, &st, format) {
                Ok(()) => {
                    assert!(!past, "step {k} read rows past the cut and succeeded");
                    ok += 1;
                }
                Err(e) => {
                    assert!(past, "step {k} failed without touching the cut: {e}");
                    let m = e.to_string();
                    assert!(matches!(e, Error::Io { .. }), "{m}");
                    assert!(m.contains("row ") && m.contains("offset"), "{m}");
                    failed += 1;
                }
            }
            if ok > 3 && failed > 3 {
                break;
            }
        }
        assert!(ok > 3 && failed > 3, "ok {ok} failed {failed}");
    }
}

/// Drops the table's pages from the page cache (its mapping's page-table entries first: mapped
/// pages stay cached), so the next steps are cold.
fn evict_all(p: &Pipeline) {
    use std::os::fd::AsRawFd;
    let map = p.table().bytes();
    // (written just now: its pages are dirty until synced, and DONTNEED drops only clean ones)
    p.table().file().sync_all().unwrap();
    // the whole file: a page cache of large folios drops nothing for a 4 KiB range
    // SAFETY: the whole mapping (its start is page-aligned, the kernel rounds the length);
    // MADV_DONTNEED on a read-only file mapping only drops page-table entries (the next access
    // reads the file again), and no step is in flight.
    unsafe {
        libc::madvise(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            libc::MADV_DONTNEED,
        )
    };
    crate::sys::fadvise(
        p.table().file().as_raw_fd(),
        0,
        0,
        libc::POSIX_FADV_DONTNEED,
    )
    .unwrap();
}

/// MMAP steps that prefetch (policy ALWAYS), cold (the page cache dropped before each) and warm,
/// each way of reading cold rows: sectors read directly then pages advised, buffered io_uring
/// reads, WILLNEED and the gather (and bigger steps, always WILLNEED). All give the generated
/// rows; a warm step reads nothing; a truncated file fails only the steps past the cut.
#[test]
fn mmap_prefetching_steps_give_the_generated_rows_every_way() {
    use crate::step::ColdReads;
    let format = RowFormat::Nvfp4;
    for cold in [ColdReads::Direct, ColdReads::Buffered, ColdReads::Willneed] {
        let d = temp_table(format);
        let p = open_with(d.path(), |o| {
            o.io_mode = IoMode::Mmap;
            o.prefetch_policy = crate::step::PrefetchPolicy::Always;
            o.cold_reads = cold;
        })
        .unwrap();
        let shapes = [1usize, 8, 64, 256, 3];
        for (k, n) in shapes.into_iter().enumerate() {
            evict_all(&p);
            step(&p, k as u64 + 1, &Step::new(k as u64 * 13 + 2, n), format).unwrap();
        }
        let c = p.counters();
        assert_eq!(c.prefetch_steps, 5, "{c:?}");
        if cold == ColdReads::Direct {
            // sector reads of every row (no more than two blocks each)
            let rows = c.decode_rows + c.prefill_rows;
            assert!(
                c.storage_reads >= 5 && c.storage_read_bytes >= rows * 512 / 2,
                "{c:?}"
            );
        }
        // the same steps once more (the evictions above dropped the earlier steps' advised
        // pages), then, once the worker was idle (their pages advised and read), again: ALWAYS
        // advises and gathers from memory, reading nothing
        for (k, n) in shapes.into_iter().enumerate() {
            step(&p, 10 + k as u64, &Step::new(k as u64 * 13 + 2, n), format).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let c0 = p.counters();
        for (k, n) in shapes.into_iter().enumerate() {
            step(&p, 20 + k as u64, &Step::new(k as u64 * 13 + 2, n), format).unwrap();
        }
        let c1 = p.counters();
        assert_eq!(c1.prefetch_steps - c0.prefetch_steps, 5, "{c1:?}");
        assert_eq!(
            c1.storage_read_bytes, c0.storage_read_bytes,
            "warm steps read storage"
        );
        truncate_and_check(&p, d.path(), format, 30);
    }
}

#[test]
fn direct_on_tmpfs_is_unsupported_and_auto_falls_back() {
    let Ok(d) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    table_in(d.path(), RowFormat::Nvfp4);
    match open(d.path(), IoMode::Direct, false) {
        Err(Error::Unsupported(m)) => assert!(m.contains("tmpfs") || m.contains("O_DIRECT"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("DIRECT on tmpfs opened"),
    }
    let p = open(d.path(), IoMode::Auto, false).unwrap();
    assert_eq!(p.io_info().mode, IoMode::Mmap);
    step(&p, 1, &Step::new(5, 8), RowFormat::Nvfp4).unwrap();
}

/// DIRECT with a row cache in front (a few rows: heavy eviction; and a roomy one: hits) gives the
/// generated rows; hits + misses = rows, and only misses are read from storage.
#[test]
fn direct_through_the_row_cache_gives_the_generated_rows() {
    let format = RowFormat::Nvfp4;
    let d = tempfile::tempdir().unwrap();
    table_in(d.path(), format);
    for cache_bytes in [1024u64, 8 << 20] {
        // 1 KiB: a few rows (heavy eviction); 8 MiB: every row of the steps
        let p = match Pipeline::open(
            d.path(),
            OpenOptions {
                max_tokens_per_step: 256,
                num_threads: 2,
                wait_timeout_us: 20_000_000,
                io_mode: IoMode::Direct,
                cache_bytes,
                ..OpenOptions::default()
            },
        ) {
            Ok(p) => p,
            Err(Error::Unsupported(m)) => {
                eprintln!("(no direct I/O on the temp dir: {m})");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut seq = 0;
        // the same steps three times: the roomy cache serves the second and third
        for _round in 0..3 {
            for (k, n) in [1usize, 8, 64, 256, 3].into_iter().enumerate() {
                seq += 1;
                let st = Step::new(k as u64 * 7 + 1, n);
                step(&p, seq, &st, format).unwrap();
            }
        }
        let c = p.counters();
        let rows = c.decode_rows + c.prefill_rows;
        assert_eq!(c.cache_hits + c.cache_misses, rows, "{c:?}");
        if cache_bytes > 1 << 20 {
            assert!(
                c.cache_hits * 3 >= rows,
                "rounds 2 and 3 come from the cache: {c:?}"
            );
        }
        assert!(c.storage_read_bytes <= c.cache_misses * 2 * 4096, "{c:?}");
    }
}

/// MMAP with direct reads of cold rows: a cold step's rows come from the sectors, and once the
/// worker is idle their pages are advised, so the page cache holds them afterwards (as a
/// faulting gather would have left it).
#[test]
fn direct_cold_reads_warm_the_page_cache_afterwards() {
    let format = RowFormat::Nvfp4;
    let d = tempfile::tempdir().unwrap();
    table_in(d.path(), format);
    let p = open_with(d.path(), |o| o.io_mode = IoMode::Mmap).unwrap();
    let map = p.table().bytes();
    let st = Step::new(99, 8);
    let ids = row_ids(&p, &st);
    let pages_of = |ids: &[u64]| -> Vec<u64> {
        let mut v: Vec<u64> = ids
            .iter()
            .flat_map(|&r| [r * 90 / 4096, (r * 90 + 89) / 4096])
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let pages = pages_of(&ids);
    evict_all(&p);
    let resident = || {
        pages
            .iter()
            .filter(|&&pg| crate::sys::page_resident(map, (pg * 4096) as usize))
            .count()
    };
    if resident() > pages.len() / 2 {
        eprintln!(
            "(the page cache kept {} of {} pages: nothing to observe here)",
            resident(),
            pages.len()
        );
        return;
    }
    let c0 = p.counters();
    step(&p, 1, &st, format).unwrap();
    let c1 = p.counters();
    if c1.storage_read_bytes == c0.storage_read_bytes {
        eprintln!("(no direct cold reads here: O_DIRECT or io_uring refused)");
        return;
    }
    // the advice runs when the worker's spin for a next step ends (tens of µs), then the reads
    let t = std::time::Instant::now();
    while resident() < pages.len() && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(
        resident(),
        pages.len(),
        "the step's pages were advised and read"
    );
    let c2 = p.counters();
    assert!(c2.pages_prefetched >= pages.len() as u64, "{c2:?}");
}

// Read-ahead (`ahead.rs`).
mod ahead;
