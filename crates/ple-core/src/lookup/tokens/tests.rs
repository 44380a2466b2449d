//! Per-token batches: hand-written grouping and errors, and the property that row ids equal those
//! of the offsets form for the same tokens under any interleaving, tracked and stateless.

use super::*;
use crate::lookup::context::{Tracker, compute_ids, resolve_contexts, validate_batch};
use crate::lookup::hash::Hasher;
use crate::model::{EOS_TOKEN_ID, HashParams, ModelConfig, VOCAB_SIZE};
use proptest::prelude::*;

const EOS: i32 = EOS_TOKEN_ID;
const H: usize = 16;
const K: usize = 2;

fn hasher() -> Hasher {
    Hasher::new(&HashParams::derive(&ModelConfig::default())).unwrap()
}

fn tb<'a>(tokens: &'a [i32], positions: &'a [i32], ids: &'a [u64]) -> TokenBatch<'a> {
    TokenBatch {
        tokens,
        positions,
        request_ids: ids,
        context: None,
    }
}

fn msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(e @ Error::InvalidArgument(_)) => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn grouped_order_by_hand() {
    // request 7 at positions 5,6,7 and request 3 at 0,1, interleaved and out of position order
    let tokens = [70, 30, 72, 31, 71];
    let positions = [5, 0, 7, 1, 6];
    let ids = [7, 3, 7, 3, 7];
    let g = group_tokens(&tb(&tokens, &positions, &ids)).unwrap();
    let b = g.batch();
    assert_eq!(b.request_ids, &[7, 3]);
    assert_eq!(b.query_start, &[0, 3, 5]);
    assert_eq!(b.tokens, &[70, 71, 72, 30, 31]);
    assert_eq!(b.positions, &[5, 6, 7, 0, 1]);
    assert_eq!(g.order(), Some(&[0, 4, 2, 1, 3][..]));
    // rows of width 2 go back to the caller's order
    let rows: Vec<i32> = b.tokens.iter().flat_map(|&t| [t, -t]).collect();
    let back = g.to_caller_order(&rows, 2);
    let want: Vec<i32> = tokens.iter().flat_map(|&t| [t, -t]).collect();
    assert_eq!(back, want);
}

#[test]
fn already_grouped_is_the_identity() {
    let g = group_tokens(&tb(&[1, 2, 3, 4], &[4, 5, 0, 9], &[1, 1, 2, 3])).unwrap();
    assert!(g.order().is_none());
    assert_eq!(g.batch().query_start, &[0, 2, 3, 4]);
    // a request that comes back later is not contiguous, whatever its numbering
    let g = group_tokens(&tb(&[1, 2, 3, 4], &[0, 0, 1, 1], &[1, 2, 1, 2])).unwrap();
    assert_eq!(g.order(), Some(&[0, 2, 1, 3][..]));
    assert_eq!(g.batch().request_ids, &[1, 2]);
    // 50 one-token requests in order (the seen-set past 32 requests), then request 3 again
    let mut ids: Vec<u64> = (0..50).collect();
    let mut positions = vec![7; 50];
    let ones = vec![1; 51];
    let g = group_tokens(&tb(&ones[..50], &positions, &ids)).unwrap();
    assert!(g.order().is_none());
    assert_eq!(g.batch().query_start, (0..=50).collect::<Vec<u32>>());
    ids.push(3);
    positions.push(8);
    let g = group_tokens(&tb(&ones, &positions, &ids)).unwrap();
    let o = g.order().unwrap();
    assert_eq!(&o[..5], &[0, 1, 2, 3, 50]);
    assert_eq!(g.batch().query_start[3..6], [3, 5, 6]);
}

#[test]
fn many_requests_use_the_map() {
    // 40 requests, two tokens each, the second tokens after all the first ones
    let n = 40u64;
    let ids: Vec<u64> = (0..n).chain(0..n).map(|i| 1000 - i).collect();
    let positions: Vec<i32> = (0..2 * n).map(|i| (i / n) as i32 + 10).collect();
    let tokens: Vec<i32> = (0..2 * n as i32).collect();
    let g = group_tokens(&tb(&tokens, &positions, &ids)).unwrap();
    let b = g.batch();
    assert_eq!(b.request_ids, (0..n).map(|i| 1000 - i).collect::<Vec<_>>());
    for r in 0..n as usize {
        assert_eq!(&b.tokens[b.span(r)], &[r as i32, (r + n as usize) as i32]);
    }
    validate_batch(&b, VOCAB_SIZE, 1 << 16).unwrap();
}

#[test]
fn errors_name_the_callers_tokens() {
    let m = msg(group_tokens(&tb(&[1, 2], &[0], &[1, 1])));
    assert!(m.contains("2 tokens, 1 positions and 2 request ids"), "{m}");
    let m = msg(group_tokens(&tb(&[1, 2], &[0, -3], &[1, 1])));
    assert!(
        m.contains("token 1 (request id 1): negative position -3"),
        "{m}"
    );
    let m = msg(group_tokens(&tb(&[1, 2, 3], &[4, 9, 4], &[5, 6, 5])));
    assert!(
        m.contains("request id 5: tokens 0 and 2 both at position 4"),
        "{m}"
    );
    let m = msg(group_tokens(&tb(&[1, 2, 3], &[4, 9, 6], &[5, 6, 5])));
    assert!(
        m.contains("request id 5: token 2 at position 6 but its 2 tokens start at position 4"),
        "{m}"
    );
    let m = msg(group_tokens(&tb(&[1], &[i32::MAX], &[5]))
        .and_then(|_| group_tokens(&tb(&[1, 2], &[i32::MAX, i32::MAX], &[5, 5]))));
    assert!(m.contains("both at position 2147483647"), "{m}");
    // an empty batch groups to an empty offsets batch, which validation refuses
    let g = group_tokens(&tb(&[], &[], &[])).unwrap();
    let m = msg(validate_batch(&g.batch(), VOCAB_SIZE, 16));
    assert!(m.contains("no tokens"), "{m}");
}

// ---------------------------------------------------------------------------------------------
// Property: ids equal the offsets form's under any interleaving
// ---------------------------------------------------------------------------------------------

fn token() -> impl Strategy<Value = i32> {
    prop_oneof![2 => Just(EOS), 8 => 0..VOCAB_SIZE as i32, 3 => 0i32..6]
}

/// Steps of a schedule: for each step, per request, how many tokens it submits (0 = none).
fn schedule() -> impl Strategy<Value = (Vec<Vec<i32>>, Vec<Vec<usize>>, u64)> {
    proptest::collection::vec(proptest::collection::vec(token(), 1..30), 1..5).prop_flat_map(
        |seqs| {
            let r = seqs.len();
            let steps = proptest::collection::vec(proptest::collection::vec(0usize..6, r), 1..12);
            (Just(seqs), steps, any::<u64>())
        },
    )
}

/// The raw tokens before position p, oldest first, EOS before the start.
fn raw_context(seq: &[i32], p: usize) -> Vec<i32> {
    (0..K)
        .map(|s| if p >= K - s { seq[p - (K - s)] } else { EOS })
        .collect()
}

struct Step {
    // offsets form
    tokens: Vec<i32>,
    positions: Vec<i32>,
    ids: Vec<u64>,
    qs: Vec<u32>,
    ctx: Vec<i32>,
    // the same tokens permuted: caller token i is offsets token perm[i]
    perm: Vec<usize>,
}

impl Step {
    fn offsets(&self, stateless: bool) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.ids,
            query_start: &self.qs,
            context: stateless.then_some(&self.ctx[..]),
        }
    }
}

fn ids_of(h: &Hasher, b: &Batch, tr: Option<&mut Tracker>) -> Result<Vec<u64>> {
    validate_batch(b, VOCAB_SIZE, 1 << 16)?;
    let ctx = resolve_contexts(b, tr.as_deref(), EOS, 3)?;
    if let Some(t) = tr {
        t.commit(b)?;
    }
    let mut ids = vec![0; b.num_tokens() * H];
    compute_ids(h, b, &ctx, &mut ids);
    Ok(ids)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn per_token_ids_equal_offsets_ids_under_any_interleaving((seqs, steps, seed) in schedule()) {
        let h = hasher();
        let mut rng = seed | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut tr_off = Tracker::new(3, EOS, 8).unwrap();
        let mut tr_tok = Tracker::new(3, EOS, 8).unwrap();
        let mut done = vec![0usize; seqs.len()];
        for counts in &steps {
            let mut s = Step { tokens: vec![], positions: vec![], ids: vec![], qs: vec![0], ctx: vec![], perm: vec![] };
            for (r, &c) in counts.iter().enumerate() {
                let c = c.min(seqs[r].len() - done[r]);
                if c == 0 {
                    continue;
                }
                let p = done[r];
                s.ids.push(r as u64 * 0x9E37 + 11);
                s.tokens.extend_from_slice(&seqs[r][p..p + c]);
                s.positions.extend((p..p + c).map(|x| x as i32));
                s.qs.push(s.tokens.len() as u32);
                s.ctx.extend(raw_context(&seqs[r], p));
                done[r] += c;
            }
            if s.tokens.is_empty() {
                continue;
            }
            let n = s.tokens.len();
            s.perm = (0..n).collect();
            for i in (1..n).rev() {
                s.perm.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let tok: Vec<i32> = s.perm.iter().map(|&j| s.tokens[j]).collect();
            let pos: Vec<i32> = s.perm.iter().map(|&j| s.positions[j]).collect();
            let tid: Vec<u64> = s.perm.iter().map(|&j| {
                let r = s.qs.windows(2).position(|w| (w[0] as usize..w[1] as usize).contains(&j)).unwrap();
                s.ids[r]
            }).collect();
            // stateless context of the per-token form: requests in order of first appearance
            let mut first: Vec<u64> = Vec::new();
            for &id in &tid {
                if !first.contains(&id) {
                    first.push(id);
                }
            }
            let tctx: Vec<i32> = first.iter().flat_map(|id| {
                let r = s.ids.iter().position(|x| x == id).unwrap();
                s.ctx[r * K..(r + 1) * K].to_vec()
            }).collect();
            for stateless in [false, true] {
                let want = ids_of(&h, &s.offsets(stateless), (!stateless).then_some(&mut tr_off)).unwrap();
                let t = TokenBatch { tokens: &tok, positions: &pos, request_ids: &tid, context: stateless.then_some(&tctx[..]) };
                let g = group_tokens(&t).unwrap();
                let grouped = ids_of(&h, &g.batch(), (!stateless).then_some(&mut tr_tok)).unwrap();
                let got = g.to_caller_order(&grouped, H);
                for (i, &j) in s.perm.iter().enumerate() {
                    prop_assert_eq!(&got[i * H..(i + 1) * H], &want[j * H..(j + 1) * H],
                        "caller token {} (offsets token {}), stateless {}", i, j, stateless);
                }
            }
        }
    }
}

proptest! {
    /// `group_tokens` accepts exactly the batches whose requests each have distinct, consecutive
    /// positions (checked here by sorting), and then groups every token once, in position order.
    #[test]
    fn accepts_exactly_consecutive_positions(
        toks in proptest::collection::vec((0u64..4, 0i32..12), 1..40),
    ) {
        let ids: Vec<u64> = toks.iter().map(|t| t.0).collect();
        let pos: Vec<i32> = toks.iter().map(|t| t.1).collect();
        let tokens: Vec<i32> = (0..toks.len() as i32).collect();
        let mut by_req: std::collections::BTreeMap<u64, Vec<i32>> = Default::default();
        for &(r, p) in &toks {
            by_req.entry(r).or_default().push(p);
        }
        let valid = by_req.values_mut().all(|v| {
            v.sort_unstable();
            v.windows(2).all(|w| w[1] == w[0] + 1)
        });
        let got = group_tokens(&tb(&tokens, &pos, &ids));
        prop_assert_eq!(got.is_ok(), valid, "{:?}", got.as_ref().err());
        if let Ok(g) = got {
            let b = g.batch();
            validate_batch(&b, VOCAB_SIZE, 1 << 16).unwrap();
            let mut seen = vec![false; tokens.len()];
            for r in 0..b.num_requests() {
                for j in b.span(r) {
                    let c = b.tokens[j] as usize; // the caller's index
                    prop_assert!(!seen[c]);
                    seen[c] = true;
                    prop_assert_eq!((ids[c], pos[c]), (b.request_ids[r], b.positions[j]));
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            if let Some(o) = g.order() {
                prop_assert!(o.iter().enumerate().all(|(j, &c)| b.tokens[j] == c as i32));
            }
        }
    }
}
