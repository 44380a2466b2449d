//! Request context: batch validation, stateless context and tracked per-request history
//! (SPEC §3, invariants 1–3). Filled in by the hash issue.

/// A borrowed view of one step's batch (the C `ple_batch`, checked for NULLs and lengths).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [i32],
    pub positions: &'a [i32],
    pub request_ids: &'a [u64],
    /// `num_requests + 1` offsets into `tokens`.
    pub query_start: &'a [u32],
    /// Stateless mode: `[num_requests][ngram_size - 1]`, oldest first.
    pub context: Option<&'a [i32]>,
}
