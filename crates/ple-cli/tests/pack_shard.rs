//! Shard tables (`ple pack --shard K/N`, `PackOptions::shard`): each holds exactly its heads'
//! rows of the whole table (round-robin heads K, K + N, …; each head's range in turn); the files
//! add up to the whole table's; a shard table opens only as its own shard (`Error::Format` naming
//! both otherwise) and gives the rows and output of the whole table opened as that shard; a
//! shard table of the old contiguous layout is refused, never read as the new one.

mod common;

use common::*;
use ple_core::dequant::{Dtype, OutArgs};
use ple_core::error::Error;
use ple_core::format::pack::PackOptions;
use ple_core::lookup::context::Batch;
use ple_core::model::RowFormat;
use ple_core::shard::Shard;
use ple_core::step::{OpenOptions, Pipeline};
use ple_testkit::synth::{expected_row, write_checkpoint};
use std::path::Path;
use std::process::Command;

fn shard_opts(index: u32, count: u32) -> PackOptions {
    PackOptions {
        shard: Shard::new(index, count).unwrap(),
        ..Default::default()
    }
}

fn file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("table.rows")).unwrap().len()
}

#[test]
fn shard_tables_hold_their_heads_rows_and_add_up_to_the_whole() {
    let d = tempfile::tempdir().unwrap();
    for (format, seed) in [
        (RowFormat::Nvfp4, 31),
        (RowFormat::Bf16, 32),
        (RowFormat::F32, 33),
    ] {
        let ck = d.path().join(format!("ck-{}", format.name()));
        write_checkpoint(&ck, &spec(format, seed)).unwrap();
        let whole_dir = d.path().join(format!("whole-{}", format.name()));
        pack_quiet(&ck, &whole_dir, &PackOptions::default()).unwrap();
        let whole = open(&whole_dir).unwrap();
        let wm = whole.meta().clone();
        assert!(wm.shard.is_none());
        for count in [2u32, 3, 16] {
            let mut bytes = 0;
            let mut ranges = Vec::new();
            for index in 0..count {
                let out = d
                    .path()
                    .join(format!("{}-{index}-of-{count}", format.name()));
                let rep = pack_quiet(&ck, &out, &shard_opts(index, count)).unwrap();
                let t = open(&out).unwrap();
                let m = t.meta();
                let s = m.shard.as_ref().expect("a shard record");
                // round-robin: heads index, index + count, …
                let heads: Vec<u32> = (index..16).step_by(count as usize).collect();
                assert_eq!((s.index, s.count), (index, count));
                assert_eq!(s.layout.as_deref(), Some("round_robin"));
                assert_eq!(s.head_ids, heads);
                // each head's rows of the whole table: [offset[h], offset[h + 1]) (the last
                // head also the padding)
                let end = |h: usize| wm.hash.offsets.get(h + 1).copied().unwrap_or(wm.total_rows);
                let want: Vec<[u64; 2]> = heads
                    .iter()
                    .map(|&h| [wm.hash.offsets[h as usize], end(h as usize)])
                    .collect();
                assert_eq!(s.row_ranges, want);
                assert_eq!(s.whole_total_rows, wm.total_rows);
                // the whole table's identity and hash, this file's rows
                assert_eq!(m.source, wm.source);
                assert_eq!(m.hash, wm.hash);
                assert_eq!(rep.table_bytes, file_len(&out));
                // the file: the heads' ranges one after another
                let whole_rows: Vec<u64> = want.iter().flat_map(|r| r[0]..r[1]).collect();
                assert_eq!(whole_rows.len() as u64, m.total_rows);
                for (r, &w) in whole_rows.iter().enumerate() {
                    assert_eq!(
                        t.row(r as u64).unwrap(),
                        expected_row(seed, format, w),
                        "{index}/{count} row {r}"
                    );
                }
                ranges.extend(want);
                bytes += file_len(&out);
                // about 1/N of the whole (± a head's rows for uneven splits)
                let per_head = wm.total_rows / 16 * wm.row_bytes as u64;
                let even = file_len(&whole_dir) / count as u64;
                assert!(file_len(&out).abs_diff(even) <= per_head + 128 * wm.row_bytes as u64);
            }
            // the shards' ranges tile the whole table
            ranges.sort();
            let mut next_row = 0;
            for r in &ranges {
                assert_eq!(r[0], next_row, "shards tile the whole table");
                next_row = r[1];
            }
            assert_eq!(next_row, wm.total_rows);
            assert_eq!(
                bytes,
                file_len(&whole_dir),
                "{count} shards add up to the whole"
            );
        }
    }
}

/// A stateless batch of `n` tokens starting at position 5.
fn batch(tokens: &[i32]) -> (Vec<i32>, Vec<u64>, Vec<u32>, Vec<i32>) {
    let positions = (5..5 + tokens.len() as i32).collect();
    (
        positions,
        vec![9],
        vec![0, tokens.len() as u32],
        vec![17, 4242],
    )
}

fn handle(dir: &Path, shard: Shard) -> ple_core::Result<Pipeline> {
    let o = OpenOptions {
        max_tokens_per_step: 256,
        num_threads: 2,
        shard,
        ..Default::default()
    };
    Pipeline::open(dir, o)
}

#[test]
fn a_shard_table_opens_only_as_its_shard_and_serves_the_same_rows() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    write_checkpoint(&ck, &spec(RowFormat::Nvfp4, 41)).unwrap();
    let whole_dir = d.path().join("whole");
    pack_quiet(&ck, &whole_dir, &PackOptions::default()).unwrap();
    let shard_dir = d.path().join("s1of3");
    pack_quiet(&ck, &shard_dir, &shard_opts(1, 3)).unwrap();
    let s13 = Shard::new(1, 3).unwrap();

    for (wrong, named) in [
        (Shard::WHOLE, "the whole table"),
        (Shard::new(0, 3).unwrap(), "shard 0/3"),
        (Shard::new(1, 4).unwrap(), "shard 1/4"),
    ] {
        let e = handle(&shard_dir, wrong).err().expect("refused");
        assert!(matches!(e, Error::Format(_)), "{e}");
        let m = e.to_string();
        assert!(m.contains("shard 1/3") && m.contains(named), "{m}");
    }

    let from_shard = handle(&shard_dir, s13).unwrap();
    let from_whole = handle(&whole_dir, s13).unwrap();
    let info = from_shard.table_info();
    // heads 1, 4, 7, 10, 13
    assert_eq!(
        (info.first_head, info.head_stride, info.shard_heads),
        (1, 3, 5)
    );
    assert_eq!(info.file_size, file_len(&shard_dir));
    let tokens: Vec<i32> = (0..200).map(|i| (i * 7919 + 13) % 248_320).collect();
    let (positions, ids, qs, ctx) = batch(&tokens);
    let b = Batch {
        tokens: &tokens,
        positions: &positions,
        request_ids: &ids,
        query_start: &qs,
        context: Some(&ctx),
    };
    let rb = 90;
    let mut outs = Vec::new();
    for p in [&from_shard, &from_whole] {
        p.submit(&b, 1).unwrap();
        let (ptr, n) = p.packed_rows(1).unwrap();
        // SAFETY: step 1 is Ready: n × 5 heads × 90 bytes at `ptr` until it is consumed.
        let rows = unsafe { std::slice::from_raw_parts(ptr, n as usize * 5 * rb) }.to_vec();
        let mut out = vec![f32::NAN; tokens.len() * 2560];
        let args = OutArgs {
            dtype: Dtype::F32,
            stride: 2560,
            accumulate: false,
        };
        // SAFETY: `out` holds the step's tokens × 2560 f32, used by nobody else.
        unsafe { p.dequant_cpu(1, out.as_mut_ptr().cast(), args) }.unwrap();
        outs.push((rows, out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()));
    }
    assert!(
        outs[0] == outs[1],
        "a shard table serves the whole table's shard rows"
    );
    // and they are the rows of the whole ids of heads 1, 4, 7, 10, 13
    let mut whole_ids = vec![0i64; tokens.len() * 16];
    from_whole.ngram_ids(&b, &mut whole_ids).unwrap();
    for (t, ids) in whole_ids.chunks(16).enumerate() {
        for (j, h) in [1, 4, 7, 10, 13].into_iter().enumerate() {
            let want = expected_row(41, RowFormat::Nvfp4, ids[h] as u64);
            assert_eq!(&outs[0].0[(t * 5 + j) * rb..][..rb], &want[..]);
        }
    }
}

#[test]
fn the_cli_packs_a_shard_and_refuses_bad_ones() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    write_checkpoint(&ck, &spec(RowFormat::Fp8, 51)).unwrap();
    let out = d.path().join("s2of4");
    let o = Command::new(PLE)
        .args([
            "pack",
            ck.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shard",
            "2/4",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("(shard 2/4)"), "{stdout}");
    let s = open(&out).unwrap().meta().shard.clone().unwrap();
    assert_eq!(
        (s.index, s.count, &s.head_ids[..]),
        (2, 4, &[2, 6, 10, 14][..])
    );
    let o = Command::new(PLE)
        .args(["inspect", out.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    let want = format!(
        "head shard:   2/4 (round_robin): heads 2, 6, 10, 14, {} of the whole table's {} rows",
        open(&out).unwrap().meta().total_rows,
        s.whole_total_rows
    );
    assert!(text.contains(&want), "{text}");
    for bad in ["4/4", "0/17", "1", "a/b", "0/0"] {
        let o = Command::new(PLE)
            .args([
                "pack",
                ck.to_str().unwrap(),
                d.path().join("x").to_str().unwrap(),
            ])
            .args(["--shard", bad])
            .output()
            .unwrap();
        assert!(!o.status.success(), "--shard {bad} accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--shard"), "{bad}: {err}");
        assert!(!d.path().join("x").join("table.json").exists());
    }
}

/// A shard table packed with contiguous heads (its `shard` record has `first_head`, `heads` and
/// `first_row`, and no `layout`) is refused with a message saying to re-pack — its rows are
/// never read as the round-robin layout's.
#[test]
fn a_shard_table_of_the_contiguous_layout_is_refused_with_a_re_pack_message() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    write_checkpoint(&ck, &spec(RowFormat::Bf16, 61)).unwrap();
    let out = d.path().join("s1of2");
    pack_quiet(&ck, &out, &shard_opts(1, 2)).unwrap();
    // rewrite its record as the contiguous layout wrote it (heads 8..16 of 2 shards)
    let meta_path = out.join("table.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    let first_row = meta["hash"]["offsets"][8].as_u64().unwrap();
    let whole = meta["shard"]["whole_total_rows"].clone();
    meta["shard"] = serde_json::json!({
        "index": 1, "count": 2, "first_head": 8, "heads": 8, "first_row": first_row,
        "whole_total_rows": whole,
    });
    meta["total_rows"] = (whole.as_u64().unwrap() - first_row).into();
    std::fs::write(&meta_path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(out.join("table.rows"))
        .unwrap()
        .set_len((whole.as_u64().unwrap() - first_row) * 320)
        .unwrap();
    for shard in [Shard::new(1, 2).unwrap(), Shard::WHOLE] {
        let e = handle(&out, shard).err().expect("refused");
        let m = e.to_string();
        assert!(matches!(e, Error::Format(_)), "{m}");
        assert!(
            m.contains("contiguous") && m.contains("re-pack") && m.contains("--shard 1/2"),
            "{m}"
        );
    }
}
