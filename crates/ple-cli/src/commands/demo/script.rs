//! The engine's script of the demo: its steps, and the engine's own record of each request's
//! tokens (from which the reference ids are computed).

use ple::ple_batch;

/// One engine step: the requests' spans.
#[derive(Clone, Debug)]
pub(super) struct Step {
    pub(super) tokens: Vec<i32>,
    pub(super) positions: Vec<i32>,
    pub(super) request_ids: Vec<u64>,
    pub(super) query_start: Vec<u32>,
    pub(super) prefill: bool,
}

impl Step {
    pub(super) fn batch(&self) -> ple_batch {
        ple_batch {
            tokens: self.tokens.as_ptr(),
            positions: self.positions.as_ptr(),
            num_tokens: self.tokens.len() as u32,
            request_ids: self.request_ids.as_ptr(),
            query_start: self.query_start.as_ptr(),
            num_requests: self.request_ids.len() as u32,
            context: std::ptr::null(),
        }
    }
}

/// The engine's view of its requests: every accepted token by position, for the reference ids.
#[derive(Default, Clone)]
pub(super) struct Requests {
    pub(super) seqs: std::collections::BTreeMap<u64, Vec<i32>>,
}

impl Requests {
    /// Applies a step the way the library's tracked mode must: a span at position p replaces
    /// positions >= p.
    pub(super) fn apply(&mut self, s: &Step) {
        for (i, &rid) in s.request_ids.iter().enumerate() {
            let (a, b) = (s.query_start[i] as usize, s.query_start[i + 1] as usize);
            let seq = self.seqs.entry(rid).or_default();
            seq.truncate(s.positions[a] as usize);
            seq.extend_from_slice(&s.tokens[a..b]);
        }
    }
}

/// The engine's script: prefill of request 1 (2,048 tokens of real text), prompts for requests
/// 2..=8, then `decode_steps` decode steps of 8 requests; request 5 verifies 4 drafts per step and
/// 2 are accepted, so every step rolls back the 2 rejected positions.
pub(super) fn script(decode_steps: usize, rid_base: u64) -> Vec<Step> {
    let mut steps = Vec::new();
    let long = ple_testkit::text::stream(2048 + decode_steps + 1, 0);
    steps.push(Step {
        tokens: long[..2048].to_vec(),
        positions: (0..2048).collect(),
        request_ids: vec![rid_base + 1],
        query_start: vec![0, 2048],
        prefill: true,
    });
    let mut prompts: Vec<Vec<i32>> = (2..=8)
        .map(|r| ple_testkit::text::stream(64 + 200, r))
        .collect();
    let mut s = Step {
        tokens: vec![],
        positions: vec![],
        request_ids: vec![],
        query_start: vec![0],
        prefill: true,
    };
    for (i, p) in prompts.iter().enumerate() {
        s.tokens.extend_from_slice(&p[..64]);
        s.positions.extend(0..64);
        s.request_ids.push(rid_base + 2 + i as u64);
        s.query_start.push(s.tokens.len() as u32);
    }
    steps.push(s);
    let mut next = [0i32; 9];
    next[1] = 2048;
    for n in next.iter_mut().skip(2) {
        *n = 64;
    }
    for d in 0..decode_steps {
        let mut s = Step {
            tokens: vec![],
            positions: vec![],
            request_ids: vec![],
            query_start: vec![0],
            prefill: false,
        };
        for r in 1..=8usize {
            let len = if r == 5 { 4 } else { 1 };
            for k in 0..len {
                let p = next[r] + k;
                let tok = if r == 1 {
                    long[p as usize]
                } else if r == 5 && k >= 2 {
                    // a rejected draft: some other word
                    ple_testkit::text::piece_id(&format!(" draft{d}_{k}"))
                } else {
                    let src = &mut prompts[r - 2];
                    src[(p as usize) % src.len()]
                };
                s.tokens.push(tok);
                s.positions.push(p);
            }
            s.request_ids.push(rid_base + r as u64);
            s.query_start.push(s.tokens.len() as u32);
            next[r] += if r == 5 { 2 } else { 1 };
        }
        steps.push(s);
    }
    steps
}
