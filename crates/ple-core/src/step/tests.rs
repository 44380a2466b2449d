//! Tests of the step pipeline against independent expectations: rows are compared with
//! `synth::expected_row` (a pure function of the row id), never with what the pipeline read.

use super::*;
use crate::dequant::cpu as dequant;
use crate::dequant::cpu::{Dtype, OutArgs};
use crate::io::gather;
use crate::step::options::PrefetchPolicy;

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

#[test]
fn dequant_cpu_consumes_and_matches_rows() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 2000);
    let p = open(d.path(), |_| {});
    let mut rng = Rng(4);
    let b = random_batch(&mut rng, 5, 30);
    let ids = ids_of(&p, &b);
    let n = b.tokens.len();
    p.submit(&b.view(), 1).unwrap();
    let stride = 2600;
    let mut out = vec![f32::NAN; (n - 1) * stride + 2560];
    // bad arguments do not consume the step
    // SAFETY: `out` holds the step's tokens at `stride` f32 apart; the call is refused before writing.
    let e = unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, f32_out(2559)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    // SAFETY: 2 bytes into `out`, a Vec of more than 2 bytes: still inside the allocation.
    let misaligned = unsafe { (out.as_mut_ptr() as *mut u8).add(2) };
    // SAFETY: refused for its misalignment before anything is written.
    let e = unsafe { p.dequant_cpu(1, misaligned, f32_out(stride)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    // SAFETY: `out` holds `(n - 1) * stride + 2560` f32 and nobody else uses it.
    unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, f32_out(stride)) }.unwrap();
    let dq = dequant::Dequantizer::new(format, synth::global_scale(format));
    let mut want = [0f32; 160];
    for t in 0..n {
        for h in 0..16 {
            dq.row_f32(
                &synth::expected_row(SEED, format, ids[t * 16 + h] as u64),
                &mut want,
            );
            let got = &out[t * stride + h * 160..t * stride + (h + 1) * 160];
            assert_eq!(got, &want[..], "token {t} head {h}");
        }
    }
    p.wait(1, 0).unwrap(); // consumed and complete
    // SAFETY: as above; the step is already consumed, so nothing is written.
    let e = unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, f32_out(stride)) }.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State);
    let e = p
        .dequant_fuse(std::ptr::null_mut(), 1, 0, F32_OUT)
        .unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable);
}

#[test]
fn stats_count_steps_pages_and_prefetch() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 3000);
    let p = open(d.path(), |o| o.prefetch_policy = PrefetchPolicy::Always);
    let prefill = B::new(&[(1, 0, (100..140).collect())], None); // span of 40 > 8
    let verify = B::new(
        &[(2, 0, vec![1, 2, 3, 4, 5, 6, 7, 8]), (3, 0, vec![9])],
        None,
    ); // decode
    let single = B::new(&[(4, 0, vec![77])], None);
    let mut all_pages = 0;
    // unique pages counted independently (first and last 4 KiB page of each 90-byte row)
    let pages = |ids: &[i64]| {
        let mut v: Vec<u64> = ids
            .iter()
            .flat_map(|&r| [r as u64 * 90 / 4096, (r as u64 * 90 + 89) / 4096])
            .collect();
        v.sort();
        v.dedup();
        v.len() as u64
    };
    for (seq, b) in [(1, &prefill), (2, &verify), (3, &single)] {
        all_pages += pages(&ids_of(&p, b));
        p.submit(&b.view(), seq).unwrap();
        p.release_step(seq).unwrap();
    }
    let s = p.stats();
    assert_eq!((s.prefill_steps, s.decode_steps), (1, 2));
    assert_eq!((s.prefill_tokens, s.decode_tokens), (40, 10));
    assert_eq!((s.prefill_rows, s.decode_rows), (640, 160));
    assert_eq!(s.unique_pages, all_pages);
    assert_eq!(s.prefetch_steps, 3);
    assert_eq!(s.pages_prefetched, all_pages);
    assert!(s.hash_ns > 0 && s.gather_ns > 0 && s.prefill_step_ns > 0 && s.decode_step_ns > 0);
    assert_eq!(s.copy_ns, 0);
    let file = p.table().bytes().len() as u64;
    assert_eq!(s.table_pages, file.div_ceil(stats::os_page_size() as u64));
    assert!(s.resident_pages > 0 && s.resident_pages <= s.table_pages);
    assert!(s.mem_available_bytes > 0);
    drop(p);

    // NEVER: no prefetch whatever the size; distinct pages still counted — for a step big
    // enough for the pool, on the worker thread while the pool gathers; for a small one after
    // it is published
    let q = open(d.path(), |o| o.prefetch_policy = PrefetchPolicy::Never);
    let big = B::new(
        &[(5, 0, (0..100).map(|i| (i * 7919) % 150_000).collect())],
        None,
    );
    assert!(big.tokens.len() * 16 >= gather::PARALLEL_MIN_ROWS);
    let mut want_pages = 0;
    for (seq, b) in [(1, &prefill), (2, &big), (3, &single)] {
        want_pages += pages(&ids_of(&q, b));
        q.submit(&b.view(), seq).unwrap();
        check_rows(&q, seq, &ids_of(&q, b), format);
        q.release_step(seq).unwrap();
    }
    let s = q.stats();
    assert_eq!((s.prefetch_steps, s.pages_prefetched), (0, 0));
    assert_eq!(s.unique_pages, want_pages);
    assert!(s.queue_ns <= s.prefill_step_ns + s.decode_step_ns);
    drop(q);

    // AUTO: small steps never; big steps only when their pages are not cached
    let q = open(d.path(), |o| o.prefetch_min_rows = 100);
    q.submit(&single.view(), 1).unwrap();
    q.submit(&prefill.view(), 2).unwrap(); // the table was just written: cached
    q.wait(2, 0).unwrap();
    assert_eq!(q.stats().prefetch_steps, 0);
    drop(q);
    let rows = std::fs::File::open(d.path().join(crate::format::table::ROWS_FILE)).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise takes any fd and range; `rows` is an open file.
    unsafe { libc::posix_fadvise(rows.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let q = open(d.path(), |o| o.prefetch_min_rows = 100);
    if q.stats().resident_pages > 0 {
        eprintln!("(page cache could not be evicted here: cold AUTO case not checked)");
        return;
    }
    // 100 tokens = 1,600 rows: the prefetch is overlapped with the pool's gather
    let cold = B::new(&[(5, 0, (200..300).collect())], None);
    q.submit(&cold.view(), 1).unwrap();
    check_rows(&q, 1, &ids_of(&q, &cold), format);
    let s = q.stats();
    assert_eq!(s.prefetch_steps, 1);
    assert_eq!(s.pages_prefetched, pages(&ids_of(&q, &cold)));
    if stats::thread_read_bytes().is_some() {
        assert!(
            s.storage_read_bytes >= 4096 * s.pages_prefetched / 2,
            "{s:?}"
        );
    }
}

#[test]
fn table_info_describes_the_table() {
    let d = make_table(RowFormat::Fp8, 2000);
    let p = open(d.path(), |_| {});
    let i = p.table_info();
    let m = p.table().meta();
    assert_eq!(i.format, RowFormat::Fp8);
    assert_eq!((i.row_bytes, i.total_rows), (160, m.total_rows));
    assert_eq!(i.addressed_rows, m.hash.addressed_rows());
    assert_eq!((i.num_heads, i.head_dim, i.ngram_size), (16, 160, 3));
    assert_eq!((i.vocab_size, i.eos_token_id), (248_320, EOS));
    assert_eq!(i.global_scale, synth::global_scale(RowFormat::Fp8));
    assert_eq!(i.file_size, m.total_rows * 160);
    assert_eq!(i.source_name, m.source.name);
}

#[test]
fn drop_with_steps_in_flight_returns() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let mut rng = Rng(2);
    let p = open(d.path(), |o| o.max_in_flight = 4);
    p.hooks().delay_us.store(100_000, Ordering::Relaxed);
    for seq in 1..=4 {
        p.submit(&random_batch(&mut rng, 4, 50).view(), seq)
            .unwrap();
    }
    drop(p); // the running step finishes, queued ones are abandoned, threads joined
    // and one with a step mid-gather (no delay)
    let p = open(d.path(), |_| {});
    p.submit(&random_batch(&mut rng, 8, 60).view(), 1).unwrap();
    drop(p);
}

#[test]
fn threads_with_separate_handles() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 3000);
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let dir = d.path();
            s.spawn(move || {
                let p = open(dir, |o| {
                    o.num_threads = 1 + (t as u32 % 2);
                    o.max_in_flight = 1 + (t as u32 % 3);
                });
                let mut rng = Rng(100 + t);
                for seq in 1..=40u64 {
                    let n = 1 + rng.below(6) as usize;
                    let b = random_batch(&mut rng, n, 40);
                    let ids = ids_of(&p, &b);
                    p.submit(&b.view(), seq).unwrap();
                    check_rows(&p, seq, &ids, format);
                    p.release_step(seq).unwrap();
                }
            });
        }
    });
}

#[test]
fn one_handle_shared_by_a_submitter_and_waiters() {
    let format = RowFormat::Fp8;
    let d = make_table(format, 2000);
    let p = open(d.path(), |o| o.max_in_flight = 3);
    let mut rng = Rng(6);
    let batches: Vec<B> = (0..60).map(|_| random_batch(&mut rng, 3, 20)).collect();
    let ids: Vec<Vec<i64>> = batches.iter().map(|b| ids_of(&p, b)).collect();
    std::thread::scope(|s| {
        let p = &p;
        let ids = &ids;
        // a consumer thread waits on each step and checks and releases it
        s.spawn(move || {
            for (i, ids) in ids.iter().enumerate() {
                let seq = i as u64 + 1;
                loop {
                    match p.wait(seq, 0) {
                        Ok(()) => break,
                        Err(e) if e.kind() == crate::ErrorKind::State => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                }
                check_rows(p, seq, ids, format);
                p.release_step(seq).unwrap();
            }
        });
        for (i, b) in batches.iter().enumerate() {
            p.submit(&b.view(), i as u64 + 1).unwrap();
        }
    });
}

/// The GPU mode's ring (`seq % slots`, forced on the CPU here: the GPU side itself needs a
/// driver) serves the right rows through wraparound with sparse seqs, refuses or waits for an
/// occupied target slot, and never overwrites an unconsumed step.
#[test]
fn seq_mod_slots_ring_wraps_refuses_and_waits() {
    let format = RowFormat::Fp8;
    let d = make_table(format, 2000);
    let mut rng = Rng(5);
    FORCE_SLOT_BY_SEQ.with(|f| f.set(true));
    let p = open(d.path(), |o| {
        o.max_in_flight = 3;
        o.ring_full_policy = RingFullPolicy::Error;
    });
    let p_wait = open(d.path(), |o| o.max_in_flight = 2);
    FORCE_SLOT_BY_SEQ.with(|f| f.set(false));
    assert!(p.sh.slot_by_seq && p_wait.sh.slot_by_seq);

    let bs: Vec<B> = (0..4).map(|_| random_batch(&mut rng, 2, 5)).collect();
    p.submit(&bs[0].view(), 1).unwrap(); // slot 1
    p.submit(&bs[1].view(), 2).unwrap(); // slot 2
    // seq 4 needs slot 1, still held by step 1, although slot 0 is free
    let e = p.submit(&bs[3].view(), 4).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State);
    assert!(e.to_string().contains("ring full: slot 1"), "{e}");
    p.submit(&bs[2].view(), 3).unwrap(); // slot 0
    p.release_step(1).unwrap();
    p.submit(&bs[3].view(), 4).unwrap(); // slot 1 again
    for (seq, b) in [(2u64, &bs[1]), (3, &bs[2]), (4, &bs[3])] {
        check_rows(&p, seq, &ids_of(&p, b), format);
    }
    p.wait(1, 0).unwrap(); // released: complete (see gpu_tests.rs for the wait semantics)

    // sparse seqs through many wraparounds (3i + 1 alternates slots 1, 0 with 2 slots)
    let mut pending: VecDeque<(u64, Vec<i64>)> = VecDeque::new();
    for i in 0..100u64 {
        let seq = 3 * i + 1;
        let (nreq, len) = (1 + rng.below(4) as usize, 1 + rng.below(3));
        let b = random_batch(&mut rng, nreq, len);
        let ids = ids_of(&p_wait, &b);
        p_wait.submit(&b.view(), seq).unwrap();
        pending.push_back((seq, ids));
        if pending.len() == 2 {
            let (s, ids) = pending.pop_front().unwrap();
            check_rows(&p_wait, s, &ids, format);
            p_wait.release_step(s).unwrap();
        }
    }
    // PLE_RING_WAIT: seq s + 2 maps to the slot of the unconsumed step s (the other slot is
    // free): the submit waits until another thread releases step s
    let (s, ids) = pending.pop_front().unwrap();
    let b = random_batch(&mut rng, 1, 1);
    let next_ids = ids_of(&p_wait, &b);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            check_rows(&p_wait, s, &ids, format);
            p_wait.release_step(s).unwrap();
        });
        p_wait.submit(&b.view(), s + 2).unwrap(); // blocks until step s is released
    });
    check_rows(&p_wait, s + 2, &next_ids, format);
}

/// A handle opened without a CUDA device answers every GPU entry point with
/// CUDA_UNAVAILABLE, and reports no device waits.
#[test]
fn cpu_handle_gpu_entry_points_are_cuda_unavailable() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |_| {});
    assert!(p.sh.gpu.is_none());
    let null = std::ptr::null_mut();
    let errs = [
        p.graph_prepare(null, 1).unwrap_err(),
        p.dequant_fuse_graph(null, 8, 0x1000, F32_OUT).unwrap_err(),
        p.check_device().unwrap_err(),
        p.dequant_fuse(null, 1, 0x1000, F32_OUT).unwrap_err(),
    ];
    for e in errs {
        assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable, "{e}");
        assert!(e.to_string().contains("cuda_device = -1"), "{e}");
    }
    assert!(!p.table_info().device_wait_supported);
}

/// `cuda_device = 0` on a machine without a CUDA driver: `Pipeline::open` and `ple_open` fail
/// with CUDA_UNAVAILABLE and a message that says what to do. (Skipped where a driver loads.)
#[test]
fn cuda_device_without_driver_is_cuda_unavailable() {
    if crate::dequant::gpu::probe_driver().is_ok() {
        eprintln!("a CUDA driver is present: not checking the no-driver error");
        return;
    }
    let d = make_table(RowFormat::Nvfp4, 2000);
    let o = OpenOptions {
        max_tokens_per_step: 64,
        num_threads: 1,
        cuda_device: 0,
        ..OpenOptions::default()
    };
    let e = Pipeline::open(d.path(), o.clone())
        .err()
        .expect("open must fail");
    assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable, "{e}");

    assert!(e.to_string().contains("libcuda"), "{e}");
    assert!(e.to_string().contains("cuda_device = -1"), "{e}");
}

#[test]
fn pipeline_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Pipeline>();
}

/// `shutdown` (from `ple_close`) wakes every blocked call, whatever its timeout: a wait, the wait
/// inside a dequant, and a submit parked on a full ring all return `Error::State` at once.
#[test]
fn shutdown_wakes_every_blocked_call() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = Arc::new(open(d.path(), |o| {
        o.max_in_flight = 1;
        o.wait_timeout_us = u64::MAX;
    }));
    p.hooks().delay_us.store(3_000_000, Ordering::Relaxed);
    let mut rng = Rng(3);
    let b = random_batch(&mut rng, 1, 1);
    p.submit(&b.view(), 1).unwrap();
    let t = Instant::now();
    let waiters: Vec<_> = (0..3)
        .map(|k| {
            let (p, b) = (p.clone(), b.clone());
            std::thread::spawn(move || match k {
                0 => p.wait(1, u64::MAX),
                1 => {
                    let mut out = vec![0f32; 2560];
                    // SAFETY: `out` holds the one token's row.
                    unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, F32_OUT) }
                }
                _ => p.submit(&b.view(), 2),
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    p.shutdown();
    for w in waiters {
        let e = w.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::State, "{e}");
    }
    let el = t.elapsed();
    assert!(
        el < Duration::from_millis(2_000),
        "woken after {el:?}, step takes 3 s"
    );
}

/// `poll` never blocks: `Timeout` while the step runs, `Ok` once it is done, and it is not counted
/// as a timeout.
#[test]
fn poll_does_not_wait() {
    let d = make_table(RowFormat::Nvfp4, 2000);
    let p = open(d.path(), |_| {});
    p.hooks().delay_us.store(300_000, Ordering::Relaxed);
    let mut rng = Rng(4);
    let b = random_batch(&mut rng, 1, 1);
    p.submit(&b.view(), 1).unwrap();
    let t = Instant::now();
    assert_eq!(p.poll(1).unwrap_err().kind(), crate::ErrorKind::Timeout);
    assert!(t.elapsed() < Duration::from_millis(100));
    p.wait(1, u64::MAX).unwrap();
    p.poll(1).unwrap();
    assert_eq!(p.poll(9).unwrap_err().kind(), crate::ErrorKind::State);
    assert_eq!(p.stats().timeouts, 0);
}
