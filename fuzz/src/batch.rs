//! Target `batch_context`: batch validation and context resolution over arbitrary step
//! sequences, tracked and stateless, checked against an oracle that keeps every request's whole
//! accepted sequence and applies the context rule of `docs/FORMAT.md#the-n-gram-hash` literally.

use ple_core::error::Error;
use ple_core::lookup::context::{Batch, Tracker, resolve_contexts, validate_batch};
use std::collections::HashMap;

/// Reads the fuzzer's bytes one at a time; 0 once they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn below(&mut self, n: u8) -> u8 {
        self.next() % n
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const VOCAB: u32 = 16;
const EOS: i32 = 15;
const MAX_TOKENS: u32 = 32;
const IDS: u8 = 5;

/// An owned batch.
#[derive(Default)]
struct Owned {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    ids: Vec<u64>,
    starts: Vec<u32>,
    context: Option<Vec<i32>>,
}

impl Owned {
    fn view(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.ids,
            query_start: &self.starts,
            context: self.context.as_deref(),
        }
    }
}

/// The context rule taken literally: `ctx_j` of position `q` of `seq` (ctx_1 first).
fn literal(seq: &[i32], q: usize, k: usize) -> Vec<i32> {
    let s = seq[..q]
        .iter()
        .rposition(|&t| t == EOS)
        .map_or(0, |i| i + 1);
    (1..=k)
        .map(|j| {
            if q >= j && q - j >= s {
                seq[q - j]
            } else {
                EOS
            }
        })
        .collect()
}

/// The positions before `p` the tracker must read: walking back from `p - 1`, stopping at
/// position 0, after `k` positions, or after an EOS. `None` where the oracle does not know one.
fn needed(seq: &[i32], p: usize, k: usize) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for j in 1..=k.min(p) {
        let t = *seq.get(p - j)?;
        v.push(p - j);
        if t == EOS {
            break;
        }
    }
    Some(v)
}

/// A batch of up to three spans whose positions append, roll back, restart or leave a gap, and
/// whose tokens are mostly valid.
fn gen_batch(r: &mut Bytes, oracle: &HashMap<u64, Vec<i32>>) -> Owned {
    let mut b = Owned {
        starts: vec![0],
        ..Default::default()
    };
    for _ in 0..1 + r.below(3) {
        let id = r.below(IDS) as u64;
        let len = oracle.get(&id).map_or(0, Vec::len);
        let p = match r.below(4) {
            0 => len,
            1 => len - (r.next() as usize % (len + 1)),
            2 => 0,
            _ => len + 1 + r.below(3) as usize,
        };
        for i in 0..r.below(5) as usize {
            b.tokens.push(match r.below(20) {
                16 => -1,
                17 => VOCAB as i32,
                t => (t % 16) as i32,
            });
            b.positions.push((p + i) as i32);
        }
        b.ids.push(id);
        b.starts.push(b.tokens.len() as u32);
    }
    b
}

/// A batch with arbitrary (mostly malformed) structure.
fn gen_malformed(r: &mut Bytes) -> Owned {
    let v = |r: &mut Bytes| (0..r.below(6)).map(|_| r.next()).collect::<Vec<u8>>();
    let tokens = v(r).into_iter().map(|x| x as i32 - 8).collect();
    let positions = v(r).into_iter().map(|x| x as i32 - 2).collect();
    let ids = v(r).into_iter().map(|x| (x % 4) as u64).collect();
    let starts = v(r).into_iter().map(|x| (x % 8) as u32).collect();
    let context = (r.below(2) == 1).then(|| v(r).into_iter().map(|x| x as i32).collect());
    Owned {
        tokens,
        positions,
        ids,
        starts,
        context,
    }
}

struct State {
    k: usize,
    ngram: u32,
    tracker: Tracker,
    oracle: HashMap<u64, Vec<i32>>,
}

impl State {
    fn known(&self) -> Vec<Option<std::ops::Range<i64>>> {
        (0..IDS as u64)
            .map(|id| self.tracker.known_positions(id))
            .collect()
    }

    /// The expected per-token contexts of a valid batch (`None` if a span starts past what the
    /// oracle knows).
    fn expected(&self, b: &Owned) -> Option<Vec<i32>> {
        let mut out = Vec::new();
        let v = b.view();
        for i in 0..b.ids.len() {
            let span = v.span(i);
            if span.is_empty() {
                continue;
            }
            let seq = self.oracle.get(&b.ids[i]).map_or(&[][..], Vec::as_slice);
            let p = b.positions[span.start] as usize;
            if p > seq.len() {
                return None;
            }
            let mut full = seq[..p].to_vec();
            full.extend_from_slice(&b.tokens[span.clone()]);
            for q in p..p + span.len() {
                out.extend(literal(&full, q, self.k));
            }
        }
        Some(out)
    }

    /// The stateless context `[num_requests][k]` (oldest first) the oracle gives for `b`.
    fn stateless_context(&self, b: &Owned) -> Option<Vec<i32>> {
        let v = b.view();
        let mut ctx = vec![EOS; b.ids.len() * self.k];
        for i in 0..b.ids.len() {
            let span = v.span(i);
            if span.is_empty() {
                continue;
            }
            let seq = self.oracle.get(&b.ids[i]).map_or(&[][..], Vec::as_slice);
            let p = b.positions[span.start] as usize;
            needed(seq, p, self.k)?;
            let c = literal(&seq[..p.min(seq.len())], p.min(seq.len()), self.k);
            for (j, t) in c.into_iter().enumerate() {
                ctx[i * self.k + self.k - 1 - j] = t;
            }
        }
        Some(ctx)
    }

    /// Submits `b` as the pipeline does; returns whether the tracker accepted it.
    fn submit(&mut self, b: &mut Owned) -> bool {
        let before = self.known();
        if let Err(e) = validate_batch(&b.view(), VOCAB, MAX_TOKENS) {
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let _ = self.tracker.clone().submit(&b.view());
            return false;
        }
        let got = resolve_contexts(&b.view(), Some(&self.tracker), EOS, self.ngram);
        let want = self.expected(b);
        let v = b.view();
        // Spans whose needed positions the tracker holds must resolve.
        let all_held = (0..b.ids.len()).all(|i| {
            let span = v.span(i);
            let seq = self.oracle.get(&b.ids[i]).map_or(&[][..], Vec::as_slice);
            span.is_empty()
                || needed(seq, b.positions[span.start] as usize, self.k).is_some_and(|n| {
                    let known = self.tracker.known_positions(b.ids[i]);
                    n.iter()
                        .all(|&q| known.as_ref().is_some_and(|r| r.contains(&(q as i64))))
                })
        });
        let accepted = got.is_ok();
        match got {
            Ok(ctx) => {
                let want = want.expect("the tracker resolved a position nobody submitted");
                assert_eq!(ctx, want, "tracked context differs from the literal rule");
                self.tracker
                    .commit(&b.view())
                    .expect("commit after resolve");
                for i in 0..b.ids.len() {
                    let span = b.view().span(i);
                    if span.is_empty() {
                        continue;
                    }
                    let seq = self.oracle.entry(b.ids[i]).or_default();
                    seq.truncate(b.positions[span.start] as usize);
                    seq.extend_from_slice(&b.tokens[span]);
                }
            }
            Err(e) => {
                assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
                assert!(
                    !all_held,
                    "refused although every needed position is held: {e}"
                );
                assert_eq!(before, self.known(), "a refused batch changed the history");
            }
        }
        // Stateless: the oracle's context gives the same per-token contexts.
        if let (Some(c), Some(want)) = (self.stateless_context(b), self.expected(b)) {
            b.context = Some(c);
            validate_batch(&b.view(), VOCAB, MAX_TOKENS).expect("oracle context is valid");
            let got = resolve_contexts(&b.view(), None, EOS, self.ngram).expect("stateless");
            assert_eq!(got, want, "stateless context differs from the literal rule");
            b.context = None;
        }
        accepted
    }
}

/// Target `batch_context`: a hash order, a history window, then up to 64 steps of submits,
/// releases and malformed batches.
pub fn batch_context(data: &[u8]) -> bool {
    let mut r = Bytes(data);
    let ngram = 2 + r.below(3) as u32;
    let k = ngram as usize - 1;
    let window = k as u32 + r.below(4) as u32;
    let mut st = State {
        k,
        ngram,
        tracker: Tracker::new(ngram, EOS, window).expect("valid tracker"),
        oracle: HashMap::new(),
    };
    let mut accepted = false;
    for _ in 0..64 {
        if r.is_empty() {
            break;
        }
        match r.below(8) {
            0..=5 => {
                let mut b = gen_batch(&mut r, &st.oracle);
                accepted |= st.submit(&mut b);
            }
            6 => {
                let id = r.below(IDS) as u64;
                let had = st.oracle.remove(&id).is_some();
                assert_eq!(st.tracker.release(id), had, "release of request {id}");
            }
            _ => {
                let mut b = gen_malformed(&mut r);
                if b.context.is_none() {
                    accepted |= st.submit(&mut b);
                } else {
                    let before = st.known();
                    let _ = validate_batch(&b.view(), VOCAB, MAX_TOKENS);
                    let _ = resolve_contexts(&b.view(), None, EOS, ngram);
                    let _ = st.tracker.resolve(&b.view());
                    assert_eq!(before, st.known(), "resolve changed the history");
                }
            }
        }
    }
    accepted
}
