//! The engine's side: `fuse` (one step), CUDA Graph mode, and the checks of the engine's stream
//! and output buffer.

use super::driver::{CtxGuard, RelaxedCapture, ck, launch};
use super::layout::*;
use super::side::GpuSide;
use super::{OutPlacement, StreamCall, WaitKind, capture_allowed, check_out, vmm_probe_needed};
use crate::dequant::cpu::OutArgs;
use crate::error::{Error, Result};
use crate::sync;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

impl GpuSide {
    /// What every dequant launch checks first, with the handle's context pushed (the guard it
    /// returns pops it): the output arguments, no pending device error, the stream (`call`
    /// names the entry point), and that `out` holds `tokens` tokens.
    fn enter_launch(
        &self,
        stream: *mut c_void,
        call: StreamCall,
        out: u64,
        args: OutArgs,
        tokens: u32,
    ) -> Result<(sys::CUstream, CtxGuard)> {
        args.check(self.spec.embed_dim())?;
        let stream = stream as sys::CUstream;
        let c = CtxGuard::push(self.ctx)?;
        if let Some(e) = self.device_error() {
            return Err(e);
        }
        self.check_stream(stream, call)?;
        self.check_out_ptr(out, args, tokens)?;
        Ok((stream, c))
    }

    /// Checks the engine's stream: valid, of our context, and not capturing where `call` must
    /// not be captured.
    fn check_stream(&self, stream: sys::CUstream, call: StreamCall) -> Result<()> {
        let d = self.d;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        ck(
            // SAFETY: a query on the caller's stream handle into a valid local.
            unsafe { (d.cuStreamIsCapturing)(stream, &mut status) },
            "cuStreamIsCapturing(cuda_stream)",
        )
        .map_err(|e| Error::InvalidArgument(format!("cuda_stream is not a valid stream: {e}")))?;
        let capturing = status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        capture_allowed(call, capturing)?;
        let mut sctx: sys::CUcontext = std::ptr::null_mut();
        ck(
            // SAFETY: as above.
            unsafe { (d.cuStreamGetCtx)(stream, &mut sctx) },
            "cuStreamGetCtx(cuda_stream)",
        )?;
        if sctx != self.ctx {
            return crate::invalid!(
                "{}: cuda_stream belongs to another CUDA context; libple uses device {}'s \
                 primary context (the CUDA runtime's)",
                call.name(),
                self.device
            );
        }
        Ok(())
    }

    /// Whether the driver knows `p` as device (or managed) memory of our device: its memory type
    /// is device or unified, and its device ordinal, where the driver reports one, is ours.
    fn is_our_device_memory(&self, p: u64) -> bool {
        let d = self.d;
        let mut mt: u32 = 0;
        // SAFETY: attribute query; MEMORY_TYPE writes an unsigned int into a valid local.
        let r = unsafe {
            (d.cuPointerGetAttribute)(
                &mut mt as *mut u32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                p,
            )
        };
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        let unified = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32;
        if r != sys::CUresult::CUDA_SUCCESS || (mt != device && mt != unified) {
            return false;
        }
        let mut ord: i32 = -1;
        // SAFETY: attribute query; DEVICE_ORDINAL writes an int into a valid local.
        let r = unsafe {
            (d.cuPointerGetAttribute)(
                &mut ord as *mut i32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                p,
            )
        };
        r != sys::CUresult::CUDA_SUCCESS || ord == self.device
    }

    /// What the driver says about `out` and the last byte of `extent` bytes from it. The VMM
    /// probe (`cuMemRetainAllocationHandle`) runs only where `cuMemGetAddressRange` does not
    /// already cover the extent ([`vmm_probe_needed`]), so a buffer inside one allocation is
    /// checked with queries alone; where it runs, it runs in relaxed capture mode, so an engine
    /// capturing `fuse_graph` in global mode never sees a call it may count as unsafe.
    fn placement(&self, out: u64, extent: u64) -> OutPlacement {
        let d = self.d;
        let device_memory = self.is_our_device_memory(out);
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: a range query into valid locals.
        let range = (unsafe { (d.cuMemGetAddressRange_v2)(&mut base, &mut size, out) }
            == sys::CUresult::CUDA_SUCCESS)
            .then_some((base, size as u64));
        let vmm = vmm_probe_needed(out, extent, range) && self.is_vmm(out);
        let last = out.saturating_add(extent.saturating_sub(1));
        OutPlacement {
            device_memory,
            vmm,
            range,
            last_byte_mapped: self.is_our_device_memory(last),
        }
    }

    /// Whether `p` lies in memory mapped with `cuMemMap` (the VMM API).
    fn is_vmm(&self, p: u64) -> bool {
        let d = self.d;
        // The retain may run while the engine captures in global mode (`fuse_graph`); in relaxed
        // mode this thread's calls never invalidate a capture. Without the guard (a driver
        // without the mode exchange) the probe still runs: it is a query, never a sync.
        let _m = RelaxedCapture::enter().ok();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: succeeds only for memory mapped with cuMemMap; the retained handle is
        // released right below.
        let vmm = unsafe { (d.cuMemRetainAllocationHandle)(&mut handle, p as *mut c_void) }
            == sys::CUresult::CUDA_SUCCESS;
        if vmm {
            // SAFETY: balances the retain above.
            let _ = unsafe { (d.cuMemRelease)(handle) };
        }
        vmm
    }

    fn check_out_ptr(&self, out: u64, args: OutArgs, tokens: u32) -> Result<()> {
        let extent = args.extent_bytes(tokens, self.spec.embed_dim());
        check_out(out, extent, args.dtype.size(), &self.placement(out, extent))
    }

    /// Work items of `ple_dequant` per token (the whole table's embedding, 8 elements each).
    fn items_per_token(&self) -> u32 {
        items_per_token(self.spec.embed_dim())
    }

    fn dequant_params(&self, out: u64, args: OutArgs, capacity: u32) -> DequantParams {
        let es = args.dtype.size();
        let mut flags = 0;
        if args.accumulate {
            flags |= FLAG_ACCUMULATE;
        }
        if vec_ok(out, args.stride, es) {
            flags |= FLAG_VEC;
        }
        let zero_copy = self.reads_zero_copy();
        if zero_copy {
            flags |= FLAG_ZERO_COPY;
        }
        DequantParams {
            rows: if zero_copy {
                self.staging_dptr
            } else {
                self.rows_dptr
            },
            slot_stride: self.slot_stride as u64,
            ctrl: self.ctrl_dptr,
            dctrl: self.dev_mem,
            expected: 0,
            out,
            out_stride: args.stride as u64,
            slots: self.slots as u32,
            capacity,
            expect_n: 0,
            fmt: self.spec.format.kernel_code(),
            dtype: kernel_dtype(args.dtype),
            flags,
            scale: self.spec.global_scale,
            first_head: self.heads.first as u16,
            heads: self.heads.len() as u16,
            head_stride: self.heads.step as u16,
            head_dim: self.spec.head_dim as u32,
            row_bytes: self.spec.row_bytes() as u32,
            items_per_token: self.items_per_token(),
        }
    }

    fn wait_params(&self, capacity: u32) -> WaitParams {
        WaitParams {
            ctrl: self.ctrl_dptr,
            dctrl: self.dev_mem,
            expected: 0,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            slots: self.slots as u32,
            capacity,
            expect_n: 0,
            graph: 0,
        }
    }

    /// Host-wait mode, after the host saw step `seq` published: the slot header must say `seq`,
    /// not failed, with `num_tokens` tokens (then no kernel block reads the header).
    fn verify_header(&self, slot: usize, seq: u64, num_tokens: u32) -> Result<()> {
        let h = self.header_off(slot);
        let (s, n) = (
            self.ctrl_u64(h).load(Ordering::Acquire),
            self.ctrl_u32(h + 8).load(Ordering::Acquire),
        );
        let failed = self.ctrl_u32(h + 12).load(Ordering::Acquire) != 0;
        if s != seq || failed || n != num_tokens {
            return Err(Error::State(format!(
                "ring slot {slot} holds step {s} ({n} tokens, failed {failed}), not step {seq} \
                 ({num_tokens} tokens)"
            )));
        }
        Ok(())
    }

    /// Enqueues the wait of the handle's [`WaitKind`] for step `seq` on `stream` (`Host`: calls
    /// `host_wait()`, then checks the header on the host). Returns the dequant flags it implies.
    fn enqueue_wait(
        &self,
        stream: sys::CUstream,
        slot: usize,
        seq: u64,
        num_tokens: u32,
        host_wait: &dyn Fn() -> Result<()>,
    ) -> Result<u32> {
        if self.wait == WaitKind::Host {
            host_wait()?;
            self.verify_header(slot, seq, num_tokens)?;
            return Ok(0);
        }
        self.max_waited.fetch_max(seq, Ordering::AcqRel);
        if self.wait == WaitKind::StreamOp {
            let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
            // SAFETY: `done` is host-mapped memory of this context that lives until drop, which
            // releases every such wait first; the stream was checked (valid, our context).
            let r = unsafe {
                (self.d.cuStreamWaitValue64_v2)(stream, self.ctrl_dptr + CTRL_DONE as u64, seq, geq)
            };
            ck(r, "cuStreamWaitValue64(done >= seq)")?;
        }
        let mut wp = self.wait_params(num_tokens);
        wp.expected = seq;
        wp.expect_n = num_tokens;
        // SAFETY: `wp` matches the kernel's WaitParams; its addresses are our control blocks,
        // which outlive every launch (drop drains our kernels first).
        unsafe { launch(self.f_wait, 1, 1, stream, &mut wp, "launch ple_wait_gate")? };
        Ok(FLAG_GATED)
    }

    /// Enqueues step `seq`'s dequantisation on the engine's `stream` (a raw `CUstream`; NULL is
    /// the legacy default stream): the wait of the handle's [`WaitKind`] (`Host`: calls
    /// `host_wait()` first, which must block until the step is published and return its error),
    /// then `ple_dequant` into `out` (`[num_tokens][out_stride]` of `out_dtype`), then records an
    /// event so the worker does not reuse the slot before the kernel has read it. Mark the step
    /// consumed only after this returns. Refuses a capturing stream.
    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors ple_dequant_fuse plus the ring slot"
    )]
    pub fn fuse(
        &self,
        stream: *mut c_void,
        slot: usize,
        seq: u64,
        num_tokens: u32,
        out: u64,
        args: OutArgs,
        host_wait: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        self.check_slot(slot, seq)?;
        self.check_tokens(num_tokens, "num_tokens")?;
        let (stream, _c) = self.enter_launch(stream, StreamCall::Fuse, out, args, num_tokens)?;
        let gate = self.enqueue_wait(stream, slot, seq, num_tokens, host_wait)?;
        // Built after the wait: a host wait may span a `graph_prepare`, after which the worker
        // copies no rows to the device (`reads_zero_copy`), so parameters built before it would
        // read the slot's device rows, still an older step's. `graph_base` only ever goes from
        // 0 to a step, and the worker decided copy or not before publishing the step the wait
        // saw, so reading zero-copy now is right either way: the staging holds the rows of every
        // published step.
        let mut dp = self.dequant_params(out, args, num_tokens);
        dp.expected = seq;
        dp.expect_n = num_tokens;
        dp.flags |= gate;
        let grid = dequant_grid(
            num_tokens,
            self.items_per_token(),
            self.sm_count,
            self.blocks_per_sm,
        );
        // SAFETY: `dp` matches the kernel's DequantParams; `out` holds the step (checked above);
        // the rows and control blocks outlive the launch (drop drains our kernels first).
        unsafe {
            launch(
                self.f_dequant,
                grid,
                DEQUANT_BLOCK,
                stream,
                &mut dp,
                "launch ple_dequant",
            )?
        };
        let i = self.take_event()?;
        let ev = sync::lock(&self.events).0[i];
        // SAFETY: our event, the caller's stream (same context, checked).
        let r = unsafe { (self.d.cuEventRecord)(ev.0, stream) };
        if let Err(e) = ck(r, "cuEventRecord") {
            self.recycle_events(std::iter::once(i));
            return Err(e);
        }
        sync::lock(&self.slot_state[slot]).readers.push((seq, i));
        Ok(())
    }

    /// CUDA Graph mode, step 1: enqueues `dev_seq = base_seq, consumed = base_seq - 1` on the
    /// engine's `stream`, so the next `fuse_graph` execution (replay) consumes step `base_seq`.
    /// Refused while the stream is capturing, and for a `base_seq` a replay already consumed.
    /// Call it when no replay is in flight.
    pub fn graph_prepare(&self, stream: *mut c_void, base_seq: u64) -> Result<()> {
        if base_seq == 0 {
            return crate::invalid!("base_seq 0 is not a valid step");
        }
        let stream = stream as sys::CUstream;
        let _c = CtxGuard::push(self.ctx)?;
        self.check_stream(stream, StreamCall::GraphPrepare)?;
        let old = self.graph_base.load(Ordering::Acquire);
        let consumed = self.consumed_seq();
        if old != 0 && base_seq <= consumed {
            return crate::invalid!(
                "base_seq {base_seq}: a CUDA Graph replay already consumed step {consumed}; \
                 prepare with the next step ({})",
                consumed + 1
            );
        }
        let mut sp = SetParams {
            ctrl: self.ctrl_dptr,
            dctrl: self.dev_mem,
            value: base_seq,
        };
        // SAFETY: `sp` matches the kernel's SetParams; the control blocks outlive the launch.
        unsafe { launch(self.f_set, 1, 1, stream, &mut sp, "launch ple_graph_set")? };
        self.ctrl_u64(CTRL_CONSUMED)
            .store(base_seq - 1, Ordering::Release);
        self.graph_base.store(base_seq, Ordering::Release);
        Ok(())
    }

    /// CUDA Graph mode, step 2 (capture once, replay per step): enqueues on `stream` the spin
    /// wait for `done >= *dev_seq` (whatever the wait mode: a stream memory wait would bake its
    /// value into the graph), `ple_dequant` of step `*dev_seq` into `out`, which must hold
    /// `capacity_tokens` tokens at `out_stride` (a larger step raises `ERR_OVER_CAPACITY` and
    /// fills NaN), and `ple_graph_advance`. No host-side step number is involved.
    pub fn fuse_graph(
        &self,
        stream: *mut c_void,
        capacity_tokens: u32,
        out: u64,
        args: OutArgs,
    ) -> Result<()> {
        if self.graph_base.load(Ordering::Acquire) == 0 {
            return Err(Error::State(
                "ple_dequant_fuse_graph before ple_graph_prepare".into(),
            ));
        }
        self.check_tokens(capacity_tokens, "capacity_tokens")?;
        let (stream, _c) =
            self.enter_launch(stream, StreamCall::FuseGraph, out, args, capacity_tokens)?;
        let mut wp = self.wait_params(capacity_tokens);
        wp.graph = 1;
        let mut dp = self.dequant_params(out, args, capacity_tokens);
        dp.flags |= FLAG_GATED | FLAG_GRAPH;
        let mut ap = AdvanceParams {
            ctrl: self.ctrl_dptr,
            dctrl: self.dev_mem,
        };
        let grid = dequant_grid(
            capacity_tokens,
            self.items_per_token(),
            self.sm_count,
            self.blocks_per_sm,
        );
        // SAFETY: the parameter blocks match the kernels; `out` holds capacity_tokens tokens
        // (checked); our memory outlives every replay the engine makes before closing.
        unsafe {
            launch(self.f_wait, 1, 1, stream, &mut wp, "launch ple_wait_gate")?;
            launch(
                self.f_dequant,
                grid,
                DEQUANT_BLOCK,
                stream,
                &mut dp,
                "launch ple_dequant",
            )?;
            launch(
                self.f_advance,
                1,
                1,
                stream,
                &mut ap,
                "launch ple_graph_advance",
            )?;
        }
        self.graph_capacity
            .store(capacity_tokens, Ordering::Relaxed);
        Ok(())
    }
}
