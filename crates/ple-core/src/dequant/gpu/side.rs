//! [`GpuSide`]: the GPU resources of one handle, from open to close.

use super::driver::{Api, CtxGuard, RelaxedCapture, api, ck, cu_error_text, device_attr};
use super::layout::*;
use super::poll::Poll;
use super::{GpuConfig, WaitKind, select_wait};
use crate::error::{Error, Result};
use crate::model::RowSpec;
use crate::sync;
use cudarc::driver::sys;
use std::ffi::{CStr, CString, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Host-side state of one ring slot.
#[derive(Default)]
pub(super) struct SlotState {
    /// The step whose rows the slot holds (0: none yet).
    pub occupant: u64,
    /// The step `begin_step` confirmed the slot free for (0: none).
    pub prepared: u64,
    /// Events recorded after direct `fuse` kernels that read this slot, with their step.
    pub readers: Vec<(u64, usize)>,
}

/// An event handle that may move between threads (the driver API is thread-safe).
#[derive(Clone, Copy)]
pub(super) struct Ev(pub sys::CUevent);

/// The GPU side of one handle: mapped staging, control blocks, kernels. See the module docs.
pub struct GpuSide {
    pub(super) d: &'static Api,
    pub(super) device: i32,
    pub(super) dev: sys::CUdevice,
    pub(super) ctx: sys::CUcontext,
    pub(super) module: sys::CUmodule,
    pub(super) f_wait: sys::CUfunction,
    pub(super) f_dequant: sys::CUfunction,
    pub(super) f_advance: sys::CUfunction,
    pub(super) f_set: sys::CUfunction,
    /// libple's own stream: host-wait mode's H2D copies only.
    pub(super) copy_stream: sys::CUstream,
    /// Recorded after each H2D copy (worker thread only).
    pub(super) copy_event: sys::CUevent,
    /// Host-mapped control block and its device address.
    pub(super) ctrl: *mut u8,
    pub(super) ctrl_dptr: u64,
    pub(super) ctrl_bytes: usize,
    /// Pinned, mapped staging of all slots (slot `s` at `s * slot_stride`) and its device address.
    pub(super) staging: *mut u8,
    pub(super) staging_dptr: u64,
    /// Device allocation: the device control block, then (host-wait mode) the device rows.
    pub(super) dev_mem: u64,
    /// Where kernels read slot 0's rows: the mapped staging, or the device rows.
    pub(super) rows_dptr: u64,
    pub(super) slots: usize,
    pub(super) max_tokens: usize,
    /// The heads a step's rows are (`GpuConfig::heads`).
    pub(super) heads: crate::shard::Heads,
    /// The table's row format, global scale and geometry.
    pub(super) spec: RowSpec,
    pub(super) slot_stride: usize,
    pub(super) timeout: Duration,
    pub(super) wait: WaitKind,
    pub(super) stream_ops: bool,
    pub(super) sm_count: u32,
    pub(super) blocks_per_sm: u32,
    pub(super) slot_state: Vec<Mutex<SlotState>>,
    /// All events ever created (index = the usize in `SlotState::readers`) and the free ones.
    pub(super) events: Mutex<(Vec<Ev>, Vec<usize>)>,
    /// First step of CUDA Graph mode (0: not prepared).
    pub(super) graph_base: AtomicU64,
    /// Last step published (monotonic).
    pub(super) published: AtomicU64,
    /// Largest step a device wait was enqueued for (what close must release).
    pub(super) max_waited: AtomicU64,
    /// Capacity of the last captured `fuse_graph` (for error messages).
    pub(super) graph_capacity: AtomicU32,
    /// Set on close: the worker's polling loops stop.
    pub(super) closing: AtomicBool,
}

// SAFETY: the raw pointers are driver handles and pinned buffers owned by this struct; the CUDA
// driver API is thread-safe, and the host-side mutable state is behind mutexes and atomics.
unsafe impl Send for GpuSide {}
// SAFETY: as above; `&self` methods touch shared state only through mutexes, atomics and atomic
// accesses of the mapped control block; staging bytes follow the pipeline's slot protocol.
unsafe impl Sync for GpuSide {}

impl GpuSide {
    /// Opens the GPU side: loads the driver, retains device `cfg.device`'s primary context,
    /// loads the kernels, allocates the mapped staging of every slot, the host-mapped control
    /// block, the device control block (and device rows in host-wait mode) and libple's stream.
    /// Errors: [`Error::CudaUnavailable`] without a usable driver, `InvalidArgument` for a bad
    /// ordinal or sizes, `Unsupported` for a device below sm_80, a driver too old for the PTX,
    /// or STREAM_OP requested without stream memory operations.
    pub fn new(cfg: &GpuConfig) -> Result<GpuSide> {
        if cfg.device < 0 {
            return crate::invalid!("cuda_device {} is not a device ordinal", cfg.device);
        }
        if cfg.slots == 0 || cfg.slots > 64 {
            return crate::invalid!("{} ring slots, expected 1..=64", cfg.slots);
        }
        if cfg.max_tokens == 0 || cfg.max_tokens > 1 << 20 {
            return crate::invalid!("max_tokens {} not in [1, 1048576]", cfg.max_tokens);
        }
        // The kernel writes 8 elements of one head per work item.
        if cfg.spec.head_dim % KERNEL_ITEM != 0 {
            return Err(Error::Unsupported(format!(
                "head_dim {} is not a multiple of {KERNEL_ITEM}: the GPU kernel does not serve it \
                 (open without cuda_device and use ple_dequant_cpu)",
                cfg.spec.head_dim
            )));
        }
        let d = api()?;
        // SAFETY: every entry point was resolved; cuInit has no other precondition.
        ck(unsafe { (d.cuInit)(0) }, "cuInit")?;
        let (mut drv, mut count) = (0i32, 0i32);
        ck(
            // SAFETY: plain queries into valid locals.
            unsafe { (d.cuDriverGetVersion)(&mut drv) },
            "cuDriverGetVersion",
        )?;
        ck(
            // SAFETY: as above.
            unsafe { (d.cuDeviceGetCount)(&mut count) },
            "cuDeviceGetCount",
        )?;
        if cfg.device >= count {
            return crate::invalid!(
                "cuda_device {} but the driver sees {count} device(s)",
                cfg.device
            );
        }
        let mut dev: sys::CUdevice = 0;
        ck(
            // SAFETY: the ordinal is in range (checked above); the out-parameter is a valid local.
            unsafe { (d.cuDeviceGet)(&mut dev, cfg.device) },
            "cuDeviceGet",
        )?;
        let mut g = GpuSide::empty(d, cfg, dev);
        // From here on, Drop frees whatever was set up.
        ck(
            // SAFETY: `dev` is a valid device; Drop balances the retain once `ctx` is non-NULL.
            unsafe { (d.cuDevicePrimaryCtxRetain)(&mut g.ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let _c = CtxGuard::push(g.ctx)?;
        // Relaxed: loading the module and allocating are calls a global-mode capture on any
        // thread forbids; refused, they would fail the open and invalidate the engine's capture.
        let _m = RelaxedCapture::enter()?;
        g.query_device(cfg, drv)?;
        g.load_module(drv)?;
        g.allocate()?;
        log::info!(
            "GPU side on device {} ({} SMs, driver {drv}): wait {:?}, stream mem ops {}, {} slots \
             of {} B, zero-copy {}",
            cfg.device,
            g.sm_count,
            g.wait,
            g.stream_ops,
            cfg.slots,
            g.slot_stride,
            g.wait.zero_copy()
        );
        Ok(g)
    }

    /// A GpuSide holding nothing yet (every handle NULL), with its sizes.
    fn empty(d: &'static Api, cfg: &GpuConfig, dev: sys::CUdevice) -> GpuSide {
        let slot_bytes = cfg.max_tokens * token_bytes(&cfg.spec, cfg.heads.len());
        GpuSide {
            d,
            device: cfg.device,
            dev,
            ctx: std::ptr::null_mut(),
            module: std::ptr::null_mut(),
            f_wait: std::ptr::null_mut(),
            f_dequant: std::ptr::null_mut(),
            f_advance: std::ptr::null_mut(),
            f_set: std::ptr::null_mut(),
            copy_stream: std::ptr::null_mut(),
            copy_event: std::ptr::null_mut(),
            ctrl: std::ptr::null_mut(),
            ctrl_dptr: 0,
            ctrl_bytes: round_up(CTRL_HEADERS + cfg.slots * size_of::<SlotHeader>(), 4096),
            staging: std::ptr::null_mut(),
            staging_dptr: 0,
            dev_mem: 0,
            rows_dptr: 0,
            slots: cfg.slots,
            max_tokens: cfg.max_tokens,
            heads: cfg.heads,
            spec: cfg.spec,
            slot_stride: round_up(slot_bytes, 256),
            timeout: Duration::from_micros(cfg.timeout_us),
            wait: WaitKind::Host,
            stream_ops: false,
            sm_count: 1,
            blocks_per_sm: 1,
            slot_state: (0..cfg.slots).map(|_| Mutex::default()).collect(),
            events: Mutex::new((Vec::new(), Vec::new())),
            graph_base: AtomicU64::new(0),
            published: AtomicU64::new(0),
            max_waited: AtomicU64::new(0),
            graph_capacity: AtomicU32::new(0),
            closing: AtomicBool::new(false),
        }
    }

    /// Compute capability, host mapping, stream memory operations, SM count; the wait kind.
    fn query_device(&mut self, cfg: &GpuConfig, drv: i32) -> Result<()> {
        use sys::CUdevice_attribute::*;
        let dev = self.dev;
        let major = device_attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = device_attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        if (major, minor) < MIN_COMPUTE_CAPABILITY {
            return Err(Error::Unsupported(format!(
                "device {} is sm_{major}{minor}; libple's kernels need sm_80 or newer",
                cfg.device
            )));
        }
        if device_attr(dev, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 1 {
            return Err(Error::Unsupported(format!(
                "device {} cannot map host memory",
                cfg.device
            )));
        }
        // The V2 attribute (122 with cuda-12080 bindings), which pairs with cuStreamWaitValue64_v2.
        // A driver that does not know it reports an error: treat as unsupported.
        self.stream_ops =
            device_attr(dev, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS).unwrap_or(0) == 1;
        self.wait = select_wait(cfg.wait_mode, self.stream_ops)?;
        self.sm_count = device_attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        log::debug!("device {} is sm_{major}{minor}, driver {drv}", cfg.device);
        Ok(())
    }

    fn load_module(&mut self, drv: i32) -> Result<()> {
        let d = self.d;
        let ptx = CString::new(PTX).map_err(|_| Error::Cuda("the PTX holds a NUL".into()))?;
        let mut log = vec![0u8; 8192];
        let mut opts = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
        // SAFETY: a NUL-terminated PTX image; the options are a log buffer that outlives the
        // call and its size passed by value, as the driver documents them.
        let r = unsafe {
            (d.cuModuleLoadDataEx)(
                &mut self.module,
                ptx.as_ptr() as *const c_void,
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            self.module = std::ptr::null_mut();
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            let jit = String::from_utf8_lossy(&log[..end]).into_owned();
            if r == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION || drv < MIN_DRIVER_VERSION {
                return Err(Error::Unsupported(format!(
                    "the CUDA driver (API version {drv}) cannot load libple's kernels (PTX ISA \
                     {PTX_ISA}, needs a driver of CUDA 12.2 or newer, r535+): {} {jit}",
                    cu_error_text(r)
                )));
            }
            return Err(Error::Cuda(format!(
                "loading libple's kernels: {} {jit}",
                cu_error_text(r)
            )));
        }
        let get = |name: &CStr| -> Result<sys::CUfunction> {
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: the module is loaded; `name` is NUL-terminated.
            let r = unsafe { (d.cuModuleGetFunction)(&mut f, self.module, name.as_ptr()) };
            ck(
                r,
                &format!("cuModuleGetFunction({})", name.to_string_lossy()),
            )?;
            Ok(f)
        };
        self.f_wait = get(c"ple_wait_gate")?;
        self.f_dequant = get(c"ple_dequant")?;
        self.f_advance = get(c"ple_graph_advance")?;
        self.f_set = get(c"ple_graph_set")?;
        let mut nb = 0i32;
        // SAFETY: a kernel of the loaded module; the out-parameter is a valid local.
        let r = unsafe {
            (d.cuOccupancyMaxActiveBlocksPerMultiprocessor)(
                &mut nb,
                self.f_dequant,
                DEQUANT_BLOCK as i32,
                0,
            )
        };
        ck(r, "cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        self.blocks_per_sm = nb.max(1) as u32;
        Ok(())
    }

    /// Pinned mapped memory of `bytes`, zeroed: (host pointer, device address).
    fn host_mapped(&self, bytes: usize, what: &str) -> Result<(*mut u8, u64)> {
        let d = self.d;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let mut p: *mut c_void = std::ptr::null_mut();
        ck(
            // SAFETY: allocation into a valid out-parameter; freed in Drop (the caller stores it).
            unsafe { (d.cuMemHostAlloc)(&mut p, bytes, flags) },
            &format!("cuMemHostAlloc({what}, {bytes} B)"),
        )?;
        // SAFETY: a fresh allocation of `bytes` bytes that nothing else references yet.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes) };
        let mut dptr = 0u64;
        // SAFETY: `p` is a DEVICEMAP allocation of the current context.
        let r = unsafe { (d.cuMemHostGetDevicePointer_v2)(&mut dptr, p, 0) };
        if let Err(e) = ck(r, "cuMemHostGetDevicePointer") {
            // SAFETY: allocated just above, never handed out.
            let _ = unsafe { (d.cuMemFreeHost)(p) };
            return Err(e);
        }
        Ok((p as *mut u8, dptr))
    }

    /// The control blocks, the staging, the device rows (host wait) and libple's stream.
    fn allocate(&mut self) -> Result<()> {
        let d = self.d;
        let (ctrl, ctrl_dptr) = self.host_mapped(self.ctrl_bytes, "control")?;
        (self.ctrl, self.ctrl_dptr) = (ctrl, ctrl_dptr);
        let staging_bytes = self.slots * self.slot_stride;
        let (st, st_dptr) = self.host_mapped(staging_bytes, "staging")?;
        (self.staging, self.staging_dptr) = (st, st_dptr);
        let rows_off = round_up(DEV_GATES + self.slots * size_of::<Gate>(), 256);
        let dev_bytes = if self.wait.zero_copy() {
            rows_off
        } else {
            rows_off + staging_bytes
        };
        ck(
            // SAFETY: allocation into a valid out-parameter; freed in Drop.
            unsafe { (d.cuMemAlloc_v2)(&mut self.dev_mem, dev_bytes) },
            &format!("cuMemAlloc({dev_bytes} B)"),
        )?;
        ck(
            // SAFETY: the device control block is the first `rows_off` bytes of that allocation.
            unsafe { (d.cuMemsetD8_v2)(self.dev_mem, 0, rows_off) },
            "cuMemsetD8",
        )?;
        self.rows_dptr = if self.wait.zero_copy() {
            self.staging_dptr
        } else {
            self.dev_mem + rows_off as u64
        };
        let nb = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        ck(
            // SAFETY: creation into a valid out-parameter in the current context; destroyed in Drop.
            unsafe { (d.cuStreamCreate)(&mut self.copy_stream, nb) },
            "cuStreamCreate",
        )?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        ck(
            // SAFETY: as above.
            unsafe { (d.cuEventCreate)(&mut self.copy_event, flags) },
            "cuEventCreate",
        )?;
        Ok(())
    }

    // -- accessors --------------------------------------------------------------------------

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.device
    }
    /// The wait the handle's `ple_dequant_fuse` uses.
    pub fn wait_kind(&self) -> WaitKind {
        self.wait
    }
    /// Whether the device supports 64-bit stream memory operations.
    pub fn stream_mem_ops(&self) -> bool {
        self.stream_ops
    }
    /// Whether the GPU waits for steps by itself (`ple_table_info.device_wait_supported`).
    pub fn device_wait_supported(&self) -> bool {
        self.wait != WaitKind::Host
    }
    /// Ring slots.
    pub fn slots(&self) -> usize {
        self.slots
    }
    /// The ring slot of step `seq`: `seq % slots`. The pipeline must use exactly this mapping
    /// (the kernels compute it on the device).
    pub fn slot_of(&self, seq: u64) -> usize {
        (seq % self.slots as u64) as usize
    }
    /// Bytes of one staging slot (`max_tokens * heads * row_bytes`).
    pub fn slot_bytes(&self) -> usize {
        self.max_tokens * token_bytes(&self.spec, self.heads.len())
    }
    /// Pinned host staging of `slot` (`slot_bytes()` bytes, rows `[tokens][16][row_bytes]`),
    /// mapped into the device: where the worker gathers, and (device-wait modes) where the kernel
    /// reads. Valid while `self` lives. Panics on a bad slot.
    pub fn staging(&self, slot: usize) -> *mut u8 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        // SAFETY: slot < slots, and the allocation holds slots * slot_stride bytes.
        unsafe { self.staging.add(slot * self.slot_stride) }
    }
    /// The last step a CUDA Graph replay consumed (or skipped after an error); 0 before any.
    pub fn consumed_seq(&self) -> u64 {
        self.ctrl_u64(CTRL_CONSUMED).load(Ordering::Acquire)
    }
    /// The last step published.
    pub fn published_seq(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Whether kernels read the rows from the mapped staging (`ld.global.cv`), with no H2D copy:
    /// in the device-wait modes, and in CUDA Graph mode (from `graph_prepare` on, whatever the
    /// wait mode) — a replay's spinning gate must never wait for a copy on libple's stream,
    /// which may sit behind it in the same hardware queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`) and
    /// so never run. The staging holds every published step's rows in all modes, so a step
    /// copied before graph mode began is read correctly either way.
    pub(super) fn reads_zero_copy(&self) -> bool {
        self.wait.zero_copy() || self.graph_base.load(Ordering::Acquire) != 0
    }

    pub(super) fn ctrl_u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.ctrl_bytes);
        // SAFETY: ctrl is a live, page-aligned host allocation of ctrl_bytes, so `off` (a
        // multiple of 8 inside it) is an aligned u64; the GPU writes it only with aligned 8-byte
        // stores, and the host only through atomics.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU64) }
    }
    pub(super) fn ctrl_u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= self.ctrl_bytes);
        // SAFETY: as above, 4-byte aligned.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU32) }
    }
    pub(super) fn header_off(&self, slot: usize) -> usize {
        CTRL_HEADERS + slot * size_of::<SlotHeader>()
    }

    pub(super) fn check_slot(&self, slot: usize, seq: u64) -> Result<()> {
        if seq == 0 {
            return crate::invalid!("seq 0 is not a valid step");
        }
        if slot != self.slot_of(seq) {
            return Err(Error::State(format!(
                "step {seq} must use ring slot {} (seq % {}), not {slot}",
                self.slot_of(seq),
                self.slots
            )));
        }
        Ok(())
    }

    pub(super) fn check_tokens(&self, n: u32, what: &str) -> Result<()> {
        if n == 0 || n as usize > self.max_tokens {
            return crate::invalid!("{what} {n} not in [1, {}]", self.max_tokens);
        }
        Ok(())
    }

    /// Starts closing (idempotent): every device waiter is released (spin waits see `closing`;
    /// stream memory waits see `done` reach the largest step one was enqueued for; the gate of
    /// each then finds `closing` and its dequant launch fills NaN instead of reading rows), and
    /// the worker's slot and copy waits stop. Call before joining the worker.
    pub fn begin_close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.ctrl_u32(CTRL_CLOSING).store(1, Ordering::SeqCst);
        let v = release_value(
            self.published.load(Ordering::Acquire),
            self.max_waited.load(Ordering::Acquire),
        );
        self.ctrl_u64(CTRL_DONE).fetch_max(v, Ordering::SeqCst);
    }

    /// Waits (bounded) until every kernel of ours that may still read our memory has finished:
    /// the events after direct fuses, the H2D copy, and a CUDA Graph replay that has started
    /// (`entered > consumed`; released by `begin_close`, it ends within microseconds). Never
    /// synchronises the context (the engine's work is not ours to wait for); a replay the engine
    /// queued but the device has not started is the engine's to finish before `ple_close`.
    /// Returns false if some did not finish in time.
    fn drain_own_work(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        if self.graph_base.load(Ordering::Acquire) != 0 {
            let poll = Poll::start();
            while self.ctrl_u64(CTRL_ENTERED).load(Ordering::Acquire) > self.consumed_seq() {
                if Instant::now() > deadline {
                    return false;
                }
                poll.pause();
            }
        }
        let evs: Vec<Ev> = {
            let st = sync::lock(&self.events);
            let free: std::collections::HashSet<usize> = st.1.iter().copied().collect();
            (0..st.0.len())
                .filter(|i| !free.contains(i))
                .map(|i| st.0[i])
                .chain((!self.copy_event.is_null()).then_some(Ev(self.copy_event)))
                .collect()
        };
        evs.iter().all(|ev| {
            self.poll_event(*ev, Some(deadline), None)
                .map(|()| true)
                .unwrap_or(false)
        })
    }
}

/// How long close waits for libple's own kernels before leaking its memory instead of freeing
/// memory a kernel may still read.
const CLOSE_DRAIN: Duration = Duration::from_secs(10);

impl Drop for GpuSide {
    fn drop(&mut self) {
        if self.ctx.is_null() {
            return;
        }
        let d = self.d;
        let _c = CtxGuard::push(self.ctx)
            .map_err(|e| log::error!("GpuSide drop: {e}"))
            .ok();
        let _m = RelaxedCapture::enter().ok();
        if !self.ctrl.is_null() {
            self.begin_close();
        }
        if !self.drain_own_work(CLOSE_DRAIN) {
            log::error!(
                "GpuSide drop: libple's kernels did not finish within {CLOSE_DRAIN:?} (is the \
                 engine's stream stalled?); their memory is leaked rather than freed under them"
            );
            return;
        }
        // SAFETY: every handle below was created by us in this context and is freed once; our
        // kernels and copies have finished (drained above), so nothing of ours still uses them.
        unsafe {
            let evs = std::mem::take(&mut sync::get_mut(&mut self.events).0);
            for e in evs {
                let _ = (d.cuEventDestroy_v2)(e.0);
            }
            if !self.copy_event.is_null() {
                let _ = (d.cuEventDestroy_v2)(self.copy_event);
            }
            if !self.copy_stream.is_null() {
                let _ = (d.cuStreamDestroy_v2)(self.copy_stream);
            }
            if self.dev_mem != 0 {
                let _ = (d.cuMemFree_v2)(self.dev_mem);
            }
            if !self.staging.is_null() {
                let _ = (d.cuMemFreeHost)(self.staging as *mut c_void);
            }
            if !self.ctrl.is_null() {
                let _ = (d.cuMemFreeHost)(self.ctrl as *mut c_void);
            }
            if !self.module.is_null() {
                let _ = (d.cuModuleUnload)(self.module);
            }
        }
        drop(_m);
        drop(_c);
        // SAFETY: balances the retain in new() (ctx is non-NULL only after it succeeded).
        let _ = unsafe { (d.cuDevicePrimaryCtxRelease_v2)(self.dev) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::gpu::WaitMode;

    #[test]
    fn new_without_driver_is_cuda_unavailable() {
        let cfg = GpuConfig {
            device: 0,
            wait_mode: WaitMode::Auto,
            slots: 2,
            max_tokens: 16,
            heads: crate::shard::Heads::all(16),
            spec: RowSpec::shipped(crate::model::RowFormat::Nvfp4, 1.0),
            timeout_us: 1_000_000,
        };
        let present = api().is_ok();
        match GpuSide::new(&cfg) {
            Err(Error::CudaUnavailable(m)) => assert!(!present || m.contains("CUDA"), "{m}"),
            Err(e) => assert!(present, "no driver here, yet: {e}"),
            Ok(_) => assert!(present, "GpuSide::new succeeded without a driver"),
        }
        if !present {
            let e = GpuSide::new(&cfg).err().unwrap();
            assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable);
            assert!(e.to_string().contains("libcuda.so.1"), "{e}");
        }
    }

    #[test]
    fn bad_config_is_rejected_before_touching_the_driver() {
        let mut cfg = GpuConfig {
            device: -1,
            wait_mode: WaitMode::Auto,
            slots: 2,
            max_tokens: 16,
            heads: crate::shard::Heads::all(16),
            spec: RowSpec::shipped(crate::model::RowFormat::Fp8, 1.0),
            timeout_us: 1,
        };
        assert!(matches!(GpuSide::new(&cfg), Err(Error::InvalidArgument(_))));
        cfg.device = 0;
        cfg.slots = 0;
        assert!(matches!(GpuSide::new(&cfg), Err(Error::InvalidArgument(_))));
        cfg.slots = 2;
        cfg.max_tokens = 0;
        assert!(matches!(GpuSide::new(&cfg), Err(Error::InvalidArgument(_))));
    }
}
