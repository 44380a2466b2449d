//! The GPU side: CUDA driver loading, the device's primary context, device row buffers, the
//! CPU → GPU handshake and the dequant kernels (`docs/FORMAT.md#row-formats-and-dequantisation`,
//! `docs/FORMAT.md#the-cpu-gpu-handshake`). The pipeline owns one
//! [`GpuSide`] per handle opened with `cuda_device >= 0` (wired in `crate::step::pipeline`; see its
//! module docs and docs/GPU.md for what has not run on a GPU yet).
//!
//! # Driver
//! libcuda is loaded at run time (cudarc, `dynamic-loading`); a machine without it builds, tests
//! and runs CPU-only, and [`GpuSide::new`] returns [`Error::CudaUnavailable`] there. The kernels
//! are PTX for `compute_80` embedded in the library ([`PTX`], generated from
//! `kernels/ple_kernels.cu` by `scripts/gen-ptx.py` with NVRTC 12.2): the driver JIT-compiles them
//! for the device (sm_80 … sm_121). PTX ISA 8.2 needs a driver of CUDA 12.2 or newer (Linux
//! r535+); an older driver fails in [`GpuSide::new`] with [`Error::Unsupported`].
//!
//! libple never creates or destroys a CUDA context and never touches the engine's streams beyond
//! enqueueing on them: it retains the device's **primary** context (the one the CUDA runtime
//! uses), pushes it around its own driver calls, and releases it on drop. The engine's stream
//! must belong to that context.
//!
//! # The dequantisation rule
//! Written once in `docs/FORMAT.md#row-formats-and-dequantisation`; the kernels implement it with
//! `__fmul_rn`/`__fadd_rn` (no FMA) and match the CPU path bit for bit.
//!
//! # Handshake
//! Ring slot of step `seq` is `seq % slots` ([`GpuSide::slot_of`]); the pipeline must use it.
//! The worker gathers into [`GpuSide::staging`], then [`GpuSide::upload`] waits until no kernel
//! still reads the slot's device rows, copies host → device on the library's own copy stream,
//! waits for the copy, writes the slot header `{seq, num_tokens, failed = 0}` and publishes
//! `done = seq` (release) in a host-mapped word. Steps publish in increasing `seq` order. A step
//! that failed is published with [`GpuSide::publish_failed`] so device waiters are released; its
//! kernel writes nothing. A kernel consumes step `seq` only if `done >= seq` and the slot header
//! says `seq` (never "flag set": stale rows are impossible).
//!
//! Waits ([`WaitKind`]): `Host` (the caller's host wait, then the kernel), `StreamOp`
//! (`cuStreamWaitValue64(done >= seq)` on the engine's stream; cannot time out, so the worker
//! always publishes, failures included), `SpinKernel` (a one-thread kernel polling `done` with a
//! `%globaltimer` timeout that raises a device error instead of hanging).
//!
//! # CUDA Graphs
//! `ple_dequant_fuse` bakes `seq` into what it enqueues, so it refuses to be captured. For graphs:
//! 1. [`GpuSide::graph_prepare`]`(stream, base)` enqueues `dev_seq = base` on the engine's stream
//!    (call it when no replay is in flight, outside capture or inside it, before the first replay).
//! 2. Capture [`GpuSide::fuse_graph`]`(stream, capacity, ...)` once: it enqueues
//!    `ple_wait_gate` (spin wait for `done >= *dev_seq`, whatever the wait mode), `ple_dequant`
//!    (reads `*dev_seq`, its slot `*dev_seq % slots` and that slot's token count from the header
//!    the host wrote, raising `ERR_OVER_CAPACITY` instead of writing past `capacity` tokens) and
//!    `ple_graph_advance` (reports `consumed = *dev_seq` to the host, then `*dev_seq += 1`).
//! 3. The engine submits steps `base, base+1, base+2, …` in order and replays the graph once per
//!    step: replay k consumes step `base + k` and can never consume an earlier step's rows (the
//!    header's seq must equal `*dev_seq`). Every step from `base` on must be consumed by exactly one
//!    replay: the worker waits for `consumed >= previous occupant` before reusing a slot. After a
//!    device error, call `graph_prepare` again with the next step to resynchronise.

use crate::dequant::cpu::{Dtype, OutArgs};
use crate::error::{Error, Result};
use crate::model::{HEAD_DIM, NUM_HEADS, PLE_EMBED_DIM, RowFormat};
use cudarc::driver::sys;
use std::ffi::{CStr, CString, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The kernels as PTX (compute_80), generated from `kernels/ple_kernels.cu`.
pub const PTX: &str = include_str!("../../../../kernels/ple_kernels.ptx");
/// PTX ISA version of [`PTX`] (its `.version` line): fixed by the pinned NVRTC (12.2).
pub const PTX_ISA: &str = "8.2";
/// Oldest driver API version that can JIT [`PTX`] (`cuDriverGetVersion`: 12020 = CUDA 12.2, r535).
pub const MIN_DRIVER_VERSION: i32 = 12020;
/// Oldest compute capability the PTX targets.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Threads per block of `ple_dequant`.
pub const DEQUANT_BLOCK: u32 = 256;
/// Work items (8 output elements each) per token.
pub const ITEMS_PER_TOKEN: u64 = (PLE_EMBED_DIM / 8) as u64;

/// Device error codes (`DevError.code`, see the kernels).
pub const ERR_WAIT_TIMEOUT: u32 = 1;
pub const ERR_OVER_CAPACITY: u32 = 2;
pub const ERR_SEQ_MISMATCH: u32 = 3;
pub const ERR_TOKEN_COUNT: u32 = 4;
pub const ERR_CLOSED: u32 = 5;

// Host-mapped control block layout (bytes); each group on its own 128-byte line.
const CTRL_DONE: usize = 0;
const CTRL_ERR: usize = 128;
const CTRL_CONSUMED: usize = 256;
const CTRL_HEADERS: usize = 384;
// Device control layout: dev_seq, then gates.
const DEV_SEQ: usize = 0;
const DEV_GATES: usize = 256;
// Each group of the control block on its own line, headers last; device gates after dev_seq.
const _: () = assert!(CTRL_ERR >= CTRL_DONE + 8 && CTRL_ERR % 128 == 0);
const _: () = assert!(CTRL_CONSUMED >= CTRL_ERR + size_of::<DevError>());
const _: () = assert!(CTRL_HEADERS >= CTRL_CONSUMED + 8 && CTRL_HEADERS % 16 == 0);
const _: () = assert!(DEV_GATES >= DEV_SEQ + 8);

/// Per-slot header in host-mapped memory (`SlotHeader` in the kernels).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotHeader {
    pub seq: u64,
    pub num_tokens: u32,
    pub failed: u32,
}

/// The first device-side error (`DevError` in the kernels); `code` is written last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DevError {
    pub code: u32,
    pub slot: u32,
    pub seq: u64,
    pub detail: u64,
    pub reserved: u64,
}

/// Result of the wait kernel for one slot (`Gate`, device memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Gate {
    pub seq: u64,
    pub num_tokens: u32,
    pub ok: u32,
}

/// Parameters of `ple_wait_gate` (layout mirrors the kernels' `WaitParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitParams {
    pub done: u64,
    pub err: u64,
    pub headers: u64,
    pub gates: u64,
    pub dev_seq: u64,
    pub expected: u64,
    pub timeout_ns: u64,
    pub slots: u32,
    pub capacity: u32,
    pub expect_n: u32,
    pub reserved: u32,
}

/// Parameters of `ple_dequant` (layout mirrors the kernels' `DequantParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DequantParams {
    pub rows: u64,
    pub slot_stride: u64,
    pub err: u64,
    pub headers: u64,
    pub gates: u64,
    pub dev_seq: u64,
    pub expected: u64,
    pub out: u64,
    pub out_stride: u64,
    pub slots: u32,
    pub capacity: u32,
    pub expect_n: u32,
    pub fmt: i32,
    pub dtype: i32,
    pub flags: u32,
    pub scale: f32,
    pub vec_ok: u32,
}

/// Parameters of `ple_graph_advance`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AdvanceParams {
    pub dev_seq: u64,
    pub consumed: u64,
}

/// Parameters of `ple_graph_set`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SetParams {
    pub dev_seq: u64,
    pub value: u64,
}

/// How a handle with a GPU orders the dequant kernel after the step's rows (`ple_options.wait_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// A device wait where the GPU supports one (stream memory operations, else the spin kernel).
    #[default]
    Auto,
    /// The host waits (`ple_wait`) before enqueueing the kernel.
    Host,
    /// `cuStreamWaitValue64(done >= seq)` on the engine's stream; refused where unsupported.
    StreamOp,
    /// A one-thread kernel polling the mapped `done` word, with a timeout.
    SpinKernel,
}

/// How `fuse` orders the kernel after the step's rows (resolved from [`WaitMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// The caller's host wait (`ple_wait`), then the kernel.
    Host,
    /// `cuStreamWaitValue64(done >= seq)` on the engine's stream.
    StreamOp,
    /// A one-thread spin kernel on the engine's stream, with a timeout.
    SpinKernel,
}

/// Resolves a [`WaitMode`] for a device that does (`stream_ops`) or does not support 64-bit
/// stream memory operations. Auto: stream op where supported, else the spin kernel. Asking for
/// StreamOp on a device without support is an error: such a wait may "succeed" and never
/// synchronise (GB10; `docs/GPU.md`).
pub fn select_wait(mode: WaitMode, stream_ops: bool) -> Result<WaitKind> {
    match mode {
        WaitMode::Auto if stream_ops => Ok(WaitKind::StreamOp),
        WaitMode::Auto => Ok(WaitKind::SpinKernel),
        WaitMode::Host => Ok(WaitKind::Host),
        WaitMode::StreamOp if stream_ops => Ok(WaitKind::StreamOp),
        WaitMode::StreamOp => Err(Error::Unsupported(
            "wait_mode PLE_WAIT_STREAM_OP, but the device reports no 64-bit stream memory \
             operations (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 0); use \
             PLE_WAIT_AUTO or PLE_WAIT_SPIN_KERNEL"
                .into(),
        )),
        WaitMode::SpinKernel => Ok(WaitKind::SpinKernel),
    }
}

/// Blocks of `ple_dequant` for `num_tokens` tokens: enough for one item per thread, but no more
/// than can be resident at once (`sm_count * blocks_per_sm`; the kernel is grid-stride). At least 1.
pub fn dequant_grid(num_tokens: u32, sm_count: u32, blocks_per_sm: u32) -> u32 {
    let items = num_tokens as u64 * ITEMS_PER_TOKEN;
    let needed = items.div_ceil(DEQUANT_BLOCK as u64).max(1);
    let resident = (sm_count.max(1) as u64) * (blocks_per_sm.max(1) as u64);
    needed.min(resident) as u32
}

/// The kernels' `DT_*` value of `dtype`.
fn kernel_dtype(dtype: Dtype) -> i32 {
    match dtype {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
    }
}

/// The kernels' `FLAG_ACCUMULATE` bit.
const KERNEL_FLAG_ACCUMULATE: u32 = 1;

/// Whether the kernel may use 16-byte vector loads/stores: `out` and every token row start
/// (`out_stride * elem_size`) are 16-byte aligned.
pub fn vec_ok(out: u64, out_stride: usize, elem_size: usize) -> bool {
    out % 16 == 0 && (out_stride * elem_size) % 16 == 0
}

/// Bytes of one token's 16 rows.
pub fn token_bytes(format: RowFormat) -> usize {
    NUM_HEADS * format.row_bytes(HEAD_DIM)
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

// ---------------------------------------------------------------------------------------------
// Driver plumbing
// ---------------------------------------------------------------------------------------------

/// Every driver entry point this module calls: checked before the first call, because cudarc
/// panics on a missing symbol (an old driver) and we want an error instead.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxSynchronize",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamGetCtx",
    "cuStreamIsCapturing",
    "cuStreamWaitValue64_v2",
    "cuThreadExchangeStreamCaptureMode",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemGetAddressRange_v2",
    "cuPointerGetAttribute",
    "cuLaunchKernel",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// Checks that libcuda can be loaded and has every entry point we use.
pub fn probe_driver() -> Result<()> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "no CUDA driver library (libcuda.so.1) could be loaded; install the NVIDIA driver, or \
             open the table with cuda_device = -1 for the CPU path"
                .into(),
        ));
    }
    // SAFETY: the library is present (checked above), so culib() does not panic.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: looking a symbol up does not call it.
        if unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err() {
            return Err(Error::CudaUnavailable(format!(
                "the CUDA driver library lacks {name}: a driver of CUDA 12.2 or newer is needed"
            )));
        }
    }
    Ok(())
}

fn cu_error_text(r: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver returns pointers to static strings (or leaves them NULL).
    unsafe {
        let _ = sys::cuGetErrorName(r, &mut name);
        let _ = sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: NUL-terminated static string from the driver.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (s(name), s(text)) {
        (Some(n), Some(t)) => format!("{n} ({t})"),
        (Some(n), None) => n,
        _ => format!("CUresult {}", r as i32),
    }
}

/// Converts a driver result to our error, naming the call.
fn ck(r: sys::CUresult, what: &str) -> Result<()> {
    use sys::CUresult::*;
    match r {
        CUDA_SUCCESS => Ok(()),
        CUDA_ERROR_OUT_OF_MEMORY => {
            Err(Error::OutOfMemory(format!("{what}: {}", cu_error_text(r))))
        }
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_STUB_LIBRARY | CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => Err(
            Error::CudaUnavailable(format!("{what}: {}", cu_error_text(r))),
        ),
        _ => Err(Error::Cuda(format!("{what}: {}", cu_error_text(r)))),
    }
}

/// Pushes a context on the calling thread for the guard's lifetime.
struct CtxGuard;

impl CtxGuard {
    fn push(ctx: sys::CUcontext) -> Result<CtxGuard> {
        // SAFETY: ctx is a retained primary context.
        ck(unsafe { sys::cuCtxPushCurrent_v2(ctx) }, "cuCtxPushCurrent")?;
        Ok(CtxGuard)
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        let mut old: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what push pushed.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// Sets the calling thread's stream capture mode to RELAXED for the guard's lifetime, so the
/// worker's copies and syncs are never refused because an engine thread is capturing a graph in
/// global mode.
struct RelaxedCapture(sys::CUstreamCaptureMode);

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let mut m = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges a per-thread setting.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
        RelaxedCapture(m)
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut m = self.0;
        // SAFETY: restores the previous per-thread setting.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
    }
}

fn device_attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: plain query.
    ck(
        unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

unsafe fn launch<P>(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut P,
    what: &str,
) -> Result<()> {
    let mut args = [params as *mut P as *mut c_void];
    // SAFETY: the kernel takes exactly one parameter of type P (layouts checked by tests).
    ck(
        unsafe {
            sys::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        what,
    )
}

/// Host-side state of one ring slot.
#[derive(Default)]
struct SlotState {
    /// The step whose rows the slot's device buffer holds (0: none yet).
    occupant: u64,
    /// Events recorded after direct `fuse` kernels that read this slot, with their step.
    readers: Vec<(u64, usize)>,
}

/// An event pointer that may move between threads (the driver API is thread-safe).
#[derive(Clone, Copy)]
struct Ev(sys::CUevent);

/// The GPU side of one handle: device buffers, handshake words, kernels. See the module docs.
pub struct GpuSide {
    device: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    f_wait: sys::CUfunction,
    f_dequant: sys::CUfunction,
    f_advance: sys::CUfunction,
    f_set: sys::CUfunction,
    copy_stream: sys::CUstream,
    /// Host-mapped control block (done, err, consumed, headers) and its device address.
    ctrl: *mut u8,
    ctrl_dptr: u64,
    ctrl_bytes: usize,
    /// Pinned host staging per slot.
    staging: Vec<*mut u8>,
    /// Device allocation: dev_seq and gates at the start, rows from `rows_dptr`.
    dev_mem: u64,
    rows_dptr: u64,
    slots: usize,
    max_tokens: usize,
    format: RowFormat,
    global_scale: f32,
    slot_stride: usize,
    timeout: Duration,
    wait: WaitKind,
    stream_ops: bool,
    sm_count: u32,
    blocks_per_sm: u32,
    slot_state: Vec<Mutex<SlotState>>,
    /// All events ever created (index = the usize in `SlotState::readers`) and the free ones.
    events: Mutex<(Vec<Ev>, Vec<usize>)>,
    /// First step of CUDA Graph mode (0: not prepared).
    graph_base: AtomicU64,
    /// Last step published (monotonic).
    published: AtomicU64,
    /// Capacity of the last captured `fuse_graph` (for error messages).
    graph_capacity: AtomicU32,
}

// SAFETY: the raw pointers are driver handles and pinned buffers owned by this struct; the CUDA
// driver API is thread-safe, and the host-side mutable state is behind mutexes and atomics.
unsafe impl Send for GpuSide {}
// SAFETY: as above; `&self` methods only touch shared state through mutexes, atomics and
// volatile/atomic accesses of the mapped control block.
unsafe impl Sync for GpuSide {}

/// What [`GpuSide::new`] needs.
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// CUDA device ordinal (`ple_options.cuda_device`).
    pub device: i32,
    /// How the kernel waits for a step.
    pub wait_mode: WaitMode,
    /// Ring slots (`max_in_flight`).
    pub slots: usize,
    /// Largest step (`max_tokens_per_step`).
    pub max_tokens: usize,
    /// The table's row format and global scale.
    pub format: RowFormat,
    pub global_scale: f32,
    /// Timeout of device spin waits and of waiting for a slot to be free (`wait_timeout_us`).
    pub timeout_us: u64,
}

impl GpuSide {
    /// Opens the GPU side: loads the driver, retains device `cfg.device`'s primary context,
    /// loads the kernels, allocates pinned staging per slot, device rows for every slot (slot `s`
    /// at `rows + s * slot_stride`), the host-mapped handshake words, and a non-blocking copy
    /// stream. Errors: [`Error::CudaUnavailable`] without a usable driver, `InvalidArgument` for a
    /// bad ordinal or sizes, `Unsupported` for a device below sm_80, a driver too old for the PTX,
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
        probe_driver()?;
        // SAFETY: the driver is present with every symbol we use.
        ck(unsafe { sys::cuInit(0) }, "cuInit")?;
        let mut drv = 0i32;
        ck(
            unsafe { sys::cuDriverGetVersion(&mut drv) },
            "cuDriverGetVersion",
        )?;
        let mut count = 0i32;
        ck(
            unsafe { sys::cuDeviceGetCount(&mut count) },
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
            unsafe { sys::cuDeviceGet(&mut dev, cfg.device) },
            "cuDeviceGet",
        )?;

        let slot_bytes = cfg.max_tokens * token_bytes(cfg.format);
        let mut g = GpuSide {
            device: cfg.device,
            dev,
            ctx: std::ptr::null_mut(),
            module: std::ptr::null_mut(),
            f_wait: std::ptr::null_mut(),
            f_dequant: std::ptr::null_mut(),
            f_advance: std::ptr::null_mut(),
            f_set: std::ptr::null_mut(),
            copy_stream: std::ptr::null_mut(),
            ctrl: std::ptr::null_mut(),
            ctrl_dptr: 0,
            ctrl_bytes: round_up(CTRL_HEADERS + cfg.slots * size_of::<SlotHeader>(), 4096),
            staging: Vec::new(),
            dev_mem: 0,
            rows_dptr: 0,
            slots: cfg.slots,
            max_tokens: cfg.max_tokens,
            format: cfg.format,
            global_scale: cfg.global_scale,
            slot_stride: round_up(slot_bytes, 256),
            timeout: Duration::from_micros(cfg.timeout_us),
            wait: WaitKind::Host,
            stream_ops: false,
            sm_count: 1,
            blocks_per_sm: 1,
            slot_state: (0..cfg.slots)
                .map(|_| Mutex::new(SlotState::default()))
                .collect(),
            events: Mutex::new((Vec::new(), Vec::new())),
            graph_base: AtomicU64::new(0),
            published: AtomicU64::new(0),
            graph_capacity: AtomicU32::new(0),
        };
        // From here on, Drop frees whatever was set up.
        ck(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut g.ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let _c = CtxGuard::push(g.ctx)?;

        use sys::CUdevice_attribute::*;
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
        g.stream_ops =
            device_attr(dev, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS).unwrap_or(0) == 1;
        g.wait = select_wait(cfg.wait_mode, g.stream_ops)?;
        g.sm_count = device_attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;

        g.load_module(drv)?;

        let mut nb = 0i32;
        ck(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut nb,
                    g.f_dequant,
                    DEQUANT_BLOCK as i32,
                    0,
                )
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        g.blocks_per_sm = nb.max(1) as u32;

        ck(
            unsafe {
                sys::cuStreamCreate(
                    &mut g.copy_stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;

        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let mut p: *mut c_void = std::ptr::null_mut();
        ck(
            unsafe { sys::cuMemHostAlloc(&mut p, g.ctrl_bytes, flags) },
            "cuMemHostAlloc(control)",
        )?;
        g.ctrl = p as *mut u8;
        // SAFETY: fresh allocation of ctrl_bytes.
        unsafe { std::ptr::write_bytes(g.ctrl, 0, g.ctrl_bytes) };
        ck(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut g.ctrl_dptr, p, 0) },
            "cuMemHostGetDevicePointer",
        )?;
        for s in 0..cfg.slots {
            let mut p: *mut c_void = std::ptr::null_mut();
            ck(
                unsafe { sys::cuMemHostAlloc(&mut p, slot_bytes, flags) },
                &format!("cuMemHostAlloc(staging slot {s}, {slot_bytes} B)"),
            )?;
            g.staging.push(p as *mut u8);
        }

        let rows_off = round_up(DEV_GATES + cfg.slots * size_of::<Gate>(), 256);
        let dev_bytes = rows_off + cfg.slots * g.slot_stride;
        ck(
            unsafe { sys::cuMemAlloc_v2(&mut g.dev_mem, dev_bytes) },
            &format!("cuMemAlloc({dev_bytes} B)"),
        )?;
        g.rows_dptr = g.dev_mem + rows_off as u64;
        ck(
            unsafe { sys::cuMemsetD8_v2(g.dev_mem, 0, rows_off) },
            "cuMemsetD8",
        )?;
        log::info!(
            "GPU side on device {} (sm_{major}{minor}, {} SMs, driver {drv}): wait {:?}, stream mem ops {}, {} slots of {} B",
            cfg.device,
            g.sm_count,
            g.wait,
            g.stream_ops,
            cfg.slots,
            g.slot_stride
        );
        Ok(g)
    }

    fn load_module(&mut self, drv: i32) -> Result<()> {
        let ptx = CString::new(PTX).expect("PTX has no NUL");
        let mut log = vec![0u8; 8192];
        let mut opts = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
        // SAFETY: NUL-terminated PTX image; option values as the driver documents them.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut self.module,
                ptx.as_ptr() as *const c_void,
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            self.module = std::ptr::null_mut();
            let jit =
                String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                    .into_owned();
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
            // SAFETY: module is loaded; name is NUL-terminated.
            ck(
                unsafe { sys::cuModuleGetFunction(&mut f, self.module, name.as_ptr()) },
                &format!("cuModuleGetFunction({})", name.to_string_lossy()),
            )?;
            Ok(f)
        };
        self.f_wait = get(c"ple_wait_gate")?;
        self.f_dequant = get(c"ple_dequant")?;
        self.f_advance = get(c"ple_graph_advance")?;
        self.f_set = get(c"ple_graph_set")?;
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
    /// (the graph kernels compute it on the device).
    pub fn slot_of(&self, seq: u64) -> usize {
        (seq % self.slots as u64) as usize
    }
    /// Bytes of one staging slot (`max_tokens * 16 * row_bytes`).
    pub fn slot_bytes(&self) -> usize {
        self.max_tokens * token_bytes(self.format)
    }
    /// Pinned host staging of `slot` (`slot_bytes()` bytes, rows `[tokens][16][row_bytes]`):
    /// where the worker gathers. Valid while `self` lives. Panics on a bad slot.
    pub fn staging(&self, slot: usize) -> *mut u8 {
        self.staging[slot]
    }
    /// The last step a CUDA Graph replay consumed (or skipped after an error); 0 before any.
    /// In graph mode the pipeline treats step `s` as consumed once this is `>= s`.
    pub fn consumed_seq(&self) -> u64 {
        self.ctrl_u64(CTRL_CONSUMED).load(Ordering::Acquire)
    }
    /// The last step published.
    pub fn published_seq(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    fn ctrl_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: ctrl is a live, 8-byte aligned (page aligned base) host allocation; the GPU
        // writes it only with aligned 8-byte stores.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU64) }
    }
    fn ctrl_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, 4-byte aligned.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU32) }
    }
    fn header_off(&self, slot: usize) -> usize {
        CTRL_HEADERS + slot * size_of::<SlotHeader>()
    }
    fn dptr(&self, off: usize) -> u64 {
        self.ctrl_dptr + off as u64
    }

    fn check_slot(&self, slot: usize, seq: u64) -> Result<()> {
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

    fn check_tokens(&self, n: u32, what: &str) -> Result<()> {
        if n == 0 || n as usize > self.max_tokens {
            return crate::invalid!("{what} {n} not in [1, {}]", self.max_tokens);
        }
        Ok(())
    }

    // -- worker side ----------------------------------------------------------------------

    /// Waits until no kernel may still read `slot`'s device rows or header: every direct `fuse`
    /// of an older step in the slot has finished (its event), and in graph mode a replay has
    /// consumed the previous occupant. Polls with the handle's timeout.
    fn wait_slot_free(&self, slot: usize, seq: u64) -> Result<()> {
        let (old, occupant) = {
            let mut st = self.slot_state[slot]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (old, keep): (Vec<_>, Vec<_>) = st.readers.drain(..).partition(|&(q, _)| q < seq);
            st.readers = keep;
            (old, st.occupant)
        };
        // None: no deadline (a timeout too large to add to now, e.g. UINT64_MAX microseconds).
        let deadline = Instant::now().checked_add(self.timeout);
        let late = || deadline.is_some_and(|d| Instant::now() > d);
        // Copy the handles out: never hold the event lock while polling (fuse needs it).
        let handles: Vec<(u64, Ev)> = {
            let evs = self.events.lock().unwrap_or_else(|p| p.into_inner());
            old.iter().map(|&(q, i)| (q, evs.0[i])).collect()
        };
        let mut result = Ok(());
        let direct = old.iter().any(|&(q, _)| q == occupant);
        'events: for &(q, ev) in &handles {
            loop {
                // SAFETY: a live event created by us (events are destroyed only in drop).
                let r = unsafe { sys::cuEventQuery(ev.0) };
                if r == sys::CUresult::CUDA_SUCCESS {
                    break;
                }
                if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                    result = ck(r, "cuEventQuery(slot reader)");
                    break 'events;
                }
                if late() {
                    result = Err(Error::Timeout(format!(
                        "the dequant kernel of step {q} (ring slot {slot}) did not finish \
                         within {:?}; is the engine's stream stalled?",
                        self.timeout
                    )));
                    break 'events;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        self.recycle_events(old.iter().map(|&(_, i)| i));
        result?;
        let base = self.graph_base.load(Ordering::Acquire);
        if base != 0 && occupant >= base && !direct {
            while self.consumed_seq() < occupant {
                if late() {
                    return Err(Error::Timeout(format!(
                        "step {occupant} (ring slot {slot}) was not consumed by a CUDA Graph \
                         replay within {:?} (last consumed: {}); in graph mode every step from \
                         {base} on must be consumed by one replay",
                        self.timeout,
                        self.consumed_seq()
                    )));
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(())
    }

    fn publish(&self, slot: usize, seq: u64, num_tokens: u32, failed: bool) {
        let h = self.header_off(slot);
        self.ctrl_u64(h).store(seq, Ordering::Relaxed);
        self.ctrl_u32(h + 8).store(num_tokens, Ordering::Relaxed);
        self.ctrl_u32(h + 12)
            .store(failed as u32, Ordering::Relaxed);
        self.slot_state[slot]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .occupant = seq;
        self.published.store(seq, Ordering::Release);
        // Release: the header (and, for upload, the completed copy) before done.
        self.ctrl_u64(CTRL_DONE).store(seq, Ordering::Release);
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
    /// `num_tokens * 16 * row_bytes` bytes) into `staging(slot)`: waits until the slot's device
    /// rows are free, copies them host → device on the library's copy stream, waits for the copy,
    /// writes the slot header and publishes `done = seq`. On error nothing is published: call
    /// [`GpuSide::publish_failed`] then.
    pub fn upload(&self, slot: usize, bytes: usize, seq: u64, num_tokens: u32) -> Result<()> {
        self.check_slot(slot, seq)?;
        self.check_tokens(num_tokens, "num_tokens")?;
        let expect = num_tokens as usize * token_bytes(self.format);
        if bytes != expect {
            return crate::invalid!(
                "upload of {bytes} B for {num_tokens} tokens; expected {expect} (16 rows of {} B each)",
                self.format.row_bytes(HEAD_DIM)
            );
        }
        self.check_order(seq)?;
        let _c = CtxGuard::push(self.ctx)?;
        let _m = RelaxedCapture::enter();
        self.wait_slot_free(slot, seq)?;
        let dst = self.rows_dptr + (slot * self.slot_stride) as u64;
        // SAFETY: staging[slot] holds slot_bytes >= bytes; dst has slot_stride >= bytes.
        ck(
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst,
                    self.staging[slot] as *const c_void,
                    bytes,
                    self.copy_stream,
                )
            },
            "cuMemcpyHtoDAsync(rows)",
        )?;
        ck(
            unsafe { sys::cuStreamSynchronize(self.copy_stream) },
            "cuStreamSynchronize(copy stream)",
        )?;
        self.publish(slot, seq, num_tokens, false);
        Ok(())
    }

    /// Worker thread, when step `seq` failed: publishes it as failed so device waiters are
    /// released (its kernel writes nothing; the pipeline reports the step's error from
    /// `ple_wait`). Always publishes; returns an error only if the slot could not be confirmed
    /// free first (a kernel of an older step may then report `ERR_SEQ_MISMATCH`, never read
    /// wrong rows).
    pub fn publish_failed(&self, slot: usize, seq: u64) -> Result<()> {
        self.check_slot(slot, seq)?;
        self.check_order(seq)?;
        let r = CtxGuard::push(self.ctx).and_then(|_c| {
            let _m = RelaxedCapture::enter();
            self.wait_slot_free(slot, seq)
        });
        self.publish(slot, seq, 0, true);
        r
    }

    // -- engine side ----------------------------------------------------------------------

    /// Reads and clears the device error word: a device wait that timed out, a graph step larger
    /// than the captured capacity, a slot holding another step. `None` when clear.
    pub fn device_error(&self) -> Option<Error> {
        let code = self.ctrl_u32(CTRL_ERR).load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let slot = self.ctrl_u32(CTRL_ERR + 4).load(Ordering::Relaxed);
        let seq = self.ctrl_u64(CTRL_ERR + 8).load(Ordering::Relaxed);
        let detail = self.ctrl_u64(CTRL_ERR + 16).load(Ordering::Relaxed);
        self.ctrl_u32(CTRL_ERR).store(0, Ordering::Release);
        Some(device_error_to_error(
            code,
            slot,
            seq,
            detail,
            self.timeout,
            self.graph_capacity.load(Ordering::Relaxed),
        ))
    }

    fn check_stream(&self, stream: sys::CUstream, what: &str) -> Result<()> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: query on the caller's stream handle.
        ck(
            unsafe { sys::cuStreamIsCapturing(stream, &mut status) },
            "cuStreamIsCapturing(cuda_stream)",
        )
        .map_err(|e| Error::InvalidArgument(format!("cuda_stream is not a valid stream: {e}")))?;
        if what == "ple_dequant_fuse"
            && status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        {
            return crate::invalid!(
                "ple_dequant_fuse cannot be captured into a CUDA graph (a replay would reuse its \
                 step); capture ple_dequant_fuse_graph after ple_graph_prepare instead"
            );
        }
        let mut sctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: query on the caller's stream handle.
        ck(
            unsafe { sys::cuStreamGetCtx(stream, &mut sctx) },
            "cuStreamGetCtx(cuda_stream)",
        )?;
        if sctx != self.ctx {
            return crate::invalid!(
                "{what}: cuda_stream belongs to another CUDA context; libple uses device {}'s \
                 primary context (the CUDA runtime's)",
                self.device
            );
        }
        Ok(())
    }

    /// Checks that `out` is device memory of our device and, where the driver can tell, that the
    /// allocation holds `extent` bytes from `out` (never write past a wrong-shaped buffer).
    fn check_out_ptr(&self, out: u64, extent: u64) -> Result<()> {
        if out == 0 {
            return crate::invalid!("out is NULL");
        }
        let mut mt: u32 = 0;
        // SAFETY: attribute query, data is a u32 for MEMORY_TYPE.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut mt as *mut u32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                out,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return crate::invalid!(
                "out ({out:#x}) is not memory CUDA knows: {}",
                cu_error_text(r)
            );
        }
        if mt != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
            && mt != sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32
        {
            return crate::invalid!(
                "out ({out:#x}) is host memory (CUmemorytype {mt}); pass device memory"
            );
        }
        let mut ord: i32 = -1;
        // SAFETY: attribute query, data is an int for DEVICE_ORDINAL.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut ord as *mut i32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                out,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS && ord != self.device {
            return crate::invalid!(
                "out ({out:#x}) is memory of device {ord}, the handle uses device {}",
                self.device
            );
        }
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: range query.
        let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, out) };
        if r == sys::CUresult::CUDA_SUCCESS {
            let end = base + size as u64;
            if out.checked_add(extent).is_none_or(|e| e > end) {
                return crate::invalid!(
                    "out buffer too small: the step needs {extent} B from {out:#x}, its \
                     allocation ends {} B after it",
                    end.saturating_sub(out)
                );
            }
        }
        Ok(())
    }

    fn dequant_params(&self, out: u64, args: OutArgs) -> DequantParams {
        let es = args.dtype.size();
        DequantParams {
            rows: self.rows_dptr,
            slot_stride: self.slot_stride as u64,
            err: self.dptr(CTRL_ERR),
            headers: self.dptr(CTRL_HEADERS),
            gates: 0,
            dev_seq: 0,
            expected: 0,
            out,
            out_stride: args.stride as u64,
            slots: self.slots as u32,
            capacity: 0,
            expect_n: 0,
            fmt: self.format.kernel_code(),
            dtype: kernel_dtype(args.dtype),
            flags: if args.accumulate {
                KERNEL_FLAG_ACCUMULATE
            } else {
                0
            },
            scale: self.global_scale,
            vec_ok: vec_ok(out, args.stride, es) as u32,
        }
    }

    fn wait_params(&self) -> WaitParams {
        WaitParams {
            done: self.dptr(CTRL_DONE),
            err: self.dptr(CTRL_ERR),
            headers: self.dptr(CTRL_HEADERS),
            gates: self.dev_mem + DEV_GATES as u64,
            dev_seq: 0,
            expected: 0,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            slots: self.slots as u32,
            capacity: 0,
            expect_n: 0,
            reserved: 0,
        }
    }

    fn take_event(&self) -> Result<usize> {
        let mut ev = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = ev.1.pop() {
            return Ok(i);
        }
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: plain creation in the current (our) context.
        ck(
            unsafe {
                sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            },
            "cuEventCreate",
        )?;
        ev.0.push(Ev(e));
        Ok(ev.0.len() - 1)
    }

    fn recycle_events(&self, ids: impl Iterator<Item = usize>) {
        let mut ev = self.events.lock().unwrap_or_else(|p| p.into_inner());
        ev.1.extend(ids);
    }

    /// Enqueues step `seq`'s dequantisation on the engine's `stream` (a raw `CUstream`; NULL is
    /// the legacy default stream): the wait of the handle's [`WaitKind`] (`Host`: calls
    /// `host_wait()` first, which must block until the step is published and return its error),
    /// then `ple_dequant` into `out` (`[num_tokens][out_stride]` of `out_dtype`), then records an
    /// event so the worker does not overwrite the slot's rows before the kernel has read them.
    /// Mark the step consumed only after this returns. Refuses a capturing stream.
    #[allow(clippy::too_many_arguments)]
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
        args.check()?;
        let stream = stream as sys::CUstream;
        let _c = CtxGuard::push(self.ctx)?;
        if let Some(e) = self.device_error() {
            return Err(e);
        }
        self.check_stream(stream, "ple_dequant_fuse")?;
        self.check_out_ptr(out, args.extent_bytes(num_tokens))?;
        let mut dp = self.dequant_params(out, args);
        dp.expected = seq;
        dp.capacity = num_tokens;
        dp.expect_n = num_tokens;
        let grid = dequant_grid(num_tokens, self.sm_count, self.blocks_per_sm);
        match self.wait {
            WaitKind::Host => host_wait()?,
            WaitKind::StreamOp => {
                // SAFETY: done is host-mapped memory of this context; stream checked above.
                ck(
                    unsafe {
                        sys::cuStreamWaitValue64_v2(
                            stream,
                            self.dptr(CTRL_DONE),
                            seq,
                            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                        )
                    },
                    "cuStreamWaitValue64(done >= seq)",
                )?;
            }
            WaitKind::SpinKernel => {
                let mut wp = self.wait_params();
                wp.expected = seq;
                wp.capacity = num_tokens;
                wp.expect_n = num_tokens;
                // SAFETY: parameters match the kernel's WaitParams.
                unsafe { launch(self.f_wait, 1, 1, stream, &mut wp, "launch ple_wait_gate")? };
                dp.gates = self.dev_mem + DEV_GATES as u64;
            }
        }
        // SAFETY: parameters match the kernel's DequantParams; out checked above.
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
        let ev = self.events.lock().unwrap_or_else(|p| p.into_inner()).0[i];
        // SAFETY: our event, the caller's stream (same context, checked).
        if let Err(e) = ck(unsafe { sys::cuEventRecord(ev.0, stream) }, "cuEventRecord") {
            self.recycle_events(std::iter::once(i));
            return Err(e);
        }
        self.slot_state[slot]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .readers
            .push((seq, i));
        Ok(())
    }

    /// CUDA Graph mode, step 1: enqueues `dev_seq = base_seq` on the engine's `stream`, so the
    /// next `fuse_graph` execution (replay) consumes step `base_seq`, the one after `base_seq+1`…
    /// Call it when no replay is in flight; from then on the worker reuses a slot whose previous
    /// step is `>= base_seq` only after a replay consumed it.
    pub fn graph_prepare(&self, stream: *mut c_void, base_seq: u64) -> Result<()> {
        if base_seq == 0 {
            return crate::invalid!("base_seq 0 is not a valid step");
        }
        let stream = stream as sys::CUstream;
        let _c = CtxGuard::push(self.ctx)?;
        self.check_stream(stream, "ple_graph_prepare")?;
        let mut sp = SetParams {
            dev_seq: self.dev_mem + DEV_SEQ as u64,
            value: base_seq,
        };
        // SAFETY: parameters match the kernel's SetParams.
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
    /// writes nothing), and `ple_graph_advance`. No host-side step number is involved.
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
        args.check()?;
        let stream = stream as sys::CUstream;
        let _c = CtxGuard::push(self.ctx)?;
        if let Some(e) = self.device_error() {
            return Err(e);
        }
        self.check_stream(stream, "ple_dequant_fuse_graph")?;
        self.check_out_ptr(out, args.extent_bytes(capacity_tokens))?;
        let dev_seq = self.dev_mem + DEV_SEQ as u64;
        let mut wp = self.wait_params();
        wp.dev_seq = dev_seq;
        wp.capacity = capacity_tokens;
        let mut dp = self.dequant_params(out, args);
        dp.dev_seq = dev_seq;
        dp.capacity = capacity_tokens;
        dp.gates = self.dev_mem + DEV_GATES as u64;
        let mut ap = AdvanceParams {
            dev_seq,
            consumed: self.dptr(CTRL_CONSUMED),
        };
        let grid = dequant_grid(capacity_tokens, self.sm_count, self.blocks_per_sm);
        // SAFETY: parameter blocks match the kernels; out checked for capacity_tokens.
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

/// Turns a device error record into an [`Error`].
pub fn device_error_to_error(
    code: u32,
    slot: u32,
    seq: u64,
    detail: u64,
    timeout: Duration,
    capacity: u32,
) -> Error {
    match code {
        ERR_WAIT_TIMEOUT => Error::Timeout(format!(
            "the device wait for step {seq} timed out after {timeout:?} (done was {detail}); its \
             kernel wrote nothing"
        )),
        ERR_OVER_CAPACITY => Error::State(format!(
            "step {seq} has {detail} tokens, more than the {capacity} the graph was captured \
             for; its kernel wrote nothing"
        )),
        ERR_SEQ_MISMATCH => Error::State(format!(
            "ring slot {slot} held step {detail} when step {seq} was to be consumed (steps \
             submitted out of order, or a replay without its step); the kernel wrote nothing"
        )),
        ERR_TOKEN_COUNT => Error::State(format!(
            "step {seq} was published with {detail} tokens, not the count it was submitted with"
        )),
        ERR_CLOSED => Error::State("the handle was closed while a device wait was pending".into()),
        c => Error::Cuda(format!("unknown device error code {c} (step {seq})")),
    }
}

impl Drop for GpuSide {
    fn drop(&mut self) {
        if self.ctx.is_null() {
            return;
        }
        let _c = match CtxGuard::push(self.ctx) {
            Ok(c) => Some(c),
            Err(e) => {
                log::error!("GpuSide drop: {e}");
                None
            }
        };
        let _m = RelaxedCapture::enter();
        if !self.ctrl.is_null() {
            // Release every device waiter: spin kernels see the error and stop, stream memory
            // waits see done = MAX, and dequant kernels then write nothing.
            if self.ctrl_u32(CTRL_ERR).load(Ordering::Acquire) == 0 {
                self.ctrl_u32(CTRL_ERR).store(ERR_CLOSED, Ordering::Release);
            }
            self.ctrl_u64(CTRL_DONE).store(u64::MAX, Ordering::Release);
        }
        // SAFETY: every handle below was created by us in this context; frees happen after a
        // context synchronisation so no kernel of ours still uses them.
        unsafe {
            let r = sys::cuCtxSynchronize();
            if r != sys::CUresult::CUDA_SUCCESS {
                log::warn!("GpuSide drop: cuCtxSynchronize: {}", cu_error_text(r));
            }
            let evs =
                std::mem::take(&mut self.events.get_mut().unwrap_or_else(|p| p.into_inner()).0);
            for e in evs {
                let _ = sys::cuEventDestroy_v2(e.0);
            }
            if !self.copy_stream.is_null() {
                let _ = sys::cuStreamSynchronize(self.copy_stream);
                let _ = sys::cuStreamDestroy_v2(self.copy_stream);
            }
            if self.dev_mem != 0 {
                let _ = sys::cuMemFree_v2(self.dev_mem);
            }
            for &p in &self.staging {
                let _ = sys::cuMemFreeHost(p as *mut c_void);
            }
            if !self.ctrl.is_null() {
                let _ = sys::cuMemFreeHost(self.ctrl as *mut c_void);
            }
            if !self.module.is_null() {
                let _ = sys::cuModuleUnload(self.module);
            }
        }
        drop(_m);
        drop(_c);
        // SAFETY: balances the retain in new().
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// A stand-in for an engine's CUDA side, for the demo and tools: the device's primary context
/// (retained), a stream of its own and one device buffer. libple's handle only borrows the stream.
pub struct EngineStream {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    buf: sys::CUdeviceptr,
    bytes: usize,
}

impl EngineStream {
    /// Retains `device`'s primary context and creates a stream and a `bytes`-byte buffer.
    pub fn new(device: i32, bytes: usize) -> Result<EngineStream> {
        probe_driver()?;
        // SAFETY: the driver is present with every symbol used here (probed above).
        ck(unsafe { sys::cuInit(0) }, "cuInit")?;
        let mut dev: sys::CUdevice = 0;
        ck(unsafe { sys::cuDeviceGet(&mut dev, device) }, "cuDeviceGet")?;
        let mut e = EngineStream {
            dev,
            ctx: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            buf: 0,
            bytes,
        };
        ck(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut e.ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let _g = CtxGuard::push(e.ctx)?;
        ck(
            unsafe {
                sys::cuStreamCreate(
                    &mut e.stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;
        ck(
            unsafe { sys::cuMemAlloc_v2(&mut e.buf, bytes) },
            "cuMemAlloc",
        )?;
        ck(unsafe { sys::cuMemsetD8_v2(e.buf, 0, bytes) }, "cuMemsetD8")?;
        Ok(e)
    }

    /// The stream, as `ple_dequant_fuse` takes it.
    pub fn stream(&self) -> *mut c_void {
        self.stream as *mut c_void
    }

    /// The device buffer's address.
    pub fn buffer(&self) -> u64 {
        self.buf
    }

    /// Waits for the stream, then copies the first `out.len()` bytes of the buffer to `out`.
    pub fn download(&self, out: &mut [u8]) -> Result<()> {
        if out.len() > self.bytes {
            return crate::invalid!(
                "download of {} bytes from a {}-byte buffer",
                out.len(),
                self.bytes
            );
        }
        let _g = CtxGuard::push(self.ctx)?;
        ck(
            unsafe { sys::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        )?;
        ck(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, self.buf, out.len()) },
            "cuMemcpyDtoH",
        )
    }
}

impl Drop for EngineStream {
    fn drop(&mut self) {
        if let Ok(_g) = CtxGuard::push(self.ctx) {
            // SAFETY: created in new(); freed once.
            unsafe {
                if !self.stream.is_null() {
                    let _ = sys::cuStreamSynchronize(self.stream);
                    let _ = sys::cuStreamDestroy_v2(self.stream);
                }
                if self.buf != 0 {
                    let _ = sys::cuMemFree_v2(self.buf);
                }
            }
        }
        if !self.ctx.is_null() {
            // SAFETY: retained in new().
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    const SRC: &str = include_str!("../../../../kernels/ple_kernels.cu");

    fn cu_define(name: &str) -> u64 {
        let pat = format!("#define {name} ");
        let line = SRC
            .lines()
            .find(|l| l.starts_with(&pat))
            .unwrap_or_else(|| panic!("{name} not defined in ple_kernels.cu"));
        let v = line[pat.len()..].split_whitespace().next().unwrap();
        v.trim_end_matches('u').parse().unwrap()
    }

    fn cu_sizeof(name: &str) -> usize {
        let pat = format!("static_assert(sizeof({name}) == ");
        let line = SRC
            .lines()
            .find(|l| l.starts_with(&pat))
            .unwrap_or_else(|| panic!("no size assertion for {name}"));
        line[pat.len()..]
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn new_without_driver_is_cuda_unavailable() {
        let cfg = GpuConfig {
            device: 0,
            wait_mode: WaitMode::Auto,
            slots: 2,
            max_tokens: 16,
            format: RowFormat::Nvfp4,
            global_scale: 1.0,
            timeout_us: 1_000_000,
        };
        let present = unsafe { sys::is_culib_present() };
        match GpuSide::new(&cfg) {
            Err(Error::CudaUnavailable(m)) => assert!(!present || m.contains("CUDA"), "{m}"),
            Err(e) => assert!(present, "no driver here, yet: {e}"),
            Ok(_) => assert!(present, "GpuSide::new succeeded without a driver"),
        }
        if !present {
            let e = GpuSide::new(&cfg).err().unwrap();
            assert_eq!(e.kind(), crate::ErrorKind::CudaUnavailable);
            assert!(e.to_string().contains("libcuda"), "{e}");
        }
    }

    #[test]
    fn bad_config_is_rejected_before_touching_the_driver() {
        let mut cfg = GpuConfig {
            device: -1,
            wait_mode: WaitMode::Auto,
            slots: 2,
            max_tokens: 16,
            format: RowFormat::Fp8,
            global_scale: 1.0,
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

    #[test]
    fn wait_mode_selection() {
        use WaitKind::*;
        assert_eq!(select_wait(WaitMode::Auto, true).unwrap(), StreamOp);
        assert_eq!(select_wait(WaitMode::Auto, false).unwrap(), SpinKernel);
        assert_eq!(select_wait(WaitMode::Host, true).unwrap(), Host);
        assert_eq!(select_wait(WaitMode::Host, false).unwrap(), Host);
        assert_eq!(select_wait(WaitMode::StreamOp, true).unwrap(), StreamOp);
        assert!(matches!(
            select_wait(WaitMode::StreamOp, false),
            Err(Error::Unsupported(_))
        ));
        assert_eq!(select_wait(WaitMode::SpinKernel, true).unwrap(), SpinKernel);
        assert_eq!(
            select_wait(WaitMode::SpinKernel, false).unwrap(),
            SpinKernel
        );
    }

    #[test]
    fn launch_geometry() {
        // One token: 320 items of 8 elements -> 2 blocks of 256.
        assert_eq!(dequant_grid(1, 132, 6), 2);
        assert_eq!(dequant_grid(4, 132, 6), 5); // 1280 items
        // Large steps are capped at what is resident (grid-stride covers the rest).
        assert_eq!(dequant_grid(8192, 132, 6), 792);
        assert_eq!(dequant_grid(8192, 0, 0), 1);
        // Coverage: grid * block * iterations >= items for any size.
        for n in [1u32, 2, 3, 7, 100, 2048, 8192, 1 << 20] {
            let g = dequant_grid(n, 132, 6) as u64;
            assert!(g >= 1);
            assert!(
                g * DEQUANT_BLOCK as u64 <= (n as u64 * 2560 / 8).max(DEQUANT_BLOCK as u64) + 255
            );
        }
        assert_eq!(ITEMS_PER_TOKEN * 8, 2560);
    }

    #[test]
    fn output_argument_checks() {
        let a = |dtype, stride, accumulate| OutArgs {
            dtype,
            stride,
            accumulate,
        };
        assert!(a(Dtype::F32, 2560, false).check().is_ok());
        assert!(a(Dtype::F16, 2560, true).check().is_ok());
        assert!(a(Dtype::Bf16, 4096, false).check().is_ok());
        assert!(a(Dtype::F32, 2559, false).check().is_err());
        assert!(a(Dtype::F32, 1 << 41, false).check().is_err());
        // The last token needs 2560 elements, not a whole stride.
        assert_eq!(a(Dtype::F32, 4000, false).extent_bytes(1), 2560 * 4);
        assert_eq!(
            a(Dtype::F16, 2600, false).extent_bytes(3),
            (2 * 2600 + 2560) * 2
        );
        assert_eq!(a(Dtype::F32, 2560, false).extent_bytes(0), 0);
        assert!(vec_ok(0x1000, 2560, 4));
        assert!(vec_ok(0x1000, 2568, 2));
        assert!(!vec_ok(0x1000, 2561, 4)); // rows 4 B apart from alignment
        assert!(!vec_ok(0x1000, 2564, 2)); // 5128 B rows
        assert!(!vec_ok(0x1008, 2560, 4));
        assert_eq!(token_bytes(RowFormat::Nvfp4), 1440);
        assert_eq!(token_bytes(RowFormat::Fp8), 2560);
        assert_eq!(token_bytes(RowFormat::Bf16), 5120);
    }

    #[test]
    fn parameter_layouts_match_the_kernels() {
        assert_eq!(size_of::<SlotHeader>(), cu_sizeof("SlotHeader"));
        assert_eq!(size_of::<DevError>(), cu_sizeof("DevError"));
        assert_eq!(size_of::<Gate>(), cu_sizeof("Gate"));
        assert_eq!(size_of::<WaitParams>(), cu_sizeof("WaitParams"));
        assert_eq!(size_of::<DequantParams>(), cu_sizeof("DequantParams"));
        assert_eq!(size_of::<AdvanceParams>(), cu_sizeof("AdvanceParams"));
        // Field order as in the .cu file.
        assert_eq!(offset_of!(WaitParams, timeout_ns), 48);
        assert_eq!(offset_of!(WaitParams, expect_n), 64);
        assert_eq!(offset_of!(DequantParams, out_stride), 64);
        assert_eq!(offset_of!(DequantParams, slots), 72);
        assert_eq!(offset_of!(DequantParams, fmt), 84);
        assert_eq!(offset_of!(DequantParams, scale), 96);
        assert_eq!(offset_of!(DequantParams, vec_ok), 100);
        assert_eq!(offset_of!(SlotHeader, failed), 12);
        assert_eq!(offset_of!(DevError, detail), 16);
    }

    #[test]
    fn constants_match_the_kernels() {
        assert_eq!(cu_define("ERR_WAIT_TIMEOUT"), ERR_WAIT_TIMEOUT as u64);
        assert_eq!(cu_define("ERR_OVER_CAPACITY"), ERR_OVER_CAPACITY as u64);
        assert_eq!(cu_define("ERR_SEQ_MISMATCH"), ERR_SEQ_MISMATCH as u64);
        assert_eq!(cu_define("ERR_TOKEN_COUNT"), ERR_TOKEN_COUNT as u64);
        assert_eq!(cu_define("ERR_CLOSED"), ERR_CLOSED as u64);
        assert_eq!(cu_define("DEQUANT_BLOCK"), DEQUANT_BLOCK as u64);
        assert_eq!(cu_define("ITEMS_PER_TOKEN"), ITEMS_PER_TOKEN);
        assert_eq!(
            cu_define("FMT_NVFP4"),
            RowFormat::Nvfp4.kernel_code() as u64
        );
        assert_eq!(cu_define("FMT_FP8"), RowFormat::Fp8.kernel_code() as u64);
        assert_eq!(cu_define("FMT_BF16"), RowFormat::Bf16.kernel_code() as u64);
        assert_eq!(cu_define("DT_F32"), kernel_dtype(Dtype::F32) as u64);
        assert_eq!(cu_define("DT_F16"), kernel_dtype(Dtype::F16) as u64);
        assert_eq!(cu_define("DT_BF16"), kernel_dtype(Dtype::Bf16) as u64);
        assert_eq!(cu_define("FLAG_ACCUMULATE"), KERNEL_FLAG_ACCUMULATE as u64);
        // The V2 attribute (pairs with cuStreamWaitValue64_v2).
        assert_eq!(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS as i32,
            122
        );
    }

    #[test]
    fn embedded_ptx_is_the_kernels() {
        assert!(PTX.contains(&format!("\n.version {PTX_ISA}\n")), "ISA line");
        assert!(PTX.contains("\n.target sm_80\n"));
        assert!(PTX.contains("Cuda compilation tools, release 12.2"));
        for k in [
            "ple_wait_gate",
            "ple_dequant",
            "ple_graph_advance",
            "ple_graph_set",
        ] {
            assert!(
                PTX.contains(&format!(".visible .entry {k}(")),
                "kernel {k} missing from the PTX"
            );
        }
        assert!(!PTX.contains('\0'));
        // No FMA in the dequant path: -fmad=false plus explicit _rn intrinsics.
        assert!(
            !PTX.contains("fma.rn.f32"),
            "PTX contains a fused multiply-add"
        );
    }

    #[test]
    fn device_errors_become_errors() {
        let t = Duration::from_millis(5);
        let e = device_error_to_error(ERR_WAIT_TIMEOUT, 1, 7, 6, t, 0);
        assert_eq!(e.kind(), crate::ErrorKind::Timeout);
        assert!(e.to_string().contains("step 7"), "{e}");
        let e = device_error_to_error(ERR_OVER_CAPACITY, 0, 9, 300, t, 256);
        assert_eq!(e.kind(), crate::ErrorKind::State);
        assert!(
            e.to_string().contains("300") && e.to_string().contains("256"),
            "{e}"
        );
        let e = device_error_to_error(ERR_SEQ_MISMATCH, 1, 9, 7, t, 0);
        assert_eq!(e.kind(), crate::ErrorKind::State);
        assert_eq!(
            device_error_to_error(99, 0, 0, 0, t, 0).kind(),
            crate::ErrorKind::Cuda
        );
    }

    #[test]
    fn every_driver_call_is_probed() {
        // cudarc panics on a missing symbol: every `sys::cu*(` call must be in REQUIRED_SYMBOLS
        // (checked by probe_driver before the first call), and every probed name must be used.
        let src = include_str!("gpu.rs");
        let mut called = std::collections::BTreeSet::new();
        for (i, _) in src.match_indices("sys::cu") {
            let name: String = src[i + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let driver_fn = name.len() > 2 && name.as_bytes()[2].is_ascii_uppercase();
            if driver_fn && src[i + 5 + name.len()..].starts_with('(') {
                called.insert(name);
            }
        }
        for c in &called {
            assert!(
                REQUIRED_SYMBOLS.contains(&c.as_str()),
                "{c} is called but not probed"
            );
        }
        for s in REQUIRED_SYMBOLS {
            assert!(called.contains(*s), "{s} is probed but never called");
        }
    }
}
