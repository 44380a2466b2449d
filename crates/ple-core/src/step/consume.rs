//! Consuming steps: waits, host views of the rows, `dequant_cpu`, `dequant_fuse`, releases.

use super::pipeline::Pipeline;
use super::ring::*;
use super::shared::*;

use crate::dequant::cpu::{self as dequant, OutArgs};
use crate::error::{Error, Result, panic_text};
use crate::io::gather;
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
            Some(StepStatus::Consuming) if sh.done.load(Ordering::Acquire) >= seq => return Ok(()),
            Some(StepStatus::Consuming) => usize::MAX,
            Some(StepStatus::Pending { rows }) => rows as usize,
        };
        // Spin only for steps the worker gathers alone (small ones, done in microseconds): a
        // spinning waiter would take a CPU from the pool gathering a big step.
        let spin = if rows < gather::PARALLEL_MIN_ROWS {
            WAIT_SPIN
        } else {
            Duration::ZERO
        };
        let t0 = Instant::now();
        let timeout = match timeout_us {
            0 => Some(sh.opts.wait_timeout_us),
            u64::MAX => None,
            t => Some(t),
        };
        let deadline = timeout.and_then(|t| t0.checked_add(Duration::from_micros(t)));
        let mut i = 0u32;
        while sh.done.load(Ordering::Acquire) < seq {
            i += 1;
            if i % 16 == 0 && t0.elapsed() >= spin {
                break;
            }
            spin_round(t0, i, WAIT_BUSY_SPIN);
        }
        let mut parked = Parked::Ready;
        if sh.done.load(Ordering::Acquire) < seq {
            let ring = lock(&sh.ring);
            parked = sh
                .park(ring, deadline, |_| sh.done.load(Ordering::Acquire) >= seq)
                .1;
        }
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
                sh.done.load(Ordering::Acquire)
            )));
        }
        // (`done >= seq` was read with Acquire: a failure of this step is visible here)
        if seq > sh.last_failed.load(Ordering::Acquire) {
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
            _ if sh.done.load(Ordering::Acquire) >= seq => Ok(()),
            _ => Err(Error::Timeout(format!(
                "step {seq} is not complete (polled; done = {})",
                sh.done.load(Ordering::Acquire)
            ))),
        }
    }

    /// What `wait` needs to know of `seq`: None for a step that was submitted and has left the
    /// ring (consumed or released; still its error if a failure record is left), else its status.
    pub(super) fn status_for_wait(&self, seq: u64) -> Result<Option<StepStatus>> {
        let mut ring = lock(&self.sh.ring);
        match self.sh.status(&mut ring, seq) {
            Err(_) if ring.left_ring(seq) => Ok(None),
            r => r.map(Some),
        }
    }

    /// Waits for step `seq` and returns its rows `[tokens][heads][row_bytes]` (pointer, tokens):
    /// per token the rows of the handle's heads ([`Pipeline::heads`], all 16 for the whole
    /// table) in head order. The pointer stays valid until the step is consumed.
    pub fn packed_rows(&self, seq: u64) -> Result<(*const u8, u32)> {
        self.wait(seq, 0)?;
        match self.sh.status(&mut lock(&self.sh.ring), seq)? {
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
        let mut ring = lock(&sh.ring);
        if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
            let (_, e) = ring.failed.remove(i).expect("index from position");
            return Err(e);
        }
        waited?;
        let (slot, tokens) = match sh.status(&mut ring, seq)? {
            StepStatus::Ready { slot, tokens } => (slot, tokens),
            StepStatus::Consuming => {
                return Err(Error::State(format!(
                    "step {seq} is already being consumed by another call"
                )));
            }
            StepStatus::Failed(e) => return Err(e),
            StepStatus::Pending { .. } => {
                return Err(Error::State(format!("step {seq} is not complete")));
            }
        };
        ring.slots[slot] = SlotState::Consuming { seq, tokens };
        drop(ring);
        // SAFETY: the slot is Consuming, held by this call: nobody writes it until freed below.
        let rows = unsafe { sh.staging(slot) };
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(rows, tokens as usize)))
            .map_err(|p| Error::Panic(panic_text(&*p)))
            .and_then(|r| r);
        if r.is_ok() {
            sh.free_slot(slot);
        } else {
            // a step is consumed only by a call that succeeds: it stays Ready for a retry
            lock(&sh.ring).slots[slot] = SlotState::Ready { seq, tokens };
            sh.notify();
        }
        r
    }

    /// Releases step `seq`'s slot without dequantising (waits for the step first). Releasing a
    /// failed step forgets its error and succeeds.
    pub fn release_step(&self, seq: u64) -> Result<()> {
        let sh = &*self.sh;
        let waited = self.wait(seq, 0);
        let mut ring = lock(&sh.ring);
        if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
            ring.failed.remove(i);
            return Ok(());
        }
        waited?;
        match ring.status(seq)? {
            StepStatus::Ready { slot, .. } => {
                ring.slots[slot] = SlotState::Free;
                drop(ring);
                sh.notify();
                Ok(())
            }
            StepStatus::Consuming => Err(Error::State(format!(
                "step {seq} is being consumed by a dequant call"
            ))),
            StepStatus::Failed(e) => Err(e),
            StepStatus::Pending { .. } => Err(Error::State(format!("step {seq} is not complete"))),
        }
    }

    /// Waits for step `seq`, dequantises its rows into `out` (`[tokens]` × 2560 of `dtype`,
    /// `stride` elements apart; `PLE_FUSE_ACCUMULATE` adds) and releases the slot. A head shard
    /// writes -0.0 in the other heads' columns (accumulating: leaves them untouched). A failed
    /// step returns its error and is released too.
    ///
    /// # Safety
    /// `out` must be valid for reads and writes of `(tokens - 1) * stride + 2560` elements of
    /// `dtype` and not be used by anyone else during the call.
    pub unsafe fn dequant_cpu(&self, seq: u64, out: *mut u8, args: OutArgs) -> Result<()> {
        args.check_ptr(out as usize)?;
        let t = &self.sh.table;
        self.consume(seq, |rows, tokens| {
            // SAFETY: the caller guarantees `out` (see above).
            unsafe {
                dequant::dequant_raw(
                    t.format(),
                    t.global_scale(),
                    rows,
                    tokens,
                    self.sh.heads.clone(),
                    out,
                    args,
                    Some(self.sh.pool()),
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
        let tokens = {
            let mut ring = lock(&sh.ring);
            if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
                let (_, e) = ring.failed.remove(i).expect("index from position");
                return Err(e);
            }
            match sh.status(&mut ring, seq)? {
                StepStatus::Failed(e) => return Err(e),
                StepStatus::Consuming => {
                    return Err(Error::State(format!(
                        "step {seq} is already being consumed by another call"
                    )));
                }
                StepStatus::Pending { .. } | StepStatus::Ready { .. } => {}
            }
            let tokens = match ring.slots[slot] {
                SlotState::Pending { seq: s, tokens } | SlotState::Ready { seq: s, tokens }
                    if s == seq =>
                {
                    tokens
                }
                st => {
                    return Err(Error::State(format!(
                        "step {seq} is not in ring slot {slot} (seq % {}): {st:?}",
                        g.slots()
                    )));
                }
            };
            ring.slots[slot] = SlotState::Consuming { seq, tokens };
            tokens
        };
        let r = g.fuse(stream, slot, seq, tokens, out, args, &|| self.wait(seq, 0));
        let mut ring = lock(&sh.ring);
        if ring.slots[slot] == (SlotState::Consuming { seq, tokens }) {
            ring.slots[slot] = match &r {
                // consumed: the GPU side keeps the kernel's event until the slot is reused
                Ok(()) => SlotState::Free,
                // not enqueued: the step stays available
                Err(_) if sh.done.load(Ordering::Acquire) >= seq => {
                    SlotState::Ready { seq, tokens }
                }
                Err(_) => SlotState::Pending { seq, tokens },
            };
        }
        if r.is_err() {
            // the step's own failure (host wait) is reported now and released, as in dequant_cpu
            if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
                ring.failed.remove(i);
            }
        }
        drop(ring);
        sh.notify();
        r
    }
}
