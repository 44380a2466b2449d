//! `ple_options.cache_bytes` end to end through the C API: steps gathered through the row cache
//! (a few rows: heavy eviction; and a larger one) give exactly the rows and dequantised output of
//! a handle without a cache, several steps in flight; the counters add up; bad sizes are errors.

mod common;

use common::*;
use ple::*;
use std::ffi::CString;

fn open(dir: &CString, cache_bytes: u64) -> Result<Handle, (ple_status, String)> {
    let o = options(|o| {
        assert_eq!(o.cache_bytes, PLE_CACHE_AUTO, "AUTO by default");
        o.max_tokens_per_step = 512;
        o.max_in_flight = 4;
        o.num_threads = 2;
        o.cache_bytes = cache_bytes;
    });
    try_open(dir, &o)
}

#[test]
fn rows_through_the_cache_equal_rows_without_it() {
    let d = tempfile::tempdir().unwrap();
    let meta = ple_testkit::synth::write_table(
        d.path(),
        ple_core::model::RowFormat::Nvfp4,
        &ple_testkit::synth::small_config(2000, 8),
        5,
    )
    .unwrap();
    let rb = meta.row_bytes as usize;
    let dir = CString::new(d.path().to_str().unwrap()).unwrap();
    let plain = open(&dir, 0).unwrap();
    let stream = ple_testkit::text::stream(6000, 0);
    let mut seq0 = 0u64;
    // a cache of 3 rows (every step evicts), and one of about 20,000 rows
    for cache_bytes in [(3.0 * (rb as f64 + 21.0)) as u64 + 500, 2 << 20] {
        let h = open(&dir, cache_bytes).unwrap();
        let mut rows_total = 0u64;
        // (the plain handle's seqs go on across both caches)
        let mut seq = seq0;
        for round in 0..30usize {
            // three steps in flight: decode-like and prefill-like shapes
            let steps: Vec<Step> = (0..3)
                .map(|k| {
                    let (reqs, toks) = [(16, 1), (1, 300), (8, 4)][(round + k) % 3];
                    Step::new(&stream, round * 131 + k * 17, reqs, toks)
                })
                .collect();
            let first = seq + 1;
            for st in &steps {
                seq += 1;
                let b = st.batch();
                // SAFETY: the batch borrows `st`, alive across the calls; both handles are open.
                unsafe {
                    assert_eq!(ple_submit(h.0, &b, seq), PLE_OK, "{}", last_error());
                    assert_eq!(ple_submit(plain.0, &b, seq), PLE_OK);
                }
            }
            for (i, st) in steps.iter().enumerate() {
                let s = first + i as u64;
                let n = st.tokens.len();
                rows_total += (n * 16) as u64;
                // SAFETY: the out pointers are valid locals; the row views are read before their steps are consumed.
                unsafe {
                    let (mut p1, mut p2) = (std::ptr::null(), std::ptr::null());
                    let (mut n1, mut n2) = (0u32, 0u32);
                    assert_eq!(ple_packed_rows(h.0, s, &mut p1, &mut n1), PLE_OK);
                    assert_eq!(ple_packed_rows(plain.0, s, &mut p2, &mut n2), PLE_OK);
                    assert_eq!((n1, n2), (n as u32, n as u32));
                    let a = std::slice::from_raw_parts(p1, n * 16 * rb);
                    let b = std::slice::from_raw_parts(p2, n * 16 * rb);
                    assert!(a == b, "cache {cache_bytes}: step {s} rows differ");
                    let mut o1 = vec![0f32; n * 2560];
                    let mut o2 = vec![1f32; n * 2560];
                    for (hh, o) in [(&h, &mut o1), (&plain, &mut o2)] {
                        let r =
                            ple_dequant_cpu(hh.0, s, o.as_mut_ptr().cast(), PLE_DTYPE_F32, 2560, 0);
                        assert_eq!(r, PLE_OK, "{}", last_error());
                    }
                    assert!(o1 == o2, "cache {cache_bytes}: step {s} output differs");
                }
            }
        }
        seq0 = seq;
        let k = stats(&h);
        assert_eq!(k.prefill_rows + k.decode_rows, rows_total);
        assert_eq!(
            k.cache_hits + k.cache_misses,
            rows_total,
            "every row is a hit or a miss"
        );
        if cache_bytes > 1 << 20 {
            assert!(
                k.cache_hits > rows_total / 10,
                "text repeats n-grams: {}",
                k.cache_hits
            );
        }
        assert!(k.cache_bytes_used > 0 && k.cache_bytes_used <= cache_bytes);
        let p = stats(&plain);
        assert_eq!(
            (p.cache_hits, p.cache_misses, p.cache_bytes_used),
            (0, 0, 0)
        );
    }
}

#[test]
fn cache_bytes_errors_and_older_callers() {
    let d = tempfile::tempdir().unwrap();
    ple_testkit::synth::write_table(
        d.path(),
        ple_core::model::RowFormat::Nvfp4,
        &ple_testkit::synth::small_config(500, 4),
        1,
    )
    .unwrap();
    let dir = CString::new(d.path().to_str().unwrap()).unwrap();
    for bad in [10u64, (1 << 40) + 1] {
        let (s, m) = open(&dir, bad).err().expect("refused");
        assert_eq!(s, PLE_E_INVALID_ARGUMENT);
        assert!(m.contains("cache_bytes"), "{m}");
    }
    // a caller compiled before cache_bytes was appended: its struct ends before the field
    // SAFETY: ple_options is plain data filled by ple_options_default; the path and out pointer are valid for the call.
    unsafe {
        let mut o: ple_options = std::mem::zeroed();
        assert_eq!(ple_options_default(&mut o), PLE_OK);
        o.struct_size = std::mem::offset_of!(ple_options, cache_bytes);
        o.cache_bytes = 12345; // beyond the caller's struct: must be ignored
        let mut h = std::ptr::null_mut();
        assert_eq!(
            ple_open(dir.as_ptr(), &o, &mut h),
            PLE_OK,
            "{}",
            last_error()
        );
        let h = Handle(h);
        assert_eq!(stats(&h).cache_bytes_used, 0);
    }
}
