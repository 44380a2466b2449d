//! Head shards through the C API (`ple_options.shard_count` / `.shard_index`): for N = 1, 2, 3,
//! 4, 5 and 16 shard handles of one table, the sum of their `ple_dequant_cpu` outputs (summed
//! as an all-reduce would, in the output dtype) is a whole handle's output bit for bit in f32,
//! f16 and bf16; accumulating every shard into one buffer is the whole accumulate; each shard's
//! `ple_packed_rows` is its heads' rows; `ple_info` reports the shard; bad values and older
//! callers.

mod common;

use common::*;
use half::{bf16, f16};
use ple::*;
use std::ffi::CString;

fn options(count: u32, index: u32) -> ple_options {
    // SAFETY: ple_options is plain data; all-zero is valid before ple_options_default fills it.
    let mut o: ple_options = unsafe { std::mem::zeroed() };
    // SAFETY: `o` is a writable ple_options.
    assert_eq!(unsafe { ple_options_default(&mut o) }, PLE_OK);
    assert_eq!(
        (o.shard_count, o.shard_index),
        (1, 0),
        "the whole table by default"
    );
    o.max_tokens_per_step = 512;
    o.num_threads = 2;
    o.shard_count = count;
    o.shard_index = index;
    o
}

fn open(dir: &CString, count: u32, index: u32) -> Handle {
    try_open(dir, &options(count, index)).unwrap_or_else(|e| panic!("{e:?}"))
}

/// `ple_dequant_cpu` of step `seq` into `out` (tokens × 2560 elements of `dtype`, f16/bf16 two
/// to a word).
fn dequant(h: &Handle, seq: u64, out: &mut [u32], dtype: ple_dtype, flags: ple_fuse_flags) {
    // SAFETY: `out` holds the step's tokens × 2560 elements of `dtype`, 4-byte aligned.
    let r = unsafe { ple_dequant_cpu(h.0, seq, out.as_mut_ptr().cast(), dtype, 2560, flags) };
    assert_eq!(r, PLE_OK, "{}", last_error());
}

/// `a += b` element-wise in `dtype`, as an all-reduce sums (f16/bf16 through f32, one rounding).
fn add(a: &mut [u32], b: &[u32], dtype: ple_dtype) {
    let add16 = |x: u32, y: u32| -> u32 {
        let (x, y) = (x as u16, y as u16);
        (if dtype == PLE_DTYPE_F16 {
            f16::from_f32(f16::from_bits(x).to_f32() + f16::from_bits(y).to_f32()).to_bits()
        } else {
            bf16::from_f32(bf16::from_bits(x).to_f32() + bf16::from_bits(y).to_f32()).to_bits()
        }) as u32
    };
    for (x, &y) in a.iter_mut().zip(b) {
        *x = if dtype == PLE_DTYPE_F32 {
            (f32::from_bits(*x) + f32::from_bits(y)).to_bits()
        } else {
            add16(*x & 0xFFFF, y & 0xFFFF) | add16(*x >> 16, y >> 16) << 16
        };
    }
}

fn words(tokens: usize, dtype: ple_dtype) -> usize {
    if dtype == PLE_DTYPE_F32 {
        tokens * 2560
    } else {
        tokens * 1280
    }
}

fn splitmix(mut v: u64) -> u64 {
    v = v.wrapping_add(0x9E37_79B9_7F4A_7C15);
    v = (v ^ (v >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    v = (v ^ (v >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    v ^ (v >> 31)
}

#[test]
fn the_sum_of_n_shards_is_the_whole_output_for_every_dtype_and_flag() {
    let d = tempfile::tempdir().unwrap();
    let meta = ple_testkit::synth::write_table(
        d.path(),
        ple_core::model::RowFormat::Nvfp4,
        &ple_testkit::synth::small_config(2000, 8),
        3,
    )
    .unwrap();
    let rb = meta.row_bytes as usize;
    let dir = CString::new(d.path().to_str().unwrap()).unwrap();
    let whole = open(&dir, 1, 0);
    let stream = ple_testkit::text::stream(6000, 0);
    let st = Step::new(&stream, 17, 6, 25);
    let n = st.tokens.len();
    let mut whole_ids = vec![0i64; n * 16];
    let b = st.batch();
    // SAFETY: the batch borrows `st`; `whole_ids` holds 16 ids per token.
    let r = unsafe { ple_ngram_ids(whole.0, &b, whole_ids.as_mut_ptr()) };
    assert_eq!(r, PLE_OK);
    let mut seq = 0u64;
    for count in [1u32, 2, 3, 4, 5, 16] {
        let shards: Vec<Handle> = (0..count).map(|i| open(&dir, count, i)).collect();
        // ple_info and ple_packed_rows: the shard's heads, in order, as [tokens][heads][row]
        seq += 1;
        submit_step(&whole, &st, seq);
        let mut seen = [0u32; 16];
        for (i, h) in shards.iter().enumerate() {
            let inf = info(h);
            assert_eq!((inf.shard_index, inf.shard_count), (i as u32, count));
            // round-robin: heads i, i + count, …
            let heads: Vec<usize> = (i..16).step_by(count as usize).collect();
            assert_eq!(
                (inf.shard_first_head, inf.shard_head_stride),
                (i as u32, count),
                "round-robin heads"
            );
            let k = inf.shard_heads as usize;
            assert_eq!(k, heads.len());
            assert!(k == 16 / count as usize || k == 16 / count as usize + 1);
            submit_step(h, &st, seq);
            let (mut p, mut t) = (std::ptr::null(), 0u32);
            // SAFETY: out pointers are locals; the rows are read before the step is released.
            unsafe {
                assert_eq!(ple_packed_rows(h.0, seq, &mut p, &mut t), PLE_OK);
                let rows = std::slice::from_raw_parts(p, n * k * rb);
                for tok in 0..n {
                    for (j, &hd) in heads.iter().enumerate() {
                        let id = whole_ids[tok * 16 + hd] as u64;
                        let want = ple_testkit::synth::expected_row(3, meta.row_format, id);
                        assert_eq!(&rows[(tok * k + j) * rb..][..rb], &want[..]);
                    }
                }
                assert_eq!(ple_release_step(h.0, seq), PLE_OK);
            }
            for hd in heads {
                seen[hd] += 1;
            }
        }
        assert_eq!(seen, [1; 16], "the shards serve every head once");
        // SAFETY: the whole handle's step was submitted above.
        assert_eq!(unsafe { ple_release_step(whole.0, seq) }, PLE_OK);

        for dtype in [PLE_DTYPE_F32, PLE_DTYPE_F16, PLE_DTYPE_BF16] {
            // overwrite: the sum of the shards' outputs
            seq += 1;
            submit_step(&whole, &st, seq);
            let mut want = vec![0xDEAD_BEEFu32; words(n, dtype)];
            dequant(&whole, seq, &mut want, dtype, 0);
            let mut sum = vec![0u32; words(n, dtype)];
            for (i, h) in shards.iter().enumerate() {
                submit_step(h, &st, seq);
                let mut out = vec![0x1234_5678u32.rotate_left(i as u32); words(n, dtype)];
                dequant(h, seq, &mut out, dtype, 0);
                if i == 0 {
                    sum = out;
                } else {
                    add(&mut sum, &out, dtype);
                }
            }
            assert!(want.iter().filter(|&&w| w & 0x7FFF_7FFF != 0).count() > want.len() / 2);
            assert!(sum == want, "{count} shards, dtype {dtype}: sum differs");

            // accumulate: every shard into one buffer == the whole accumulate
            seq += 1;
            let base: Vec<u32> = (0..words(n, dtype))
                .map(|i| splitmix(i as u64 ^ seq << 32) as u32)
                .collect();
            let mut want = base.clone();
            submit_step(&whole, &st, seq);
            dequant(&whole, seq, &mut want, dtype, PLE_FUSE_ACCUMULATE);
            let mut got = base.clone();
            for h in &shards {
                submit_step(h, &st, seq);
                dequant(h, seq, &mut got, dtype, PLE_FUSE_ACCUMULATE);
            }
            assert!(
                got == want,
                "{count} shards, dtype {dtype}: accumulate differs"
            );
        }
    }
}

#[test]
fn bad_shards_are_invalid_arguments_and_older_callers_get_the_whole_table() {
    let d = tempfile::tempdir().unwrap();
    ple_testkit::synth::write_table(
        d.path(),
        ple_core::model::RowFormat::Fp8,
        &ple_testkit::synth::small_config(500, 4),
        1,
    )
    .unwrap();
    let dir = CString::new(d.path().to_str().unwrap()).unwrap();
    for (count, index) in [(0, 0), (17, 0), (4, 4), (16, 99)] {
        let (s, m) = try_open(&dir, &options(count, index))
            .err()
            .expect("refused");
        assert_eq!(s, PLE_E_INVALID_ARGUMENT, "{count} {index}: {m}");
        assert!(m.contains("options.shard_"), "{m}");
    }
    // callers compiled before the shard fields: their struct ends before shard_index (its
    // shard_count would lie in that struct's tail padding), whatever those bytes hold
    let old = std::mem::offset_of!(ple_options, shard_index);
    for size in [old, std::mem::offset_of!(ple_options, cache_bytes)] {
        let mut o = options(7, 5);
        o.struct_size = size;
        let h = try_open(&dir, &o).unwrap_or_else(|e| panic!("{e:?}"));
        let i = info(&h);
        assert_eq!(
            (
                i.shard_count,
                i.shard_index,
                i.shard_first_head,
                i.shard_heads,
                i.shard_head_stride
            ),
            (1, 0, 0, 16, 1)
        );
    }
    // and a ple_info of an older caller (before the shard fields) is filled up to its size
    let h = open(&dir, 4, 3);
    // SAFETY: ple_info is plain data: all-zero is a valid value.
    let mut i: ple_table_info = unsafe { std::mem::zeroed() };
    i.struct_size = std::mem::offset_of!(ple_table_info, shard_index);
    i.shard_heads = 77;
    // SAFETY: `h` is open, `i` writable for its struct_size.
    assert_eq!(unsafe { ple_table_info(h.0, &mut i) }, PLE_OK);
    assert_eq!((i.num_heads, i.shard_heads), (16, 77));
    let i = info(&h);
    assert_eq!(
        (i.shard_first_head, i.shard_heads, i.shard_head_stride),
        (3, 4, 4)
    );
}

#[test]
fn ple_pack_writes_a_shard_table_and_older_callers_the_whole() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let spec = ple_testkit::synth::CheckpointSpec::new(ple_core::model::RowFormat::Fp8, 700, 4, 9);
    let ck_info = ple_testkit::synth::write_checkpoint(&ck, &spec).unwrap();
    let ckc = CString::new(ck.to_str().unwrap()).unwrap();
    let pack = |name: &str,
                f: &dyn Fn(&mut ple_pack_options)|
     -> (ple_status, std::path::PathBuf) {
        // SAFETY: ple_pack_options is plain data; all-zero is valid before the default fills it.
        let mut o: ple_pack_options = unsafe { std::mem::zeroed() };
        // SAFETY: `o` is writable.
        assert_eq!(unsafe { ple_pack_options_default(&mut o) }, PLE_OK);
        assert_eq!((o.shard_count, o.shard_index), (1, 0));
        f(&mut o);
        let out = d.path().join(name);
        let outc = CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: the paths and options are valid for the call; no progress callback.
        let s = unsafe { ple_pack(ckc.as_ptr(), outc.as_ptr(), &o, None, std::ptr::null_mut()) };
        (s, out)
    };
    let (s, out) = pack("s2of3", &|o| {
        o.shard_count = 3;
        o.shard_index = 2;
    });
    assert_eq!(s, PLE_OK, "{}", last_error());
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("table.json")).unwrap()).unwrap();
    assert_eq!(
        meta["shard"]["head_ids"],
        serde_json::json!([2, 5, 8, 11, 14])
    );
    let rows_len = std::fs::metadata(out.join("table.rows")).unwrap().len();
    // each head's rows of the whole table; the last head (15) is shard 0's, with the padding
    let offsets: Vec<u64> = serde_json::from_value(meta["hash"]["offsets"].clone()).unwrap();
    let rows: u64 = [2, 5, 8, 11, 14]
        .iter()
        .map(|&h| offsets[h + 1] - offsets[h])
        .sum();
    assert_eq!(rows_len, rows * 160, "heads 2, 5, 8, 11 and 14");
    // opened through the C API as its shard only
    let dir = CString::new(out.to_str().unwrap()).unwrap();
    let i = info(&open(&dir, 3, 2));
    assert_eq!((i.shard_first_head, i.shard_head_stride), (2, 3));
    let (s, m) = try_open(&dir, &options(3, 1)).err().expect("refused");
    assert_eq!(s, PLE_E_FORMAT);
    assert!(m.contains("shard 2/3") && m.contains("shard 1/3"), "{m}");
    // bad shard options: refused before anything is written
    let (s, out) = pack("bad", &|o| o.shard_count = 0);
    assert_eq!(s, PLE_E_INVALID_ARGUMENT);
    assert!(last_error().contains("shard_count"), "{}", last_error());
    assert!(!out.join("table.json").exists());
    // a caller compiled before the shard fields: the whole table, whatever lies past its struct
    let (s, out) = pack("old", &|o| {
        o.struct_size = std::mem::offset_of!(ple_pack_options, shard_count);
        o.shard_count = 5;
        o.shard_index = 4;
    });
    assert_eq!(s, PLE_OK, "{}", last_error());
    let rows_len = std::fs::metadata(out.join("table.rows")).unwrap().len();
    assert_eq!(rows_len, ck_info.table_bytes);
}
