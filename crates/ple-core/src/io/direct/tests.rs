//! DirectReader against the file, both backends.
use super::*;

fn file_with(bytes: &[u8]) -> Option<(tempfile::TempDir, PathBuf)> {
    // a directory on the disk, not /tmp (tmpfs refuses direct I/O)
    let d = tempfile::Builder::new()
        .prefix("ple-direct")
        .tempdir_in(std::env::current_dir().ok()?)
        .ok()?;
    let p = d.path().join("rows");
    std::fs::write(&p, bytes).ok()?;
    Some((d, p))
}

#[test]
fn rows_match_the_file_for_both_backends_and_odd_sizes() {
    for rb in [90usize, 160, 320, 7] {
        let rows = 20_011u64; // not a multiple of any block
        let bytes: Vec<u8> = (0..rows as usize * rb)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        let Some((_d, p)) = file_with(&bytes) else {
            return;
        };
        for pread in [false, true] {
            let mut r = match DirectReader::open(&p, rb, pread) {
                Ok(r) => r,
                Err(Error::Unsupported(m)) => {
                    eprintln!("(no direct I/O here: {m})");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            assert_eq!(
                r.backend() == Backend::PreadPool,
                pread || r.backend() != Backend::IoUring
            );
            let mut ids: Vec<u64> = (0..3000u64)
                .map(|i| crate::model::splitmix64(i + rb as u64) % rows)
                .collect();
            ids.extend([0, rows - 1, 45, 46, 45, rows - 1]);
            let mut out = vec![0u8; ids.len() * rb];
            let rep = r.read_rows(&ids, &mut out).unwrap();
            for (i, &id) in ids.iter().enumerate() {
                let s = id as usize * rb;
                assert_eq!(
                    &out[i * rb..(i + 1) * rb],
                    &bytes[s..s + rb],
                    "rb {rb} row {id}"
                );
            }
            assert!(rep.reads >= 1 && rep.bytes % r.align() == 0);
        }
    }
}

#[test]
fn merged_reads_cover_exact_blocks() {
    let rb = 90usize;
    let bytes = vec![7u8; 100_000 * rb];
    let Some((_d, p)) = file_with(&bytes) else {
        return;
    };
    let Ok(mut r) = DirectReader::open(&p, rb, false) else {
        return;
    };
    let a = r.align();
    // one row inside a block, one straddling two: 1 + 2 blocks, merged if adjacent
    let inside = (0..100_000u64)
        .find(|&x| (x * 90) / a == (x * 90 + 89) / a && x * 90 > 10 * a)
        .unwrap();
    let straddle = (50_000..100_000u64)
        .find(|&x| (x * 90) / a != (x * 90 + 89) / a)
        .unwrap();
    let mut out = vec![0u8; 2 * rb];
    let rep = r.read_rows(&[inside, straddle], &mut out).unwrap();
    assert_eq!((rep.reads, rep.bytes), (2, 3 * a));
    // adjacent rows merge into one read
    let rep = r
        .read_rows(&[1000, 1001, 1002], &mut out.repeat(2))
        .unwrap();
    assert_eq!(rep.reads, 1);
}

#[test]
fn truncated_file_fails_the_read_and_the_reader_lives() {
    let rb = 90usize;
    let rows = 50_000u64;
    let bytes: Vec<u8> = (0..rows as usize * rb).map(|i| i as u8).collect();
    let Some((_d, p)) = file_with(&bytes) else {
        return;
    };
    for pread in [false, true] {
        std::fs::write(&p, &bytes).unwrap();
        let Ok(mut r) = DirectReader::open(&p, rb, pread) else {
            return;
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(1000 * rb as u64)
            .unwrap();
        let mut out = vec![0u8; 2 * rb];
        let e = r.read_rows(&[10, rows - 1], &mut out).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, Error::Io { .. }), "{m}");
        assert!(
            m.contains(&format!("row {}", rows - 1)) && m.contains("offset"),
            "{m}"
        );
        // rows that still exist read fine
        r.read_rows(&[10, 999], &mut out).unwrap();
        assert_eq!(&out[..rb], &bytes[10 * rb..11 * rb]);
        assert_eq!(&out[rb..], &bytes[999 * rb..1000 * rb]);
    }
}

#[test]
fn tmpfs_is_unsupported() {
    let Ok(d) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let p = d.path().join("rows");
    std::fs::write(&p, vec![0u8; 8192]).unwrap();
    match DirectReader::open(&p, 90, false) {
        Err(Error::Unsupported(m)) => assert!(m.contains("direct I/O"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("DIRECT on tmpfs must be unsupported"),
    }
}
