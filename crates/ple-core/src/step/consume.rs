//! The consumer side of [`Pipeline`]: waits, host views of the rows, `dequant_cpu`,
//! `dequant_fuse`, releases, and the CUDA Graph and device-error entry points (`ple_graph_*`,
//! `ple_check_device`; a handle opened with `cuda_device = -1` has no GPU side and these return
//! `Error::CudaUnavailable`). Every slot change goes through the ring's [`Completion`].
//!
//! [`Completion`]: super::ring::Completion

use super::pipeline::Pipeline;
use super::ring::{Parked, StepStatus};
use super::shared::{WAIT_SPIN, spin_round};

use crate::dequant::cpu::{self as dequant, OutArgs};
use crate::error::{Error, Result, panic_text};
use crate::stats::{self};
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Pipeline {
    /// Waits until step `seq` is complete (`done >= seq`): spins briefly, then parks. `timeout_us`
    /// 0 = the handle's default, `u64::MAX` = forever. Returns the step's own error if it failed,
    /// `Error::Timeout` past the timeout, `Error::State` for a seq never submitted or consumed.
    pub fn wait(&self, seq: u64, timeout_us: u64) -> Result<()> {
        let sh = &*self.sh;
        let rows = match self.status_for_wait(seq)? {
            None => usize::MAX, // consumed or released: wait until it is complete
            Some(StepStatus::Failed(e)) => return Err(e),
            Some(StepStatus::Ready { .. }) => return Ok(()),
            // (GPU mode: a dequant_fuse may claim a step before it is complete)
            Some(StepStatus::Consuming) if sh.completion.done() >= seq => return Ok(()),
            Some(StepStatus::Consuming) => usize::MAX,
            // (at most: rows the cache holds are not read)
            Some(StepStatus::Pending { tokens }) => tokens as usize * sh.reader.heads.len(),
        };
        // Spin only where the pool likely takes no part in the step (`Reader::reads_alone`): a
        // spinning waiter would take a CPU from the pool gathering a big step.
        let spin = if rows != usize::MAX && sh.reader.reads_alone(rows) {
            WAIT_SPIN
        } else {
            Duration::ZERO
        };
        let t0 = Instant::now();
        let timeout = match timeout_us {
            0 => Some(self.opts.wait_timeout_us),
            u64::MAX => None,
            t => Some(t),
        };
        let deadline = timeout.and_then(|t| t0.checked_add(Duration::from_micros(t)));
        let c = &sh.completion;
        let mut i = 0u32;
        while c.done() < seq {
            i += 1;
            if i % 16 == 0 && t0.elapsed() >= spin {
                break;
            }
            spin_round(i);
        }
        let parked = c.park_until_done(seq, deadline);
        sh.stats
            .wait_ns
            .fetch_add(stats::ns(t0.elapsed()), Ordering::Relaxed);
        if parked == Parked::Closing {
            return Err(Error::State(format!(
                "the handle was closed while waiting for step {seq}"
            )));
        }
        if parked == Parked::TimedOut {
            sh.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Timeout(format!(
                "step {seq} not complete after {} µs (done = {})",
                timeout.unwrap_or(u64::MAX),
                c.done()
            )));
        }
        // (`done >= seq` was read with Acquire: a failure of this step is visible here)
        if seq > c.last_failed() {
            return Ok(());
        }
        match self.status_for_wait(seq)? {
            Some(StepStatus::Failed(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Whether step `seq` is complete, without waiting (`ple_wait(.., 0)`): `Ok` if it succeeded
    /// (also once consumed or released), its own error while its failure is recorded,
    /// `Error::Timeout` while it is not complete, `Error::State` for a seq never submitted. A poll
    /// is not counted in `timeouts`.
    pub fn poll(&self, seq: u64) -> Result<()> {
        let sh = &*self.sh;
        match self.status_for_wait(seq)? {
            Some(StepStatus::Failed(e)) => Err(e),
            None | Some(StepStatus::Ready { .. }) => Ok(()),
            _ if sh.completion.done() >= seq => Ok(()),
            _ => Err(Error::Timeout(format!(
                "step {seq} is not complete (polled; done = {})",
                sh.completion.done()
            ))),
        }
    }

    /// What `wait` needs to know of `seq`: None for a step that was submitted and has left the
    /// ring (consumed or released; still its error if a failure record is left), else its status.
    fn status_for_wait(&self, seq: u64) -> Result<Option<StepStatus>> {
        self.sh.completion.status_for_wait(seq)
    }

    /// Waits for step `seq` and returns its rows `[tokens][heads][row_bytes]` (pointer, tokens):
    /// per token the rows of the handle's heads ([`Pipeline::heads`], all 16 for the whole
    /// table) in head order. The pointer stays valid until the step is consumed.
    pub fn packed_rows(&self, seq: u64) -> Result<(*const u8, u32)> {
        self.wait(seq, 0)?;
        match self.sh.completion.status(seq)? {
            StepStatus::Ready { slot, tokens } => {
                // SAFETY: the slot is Ready: its rows are complete and stay until consumed.
                Ok((unsafe { self.sh.staging(slot) }.as_ptr(), tokens))
            }
            StepStatus::Consuming => Err(Error::State(format!(
                "step {seq} is being consumed by a dequant call"
            ))),
            StepStatus::Failed(e) => Err(e),
            StepStatus::Pending { .. } => Err(Error::State(format!("step {seq} is not complete"))),
        }
    }

    /// Calls `f` with step `seq`'s rows while holding the slot (Consuming), then frees it.
    /// A failing `f` (error or panic) leaves the step Ready: only a call that succeeds consumes it.
    pub(super) fn consume<R>(
        &self,
        seq: u64,
        f: impl FnOnce(&[u8], usize) -> Result<R>,
    ) -> Result<R> {
        let sh = &*self.sh;
        let waited = self.wait(seq, 0);
        let (slot, tokens) = sh.completion.claim(seq, waited)?;
        // SAFETY: the slot is Consuming, held by this call: nobody writes it until freed below.
        let rows = unsafe { sh.staging(slot) };
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(rows, tokens as usize)))
            .map_err(|p| Error::Panic(panic_text(&*p)))
            .and_then(|r| r);
        // a step is consumed only by a call that succeeds: else it stays Ready for a retry
        sh.completion.end_claim(seq, slot, tokens, r.is_ok());
        r
    }

    /// Releases step `seq`'s slot without dequantising (waits for the step first). Releasing a
    /// failed step forgets its error and succeeds.
    pub fn release_step(&self, seq: u64) -> Result<()> {
        let waited = self.wait(seq, 0);
        self.sh.completion.release(seq, waited)
    }

    /// Waits for step `seq`, dequantises its rows into `out` (`[tokens]` × the table's `embed_dim` of `dtype`,
    /// `stride` elements apart; `PLE_FUSE_ACCUMULATE` adds) and releases the slot. A head shard
    /// writes -0.0 in the other heads' columns (accumulating: leaves them untouched). A failed
    /// step returns its error and is released too.
    ///
    /// # Safety
    /// `out` must be valid for reads and writes of `(tokens - 1) * stride + embed_dim` elements of
    /// `dtype` and not be used by anyone else during the call.
    pub unsafe fn dequant_cpu(&self, seq: u64, out: *mut u8, args: OutArgs) -> Result<()> {
        let spec = self.sh.reader.table.row_spec();
        args.check_ptr(out as usize, spec.embed_dim())?;
        self.consume(seq, |rows, tokens| {
            // SAFETY: the caller guarantees `out` (see above).
            unsafe {
                dequant::dequant_raw(
                    &spec,
                    rows,
                    tokens,
                    self.sh.reader.heads,
                    out,
                    args,
                    Some(self.sh.reader.pool()),
                )
            }
        })
    }

    /// GPU dequant (see `ple_dequant_fuse`): enqueues step `seq`'s wait and dequantisation on the
    /// engine's `stream` (`GpuSide::fuse`, `out` a device pointer) and marks the step consumed
    /// once enqueued; the GPU side keeps the kernel's event, so the worker does not overwrite the
    /// slot's rows (staging or device rows) before the kernel has read them. `Error::State` for a
    /// step not submitted, already consumed or being consumed; a failed step returns its error
    /// (and is released, as with `dequant_cpu`). With `PLE_WAIT_HOST` the call first waits for
    /// the step on the host (`wait(seq, 0)`); with device waits it returns without waiting.
    pub fn dequant_fuse(
        &self,
        stream: *mut c_void,
        seq: u64,
        out: u64,
        args: OutArgs,
    ) -> Result<()> {
        let sh = &*self.sh;
        let g = self.gpu()?;
        let slot = g.slot_of(seq);
        // Claim the step (Pending or Ready → Consuming) so no other call consumes it meanwhile.
        let tokens = sh.completion.claim_early(seq, slot)?;
        let r = g.fuse(stream, slot, seq, tokens, out, args, &|| self.wait(seq, 0));
        // consumed once enqueued: the GPU side keeps the kernel's event until the slot is
        // reused; not enqueued: the step stays available, and its own failure (host wait) is
        // reported now and released, as in dequant_cpu
        sh.completion.end_claim(seq, slot, tokens, r.is_ok());
        r
    }

    /// `ple_graph_prepare`: CUDA Graph mode from step `base_seq` on. From then on a Ready step
    /// `s >= base_seq` counts as consumed (its ring slot free) once a replay consumed it
    /// (`GpuSide::consumed_seq() >= s`). Ready steps replays consumed under an earlier base are
    /// freed first; a refused prepare (capturing stream, a base already consumed) changes
    /// nothing.
    pub fn graph_prepare(&self, stream: *mut c_void, base_seq: u64) -> Result<()> {
        let g = self.gpu()?;
        self.rebase_graph(base_seq, || g.graph_prepare(stream, base_seq))
    }

    /// Enters CUDA Graph mode from step `base_seq` on (see [`Completion::rebase_graph`]):
    /// `prepare` is the GPU side's re-base, which may refuse (then nothing changes).
    ///
    /// [`Completion::rebase_graph`]: super::ring::Completion::rebase_graph
    pub(crate) fn rebase_graph(
        &self,
        base_seq: u64,
        prepare: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.sh.completion.rebase_graph(base_seq, prepare)
    }

    /// `ple_dequant_fuse_graph`: enqueue wait + dequant + advance for graph capture.
    pub fn dequant_fuse_graph(
        &self,
        stream: *mut c_void,
        capacity_tokens: u32,
        out: u64,
        args: crate::dequant::cpu::OutArgs,
    ) -> Result<()> {
        self.gpu()?.fuse_graph(stream, capacity_tokens, out, args)
    }

    /// `ple_check_device`: the first device-side error since the last check, if any (cleared).
    pub fn check_device(&self) -> Result<()> {
        self.gpu()?.device_error().map_or(Ok(()), Err)
    }
}
