//! Rows by the engine's own ids (`Pipeline::submit_ids`, `step/ids.rs`): for a batch of tokens,
//! the ids path and the token path give the same rows and the same output bit for bit — whole
//! table and head shards, MMAP and DIRECT, with and without the row cache, read ahead or not; an
//! id outside its head's rows is refused naming token, head and id, and nothing is read.

use super::*;
use crate::shard::Shard;

/// Submits `b` as tokens (seq `seq`) and as its ids (seq `seq + 1`) on `p`; returns both steps'
/// packed rows and f32 outputs.
fn both_paths(p: &Pipeline, b: &B, ids: &[i64], seq: u64) -> [(Vec<u8>, Vec<u32>); 2] {
    p.submit(&b.view(), seq).unwrap();
    p.submit_ids(ids, false, seq + 1).unwrap();
    [seq, seq + 1].map(|s| {
        let (ptr, n) = p.packed_rows(s).unwrap();
        let bytes = n as usize * p.heads().len() * p.table().row_bytes();
        // SAFETY: the step is Ready: `tokens × heads × row_bytes` bytes at `ptr` until consumed.
        let rows = unsafe { std::slice::from_raw_parts(ptr, bytes) }.to_vec();
        let mut out = vec![0u32; n as usize * 2560];
        // SAFETY: `out` holds the step's tokens × 2560 f32, used by nobody else.
        unsafe { p.dequant_cpu(s, out.as_mut_ptr().cast(), F32_OUT) }.unwrap();
        (rows, out)
    })
}

#[test]
fn the_ids_path_gives_the_token_paths_rows_and_output_bit_for_bit() {
    for format in [RowFormat::Nvfp4, RowFormat::Bf16] {
        let d = make_table(format, 1500);
        let whole = open(d.path(), |_| {});
        let mut rng = Rng(31 + format as u64);
        let mut seq = 0;
        for (io, cache, shard) in [
            (IoMode::Mmap, 0, Shard::WHOLE),
            (IoMode::Mmap, 16 << 20, Shard::WHOLE),
            (IoMode::Direct, 16 << 20, Shard::WHOLE),
            (IoMode::Direct, 0, Shard { index: 1, count: 3 }),
            (IoMode::Mmap, 16 << 20, Shard { index: 2, count: 4 }),
        ] {
            let Ok(p) = Pipeline::open(
                d.path(),
                OpenOptions {
                    max_tokens_per_step: 512,
                    num_threads: 2,
                    io_mode: io,
                    cache_bytes: cache,
                    shard,
                    ..OpenOptions::default()
                },
            ) else {
                assert_eq!(io, IoMode::Direct, "only DIRECT may be refused (tmpfs)");
                continue;
            };
            for _ in 0..3 {
                let b = random_batch(&mut rng, 5, 30);
                let ids = ids_of(&whole, &b);
                seq += 2;
                let [tok, by_ids] = both_paths(&p, &b, &ids, seq);
                assert!(tok == by_ids, "{format:?} {io:?} cache {cache} {shard:?}");
                // and the rows are the generated rows of the shard's heads' ids
                let heads = p.heads();
                let rb = format.row_bytes(160);
                for (i, row) in by_ids.0.chunks(rb).enumerate() {
                    let (t, j) = (i / heads.len(), i % heads.len());
                    let id = ids[t * 16 + heads.get(j)] as u64;
                    assert_eq!(row, &synth::expected_row(SEED, format, id)[..]);
                }
            }
            // read ahead by ids (a cache that holds the table): the rows come from the cache
            if cache > 0 {
                let b = random_batch(&mut rng, 4, 20);
                let ids = ids_of(&whole, &b);
                let c0 = p.counters();
                p.prefetch_ahead_ids(&ids).unwrap();
                assert!(p.wait_ahead_idle(std::time::Duration::from_secs(10)));
                seq += 2;
                p.submit_ids(&ids, true, seq).unwrap();
                p.wait(seq, 0).unwrap();
                p.release_step(seq).unwrap();
                let c = p.counters().delta(&c0);
                let rows = (b.tokens.len() * p.heads().len()) as u64;
                assert_eq!((c.cache_misses, c.prefill_rows), (0, rows), "{c:?}");
                assert_eq!(c.ahead_asked, rows, "{c:?}");
            }
        }
    }
}

#[test]
fn ids_outside_their_head_are_refused_naming_token_head_and_id_and_nothing_is_read() {
    let d = make_table(RowFormat::Fp8, 1000);
    let p = open(d.path(), |o| o.max_tokens_per_step = 8);
    let mut rng = Rng(5);
    let b = random_batch(&mut rng, 2, 3);
    let ids = ids_of(&p, &b);
    let hash = p.table().meta().hash.clone();
    let c0 = p.counters();
    let n = b.tokens.len();
    // head 9's first row less one (head 8's last row), head 15's end, negative, far out
    let mut cases = vec![];
    for (t, h, id) in [
        (0, 9, hash.offsets[9] as i64 - 1),
        (n - 1, 15, (hash.offsets[15] + hash.head_sizes[15]) as i64),
        (0, 0, -1),
        (n - 1, 3, i64::MAX),
    ] {
        let mut bad = ids.clone();
        bad[t * 16 + h] = id;
        cases.push((t, h, id, bad));
    }
    for (t, h, id, bad) in &cases {
        for e in [
            p.submit_ids(bad, false, 1).unwrap_err(),
            p.prefetch_ahead_ids(bad).unwrap_err(),
        ] {
            let m = e.to_string();
            assert!(matches!(e, Error::InvalidArgument(_)), "{m}");
            assert!(
                m.contains(&format!("ids[{t}][{h}] = {id} (token {t}, head {h})")),
                "{m}"
            );
        }
    }
    // not a whole token, no token, more than max_tokens_per_step
    for bad in [&ids[..17], &[][..], &vec![ids[0]; 16 * 9][..]] {
        assert!(matches!(
            p.submit_ids(bad, false, 1),
            Err(Error::InvalidArgument(_))
        ));
    }
    // nothing was read or counted, no slot taken: seq 1 is still free
    let c = p.counters().delta(&c0);
    assert_eq!(
        (
            c.prefill_rows + c.decode_rows,
            c.ahead_asked,
            c.storage_reads
        ),
        (0, 0, 0)
    );
    p.submit_ids(&ids, false, 1).unwrap();
    check_rows(&p, 1, &ids, RowFormat::Fp8);
}
