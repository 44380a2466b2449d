//! Tests of the context rules: hand-written expectations, error cases, and the `docs/FORMAT.md#the-n-gram-hash`
//! invariants as properties against a plain whole-sequence reference.

use super::*;
use crate::model::{EOS_TOKEN_ID, HashParams, ModelConfig, VOCAB_SIZE};
use proptest::prelude::*;

const EOS: i32 = EOS_TOKEN_ID;
const H: usize = 16;

fn hasher() -> Hasher {
    Hasher::new(&HashParams::derive(&ModelConfig::default())).unwrap()
}

/// The context rule of `docs/FORMAT.md#the-n-gram-hash` taken literally on a whole sequence: s = one past the last EOS strictly before p;
/// ctx_k = t[p-k] if p-k >= s else EOS; ids with the plain-% reference.
fn reference_ids(h: &Hasher, seq: &[i32]) -> Vec<u64> {
    let k = h.context_len();
    let mut out = vec![0; seq.len() * h.num_heads()];
    for p in 0..seq.len() {
        let s = (0..p).rev().find(|&q| seq[q] == EOS).map_or(0, |q| q + 1);
        let ctx: Vec<i32> = (1..=k)
            .map(|j| {
                if p >= j && p - j >= s {
                    seq[p - j]
                } else {
                    EOS
                }
            })
            .collect();
        let hn = h.num_heads();
        h.ids_reference(seq[p], &ctx, &mut out[p * hn..(p + 1) * hn]);
    }
    out
}

/// The raw tokens before position p, oldest first, EOS before the start (no cut applied: the
/// library must apply it).
fn raw_context(seq: &[i32], p: usize, k: usize) -> Vec<i32> {
    (0..k)
        .map(|s| {
            let back = k - s;
            if p >= back { seq[p - back] } else { EOS }
        })
        .collect()
}

#[derive(Debug, Default)]
struct OwnedBatch {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    ids: Vec<u64>,
    qs: Vec<u32>,
    ctx: Option<Vec<i32>>,
}

impl OwnedBatch {
    /// Spans `(request id, first position, tokens)`.
    fn new(spans: &[(u64, usize, &[i32])]) -> OwnedBatch {
        let mut b = OwnedBatch {
            qs: vec![0],
            ..Default::default()
        };
        for &(id, p, toks) in spans {
            b.ids.push(id);
            b.tokens.extend_from_slice(toks);
            b.positions.extend((p..p + toks.len()).map(|x| x as i32));
            b.qs.push(b.tokens.len() as u32);
        }
        b
    }

    fn with_ctx(mut self, ctx: Vec<i32>) -> OwnedBatch {
        self.ctx = Some(ctx);
        self
    }

    fn view(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.ids,
            query_start: &self.qs,
            context: self.ctx.as_deref(),
        }
    }
}

/// What `ple_submit` + `ple_ngram_ids` do in tracked mode.
fn run_tracked(h: &Hasher, tr: &mut Tracker, ob: &OwnedBatch) -> Result<Vec<u64>> {
    let b = ob.view();
    validate_batch(&b, VOCAB_SIZE, 1 << 16)?;
    let ctx = resolve_contexts(&b, Some(tr), EOS, 3)?;
    tr.commit(&b)?;
    let mut ids = vec![0; b.num_tokens() * H];
    compute_ids(h, &b, &ctx, &mut ids);
    Ok(ids)
}

fn run_stateless(h: &Hasher, ob: &OwnedBatch) -> Result<Vec<u64>> {
    let b = ob.view();
    validate_batch(&b, VOCAB_SIZE, 1 << 16)?;
    let ctx = resolve_contexts(&b, None, EOS, 3)?;
    let mut ids = vec![0; b.num_tokens() * H];
    compute_ids(h, &b, &ctx, &mut ids);
    Ok(ids)
}

fn msg(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(e @ Error::InvalidArgument(_)) => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-written expectations
// ---------------------------------------------------------------------------------------------

#[test]
fn spec_vector_through_tracked_and_stateless_paths() {
    let h = hasher();
    let want: Vec<u64> = vec![
        16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897,
        169641436, 182022480, 209277433, 237891023, 256841529, 277007269, 290665954, 300984276,
    ];
    let mut tr = Tracker::new(3, EOS, 64).unwrap();
    let ob = OwnedBatch::new(&[(7, 0, &[9707])]);
    assert_eq!(run_tracked(&h, &mut tr, &ob).unwrap(), want);
    let ob = OwnedBatch::new(&[(7, 0, &[9707])]).with_ctx(vec![EOS, EOS]);
    assert_eq!(run_stateless(&h, &ob).unwrap(), want);
    // An EOS just before the token gives the same ids as the start of a sequence.
    let ob = OwnedBatch::new(&[(7, 5, &[9707])]).with_ctx(vec![123, EOS]);
    assert_eq!(run_stateless(&h, &ob).unwrap(), want);
    let mut i64s = vec![0i64; 16];
    let b = ob.view();
    let ctx = resolve_contexts(&b, None, EOS, 3).unwrap();
    compute_ids_i64(&h, &b, &ctx, &mut i64s);
    assert_eq!(i64s, want.iter().map(|&x| x as i64).collect::<Vec<_>>());
}

#[test]
fn eos_cut_by_hand() {
    let (a, b_, c, d) = (11, 22, 33, 44);
    let seq = [a, b_, EOS, c, d, EOS, EOS, a];
    let ob = OwnedBatch::new(&[(1, 0, &seq)]);
    let mut tr = Tracker::new(3, EOS, 8).unwrap();
    let ctx = resolve_contexts(&ob.view(), Some(&tr), EOS, 3).unwrap();
    #[rustfmt::skip]
    let want = vec![
        EOS, EOS, // a: start of sequence
        a, EOS,   // b: ctx2 before the start
        b_, a,    // EOS: its own EOS does not cut its context
        EOS, EOS, // c: ctx1 is EOS, so ctx2 is cut
        c, EOS,   // d: ctx2 is the EOS
        d, c,     // EOS
        EOS, EOS, // EOS after EOS
        EOS, EOS, // a
    ];
    assert_eq!(ctx, want);
    // The same with the context coming across a span boundary, one token per step.
    let mut got = Vec::new();
    for (p, &t) in seq.iter().enumerate() {
        let ob = OwnedBatch::new(&[(1, p, &[t])]);
        let b = ob.view();
        got.extend(resolve_contexts(&b, Some(&tr), EOS, 3).unwrap());
        tr.commit(&b).unwrap();
    }
    assert_eq!(got, want);
    // And stateless, with the raw tokens before each one-token span.
    let mut got = Vec::new();
    for p in 0..seq.len() {
        let ob = OwnedBatch::new(&[(1, p, &seq[p..p + 1])]).with_ctx(raw_context(&seq, p, 2));
        got.extend(resolve_contexts(&ob.view(), None, EOS, 3).unwrap());
    }
    assert_eq!(got, want);
}

#[test]
fn four_gram_cut_by_hand() {
    let seq = [1, 2, 3, EOS, 4, 5, 6];
    let ob = OwnedBatch::new(&[(9, 0, &seq)]);
    let tr = Tracker::new(4, EOS, 8).unwrap();
    let ctx = resolve_contexts(&ob.view(), Some(&tr), EOS, 4).unwrap();
    #[rustfmt::skip]
    let want = vec![
        EOS, EOS, EOS,
        1, EOS, EOS,
        2, 1, EOS,
        3, 2, 1,
        EOS, EOS, EOS,
        4, EOS, EOS,
        5, 4, EOS,
    ];
    assert_eq!(ctx, want);
}

// ---------------------------------------------------------------------------------------------
// Tracker: missing context, rollback, release, atomicity
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_request_past_zero_is_missing_context() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 16).unwrap();
    let m = msg(run_tracked(&h, &mut tr, &OwnedBatch::new(&[(42, 3, &[5])])));
    assert!(
        m.contains("missing context") && m.contains("id 42") && m.contains("position 2"),
        "{m}"
    );
    assert_eq!(tr.num_requests(), 0);
}

#[test]
fn gap_is_missing_context() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 16).unwrap();
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &[5, 6, 7])])).unwrap();
    let m = msg(run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 4, &[8])])));
    assert!(
        m.contains("missing context") && m.contains("position 3"),
        "{m}"
    );
    assert!(m.contains("positions 0..=2 are known"), "{m}");
    // Continuing at the right position works.
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 3, &[8])])).unwrap();
}

#[test]
fn rollback_past_window_is_missing_context() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 4).unwrap();
    let seq: Vec<i32> = (100..110).collect();
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &seq)])).unwrap();
    assert_eq!(tr.known_positions(1), Some(6..10));
    // p = 8 reads 7 and 6: known.
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 8, &[1, 2])])).unwrap();
    // p = 7 reads 6 and 5: 5 is gone.
    let m = msg(run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 7, &[3])])));
    assert!(
        m.contains("missing context") && m.contains("position 5"),
        "{m}"
    );
    // Restarting the request at 0 needs nothing.
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &[3])])).unwrap();
    assert_eq!(tr.known_positions(1), Some(0..1));
}

#[test]
fn eos_makes_older_positions_unneeded() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 2).unwrap();
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &[1, 2, 3, EOS, 4])])).unwrap();
    assert_eq!(tr.known_positions(1), Some(3..5));
    // p = 4 reads 3 (EOS) only; 2 is forgotten but not needed.
    let ids = run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 4, &[9])])).unwrap();
    assert_eq!(ids, reference_ids(&h, &[1, 2, 3, EOS, 9])[4 * H..]);
}

#[test]
fn failed_batch_changes_nothing() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 16).unwrap();
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &[5, 6, 7])])).unwrap();
    // Request 1 is fine (a rollback to 1), request 2 lacks context: nothing may change.
    let bad = OwnedBatch::new(&[(1, 1, &[9, 9]), (2, 5, &[1])]);
    let m = msg(run_tracked(&h, &mut tr, &bad));
    assert!(m.contains("request 1 (id 2)"), "{m}");
    assert_eq!(tr.known_positions(1), Some(0..3));
    assert_eq!(tr.known_positions(2), None);
    let ids = run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 3, &[8])])).unwrap();
    assert_eq!(ids, reference_ids(&h, &[5, 6, 7, 8])[3 * H..]);
}

#[test]
fn release_forgets() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 16).unwrap();
    run_tracked(
        &h,
        &mut tr,
        &OwnedBatch::new(&[(1, 0, &[5, 6]), (2, 0, &[7])]),
    )
    .unwrap();
    assert!(tr.release(1));
    assert!(!tr.release(1));
    assert_eq!(tr.num_requests(), 1);
    assert!(run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 2, &[1])])).is_err());
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(2, 1, &[1])])).unwrap();
}

#[test]
fn reused_id_restarting_at_zero_sees_no_old_tokens() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 16).unwrap();
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &[5, 6, 7, 8])])).unwrap();
    let ids = run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &[9, 10])])).unwrap();
    assert_eq!(ids, reference_ids(&h, &[9, 10]));
    assert_eq!(tr.known_positions(1), Some(0..2));
}

#[test]
fn long_span_keeps_only_the_window() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 5).unwrap();
    let seq: Vec<i32> = (1..=100).collect();
    run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 0, &seq[..60])])).unwrap();
    assert_eq!(tr.known_positions(1), Some(55..60));
    let ids = run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 60, &seq[60..])])).unwrap();
    assert_eq!(ids, reference_ids(&h, &seq)[60 * H..]);
    // Roll back 3 positions (within the window) and diverge.
    let ids = run_tracked(&h, &mut tr, &OwnedBatch::new(&[(1, 97, &[7, 8])])).unwrap();
    let mut alt = seq[..97].to_vec();
    alt.extend([7, 8]);
    assert_eq!(ids, reference_ids(&h, &alt)[97 * H..]);
    assert_eq!(tr.known_positions(1), Some(95..99));
}

#[test]
fn tracker_needs_a_window_for_the_context() {
    assert!(Tracker::new(3, EOS, 1).is_err());
    assert!(Tracker::new(1, EOS, 8).is_err());
    Tracker::new(3, EOS, 2).unwrap();
    let tr = Tracker::new(4, EOS, 8).unwrap();
    let ob = OwnedBatch::new(&[(1, 0, &[1])]);
    assert!(resolve_contexts(&ob.view(), Some(&tr), EOS, 3).is_err());
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

#[test]
fn validation_errors_name_the_culprit() {
    let v = |ob: &OwnedBatch| msg(validate_batch(&ob.view(), VOCAB_SIZE, 8));

    let m = v(&OwnedBatch::new(&[(5, 0, &[1, VOCAB_SIZE as i32])]));
    assert!(
        m.contains("request 0 (id 5) token 1") && m.contains("248320"),
        "{m}"
    );
    let m = v(&OwnedBatch::new(&[(5, 0, &[1]), (6, 3, &[-4])]));
    assert!(
        m.contains("request 1 (id 6) token 1") && m.contains("-4"),
        "{m}"
    );

    let mut ob = OwnedBatch::new(&[(5, 0, &[1, 2])]);
    ob.positions = vec![-1, 0];
    assert!(v(&ob).contains("negative position -1"));

    let mut ob = OwnedBatch::new(&[(5, 0, &[1, 2, 3])]);
    ob.positions = vec![4, 5, 7];
    let m = v(&ob);
    assert!(
        m.contains("token 2") && m.contains("position 7 follows position 5"),
        "{m}"
    );
    ob.positions = vec![i32::MAX - 1, i32::MAX, i32::MIN];
    assert!(v(&ob).contains("consecutive"));

    let mut ob = OwnedBatch::new(&[(5, 0, &[1, 2, 3])]);
    ob.qs = vec![1, 3];
    assert!(v(&ob).contains("query_start[0] is 1"));
    ob.qs = vec![0, 2];
    assert!(v(&ob).contains("expected num_tokens 3"));
    ob.qs = vec![0, 4];
    assert!(v(&ob).contains("past the batch"));
    ob.qs = vec![0, 3, 3];
    assert!(v(&ob).contains("query_start offsets"));
    let mut ob = OwnedBatch::new(&[(5, 0, &[1, 2]), (6, 0, &[3])]);
    ob.qs = vec![0, 3, 2];
    assert!(v(&ob).contains("decreases at request 1 (id 6)"));

    let m = v(&OwnedBatch::new(&[
        (5, 0, &[1]),
        (6, 0, &[2]),
        (5, 1, &[3]),
    ]));
    assert!(
        m.contains("request id 5 appears twice in the batch (requests 0 and 2)"),
        "{m}"
    );

    assert!(v(&OwnedBatch::new(&[(5, 0, &[])])).contains("no tokens"));
    assert!(v(&OwnedBatch::new(&[])).contains("no tokens"));
    assert!(v(&OwnedBatch::new(&[(5, 0, &[1; 9])])).contains("more than max_tokens_per_step 8"));

    let ob = OwnedBatch::new(&[(5, 4, &[1]), (6, 4, &[2])]).with_ctx(vec![1, 2, 3, 248_320]);
    let m = v(&ob);
    assert!(
        m.contains("request 1 (id 6) context token 1") && m.contains("248320"),
        "{m}"
    );

    let mut ob = OwnedBatch::new(&[(5, 0, &[1])]);
    ob.positions.clear();
    assert!(v(&ob).contains("positions"));

    // Empty spans are allowed; a good batch passes.
    validate_batch(
        &OwnedBatch::new(&[(5, 0, &[1, 2]), (6, 9, &[]), (7, 3, &[4])]).view(),
        VOCAB_SIZE,
        8,
    )
    .unwrap();
}

#[test]
fn stateless_context_errors() {
    let h = hasher();
    let ob = OwnedBatch::new(&[(5, 0, &[1])]).with_ctx(vec![EOS]);
    assert!(msg(run_stateless(&h, &ob)).contains("batch.context has 1 tokens"));
    // A slot for a position before 0 must hold EOS (a zero-filled buffer is a caller bug).
    let ob = OwnedBatch::new(&[(5, 1, &[1])]).with_ctx(vec![0, 7]);
    let m = msg(run_stateless(&h, &ob));
    assert!(m.contains("position -1 < 0 and must be EOS"), "{m}");
    let ob = OwnedBatch::new(&[(5, 1, &[1])]).with_ctx(vec![EOS, 7]);
    assert_eq!(
        run_stateless(&h, &ob).unwrap(),
        reference_ids(&h, &[7, 1])[H..]
    );
    // Neither context nor tracker.
    let ob = OwnedBatch::new(&[(5, 1, &[1])]);
    assert!(msg(resolve_contexts(&ob.view(), None, EOS, 3)).contains("no context"));
}

#[test]
fn empty_spans_are_harmless() {
    let h = hasher();
    let mut tr = Tracker::new(3, EOS, 8).unwrap();
    let ob = OwnedBatch::new(&[(1, 0, &[]), (2, 0, &[4, 5]), (3, 77, &[])]);
    let ids = run_tracked(&h, &mut tr, &ob).unwrap();
    assert_eq!(ids, reference_ids(&h, &[4, 5]));
    assert_eq!(tr.num_requests(), 1);
}

// ---------------------------------------------------------------------------------------------
// Properties (the context invariants of docs/FORMAT.md#the-n-gram-hash)
// ---------------------------------------------------------------------------------------------

/// Token streams with EOS sprinkled in and small ids that repeat.
fn token() -> impl Strategy<Value = i32> {
    prop_oneof![
        2 => Just(EOS),
        8 => 0..VOCAB_SIZE as i32,
        3 => 0i32..6,
        1 => Just(VOCAB_SIZE as i32 - 1),
    ]
}

fn sequences() -> impl Strategy<Value = Vec<Vec<i32>>> {
    proptest::collection::vec(proptest::collection::vec(token(), 1..40), 1..5)
}

/// A small deterministic generator for schedules.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        crate::model::splitmix64({
            self.0 = self.0.wrapping_add(1);
            self.0
        })
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Tracked,
    Stateless,
}

/// Feeds `seqs` (request ids `ids`) through batches: each step takes a random non-empty subset
/// of the unfinished requests in random order, each with a chunk of 1..=max_chunk tokens (all
/// remaining when `max_chunk` is 0). Returns each request's ids by position.
fn run_schedule(
    h: &Hasher,
    seqs: &[Vec<i32>],
    ids: &[u64],
    rng: &mut Rng,
    max_chunk: usize,
    mode: Mode,
) -> Vec<Vec<u64>> {
    let mut tr = Tracker::new(3, EOS, 4).unwrap();
    let mut next = vec![0usize; seqs.len()];
    let mut out: Vec<Vec<u64>> = seqs.iter().map(|s| vec![u64::MAX; s.len() * H]).collect();
    loop {
        let mut open: Vec<usize> = (0..seqs.len())
            .filter(|&r| next[r] < seqs[r].len())
            .collect();
        if open.is_empty() {
            break;
        }
        rng.shuffle(&mut open);
        open.truncate(1 + rng.below(open.len()));
        let mut spans = Vec::new();
        let mut ctx = Vec::new();
        for &r in &open {
            let p = next[r];
            let left = seqs[r].len() - p;
            let len = if max_chunk == 0 {
                left
            } else {
                (1 + rng.below(max_chunk)).min(left)
            };
            spans.push((ids[r], p, &seqs[r][p..p + len]));
            ctx.extend(raw_context(&seqs[r], p, 2));
        }
        let mut ob = OwnedBatch::new(&spans);
        let got = match mode {
            Mode::Tracked => run_tracked(h, &mut tr, &ob).unwrap(),
            Mode::Stateless => {
                ob.ctx = Some(ctx);
                run_stateless(h, &ob).unwrap()
            }
        };
        for (i, &r) in open.iter().enumerate() {
            let span = ob.view().span(i);
            let p = next[r];
            out[r][p * H..(p + span.len()) * H].copy_from_slice(&got[span.start * H..span.end * H]);
            next[r] += span.len();
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Invariants 1 and 3: prefill, any chunking, token-by-token decode, any batch order and
    /// interleaving, tracked or stateless: every request gets the ids of its own sequence.
    #[test]
    fn chunking_order_and_mode_do_not_change_ids(seqs in sequences(), seed in any::<u64>()) {
        let h = hasher();
        let want: Vec<Vec<u64>> = seqs.iter().map(|s| reference_ids(&h, s)).collect();
        let mut rng = Rng(seed);
        let mut ids: Vec<u64> = (0..seqs.len() as u64).map(|i| rng.next() ^ i).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assume!(ids.len() == seqs.len());
        for mode in [Mode::Tracked, Mode::Stateless] {
            for max_chunk in [0, 1, 3, 17] {
                let got = run_schedule(&h, &seqs, &ids, &mut rng, max_chunk, mode);
                prop_assert_eq!(&got, &want, "mode {:?} max_chunk {}", mode, max_chunk);
            }
        }
    }

    /// Invariant 2: speculative decoding. Each step submits at the first unaccepted position the
    /// verified token, some accepted drafts and some rejected ones (EOS among them); the next
    /// step resubmits from the first rejected position, sometimes further back. Another request
    /// decodes alongside. Every position's last ids must be those of the accepted sequence.
    #[test]
    fn speculative_rollback_gives_ids_of_accepted_sequence(
        accepted in proptest::collection::vec(token(), 1..60),
        other in proptest::collection::vec(token(), 1..60),
        seed in any::<u64>(),
        window in 8u32..12,
    ) {
        let h = hasher();
        let mut rng = Rng(seed);
        let mut tr = Tracker::new(3, EOS, window).unwrap();
        let want = reference_ids(&h, &accepted);
        let want_other = reference_ids(&h, &other);
        let mut got = vec![u64::MAX; accepted.len() * H];
        let mut got_other = vec![u64::MAX; other.len() * H];
        let (mut l, mut lo) = (0usize, 0usize);
        while l < accepted.len() {
            let k = 1 + rng.below(5); // tokens submitted
            let j = 1 + rng.below(k); // of which accepted (the first is always right)
            let draft: Vec<i32> = (0..k)
                .map(|i| {
                    let good = accepted.get(l + i).copied();
                    match (i < j, good) {
                        (true, Some(t)) => t,
                        (_, g) => loop {
                            let t = [EOS, 3, (rng.next() % VOCAB_SIZE as u64) as i32][rng.below(3)];
                            if Some(t) != g { break t; }
                        },
                    }
                })
                .collect();
            let mut spans = vec![(1u64, l, &draft[..])];
            if lo < other.len() {
                spans.push((2u64, lo, &other[lo..lo + 1]));
            }
            rng.shuffle(&mut spans);
            let ob = OwnedBatch::new(&spans);
            let ids = run_tracked(&h, &mut tr, &ob).unwrap();
            for (i, &(id, p, toks)) in spans.iter().enumerate() {
                let s = ob.view().span(i);
                if id == 1 {
                    let acc = j.min(accepted.len() - p).min(toks.len());
                    got[p * H..(p + acc) * H].copy_from_slice(&ids[s.start * H..(s.start + acc) * H]);
                } else {
                    got_other[p * H..(p + 1) * H].copy_from_slice(&ids[s.start * H..s.end * H]);
                    lo += 1;
                }
            }
            // Accepted up to l + j; sometimes resubmit from further back (within the window).
            // (window >= 8 >= drafts + back + 2 context tokens, so the context is always known)
            let back = rng.below(3);
            l = ((l + j).min(accepted.len()).saturating_sub(back)).max(l + 1);
        }
        while lo < other.len() {
            let ob = OwnedBatch::new(&[(2, lo, &other[lo..lo + 1])]);
            let ids = run_tracked(&h, &mut tr, &ob).unwrap();
            got_other[lo * H..(lo + 1) * H].copy_from_slice(&ids);
            lo += 1;
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(got_other, want_other);
    }

    /// The per-span context the tracker resolves is exactly the (raw) tokens before the span,
    /// after the EOS cut: tracked and stateless modes agree span by span.
    #[test]
    fn tracker_context_equals_raw_context(seq in proptest::collection::vec(token(), 1..50), seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let mut tr = Tracker::new(3, EOS, 3).unwrap();
        let mut p = 0;
        while p < seq.len() {
            let len = (1 + rng.below(4)).min(seq.len() - p);
            let ob = OwnedBatch::new(&[(1, p, &seq[p..p + len])]);
            let from_tracker = resolve_contexts(&ob.view(), Some(&tr), EOS, 3).unwrap();
            let ob2 = OwnedBatch::new(&[(1, p, &seq[p..p + len])]).with_ctx(raw_context(&seq, p, 2));
            let from_caller = resolve_contexts(&ob2.view(), None, EOS, 3).unwrap();
            prop_assert_eq!(from_tracker, from_caller);
            tr.commit(&ob.view()).unwrap();
            p += len;
        }
    }
}

proptest! {
    /// The pairwise duplicate search (small batches) and the map (big ones) both find the pair a
    /// plain double loop finds: the smallest second index, with its first occurrence.
    #[test]
    fn first_duplicate_matches_double_loop(ids in proptest::collection::vec(0u64..40, 0..80)) {
        let mut want = None;
        'outer: for i in 0..ids.len() {
            for j in 0..i {
                if ids[j] == ids[i] {
                    want = Some((j, i));
                    break 'outer;
                }
            }
        }
        prop_assert_eq!(first_duplicate(&ids), want);
    }
}
