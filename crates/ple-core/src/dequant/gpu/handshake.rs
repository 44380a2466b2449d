//! The worker's side of the handshake (slot reuse, upload, publish) and the device error record.

use super::driver::{CtxGuard, RelaxedCapture, ck};
use super::layout::*;
use super::poll::Poll;
use super::side::{Ev, GpuSide};
use crate::error::{Error, Result};
use crate::sync;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl GpuSide {
    /// Polls `ev` until it completes, `deadline` passes (None: no deadline) or the handle closes
    /// (`stop_on_close`: the message for that case).
    pub(super) fn poll_event(
        &self,
        ev: Ev,
        deadline: Option<Instant>,
        stop_on_close: Option<&str>,
    ) -> Result<()> {
        let poll = Poll::start();
        loop {
            // SAFETY: a live event created by us (events are destroyed only in drop, after
            // every poll).
            let r = unsafe { (self.d.cuEventQuery)(ev.0) };
            if r == sys::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                return ck(r, "cuEventQuery");
            }
            if let Some(what) = stop_on_close {
                if self.closing.load(Ordering::Relaxed) {
                    return Err(Error::State(format!("the handle was closed while {what}")));
                }
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(Error::Timeout(format!(
                    "a kernel or copy of libple did not finish within {:?}; is the engine's \
                     stream stalled?",
                    self.timeout
                )));
            }
            poll.pause();
        }
    }

    /// Worker thread, before gathering step `seq` into `staging(slot)`: waits until no kernel
    /// may still read the slot's rows or header: every direct `fuse` of an older step in the slot
    /// has finished (its event), and in graph mode a replay has consumed the previous occupant.
    /// Polls with the handle's timeout; stops when the handle closes.
    pub fn begin_step(&self, slot: usize, seq: u64) -> Result<()> {
        self.check_slot(slot, seq)?;
        let _c = CtxGuard::push(self.ctx)?;
        let _m = RelaxedCapture::enter()?;
        let (old, occupant) = {
            let mut st = sync::lock(&self.slot_state[slot]);
            let (old, keep): (Vec<_>, Vec<_>) = st.readers.drain(..).partition(|&(q, _)| q < seq);
            st.readers = keep;
            st.prepared = 0;
            (old, st.occupant)
        };
        // None: no deadline (a timeout too large to add to now, e.g. UINT64_MAX microseconds).
        let deadline = Instant::now().checked_add(self.timeout);
        // Copy the handles out: never hold the event lock while polling (fuse needs it).
        let handles: Vec<Ev> = {
            let evs = sync::lock(&self.events);
            old.iter().map(|&(_, i)| evs.0[i]).collect()
        };
        let what = format!("step {seq} waited for ring slot {slot}");
        let mut result = Ok(());
        for ev in &handles {
            result = self.poll_event(*ev, deadline, Some(&what));
            if result.is_err() {
                break;
            }
        }
        if result.is_err() {
            // unfinished readers stay recorded: the next attempt (or close) waits for them again
            let mut st = sync::lock(&self.slot_state[slot]);
            st.readers.extend(old.iter().copied());
            return result;
        }
        self.recycle_events(old.iter().map(|&(_, i)| i));
        let direct = old.iter().any(|&(q, _)| q == occupant);
        let base = self.graph_base.load(Ordering::Acquire);
        if base != 0 && occupant >= base && !direct {
            let poll = Poll::start();
            while self.consumed_seq() < occupant {
                if self.closing.load(Ordering::Relaxed) {
                    return Err(Error::State(format!("the handle was closed while {what}")));
                }
                if deadline.is_some_and(|d| Instant::now() > d) {
                    return Err(Error::Timeout(format!(
                        "step {occupant} (ring slot {slot}) was not consumed by a CUDA Graph \
                         replay within {:?} (last consumed: {}); in graph mode every step from \
                         {base} on must be consumed by one replay",
                        self.timeout,
                        self.consumed_seq()
                    )));
                }
                poll.pause();
            }
        }
        sync::lock(&self.slot_state[slot]).prepared = seq;
        Ok(())
    }

    /// Writes the slot header, then `done = seq` (Release: the header and the rows first).
    fn publish(&self, slot: usize, seq: u64, num_tokens: u32, failed: bool) {
        let h = self.header_off(slot);
        self.ctrl_u64(h).store(seq, Ordering::Relaxed);
        self.ctrl_u32(h + 8).store(num_tokens, Ordering::Relaxed);
        self.ctrl_u32(h + 12)
            .store(failed as u32, Ordering::Relaxed);
        {
            let mut st = sync::lock(&self.slot_state[slot]);
            st.occupant = seq;
            st.prepared = 0;
        }
        self.published.fetch_max(seq, Ordering::AcqRel);
        self.ctrl_u64(CTRL_DONE).fetch_max(seq, Ordering::Release);
    }

    fn check_order(&self, seq: u64) -> Result<()> {
        let last = self.published.load(Ordering::Acquire);
        if seq <= last {
            return Err(Error::State(format!(
                "step {seq} published after step {last}: steps must publish in increasing order"
            )));
        }
        Ok(())
    }

    /// Worker thread, after gathering step `seq` (`num_tokens` tokens, `bytes` =
    /// `num_tokens * 16 * row_bytes` bytes) into `staging(slot)` (after [`Self::begin_step`]):
    /// in host-wait mode copies the rows host → device on libple's stream and polls the copy's
    /// event; then writes the slot header and publishes `done = seq`. On error nothing is
    /// published: call [`GpuSide::publish_failed`] then.
    pub fn upload(&self, slot: usize, bytes: usize, seq: u64, num_tokens: u32) -> Result<()> {
        self.check_slot(slot, seq)?;
        self.check_tokens(num_tokens, "num_tokens")?;
        let expect = num_tokens as usize * token_bytes(&self.spec, self.heads.len());
        if bytes != expect {
            return crate::invalid!(
                "upload of {bytes} B for {num_tokens} tokens; expected {expect} ({} rows of {} B each)",
                self.heads.len(),
                self.spec.row_bytes()
            );
        }
        self.check_order(seq)?;
        let prepared = sync::lock(&self.slot_state[slot]).prepared;
        if prepared != seq {
            return Err(Error::State(format!(
                "upload of step {seq} without begin_step (ring slot {slot} not confirmed free)"
            )));
        }
        if !self.reads_zero_copy() {
            self.copy_rows(slot, bytes, seq)?;
        }
        self.publish(slot, seq, num_tokens, false);
        Ok(())
    }

    /// Host-wait mode: H2D copy of the slot's rows on libple's stream; polls its event with the
    /// handle's timeout (no unbounded stream synchronisation; stops on close).
    fn copy_rows(&self, slot: usize, bytes: usize, seq: u64) -> Result<()> {
        let d = self.d;
        let _c = CtxGuard::push(self.ctx)?;
        let _m = RelaxedCapture::enter()?;
        let dst = self.rows_dptr + (slot * self.slot_stride) as u64;
        // SAFETY: the staging slot holds slot_bytes >= bytes; the device rows of the slot hold
        // slot_stride >= bytes; the slot is confirmed free of readers (begin_step).
        let r = unsafe {
            (d.cuMemcpyHtoDAsync_v2)(
                dst,
                self.staging(slot) as *const c_void,
                bytes,
                self.copy_stream,
            )
        };
        ck(r, "cuMemcpyHtoDAsync(rows)")?;
        ck(
            // SAFETY: our event and our stream, same context.
            unsafe { (d.cuEventRecord)(self.copy_event, self.copy_stream) },
            "cuEventRecord(copy)",
        )?;
        let deadline = Instant::now().checked_add(self.timeout);
        self.poll_event(
            Ev(self.copy_event),
            deadline,
            Some(&format!("step {seq} was copied to the device")),
        )
    }

    /// Worker thread, when step `seq` (of `num_tokens` tokens) failed: publishes it as failed so
    /// device waiters are released; its launch raises `ERR_STEP_FAILED` and fills its tokens
    /// with NaN (the pipeline reports the step's error from `ple_wait`). Never blocks: the rows
    /// are not touched, and a launch of an older step that still expects this slot's header
    /// then sees a mismatch (a visible error, never wrong rows).
    pub fn publish_failed(&self, slot: usize, seq: u64, num_tokens: u32) -> Result<()> {
        self.check_slot(slot, seq)?;
        self.check_order(seq)?;
        self.publish(slot, seq, num_tokens, true);
        Ok(())
    }

    // -- the device error record ----------------------------------------------------------

    /// Reads and clears the device error record: a device wait that timed out, a failed step, a
    /// graph step larger than the captured capacity, a slot holding another step. `None` when
    /// clear. Clearing bumps the epoch, so the next error can claim the record.
    pub fn device_error(&self) -> Option<Error> {
        let code = self.ctrl_u32(CTRL_ERR).load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let slot = self.ctrl_u32(CTRL_ERR + 4).load(Ordering::Relaxed);
        let seq = self.ctrl_u64(CTRL_ERR + 8).load(Ordering::Relaxed);
        let detail = self.ctrl_u64(CTRL_ERR + 16).load(Ordering::Relaxed);
        self.ctrl_u32(CTRL_ERR).store(0, Ordering::Release);
        self.ctrl_u32(CTRL_EPOCH).fetch_add(1, Ordering::Release);
        Some(device_error_to_error(
            code,
            slot,
            seq,
            detail,
            self.timeout,
            self.graph_capacity.load(Ordering::Relaxed),
        ))
    }

    // -- events -----------------------------------------------------------------------------

    pub(super) fn take_event(&self) -> Result<usize> {
        let mut ev = sync::lock(&self.events);
        if let Some(i) = ev.1.pop() {
            return Ok(i);
        }
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        ck(
            // SAFETY: creation into a valid local in the current (our) context; destroyed in drop.
            unsafe { (self.d.cuEventCreate)(&mut e, flags) },
            "cuEventCreate",
        )?;
        ev.0.push(Ev(e));
        Ok(ev.0.len() - 1)
    }

    pub(super) fn recycle_events(&self, ids: impl Iterator<Item = usize>) {
        let mut ev = sync::lock(&self.events);
        ev.1.extend(ids);
    }
}
