//! The C types of the ABI: constants, typedef'd value types, the versioned structs, callbacks, and
//! the conversions between them and the core's typed values.

use crate::c_enum::c_enum;
use ple_core::dequant::{Dtype, OutArgs};
use ple_core::format::pack::PackOptions;
use ple_core::format::table::TableInfo;
use ple_core::invalid;
use ple_core::io::direct::Backend;
use ple_core::model::RowFormat;
use ple_core::shard::Shard;
use ple_core::step::IoInfo;
use ple_core::step::{IoMode, OpenOptions, PrefetchPolicy, RingFullPolicy, WaitMode};
use ple_core::{Error, Result};
use std::ffi::{CStr, c_char, c_void};
use std::path::PathBuf;

/// Major version of this header and library.
pub const PLE_VERSION_MAJOR: u32 = 0;
/// Minor version (the ABI changes with it while the major version is 0).
pub const PLE_VERSION_MINOR: u32 = 3;
/// Patch version.
pub const PLE_VERSION_PATCH: u32 = 0;
/// ABI version: `major * 10000 + minor * 100 + patch`, as returned by `ple_abi_version()`.
pub const PLE_ABI_VERSION: u32 =
    PLE_VERSION_MAJOR * 10000 + PLE_VERSION_MINOR * 100 + PLE_VERSION_PATCH;

/// Most heads a table may have: a token's row ids (`ple_info.num_heads`; the shipped model: 16).
/// Size buffers from `ple_info`, not from these maxima.
pub const PLE_MAX_HEADS: u32 = 64;
/// Largest head dim (elements per row, `ple_info.head_dim`; the shipped model: 160).
pub const PLE_MAX_HEAD_DIM: u32 = 4096;
/// Largest embedding width (`ple_info.embed_dim = num_heads * head_dim`; the shipped model: 2560).
pub const PLE_MAX_EMBED_DIM: u32 = 32768;
/// Most requests a handle tracks at once (tracked mode). A batch that would track more is refused
/// with `PLE_E_STATE` (requests are never evicted: an evicted request would read wrong context);
/// `ple_release_request` forgets finished ones.
pub const PLE_MAX_TRACKED_REQUESTS: u32 = 65536;
/// `ple_options.cache_bytes` default: a row cache of 256 MiB (at most an eighth of the memory
/// available at open) for a handle that runs `PLE_IO_DIRECT`, none for `PLE_IO_MMAP`.
pub const PLE_CACHE_AUTO: u64 = u64::MAX;
/// Largest `ple_options.max_tokens_per_step`.
pub const PLE_MAX_TOKENS_PER_STEP_MAX: u32 = 1 << 20;
/// Largest `ple_options.max_in_flight`.
pub const PLE_MAX_IN_FLIGHT_MAX: u32 = 64;
/// Largest `ple_options.num_threads`.
pub const PLE_NUM_THREADS_MAX: u32 = 1024;
/// Smallest `ple_options.history_window`.
pub const PLE_HISTORY_WINDOW_MIN: u32 = 2;
/// Largest `ple_options.history_window`.
pub const PLE_HISTORY_WINDOW_MAX: u32 = 1 << 20;
/// Largest `ple_options.cache_bytes` other than `PLE_CACHE_AUTO` (1 TiB).
pub const PLE_CACHE_BYTES_MAX: u64 = 1_099_511_627_776;
/// Largest `ple_options.shard_count` and `ple_pack_options.shard_count` (one head per shard).
pub const PLE_SHARD_COUNT_MAX: u32 = 16;
/// Smallest `ple_pack_options.buffer_bytes`.
pub const PLE_PACK_BUFFER_BYTES_MIN: u64 = 4096;
/// Largest `ple_pack_options.buffer_bytes` (1 GiB).
pub const PLE_PACK_BUFFER_BYTES_MAX: u64 = 1_073_741_824;

// The header's model constants and limits are the core's: a mismatch does not compile. (cbindgen
// reads only this crate, so the values are spelled here, and checked against their one home.)
const _: () = {
    use ple_core::format::pack;
    use ple_core::model;
    use ple_core::step::options as o;
    assert!(PLE_MAX_HEADS as usize == model::MAX_HEADS);
    assert!(PLE_MAX_HEAD_DIM as usize == model::MAX_HEAD_DIM);
    assert!(PLE_MAX_EMBED_DIM as usize == model::MAX_EMBED_DIM);
    assert!(PLE_CACHE_AUTO == o::CACHE_AUTO);
    assert!(PLE_MAX_TOKENS_PER_STEP_MAX == o::MAX_TOKENS_PER_STEP_MAX);
    assert!(PLE_MAX_IN_FLIGHT_MAX == o::MAX_IN_FLIGHT_MAX);
    assert!(PLE_NUM_THREADS_MAX == o::NUM_THREADS_MAX);
    assert!(PLE_HISTORY_WINDOW_MIN == o::HISTORY_WINDOW_MIN);
    assert!(PLE_HISTORY_WINDOW_MAX == o::HISTORY_WINDOW_MAX);
    assert!(PLE_CACHE_BYTES_MAX == o::MAX_CACHE_BYTES);
    assert!(PLE_SHARD_COUNT_MAX == ple_core::shard::MAX_SHARDS);
    assert!(PLE_PACK_BUFFER_BYTES_MIN == pack::MIN_BUFFER_BYTES as u64);
    assert!(PLE_PACK_BUFFER_BYTES_MAX == pack::MAX_BUFFER_BYTES as u64);
};

/// Row format of a table (`ple_info.format`): a `PLE_FORMAT_*` value.
pub type ple_format = i32;

c_enum! {
    /// The values of `ple_format`.
    enum ple_format_code: ple_format, RowFormat {
        /// Row format `nvfp4`: 80 code bytes + 10 E4M3 block scales per row.
        PLE_FORMAT_NVFP4 = 1 => (RowFormat::Nvfp4),
        /// Row format `fp8`: 160 E4M3 bytes per row.
        PLE_FORMAT_FP8 = 2 => (RowFormat::Fp8),
        /// Row format `bf16`: 160 little-endian bf16 per row.
        PLE_FORMAT_BF16 = 3 => (RowFormat::Bf16),
        /// Row format `f32`: 160 little-endian IEEE f32 per row (an unquantised table). New in
        /// 0.2.
        PLE_FORMAT_F32 = 4 => (RowFormat::F32),
    }
}

/// Output element type of `ple_dequant_*`: a `PLE_DTYPE_*` value.
pub type ple_dtype = i32;

c_enum! {
    /// The values of `ple_dtype`.
    enum ple_dtype_code: ple_dtype, Dtype {
        /// Output element type: IEEE float32.
        PLE_DTYPE_F32 = 0 => (Dtype::F32),
        /// Output element type: IEEE float16.
        PLE_DTYPE_F16 = 1 => (Dtype::F16),
        /// Output element type: bfloat16.
        PLE_DTYPE_BF16 = 2 => (Dtype::Bf16),
    }
}

/// Flags of `ple_dequant_*`: `PLE_FUSE_*` bits.
pub type ple_fuse_flags = u32;

/// `ple_dequant_*` flag: add into `out` instead of overwriting it.
pub const PLE_FUSE_ACCUMULATE: ple_fuse_flags = 1;

/// Flags of `ple_submit_ids`: `PLE_IDS_*` bits.
pub type ple_ids_flags = u32;

/// `ple_submit_ids` flag: count the step's rows as prefill rows (`ple_counters.prefill_*`; without
/// it, decode rows).
pub const PLE_IDS_PREFILL: ple_ids_flags = 1;

/// When steps prefetch (`ple_options.prefetch_policy`): a `PLE_PREFETCH_*` value.
pub type ple_prefetch_policy = i32;

c_enum! {
    /// The values of `ple_prefetch_policy`.
    enum ple_prefetch_policy_code: ple_prefetch_policy, PrefetchPolicy {
        /// Prefetch policy (the default): prefetch a step of at least `prefetch_min_rows` rows unless
        /// a residency sample finds its pages cached. How a step is sampled and prefetched:
        /// docs/ARCHITECTURE.md, "Prefetch (MMAP)".
        PLE_PREFETCH_AUTO = 0 => (PrefetchPolicy::Auto),
        /// Prefetch policy: prefetch every step, cached or not.
        PLE_PREFETCH_ALWAYS = 1 => (PrefetchPolicy::Always),
        /// Prefetch policy: never prefetch (MADV_RANDOM faults only).
        PLE_PREFETCH_NEVER = 2 => (PrefetchPolicy::Never),
    }
}

/// How a handle reads rows (`ple_options.io_mode`, `ple_info.io_mode`): a `PLE_IO_*` value.
pub type ple_io_mode = i32;

c_enum! {
    /// The values of `ple_io_mode`.
    enum ple_io_mode_code: ple_io_mode, IoMode {
        /// I/O mode (the default): DIRECT when the table is larger than the machine's memory and
        /// direct I/O works on its file, else MMAP.
        PLE_IO_AUTO = 0 => (IoMode::Auto),
        /// I/O mode: gather from the read-only mapping through the page cache.
        PLE_IO_MMAP = 1 => (IoMode::Mmap),
        /// I/O mode: `O_DIRECT` reads of exactly the rows' blocks; `ple_open` fails with
        /// `PLE_E_UNSUPPORTED` where the file system refuses direct I/O (tmpfs).
        PLE_IO_DIRECT = 2 => (IoMode::Direct),
    }
}

/// How DIRECT reads are issued (`ple_info.io_backend`): a `PLE_IO_BACKEND_*` value.
pub type ple_io_backend = i32;

c_enum! {
    /// The values of `ple_io_backend`.
    enum ple_io_backend_code: ple_io_backend, Option<Backend> {
        /// I/O backend: none (MMAP mode: page faults and WILLNEED advice).
        PLE_IO_BACKEND_MMAP = 0 => (None),
        /// I/O backend: io_uring.
        PLE_IO_BACKEND_IO_URING = 1 => (Some(Backend::IoUring)),
        /// I/O backend: a pool of `pread` threads (io_uring refused, or `PLE_IO_FORCE_PREAD` set).
        PLE_IO_BACKEND_PREAD_POOL = 2 => (Some(Backend::PreadPool)),
    }
}

/// What `ple_submit` does on a full ring (`ple_options.ring_full_policy`): a `PLE_RING_*` value.
pub type ple_ring_full_policy = i32;

c_enum! {
    /// The values of `ple_ring_full_policy`.
    enum ple_ring_full_policy_code: ple_ring_full_policy, RingFullPolicy {
        /// Ring policy (the default): `ple_submit` into a slot whose rows were not consumed blocks
        /// until they are (at most `wait_timeout_us`, then `PLE_E_TIMEOUT`).
        PLE_RING_WAIT = 0 => (RingFullPolicy::Wait),
        /// Ring policy: `ple_submit` into a slot whose rows were not consumed fails with `PLE_E_STATE`.
        PLE_RING_ERROR = 1 => (RingFullPolicy::Error),
    }
}

/// How a GPU handle orders the kernel after a step (`ple_options.wait_mode`): a `PLE_WAIT_*` value.
pub type ple_wait_mode = i32;

c_enum! {
    /// The values of `ple_wait_mode`.
    enum ple_wait_mode_code: ple_wait_mode, WaitMode {
        /// GPU wait mode (the default): a device wait where supported (stream memory op, else spin
        /// kernel), else a host wait.
        PLE_WAIT_AUTO = 0 => (WaitMode::Auto),
        /// GPU wait mode: the host blocks in `ple_wait`, then enqueues the kernel.
        PLE_WAIT_HOST = 1 => (WaitMode::Host),
        /// GPU wait mode: `cuStreamWaitValue64` on the engine's stream (needs 64-bit stream mem ops).
        PLE_WAIT_STREAM_OP = 2 => (WaitMode::StreamOp),
        /// GPU wait mode: a one-thread spin kernel on a device-mapped flag, bounded by
        /// `wait_timeout_us`.
        PLE_WAIT_SPIN_KERNEL = 3 => (WaitMode::SpinKernel),
    }
}

/// Options for `ple_open`. Always initialise with `ple_options_default()`, then change fields:
/// `struct_size` lets later versions add fields without breaking callers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_options {
    /// `sizeof(ple_options)` as the caller compiled it (set by `ple_options_default`).
    pub struct_size: usize,
    /// Largest `num_tokens` one step may carry, 1..=`PLE_MAX_TOKENS_PER_STEP_MAX` (default 8192).
    /// Sizes the staging slots.
    pub max_tokens_per_step: u32,
    /// Steps that may be submitted but not yet consumed (ring slots), 1..=`PLE_MAX_IN_FLIGHT_MAX`
    /// (default 2).
    pub max_in_flight: u32,
    /// Gather threads in the handle's private pool, at most `PLE_NUM_THREADS_MAX` (default 0: the
    /// number of CPUs).
    pub num_threads: u32,
    /// When steps prefetch: a `PLE_PREFETCH_*` value (default `PLE_PREFETCH_AUTO`).
    pub prefetch_policy: ple_prefetch_policy,
    /// `PLE_PREFETCH_AUTO` prefetches only steps of at least this many rows (default 1: every
    /// step, decode included).
    pub prefetch_min_rows: u32,
    /// What `ple_submit` does when the ring is full: a `PLE_RING_*` value (default `PLE_RING_WAIT`).
    pub ring_full_policy: ple_ring_full_policy,
    /// Timeout, in microseconds (default 300 s), of the waits libple makes on the caller's behalf:
    /// in `ple_dequant_cpu`, `ple_packed_rows`, `ple_release_step`, `ple_dequant_fuse` (host wait),
    /// `ple_submit` on a full ring, and the device spin wait. Not used by `ple_wait`.
    pub wait_timeout_us: u64,
    /// Tracked mode: tokens remembered per request, for context and speculative rollback,
    /// `PLE_HISTORY_WINDOW_MIN..=PLE_HISTORY_WINDOW_MAX` and at least `ngram_size - 1` (default 64).
    pub history_window: u32,
    /// CUDA device ordinal, or -1 for CPU only (default -1).
    pub cuda_device: i32,
    /// How a GPU handle orders the kernel after a step: a `PLE_WAIT_*` value (default
    /// `PLE_WAIT_AUTO`).
    pub wait_mode: ple_wait_mode,
    /// Path of the model's `config.json`. A libple table must have its geometry (n-gram size,
    /// heads per n-gram, head dim, PLE layer index) and hash parameters, else opening fails with
    /// `PLE_E_FORMAT` naming the field (since 0.3; NULL: not checked). A table made by the Python
    /// tool (`*.packed_u8`) takes its hash parameters from it (NULL: look beside the table).
    pub config_json_path: *const c_char,
    /// If not NULL: the checkpoint directory the table must have been packed from; opening fails
    /// with `PLE_E_FORMAT` when its fingerprint differs.
    pub checkpoint_dir: *const c_char,
    /// Bytes of memory for a cache of rows, allocated at open: `PLE_CACHE_AUTO` (the default),
    /// 0 (no cache) or a size of at most `PLE_CACHE_BYTES_MAX` that holds at least one row. Step
    /// rows found in it are copied from it, the others read from the table and inserted.
    /// `ple_info.cache_bytes` reports what the handle got.
    pub cache_bytes: u64,
    /// How the handle reads rows: a `PLE_IO_*` value (default `PLE_IO_AUTO`; appended in 0.1.x,
    /// callers compiled without it get AUTO through `struct_size`).
    pub io_mode: ple_io_mode,
    /// Head shards (tensor/data-parallel ranks), 1..=`PLE_SHARD_COUNT_MAX` (default 1: the whole
    /// table; appended in 0.1.x). The handle serves shard `shard_index` of `shard_count`: the
    /// heads `shard_index, shard_index + shard_count, …` below 16 (round-robin since 0.2, so
    /// every shard holds bigram and trigram heads alike and the ranks read alike;
    /// `ple_info.shard_first_head`, `.shard_head_stride`, `.shard_heads`), and only those heads'
    /// rows are hashed, read, cached and counted. `ple_packed_rows` gives
    /// `[tokens][shard_heads][row_bytes]`, row `j` of a token being head
    /// `shard_first_head + j·shard_head_stride`'s;
    /// `ple_dequant_*` write the whole `[tokens][2560]` row with -0.0 in the other heads' columns
    /// (`PLE_FUSE_ACCUMULATE`: nothing added there), so the sum of all shards' outputs, in any
    /// order, is the whole table's output bit for bit. A whole table opens as any shard, a shard
    /// table (`ple pack --shard`) only as its own shard (else `PLE_E_FORMAT`). Out of range:
    /// `PLE_E_INVALID_ARGUMENT`.
    pub shard_count: u32,
    /// The shard this handle serves, `0..shard_count` (default 0).
    pub shard_index: u32,
    /// Most rows queued for read-ahead (`ple_prefetch_ahead`); beyond it the oldest queued rows
    /// are dropped (`ple_counters.ahead_dropped`). 0 (the default): the row cache's capacity in
    /// rows, or 262,144 without a cache. Appended in 0.1.x.
    pub ahead_max_rows: u64,
    /// MMAP: the most bytes of the table the page cache holds for this handle; above it the least
    /// recently used parts of the row file are dropped by a background thread of the handle
    /// (`ple_counters.resident_dropped_bytes`); a step waits for the drops only while the
    /// table's residency is more than 5% above the cap. 0 (the default): no cap. Ignored in
    /// DIRECT mode. Appended in 0.1.x.
    pub resident_bytes_max: u64,
    /// 1 (the default): the handle may install libple's SIGBUS handler, process-wide, at its
    /// first copy from the table's mapping (MMAP mode needs it: a truncated file or a failed
    /// device read then fails the step with `PLE_E_IO` instead of killing the process; signals
    /// that are not its own faults go on to the handler installed before it). 0: libple installs
    /// no signal handler for this handle and never copies from its mapping: `PLE_IO_AUTO` opens
    /// DIRECT, and `PLE_IO_MMAP`, or DIRECT where the file system refuses direct I/O, is
    /// `PLE_E_UNSUPPORTED`. Other values: `PLE_E_INVALID_ARGUMENT`. Appended in 0.1.x.
    pub sigbus_handler: i32,
}

/// Options for `ple_pack`. Initialise with `ple_pack_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_pack_options {
    /// `sizeof(ple_pack_options)` as the caller compiled it.
    pub struct_size: usize,
    /// Non-zero: replace an existing table packed from another checkpoint (default 0: refuse).
    pub force: i32,
    /// Bytes per write buffer, `PLE_PACK_BUFFER_BYTES_MIN..=PLE_PACK_BUFFER_BYTES_MAX` (default
    /// 8 MiB; the packer's memory is about twice this).
    pub buffer_bytes: u64,
    /// Shards, 1..=`PLE_SHARD_COUNT_MAX` (default 1: the whole table): write only the rows of the
    /// heads that shard `shard_index` of `shard_count` serves (see `ple_options.shard_count`). The
    /// shards' files add up to the whole table's. Appended in 0.1.x.
    pub shard_count: u32,
    /// The shard to write, `0..shard_count` (default 0).
    pub shard_index: u32,
}

/// Progress callback of `ple_pack`: bytes written so far and in all. Return 0 to go on, non-zero to
/// cancel (the pack then fails with `PLE_E_STATE` and leaves no table behind).
pub type ple_progress_fn =
    Option<extern "C" fn(done_bytes: u64, total_bytes: u64, user_data: *mut c_void) -> i32>;

/// Severity of a log message: a `PLE_LOG_*` value (1 = error ... 5 = trace).
pub type ple_log_level = i32;

c_enum! {
    /// The values of `ple_log_level`.
    enum ple_log_level_code: ple_log_level, log::Level {
        /// Log level: errors.
        PLE_LOG_ERROR = 1 => (log::Level::Error),
        /// Log level: warnings (and errors).
        PLE_LOG_WARN = 2 => (log::Level::Warn),
        /// Log level: information.
        PLE_LOG_INFO = 3 => (log::Level::Info),
        /// Log level: debugging detail (every error returned, with its text).
        PLE_LOG_DEBUG = 4 => (log::Level::Debug),
        /// Log level: everything.
        PLE_LOG_TRACE = 5 => (log::Level::Trace),
    }
}

/// Log callback: `level` a `PLE_LOG_*` value; `message` is valid only during the call. Runs on
/// libple's own log thread, never inside another libple call (see `ple_set_log_callback`).
pub type ple_log_fn =
    Option<extern "C" fn(level: ple_log_level, message: *const c_char, user_data: *mut c_void)>;

/// One engine step's tokens. All arrays are read during the call only (`ple_submit` copies them).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_batch {
    /// `[num_tokens]` token ids, each in `[0, vocab_size)`.
    pub tokens: *const i32,
    /// `[num_tokens]` position of each token in its request's sequence (consecutive inside a span).
    pub positions: *const i32,
    /// Tokens in the step (1..=max_tokens_per_step).
    pub num_tokens: u32,
    /// `[num_requests]` request ids (unique within a batch).
    pub request_ids: *const u64,
    /// `[num_requests + 1]` offsets into `tokens`: first 0, last `num_tokens`, non-decreasing; request
    /// `i` owns tokens `[query_start[i], query_start[i+1])`.
    pub query_start: *const u32,
    /// Requests in the step.
    pub num_requests: u32,
    /// NULL (tracked mode: libple remembers each request's tokens), or `[num_requests][ngram_size - 1]`
    /// (stateless mode): the tokens just before each span, oldest first, EOS where the sequence has none.
    pub context: *const i32,
}

/// Facts about an open table, filled by `ple_table_info()` (named `ple_info` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_table_info {
    /// Set by the caller to `sizeof(ple_info)`.
    pub struct_size: usize,
    /// `PLE_FORMAT_NVFP4`, `_FP8`, `_BF16` or `_F32`.
    pub format: ple_format,
    /// Bytes per row (the shipped model's 16 × 160: 90, 160, 320 or 640).
    pub row_bytes: u32,
    /// Rows in the row file (padded).
    pub total_rows: u64,
    /// Rows the hash can address (sum of head sizes).
    pub addressed_rows: u64,
    /// Heads of the whole table: row ids per token (the shipped model: 16; at most `PLE_MAX_HEADS`).
    pub num_heads: u32,
    /// Elements per head (the shipped model: 160).
    pub head_dim: u32,
    /// N-gram order (the shipped model: 3).
    pub ngram_size: u32,
    /// Token ids are in `[0, vocab_size)`.
    pub vocab_size: u32,
    /// EOS / BOS token id.
    pub eos_token_id: i32,
    /// The global dequantisation scale (1.0 for bf16 and f32).
    pub global_scale: f32,
    /// Bytes of the row file.
    pub file_size: u64,
    /// 1 when the handle's GPU waits for steps itself (`PLE_WAIT_STREAM_OP` or
    /// `PLE_WAIT_SPIN_KERNEL` in effect), else 0.
    pub device_wait_supported: i32,
    /// Name of the source checkpoint (NUL-terminated, truncated to fit).
    pub source_name: [c_char; 256],
    /// Hex fingerprint of the source checkpoint's index and shard headers (NUL-terminated).
    pub source_fingerprint: [c_char; 72],
    /// The I/O mode the handle runs with, AUTO resolved: `PLE_IO_MMAP` or `PLE_IO_DIRECT`.
    pub io_mode: ple_io_mode,
    /// How its reads are issued: a `PLE_IO_BACKEND_*` value.
    pub io_backend: ple_io_backend,
    /// Bytes of the handle's row cache (`options.cache_bytes`, `PLE_CACHE_AUTO` resolved; 0 = no
    /// cache). Appended in 0.1.x.
    pub cache_bytes: u64,
    /// The head shard served (`options.shard_index`; 0 of 1 = the whole table). `total_rows` and
    /// `file_size` are the open file's (a shard table's own). Appended in 0.1.x.
    pub shard_index: u32,
    /// Shards the heads are split into (`options.shard_count`; 1 = the whole table).
    pub shard_count: u32,
    /// First head of the shard.
    pub shard_first_head: u32,
    /// Heads of the shard: the rows per token of `ple_packed_rows` (`num_heads` for the whole table).
    pub shard_heads: u32,
    /// Heads between two of the shard's heads (`shard_count`; 1 for the whole table): row `j` of
    /// a token's `ple_packed_rows` is head `shard_first_head + j·shard_head_stride`'s. Appended in
    /// 0.2.
    pub shard_head_stride: u32,
    /// Elements of one token's embedding, `num_heads * head_dim` (the shipped model: 2560): size
    /// `ple_dequant_*` outputs by it (`out_stride >= embed_dim`). Appended in 0.3.
    pub embed_dim: u32,
    /// Heads per n-gram order: `num_heads = (ngram_size - 1) * heads_per_ngram` (the shipped
    /// model: 8). Appended in 0.3.
    pub heads_per_ngram: u32,
    /// The PLE layer's index among the checkpoint's PLE layers (`ple_layer_index`; its hash
    /// parameters depend on it). Appended in 0.3.
    pub ple_layer_index: u32,
}

// `ple_stats` (`ple_counters` in C) and `counters_to_c`, generated from the core's counter list.
include!(concat!(env!("OUT_DIR"), "/ple_counters.rs"));

// ---------------------------------------------------------------------------------------------
// Conversions between the C structs and the core's typed values (the only place they happen)
// ---------------------------------------------------------------------------------------------

/// `ple_options` with the values of `o` (paths are not representable and come out NULL).
pub fn options_to_c(o: &OpenOptions) -> ple_options {
    ple_options {
        struct_size: std::mem::size_of::<ple_options>(),
        max_tokens_per_step: o.max_tokens_per_step,
        max_in_flight: o.max_in_flight,
        num_threads: o.num_threads,
        prefetch_policy: ple_prefetch_policy_code::to_c(o.prefetch_policy),
        prefetch_min_rows: o.prefetch_min_rows,
        ring_full_policy: ple_ring_full_policy_code::to_c(o.ring_full_policy),
        wait_timeout_us: o.wait_timeout_us,
        history_window: o.history_window,
        cuda_device: o.cuda_device,
        wait_mode: ple_wait_mode_code::to_c(o.wait_mode),
        config_json_path: std::ptr::null(),
        checkpoint_dir: std::ptr::null(),
        cache_bytes: o.cache_bytes,
        io_mode: ple_io_mode_code::to_c(o.io_mode),
        shard_count: o.shard.count,
        shard_index: o.shard.index,
        ahead_max_rows: o.ahead_max_rows,
        resident_bytes_max: o.resident_bytes_max,
        sigbus_handler: o.sigbus_handler as i32,
    }
}

/// Converts and validates `ple_options`.
///
/// # Safety
/// The path pointers, when not NULL, must be NUL-terminated strings.
pub unsafe fn options_from_c(c: &ple_options) -> Result<OpenOptions> {
    let path = |p: *const c_char, what: &str| -> Result<Option<PathBuf>> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
        let s = unsafe { CStr::from_ptr(p) }
            .to_str()
            .map_err(|_| Error::InvalidArgument(format!("options.{what} is not UTF-8")))?;
        Ok(Some(PathBuf::from(s)))
    };
    let o = OpenOptions {
        max_tokens_per_step: c.max_tokens_per_step,
        max_in_flight: c.max_in_flight,
        num_threads: c.num_threads,
        prefetch_policy: match ple_prefetch_policy_code::from_c(c.prefetch_policy) {
            Some(p) => p,
            None => {
                return invalid!(
                    "options.prefetch_policy {} is not a PLE_PREFETCH_* value",
                    c.prefetch_policy
                );
            }
        },
        prefetch_min_rows: c.prefetch_min_rows,
        ring_full_policy: match ple_ring_full_policy_code::from_c(c.ring_full_policy) {
            Some(p) => p,
            None => {
                return invalid!(
                    "options.ring_full_policy {} is not a PLE_RING_* value",
                    c.ring_full_policy
                );
            }
        },
        wait_timeout_us: c.wait_timeout_us,
        history_window: c.history_window,
        cuda_device: c.cuda_device,
        wait_mode: match ple_wait_mode_code::from_c(c.wait_mode) {
            Some(m) => m,
            None => {
                return invalid!(
                    "options.wait_mode {} is not a PLE_WAIT_* value",
                    c.wait_mode
                );
            }
        },
        config_json_path: path(c.config_json_path, "config_json_path")?,
        checkpoint_dir: path(c.checkpoint_dir, "checkpoint_dir")?,
        cache_bytes: c.cache_bytes,
        io_mode: match ple_io_mode_code::from_c(c.io_mode) {
            Some(m) => m,
            None => return invalid!("options.io_mode {} is not a PLE_IO_* value", c.io_mode),
        },
        // (range-checked by `validate` below)
        shard: Shard {
            index: c.shard_index,
            count: c.shard_count,
        },
        ahead_max_rows: c.ahead_max_rows,
        resident_bytes_max: c.resident_bytes_max,
        sigbus_handler: match c.sigbus_handler {
            0 => false,
            1 => true,
            v => return invalid!("options.sigbus_handler {v} is neither 0 nor 1"),
        },
        // (not in the C struct: the core's defaults)
        ..OpenOptions::default()
    };
    o.validate()?;
    Ok(o)
}

/// `ple_pack_options` with the values of `o`.
pub fn pack_options_to_c(o: &PackOptions) -> ple_pack_options {
    ple_pack_options {
        struct_size: std::mem::size_of::<ple_pack_options>(),
        force: o.force as i32,
        buffer_bytes: o.buffer_bytes as u64,
        shard_count: o.shard.count,
        shard_index: o.shard.index,
    }
}

/// Converts and validates `ple_pack_options`.
pub fn pack_options_from_c(c: &ple_pack_options) -> Result<PackOptions> {
    if !(PLE_PACK_BUFFER_BYTES_MIN..=PLE_PACK_BUFFER_BYTES_MAX).contains(&c.buffer_bytes) {
        return invalid!(
            "options.buffer_bytes {} not in [{PLE_PACK_BUFFER_BYTES_MIN}, 1 GiB]",
            c.buffer_bytes
        );
    }
    let shard = match Shard::new(c.shard_index, c.shard_count) {
        Ok(s) => s,
        Err(Error::InvalidArgument(m)) => return invalid!("options.{m}"),
        Err(e) => return Err(e),
    };
    Ok(PackOptions {
        force: c.force != 0,
        buffer_bytes: c.buffer_bytes as usize,
        preallocate: true,
        shard,
        layer: None,
    })
}

/// The `PLE_FORMAT_*` value of a row format.
pub fn format_code(f: RowFormat) -> ple_format {
    ple_format_code::to_c(f)
}

/// Copies `s` into a fixed C char array: truncated at a UTF-8 boundary, NUL-terminated.
fn copy_c_string(dst: &mut [c_char], s: &str) {
    let mut n = s.len().min(dst.len().saturating_sub(1));
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = if *b == 0 { b'?' } else { *b } as c_char;
    }
    for d in dst.iter_mut().skip(n) {
        *d = 0;
    }
}

/// `ple_info` from the core's table facts (I/O mode reported as MMAP, as for a table alone).
pub fn info_to_c(i: &TableInfo) -> ple_table_info {
    let mmap = IoInfo {
        mode: IoMode::Mmap,
        backend: None,
        cache_bytes: 0,
    };
    info_with_io_to_c(i, mmap)
}

/// `ple_info` from the core's table facts and the handle's I/O mode.
pub fn info_with_io_to_c(i: &TableInfo, io: IoInfo) -> ple_table_info {
    let mut c = ple_table_info {
        struct_size: std::mem::size_of::<ple_table_info>(),
        format: format_code(i.format),
        row_bytes: i.row_bytes,
        total_rows: i.total_rows,
        addressed_rows: i.addressed_rows,
        num_heads: i.num_heads,
        head_dim: i.head_dim,
        ngram_size: i.ngram_size,
        vocab_size: i.vocab_size,
        eos_token_id: i.eos_token_id,
        global_scale: i.global_scale,
        file_size: i.file_size,
        device_wait_supported: i.device_wait_supported as i32,
        source_name: [0; 256],
        source_fingerprint: [0; 72],
        io_mode: match io.mode {
            IoMode::Direct => PLE_IO_DIRECT,
            _ => PLE_IO_MMAP,
        },
        io_backend: ple_io_backend_code::to_c(io.backend),
        cache_bytes: io.cache_bytes,
        shard_index: i.shard.index,
        shard_count: i.shard.count,
        shard_first_head: i.first_head,
        shard_heads: i.shard_heads,
        shard_head_stride: i.head_stride,
        embed_dim: i.num_heads * i.head_dim,
        heads_per_ngram: i.heads_per_ngram,
        ple_layer_index: u32::try_from(i.ple_layer_index).unwrap_or(u32::MAX),
    };
    copy_c_string(&mut c.source_name, &i.source_name);
    copy_c_string(&mut c.source_fingerprint, &i.source_fingerprint);
    c
}

/// Checks and converts the output arguments of `ple_dequant_*`.
pub fn out_args(dtype: ple_dtype, stride: usize, flags: ple_fuse_flags) -> Result<OutArgs> {
    let Some(dtype) = ple_dtype_code::from_c(dtype) else {
        return invalid!("out_dtype {dtype} is not a PLE_DTYPE_* value");
    };
    if flags & !PLE_FUSE_ACCUMULATE != 0 {
        return invalid!("flags {flags:#x} has bits other than PLE_FUSE_ACCUMULATE");
    }
    let args = OutArgs {
        dtype,
        stride,
        accumulate: flags & PLE_FUSE_ACCUMULATE != 0,
    };
    args.check_max()?;
    Ok(args)
}

/// One engine step's tokens in per-token form (llama.cpp's `llama_batch` shape), for
/// `ple_submit_tokens` and `ple_ngram_ids_tokens`: every token carries its own request id and
/// position, in any order. All arrays are read during the call only.
///
/// Each request's positions in the step must be distinct and consecutive (`p .. p+m-1`, in any
/// order). Row ids are those of the same tokens in the offsets form (`ple_batch`), and the step's
/// rows (`ple_packed_rows`, `ple_dequant_*`, the ids of `ple_ngram_ids_tokens`) come in the
/// caller's token order. Versioned: set `struct_size = sizeof(ple_token_batch)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_token_batch {
    /// `sizeof(ple_token_batch)` as the caller compiled it.
    pub struct_size: usize,
    /// `[num_tokens]` token ids, each in `[0, vocab_size)`.
    pub tokens: *const i32,
    /// `[num_tokens]` position of each token in its request's sequence.
    pub positions: *const i32,
    /// `[num_tokens]` the request each token belongs to.
    pub token_request_ids: *const u64,
    /// Tokens in the step (1..=max_tokens_per_step).
    pub num_tokens: u32,
    /// NULL (tracked mode), or `[num_requests][ngram_size - 1]` (stateless mode) with the requests
    /// in order of their first token in `tokens`: the tokens just before the request's lowest
    /// position in the step, oldest first, EOS where the sequence has none.
    pub context: *const i32,
}

/// Size of the first version of `ple_token_batch` (through `context`).
pub(crate) const PLE_TOKEN_BATCH_SIZE_V1: usize = std::mem::size_of::<ple_token_batch>();

#[cfg(test)]
mod tests {
    use super::*;
    use ple_core::stats::Counters;

    #[test]
    fn counters_to_c_copies_every_counter_in_order() {
        // `ple_counters` is `struct_size` then one uint64_t per counter, in the list's order
        assert_eq!(
            std::mem::size_of::<ple_stats>(),
            8 + 8 * Counters::NAMES.len()
        );
        let values = std::array::from_fn(|i| 1000 + i as u64);
        let c = counters_to_c(&Counters::from_values(values));
        assert_eq!(c.struct_size, std::mem::size_of::<ple_stats>());
        // SAFETY: `ple_stats` is repr(C): a usize then only u64 fields, so no padding; reading
        // its bytes after `struct_size` as u64s is in bounds and aligned.
        let after_size = unsafe {
            std::slice::from_raw_parts(
                (&c as *const ple_stats as *const u64).add(1),
                Counters::NAMES.len(),
            )
        };
        assert_eq!(after_size, &values[..]);
        assert_eq!(c.ahead_hits, Counters::from_values(values).ahead_hits);
    }
}
