//! A stateless step of one-token requests, the shape the I/O tests and benchmarks submit.

use crate::lookup::context::Batch;
use crate::model::splitmix64;

/// `n` one-token requests with stateless contexts (tokens and contexts drawn from a seed).
pub struct Step {
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    pub ids: Vec<u64>,
    pub qs: Vec<u32>,
    pub ctx: Vec<i32>,
}

impl Step {
    /// Requests 1..=n, token `i` at position `i + 5`, each with two context tokens.
    pub fn new(seed: u64, n: usize) -> Step {
        let mut x = seed;
        let mut tok = || {
            x = splitmix64(x);
            (x % 248_000) as i32
        };
        Step {
            tokens: (0..n).map(|_| tok()).collect(),
            positions: (0..n as i32).map(|i| i + 5).collect(),
            ids: (1..=n as u64).collect(),
            qs: (0..=n as u32).collect(),
            ctx: (0..2 * n).map(|_| tok()).collect(),
        }
    }

    /// The batch of this step.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.ids,
            query_start: &self.qs,
            context: Some(&self.ctx),
        }
    }
}
