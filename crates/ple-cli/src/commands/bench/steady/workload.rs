//! The workload of `ple bench steady`: requests decoding through documents (continuous
//! batching, chunked prefill), from the English corpus streams or a trace file.

use super::SteadyOptions;
use crate::commands::bench::steps::Step;
use ple_core::error::{Error, Result};
use ple_testkit::corpus::Corpus;

/// A document: its tokens and how many of them are prompt.
struct Doc {
    tokens: Vec<i32>,
    prompt: usize,
}

enum Source {
    Corpus { c: Box<Corpus>, n: u64 },
    Trace { docs: Vec<Vec<i32>>, n: usize },
}

struct Req {
    id: u64,
    doc: Doc,
    /// Next token of `doc` to process.
    pos: usize,
}

/// The requests and where their documents come from.
pub(super) struct Workload {
    src: Source,
    reqs: Vec<Req>,
    next_id: u64,
    prompt: usize,
    decode: usize,
    chunk: usize,
    eos: i32,
    pub(super) docs_started: u64,
}

/// Documents of a trace file (see the module doc), checked against the vocabulary.
fn read_trace(path: &std::path::Path, vocab: u32) -> Result<Vec<Vec<i32>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading the trace {}", path.display()), e))?;
    let mut docs = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let mut d = Vec::new();
        for w in line.split_whitespace() {
            match w.parse::<i64>() {
                Ok(t) if (0..vocab as i64).contains(&t) => d.push(t as i32),
                _ => {
                    return ple_core::invalid!(
                        "{}:{}: {w:?} is not a token id in [0, {vocab})",
                        path.display(),
                        ln + 1
                    );
                }
            }
        }
        if d.len() >= 2 {
            docs.push(d);
        }
    }
    if docs.is_empty() {
        return ple_core::invalid!("{}: no document of 2 tokens or more", path.display());
    }
    Ok(docs)
}

impl Workload {
    pub(super) fn new(a: &SteadyOptions, vocab: u32, eos: i32) -> Result<Workload> {
        if a.requests == 0 || a.prefill_chunk == 0 || a.prompt_tokens + a.decode_tokens < 2 {
            return ple_core::invalid!(
                "--requests, --prefill-chunk and a document of 2 tokens or more are needed"
            );
        }
        let src = match &a.trace {
            Some(p) => Source::Trace {
                docs: read_trace(p, vocab)?,
                n: 0,
            },
            None => Source::Corpus {
                c: Box::new(Corpus::new(vocab, eos)),
                n: 0,
            },
        };
        let mut w = Workload {
            src,
            reqs: Vec::new(),
            next_id: 1,
            prompt: a.prompt_tokens,
            decode: a.decode_tokens,
            chunk: a.prefill_chunk,
            eos,
            docs_started: 0,
        };
        for i in 0..a.requests {
            let mut r = w.new_req();
            // staggered: request i is i/n of the way through its decoding
            let decode = r.doc.tokens.len() - r.doc.prompt;
            r.pos = r.doc.prompt + decode * i / a.requests;
            w.reqs.push(r);
        }
        Ok(w)
    }

    fn new_req(&mut self) -> Req {
        let tokens = match &mut self.src {
            Source::Corpus { c, n } => {
                *n += 1;
                c.stream(*n, self.prompt + self.decode)
            }
            Source::Trace { docs, n } => {
                *n += 1;
                docs[(*n - 1) % docs.len()].clone()
            }
        };
        let prompt = self.prompt.min(tokens.len() - 1);
        self.docs_started += 1;
        self.next_id += 1;
        Req {
            id: self.next_id - 1,
            doc: Doc { tokens, prompt },
            pos: 0,
        }
    }

    /// The next step: one token per decoding request, up to `chunk` prompt tokens.
    pub(super) fn step(&mut self, st: &mut Step) {
        st.query_start.clear();
        st.query_start.push(0);
        st.tokens.clear();
        st.positions.clear();
        st.request_ids.clear();
        st.context.clear();
        let mut budget = self.chunk;
        for i in 0..self.reqs.len() {
            let r = &self.reqs[i];
            let n = if r.pos < r.doc.prompt {
                let n = (r.doc.prompt - r.pos).min(budget);
                budget -= n;
                n
            } else {
                1
            };
            if n == 0 {
                continue;
            }
            let t = &r.doc.tokens;
            st.tokens.extend_from_slice(&t[r.pos..r.pos + n]);
            st.positions.extend((r.pos..r.pos + n).map(|p| p as i32));
            st.request_ids.push(r.id);
            st.query_start.push(st.tokens.len() as u32);
            let at = |q: usize| if q < 2 { self.eos } else { t[q - 2] };
            st.context.push(at(r.pos));
            st.context.push(at(r.pos + 1));
            let done = r.pos + n >= t.len();
            self.reqs[i].pos += n;
            if done {
                self.reqs[i] = self.new_req();
            }
        }
    }

    /// One decode step (a token of every request past its prompt), not advancing the workload.
    pub(super) fn decode_step(&self) -> Step {
        self.decode_step_at(0)
    }

    /// The decode step `ahead` steps after the next one (a token of every request past its
    /// prompt with that many tokens left), not advancing the workload.
    pub(super) fn decode_step_at(&self, ahead: usize) -> Step {
        let mut st = Step {
            query_start: vec![0],
            ..Default::default()
        };
        for r in self
            .reqs
            .iter()
            .filter(|r| r.pos >= r.doc.prompt && r.pos + ahead < r.doc.tokens.len())
        {
            let t = &r.doc.tokens;
            let pos = r.pos + ahead;
            st.tokens.push(t[pos]);
            st.positions.push(pos as i32);
            st.request_ids.push(r.id);
            st.query_start.push(st.tokens.len() as u32);
            let at = |q: usize| if q < 2 { self.eos } else { t[q - 2] };
            st.context.push(at(pos));
            st.context.push(at(pos + 1));
        }
        st
    }
}
