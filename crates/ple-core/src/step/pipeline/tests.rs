//! Tests of the step pipeline against independent expectations: rows are compared with
//! `synth::expected_row` (a pure function of the row id), never with what the pipeline read.

use super::*;
use crate::dequant::cpu as dequant;
use crate::dequant::cpu::{Dtype, OutArgs};
use crate::io::mmap::gather;
use crate::step::options::PrefetchPolicy;
use crate::step::options::{IoMode, RingFullPolicy};
use crate::step::shared::{FORCE_SLOT_BY_SEQ, PRETOUCH_MAX_BYTES};
use std::collections::VecDeque;

const F32_OUT: OutArgs = f32_out(2560);

const fn f32_out(stride: usize) -> OutArgs {
    OutArgs {
        dtype: Dtype::F32,
        stride,
        accumulate: false,
    }
}
use crate::model::{RowFormat, splitmix64};
use crate::synth;

const SEED: u64 = 99;
const EOS: i32 = crate::model::EOS_TOKEN_ID;

fn make_table(format: RowFormat, base: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    synth::write_table(d.path(), format, &synth::small_config(base, 4), SEED).unwrap();
    d
}

fn open(dir: &Path, f: impl FnOnce(&mut OpenOptions)) -> Pipeline {
    let mut o = OpenOptions {
        max_tokens_per_step: 512,
        num_threads: 2,
        wait_timeout_us: 20_000_000,
        ..OpenOptions::default()
    };
    f(&mut o);
    Pipeline::open(dir, o).unwrap()
}

/// An owned batch.
#[derive(Clone, Debug, Default)]
struct B {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    request_ids: Vec<u64>,
    query_start: Vec<u32>,
    context: Option<Vec<i32>>,
}

impl B {
    fn view(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.request_ids,
            query_start: &self.query_start,
            context: self.context.as_deref(),
        }
    }
    /// Requests `(id, start position, tokens)`; stateless context of `ctx` per request if given.
    fn new(reqs: &[(u64, i32, Vec<i32>)], ctx: Option<Vec<i32>>) -> B {
        let mut b = B {
            query_start: vec![0],
            context: ctx,
            ..B::default()
        };
        for (id, p, toks) in reqs {
            b.request_ids.push(*id);
            for (i, &t) in toks.iter().enumerate() {
                b.tokens.push(t);
                b.positions.push(p + i as i32);
            }
            b.query_start.push(b.tokens.len() as u32);
        }
        b
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn token(&mut self) -> i32 {
        if self.below(10) == 0 {
            EOS
        } else {
            self.below(248_320) as i32
        }
    }
}

/// A random stateless batch: `nreq` requests of 1..=max_len tokens at random positions.
fn random_batch(rng: &mut Rng, nreq: usize, max_len: u64) -> B {
    let mut reqs = Vec::new();
    let mut ctx = Vec::new();
    for r in 0..nreq {
        let len = 1 + rng.below(max_len) as usize;
        let toks = (0..len).map(|_| rng.token()).collect();
        reqs.push((r as u64 * 7 + 1, rng.below(1000) as i32 + 2, toks));
        ctx.push(rng.token());
        ctx.push(rng.token());
    }
    B::new(&reqs, Some(ctx))
}

fn ids_of(p: &Pipeline, b: &B) -> Vec<i64> {
    let mut ids = vec![0i64; b.tokens.len() * 16];
    p.ngram_ids(&b.view(), &mut ids).unwrap();
    ids
}

/// Every token's 16 rows in the step's staging equal the generated rows of its ids.
fn check_rows(p: &Pipeline, seq: u64, ids: &[i64], format: RowFormat) {
    let (ptr, n) = p.packed_rows(seq).unwrap();
    assert_eq!(n as usize * 16, ids.len(), "step {seq} token count");
    let rb = format.row_bytes(160);
    // SAFETY: packed_rows returned a pointer to the step's `ids.len() * rb` staged bytes, valid until the step is consumed, which happens after this read.
    let rows = unsafe { std::slice::from_raw_parts(ptr, ids.len() * rb) };
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            &rows[i * rb..(i + 1) * rb],
            &synth::expected_row(SEED, format, id as u64)[..],
            "step {seq}: token {} head {} (row {id})",
            i / 16,
            i % 16
        );
    }
}

#[test]
fn staging_layout_holds_every_tokens_rows() {
    for format in [RowFormat::Nvfp4, RowFormat::Fp8, RowFormat::Bf16] {
        let d = make_table(format, 3000);
        // every gather path: inline, pool, prefetch then gather, prefetch overlapped with gather
        for policy in [
            PrefetchPolicy::Auto,
            PrefetchPolicy::Always,
            PrefetchPolicy::Never,
        ] {
            let p = open(d.path(), |o| {
                o.prefetch_policy = policy;
                o.max_tokens_per_step = 2048;
            });
            let mut rng = Rng(format as u64 + 1);
            for (seq, b) in [
                // 14 requests of up to 220 tokens (parallel hash and gather when > 1024 tokens)
                (1u64, random_batch(&mut rng, 14, 220)),
                (2, random_batch(&mut rng, 1, 1)),
                (5, random_batch(&mut rng, 17, 30)),
                (6, random_batch(&mut rng, 3, 7)),
            ] {
                let ids = ids_of(&p, &b);
                if seq == 1 {
                    assert!(b.tokens.len() > 1024, "{}", b.tokens.len());
                }
                p.submit(&b.view(), seq).unwrap();
                p.wait(seq, 0).unwrap();
                check_rows(&p, seq, &ids, format);
                // distinct tokens really got distinct rows (a stride bug would repeat token 0's)
                if b.tokens.len() > 1 {
                    assert_ne!(ids[..16], ids[16..32]);
                }
                p.release_step(seq).unwrap();
            }
            let s = p.stats();
            assert_eq!(
                s.prefetch_steps,
                if policy == PrefetchPolicy::Always {
                    4
                } else {
                    0
                }
            );
        }
    }
}

#[test]
fn tracked_chunks_and_decode_match_one_prefill() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 2000);
    let p = open(d.path(), |_| {});
    let mut rng = Rng(5);
    let seq_toks: Vec<i32> = (0..50).map(|_| rng.token()).collect();
    // reference: the whole sequence in one stateless batch from position 0
    let whole = B::new(&[(9, 0, seq_toks.clone())], None);
    let want = ids_of(&p, &whole);
    // tracked: chunks of 20 and 10, then decode one at a time
    let mut got = Vec::new();
    let mut seq = 0;
    let mut pos = 0usize;
    for len in [
        20usize, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    ] {
        let b = B::new(&[(9, pos as i32, seq_toks[pos..pos + len].to_vec())], None);
        seq += 1;
        got.extend(ids_of(&p, &b));
        p.submit(&b.view(), seq).unwrap();
        check_rows(&p, seq, &got[pos * 16..], format);
        p.release_step(seq).unwrap();
        pos += len;
    }
    assert_eq!(got, want[..got.len()]);
}

#[test]
fn ring_wraparound_never_serves_a_stale_step() {
    let format = RowFormat::Fp8;
    let d = make_table(format, 2000);
    let p = open(d.path(), |o| o.max_in_flight = 2);
    let mut rng = Rng(77);
    let mut pending: VecDeque<(u64, Vec<i64>)> = VecDeque::new();
    for i in 0..300u64 {
        let seq = 3 * i + 1; // not consecutive
        let b = if i % 10 == 0 {
            random_batch(&mut rng, 4, 60)
        } else {
            let n = 1 + rng.below(8) as usize;
            random_batch(&mut rng, n, 1)
        };
        let ids = ids_of(&p, &b);
        p.submit(&b.view(), seq).unwrap();
        pending.push_back((seq, ids));
        if pending.len() == 2 {
            let (s, ids) = pending.pop_front().unwrap();
            p.wait(s, 0).unwrap();
            assert!(p.done() >= s);
            check_rows(&p, s, &ids, format);
            p.release_step(s).unwrap();
            // a consumed step is gone: no read of whatever the slot holds next (its wait is
            // complete, as ple.h documents)
            p.wait(s, 0).unwrap();
            assert_eq!(
                p.packed_rows(s).unwrap_err().kind(),
                crate::ErrorKind::State
            );
            assert_eq!(
                p.release_step(s).unwrap_err().kind(),
                crate::ErrorKind::State
            );
        }
    }
    let (s, ids) = pending.pop_front().unwrap();
    check_rows(&p, s, &ids, format);
    // seqs never submitted: skipped ones, 0, and the future
    for bad in [0, s - 1, s + 1] {
        assert_eq!(p.wait(bad, 0).unwrap_err().kind(), crate::ErrorKind::State);
    }
    // seq must grow
    let b = random_batch(&mut rng, 1, 1);
    let e = p.submit(&b.view(), s).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State, "{e}");
}

#[test]
fn full_ring_errors_or_waits_and_never_overwrites() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 2000);
    let mut rng = Rng(3);
    let p = open(d.path(), |o| {
        o.max_in_flight = 2;
        o.ring_full_policy = RingFullPolicy::Error;
    });
    let b1 = random_batch(&mut rng, 2, 5);
    let b2 = random_batch(&mut rng, 2, 5);
    let b3 = random_batch(&mut rng, 2, 5);
    p.submit(&b1.view(), 1).unwrap();
    p.submit(&b2.view(), 2).unwrap();
    let e = p.submit(&b3.view(), 3).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State);
    assert!(e.to_string().contains("ring full"), "{e}");
    check_rows(&p, 1, &ids_of(&p, &b1), format);
    check_rows(&p, 2, &ids_of(&p, &b2), format);
    p.release_step(1).unwrap();
    p.submit(&b3.view(), 3).unwrap(); // the refused seq is still free to use
    check_rows(&p, 2, &ids_of(&p, &b2), format);
    check_rows(&p, 3, &ids_of(&p, &b3), format);

    // PLE_RING_WAIT: the submit blocks until another thread consumes
    let p = open(d.path(), |o| o.max_in_flight = 1);
    p.submit(&b1.view(), 1).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            p.release_step(1).unwrap();
        });
        p.submit(&b2.view(), 2).unwrap();
    });
    check_rows(&p, 2, &ids_of(&p, &b2), format);
}

#[test]
fn timeouts_return_within_their_bound() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |o| {
        o.max_in_flight = 1;
        o.wait_timeout_us = 60_000;
    });
    p.hooks().delay_us.store(1_500_000, Ordering::Relaxed);
    let mut rng = Rng(1);
    let b = random_batch(&mut rng, 1, 1);
    p.submit(&b.view(), 1).unwrap();
    let margin = Duration::from_millis(500); // generous: a loaded 2-core CI machine
    let t = Instant::now();
    let e = p.wait(1, 30_000).unwrap_err();
    let el = t.elapsed();
    assert_eq!(e.kind(), crate::ErrorKind::Timeout, "{e}");
    assert!(
        el >= Duration::from_millis(30) && el < Duration::from_millis(30) + margin,
        "{el:?}"
    );
    // 0 = the handle's default (60 ms)
    let t = Instant::now();
    assert_eq!(p.wait(1, 0).unwrap_err().kind(), crate::ErrorKind::Timeout);
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(60) && el < Duration::from_millis(60) + margin,
        "{el:?}"
    );
    // the ring wait of submit uses the default too
    let t = Instant::now();
    let e = p.submit(&b.view(), 2).unwrap_err();
    let el = t.elapsed();
    assert_eq!(e.kind(), crate::ErrorKind::Timeout, "{e}");
    assert!(
        el >= Duration::from_millis(60) && el < Duration::from_millis(60) + margin,
        "{el:?}"
    );
    assert_eq!(p.stats().timeouts, 3);
    // forever: returns when the step completes
    p.wait(1, u64::MAX).unwrap();
    p.hooks().delay_us.store(0, Ordering::Relaxed);
}

#[test]
fn failing_step_surfaces_in_its_wait_and_the_next_step_works() {
    let format = RowFormat::Bf16;
    let d = make_table(format, 2000);
    let p = open(d.path(), |o| o.max_in_flight = 2);
    let mut rng = Rng(8);
    let bs: Vec<B> = (0..5).map(|_| random_batch(&mut rng, 3, 40)).collect();
    p.hooks().fail_seq.store(2, Ordering::Relaxed);
    p.hooks().panic_seq.store(4, Ordering::Relaxed);
    p.submit(&bs[0].view(), 1).unwrap();
    p.submit(&bs[1].view(), 2).unwrap();
    let e = p.wait(2, 0).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("injected failure of step 2"), "{e}");
    // reported again to a second waiter, and by packed_rows
    assert!(p.wait(2, 0).unwrap_err().to_string().contains("injected"));
    assert!(
        p.packed_rows(2)
            .unwrap_err()
            .to_string()
            .contains("injected")
    );
    // the failed step holds no slot: step 3 fits although step 1 is not consumed
    p.submit(&bs[2].view(), 3).unwrap();
    check_rows(&p, 1, &ids_of(&p, &bs[0]), format);
    check_rows(&p, 3, &ids_of(&p, &bs[2]), format);
    p.release_step(2).unwrap(); // forgets the error
    p.wait(2, 0).unwrap(); // released: its failure was reported (and forgotten)
    p.release_step(1).unwrap();
    p.release_step(3).unwrap();
    // a panicking step is an error of that step, not of the process
    p.submit(&bs[3].view(), 4).unwrap();
    p.submit(&bs[4].view(), 5).unwrap();
    let e = p.wait(4, 0).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Panic, "{e}");
    // dequant of a failed step returns its error and consumes it
    let mut out = vec![0f32; 3 * 40 * 2560];
    // SAFETY: `out` holds 2560 f32, what one token needs, and nobody else uses it.
    let e = unsafe { p.dequant_cpu(4, out.as_mut_ptr() as *mut u8, f32_out(2560)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Panic);
    p.wait(4, 0).unwrap(); // consumed: its failure was reported by dequant_cpu
    check_rows(&p, 5, &ids_of(&p, &bs[4]), format);
    let s = p.stats();
    assert_eq!(s.failed_steps, 2);
    assert_eq!(s.prefill_steps + s.decode_steps, 3);
}

#[test]
fn bad_batches_fail_at_submit_and_consume_nothing() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |_| {});
    let ok = B::new(&[(1, 0, vec![5, 6, 7])], None);
    let bad_tok = B::new(&[(1, 0, vec![5, 248_320])], None);
    let missing_ctx = B::new(&[(2, 10, vec![5])], None);
    let mut bad_ctx_len = B::new(&[(1, 0, vec![5])], Some(vec![1]));
    for b in [&bad_tok, &missing_ctx] {
        assert_eq!(
            p.submit(&b.view(), 1).unwrap_err().kind(),
            crate::ErrorKind::InvalidArgument
        );
    }
    assert_eq!(
        p.submit(&bad_ctx_len.view(), 1).unwrap_err().kind(),
        crate::ErrorKind::InvalidArgument
    );
    bad_ctx_len.context = Some(vec![248_044, 248_044]); // position 0: EOS before the start
    let too_long = B::new(&[(1, 0, vec![1; 513])], None);
    assert_eq!(
        p.submit(&too_long.view(), 1).unwrap_err().kind(),
        crate::ErrorKind::InvalidArgument
    );
    // nothing was consumed or remembered: seq 1 and request 2's missing history stay as they were
    p.submit(&ok.view(), 1).unwrap();
    p.submit(&bad_ctx_len.view(), 2).unwrap();
    assert!(p.ngram_ids(&missing_ctx.view(), &mut [0; 16]).is_err());
    let s = p.stats();
    assert_eq!(s.failed_steps, 0);
}

#[test]
fn ngram_ids_has_no_side_effects() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |_| {});
    let first = B::new(&[(3, 0, vec![11, 12])], None);
    let next = B::new(&[(3, 2, vec![13])], None);
    let mut ids = vec![0i64; 32];
    p.ngram_ids(&first.view(), &mut ids).unwrap();
    // not committed: the continuation is still missing context
    assert_eq!(
        p.ngram_ids(&next.view(), &mut ids[..16])
            .unwrap_err()
            .kind(),
        crate::ErrorKind::InvalidArgument
    );
    p.submit(&first.view(), 1).unwrap();
    p.ngram_ids(&next.view(), &mut ids[..16]).unwrap();
    // same as the stateless form with context (11, 12) oldest first
    let stateless = B::new(&[(3, 2, vec![13])], Some(vec![11, 12]));
    let mut ids2 = vec![0i64; 16];
    p.ngram_ids(&stateless.view(), &mut ids2).unwrap();
    assert_eq!(ids[..16], ids2[..]);
    // wrong output size
    assert!(p.ngram_ids(&next.view(), &mut ids).is_err());
    // release forgets the history
    p.release_request(3);
    assert!(p.ngram_ids(&next.view(), &mut ids[..16]).is_err());
}

// The second half: consumption, counters, GPU-mode ring and lifecycle tests.
mod consume;

// The MMAP residency cap.
mod residency;

// Head shards.
mod shard;

// Rows by the engine's own ids (`submit_ids`).
mod ids;

/// Closing with the worker stuck; staging beyond the pre-touch cap.
mod open_close;

// Tables of other geometries (heads, head dim, n-gram size).
mod geometry;
