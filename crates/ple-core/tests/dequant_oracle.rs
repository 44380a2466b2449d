//! CPU dequantisation checked bit for bit against an independent oracle
//! (`tests/oracle/dequant_oracle.py`: numpy + ml_dtypes), for every row format × output dtype, with
//! and without accumulate. Rows cover every byte value (E4M3 NaN codes 0x7F/0xFF, subnormals, all
//! E2M1 nibbles), for BF16 every 16-bit pattern and, for F32, the f16/bf16 rounding edges
//! (ties, overflow to inf, subnormals, NaN payloads) then random bit patterns and random values
//! across f16's range. The shipped geometry (16 heads of 160) takes every case; other geometries
//! (12 × 128, 16 × 64, nvfp4 rows of an odd byte count, odd head dims for the unblocked formats)
//! take every dtype × accumulate at one scale.
//!
//! Needs `python3` with `numpy` and `ml_dtypes`. Where they are missing the test is skipped with a
//! loud message — unless `CI=true`, where it fails.

use half::{bf16, f16};
use ple_core::dequant::{Dtype, Out, dequant_rows};
use ple_core::model::{RowFormat, RowSpec};
use std::path::Path;
use std::process::Command;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn oracle_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, ml_dtypes"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        let msg = "python3 with numpy and ml_dtypes is needed for the dequant oracle \
                   (pip install numpy ml_dtypes)";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg}: missing on CI");
        }
        eprintln!("\n!!!!!!!! SKIPPED dequant oracle test: {msg} !!!!!!!!\n");
    }
    ok
}

/// Rows for `tokens` tokens of `spec`'s geometry: the first bytes (or, for BF16, 16-bit words)
/// enumerate every value, the rest are random (F32: edge values first, then random patterns and
/// values).
fn rows(spec: &RowSpec, tokens: usize, seed: u64) -> Vec<u8> {
    let format = spec.format;
    let rb = spec.row_bytes();
    let heads = spec.num_heads;
    let code_bytes = format.code_bytes(spec.head_dim);
    let mut v = vec![0u8; tokens * heads * rb];
    let mut s = seed;
    for b in v.iter_mut() {
        *b = splitmix(&mut s) as u8;
    }
    match format {
        RowFormat::Bf16 => {
            for (i, w) in v.chunks_exact_mut(2).take(65536).enumerate() {
                w.copy_from_slice(&(i as u16).to_le_bytes());
            }
        }
        RowFormat::F32 => {
            const EDGES: [u32; 22] = [
                0x0000_0000, // +0
                0x8000_0000, // -0
                0x7F80_0000, // +inf
                0xFF80_0000, // -inf
                0x7FC0_0000, // canonical NaN
                0xFF80_0001, // negative signalling NaN, payload 1
                0x7FBF_FFFF, // positive signalling NaN, full payload
                0x0000_0001, // smallest f32 subnormal
                0x807F_FFFF, // largest negative f32 subnormal
                0x477F_E000, // 65504: largest f16
                0x477F_EFFF, // just below the f16 overflow tie
                0x477F_F000, // 65520: the tie, rounds to inf in f16
                0x3380_0000, // 2^-24: smallest f16 subnormal
                0x3300_0000, // 2^-25: the tie between 0 and it, rounds to 0 (even)
                0x3300_0001, // just above the tie: rounds to 2^-24
                0x3F80_8000, // bf16 tie, rounds to even 1.0
                0x3F81_8000, // bf16 tie, rounds to even up
                0x3F80_1000, // f16 tie (1 + 2^-11), rounds to even 1.0
                0x3F80_3000, // f16 tie, rounds to even up
                0x7F7F_FFFF, // largest f32: inf in f16, inf in bf16
                0x7F7F_7FFF, // below bf16's overflow tie: largest bf16
                0x3880_0000, // 2^-14: smallest normal f16
            ];
            for (i, w) in v.chunks_exact_mut(4).enumerate() {
                let r = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                let x = match i {
                    _ if i < EDGES.len() => EDGES[i],
                    // odd words: random sign and mantissa, exponent 96..=159 (2^-31 .. 2^32)
                    _ if i % 2 == 1 => (r & 0x807F_FFFF) | ((96 + ((r >> 23) & 63)) << 23),
                    _ => r, // any pattern: NaNs, infinities, subnormals, huge and tiny values
                };
                w.copy_from_slice(&x.to_le_bytes());
            }
        }
        RowFormat::Fp8 => {
            for (i, b) in v.iter_mut().take(4096).enumerate() {
                *b = i as u8;
            }
        }
        RowFormat::Nvfp4 => {
            // every code byte value and every scale byte value, over the first rows
            let n_rows = tokens * heads;
            for r in 0..n_rows.min(64) {
                let row = &mut v[r * rb..(r + 1) * rb];
                for (j, b) in row[..code_bytes].iter_mut().enumerate() {
                    *b = ((r * code_bytes + j) % 256) as u8;
                }
                for (j, b) in row[code_bytes..].iter_mut().enumerate() {
                    *b = ((r * 10 + j) % 256) as u8;
                }
            }
        }
    }
    v
}

fn init_bytes(dtype: Dtype, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut v = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let r = splitmix(&mut s);
        match dtype {
            // mostly moderate finite values, some arbitrary bit patterns (inf, NaN, subnormal)
            Dtype::F32 => {
                let x = if i % 16 == 0 {
                    f32::from_bits(r as u32)
                } else {
                    ((r % 20001) as f32 - 10000.0) / 997.0
                };
                v.extend_from_slice(&x.to_le_bytes());
            }
            Dtype::F16 => {
                let x = if i % 16 == 0 {
                    f16::from_bits(r as u16)
                } else {
                    f16::from_f32(((r % 20001) as f32 - 10000.0) / 997.0)
                };
                v.extend_from_slice(&x.to_le_bytes());
            }
            Dtype::Bf16 => {
                let x = if i % 16 == 0 {
                    bf16::from_bits(r as u16)
                } else {
                    bf16::from_f32(((r % 20001) as f32 - 10000.0) / 997.0)
                };
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    v
}

#[allow(
    clippy::too_many_arguments,
    reason = "the flat argument list the callers already hold"
)]
fn run_lib(
    spec: &RowSpec,
    rows: &[u8],
    tokens: usize,
    dtype: Dtype,
    stride: usize,
    acc: bool,
    init: &[u8],
    pool: Option<&rayon::ThreadPool>,
) -> Vec<u8> {
    let n = (tokens - 1) * stride + spec.embed_dim();
    match dtype {
        Dtype::F32 => {
            let mut o: Vec<f32> = init
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            dequant_rows(spec, rows, tokens, Out::F32(&mut o), stride, acc, pool).unwrap();
            o.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        Dtype::F16 => {
            let mut o: Vec<f16> = init
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]))
                .collect();
            assert_eq!(o.len(), n);
            dequant_rows(spec, rows, tokens, Out::F16(&mut o), stride, acc, pool).unwrap();
            o.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        Dtype::Bf16 => {
            let mut o: Vec<bf16> = init
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                .collect();
            dequant_rows(spec, rows, tokens, Out::Bf16(&mut o), stride, acc, pool).unwrap();
            o.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
    }
}

#[test]
fn dequant_matches_ml_dtypes_bit_for_bit() {
    if !oracle_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut case = 0;
    // (format, heads, head dim, scales, tokens)
    let mut geometries: Vec<(RowFormat, usize, usize, Vec<f32>, usize)> = Vec::new();
    for format in [
        RowFormat::Nvfp4,
        RowFormat::Fp8,
        RowFormat::Bf16,
        RowFormat::F32,
    ] {
        // global scales: the generated tables' ones, a non-power-of-two, one that overflows f16
        // and bf16 ranges' ends, one that underflows into subnormals
        let scales: Vec<f32> = match format {
            RowFormat::Bf16 | RowFormat::F32 => vec![1.0],
            _ => vec![0.015625, 0.012_345_679, 3.0e4, 1.0e-7],
        };
        let tokens = match format {
            RowFormat::Bf16 => 70,
            RowFormat::F32 => 40,
            _ => 80,
        };
        let other = scales[1.min(scales.len() - 1)];
        geometries.push((format, 16, 160, scales.clone(), tokens));
        // the other shapes: 12 heads of 128 (n-gram 4 × 4), 16 heads of 64 (n-gram 2)
        geometries.push((format, 12, 128, vec![other], tokens));
        geometries.push((format, 16, 64, vec![other], 70));
        match format {
            // rows of 27 bytes: codes and scales at odd offsets
            RowFormat::Nvfp4 => geometries.push((format, 5, 48, vec![other], 40)),
            // a head dim no block size divides
            _ => geometries.push((format, 3, 7, vec![scales[0]], 40)),
        }
    }
    for (format, num_heads, head_dim, scales, tokens) in geometries {
        for &scale in &scales {
            let global_scale = scale;
            let spec = RowSpec {
                format,
                global_scale,
                num_heads,
                head_dim,
            };
            let dim = spec.embed_dim();
            let r = rows(&spec, tokens, case as u64 + 17);
            for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                for acc in [false, true] {
                    case += 1;
                    let stride = dim + 3 * (case % 2);
                    let n = (tokens - 1) * stride + dim;
                    let init = init_bytes(dtype, n, case as u64);
                    // the parallel path on even cases, the serial one on odd cases
                    let p = if case % 2 == 0 { Some(&pool) } else { None };
                    let out = run_lib(&spec, &r, tokens, dtype, stride, acc, &init, p);
                    let cd = dir.path().join(format!(
                        "{case:03}-{}-{num_heads}x{head_dim}-{}-{}-{global_scale}",
                        format.name(),
                        dtype.name(),
                        if acc { "acc" } else { "set" }
                    ));
                    std::fs::create_dir(&cd).unwrap();
                    std::fs::write(cd.join("rows.bin"), &r).unwrap();
                    std::fs::write(cd.join("init.bin"), &init).unwrap();
                    std::fs::write(cd.join("out.bin"), &out).unwrap();
                    let meta = serde_json::json!({
                        "format": format.name(), "global_scale": global_scale, "dtype": dtype.name(),
                        "accumulate": acc, "tokens": tokens, "stride": stride,
                        "num_heads": num_heads, "head_dim": head_dim,
                    });
                    std::fs::write(cd.join("meta.json"), meta.to_string()).unwrap();
                }
            }
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/dequant_oracle.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{text}");
    assert!(o.status.success(), "oracle disagrees:\n{text}");
    assert_eq!(text.matches("elements match").count(), case, "{text}");
}
