/*
 * The emulated CUDA driver: contexts, memory, streams, events, stream memory waits (emu.h has the
 * model). Modules, launches and graphs are in emu_launch.cpp, VMM in emu_vmm.cpp. Each entry
 * point returns what the CUDA driver API documents for misuse: no current context (CUDA_ERROR_INVALID_CONTEXT), an
 * unknown or destroyed handle (CUDA_ERROR_INVALID_HANDLE), a pointer outside every live
 * allocation or a freed one (CUDA_ERROR_INVALID_VALUE), a call a stream capture forbids
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED / _IMPLICIT, and the capture is invalidated).
 */
#include "emu_api.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace emu {

std::mutex g_mu;
std::mutex g_done_mu;
std::condition_variable g_done_cv;
Config g_cfg;

std::set<Ctx *> g_ctxs;
std::set<Stream *> g_streams;
std::set<Event *> g_events;
std::map<uintptr_t, Alloc> g_allocs; /* by base, live and freed (quarantined) */
std::set<Phys *> g_phys;
std::map<uintptr_t, Mapping> g_maps; /* by base */
Ctx g_primary;
bool g_inited = false;
Stream *g_legacy = nullptr;
thread_local std::vector<Ctx *> t_ctx_stack;
thread_local CUstreamCaptureMode t_cap_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

Ctx *current_ctx() {
    if (t_ctx_stack.empty()) return nullptr;
    Ctx *c = t_ctx_stack.back();
    return c && c->alive ? c : nullptr;
}

/* ---- streams --------------------------------------------------------------------------- */

static void exec_op(Stream *s, Op &op) {
    switch (op.kind) {
    case Op::Kernel: run_kernel(op); break;
    case Op::Copy:
        memmove(reinterpret_cast<void *>(op.dst),
                op.staged ? static_cast<const void *>(op.staged->data())
                          : reinterpret_cast<const void *>(op.src),
                op.bytes);
        break;
    case Op::Memset: memset(reinterpret_cast<void *>(op.dst), op.byte, op.bytes); break;
    case Op::Record: {
        double t = now_ms();
        std::lock_guard<std::mutex> g(g_mu);
        if (op.ev->gen == op.ev_gen) op.ev->time_ms = t;
        break;
    }
    case Op::WaitValue64: {
        /* the stream stops here until the 64-bit word satisfies the condition (CUDA's
         * cuStreamWaitValue64: GEQ compares cyclically, as (int64_t)(*addr - value) >= 0) */
        const volatile uint64_t *a = reinterpret_cast<const volatile uint64_t *>(op.addr);
        unsigned spin = 0;
        for (;;) {
            uint64_t v = __atomic_load_n(const_cast<const uint64_t *>(a), __ATOMIC_ACQUIRE);
            bool ok;
            switch (op.flags & 0xF) {
            case CU_STREAM_WAIT_VALUE_GEQ: ok = int64_t(v - op.value) >= 0; break;
            case CU_STREAM_WAIT_VALUE_EQ: ok = v == op.value; break;
            case CU_STREAM_WAIT_VALUE_AND: ok = (v & op.value) != 0; break;
            default: ok = ~(v | op.value) != 0; break; /* NOR */
            }
            if (ok) break;
            if (++spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        break;
    }
    case Op::WaitTicket: {
        std::unique_lock<std::mutex> g(g_done_mu);
        g_done_cv.wait(g, [&] { return op.on->completed.load() >= op.ticket; });
        break;
    }
    case Op::HostFn: op.host_fn(op.user); break;
    }
    (void)s;
}

static void stream_main(Stream *s) {
    for (;;) {
        Op op;
        {
            std::unique_lock<std::mutex> g(s->mu);
            s->cv.wait(g, [&] { return !s->q.empty() || s->stop; });
            if (s->q.empty()) return;
            op = std::move(s->q.front());
            s->q.pop_front();
        }
        exec_op(s, op);
        {
            std::lock_guard<std::mutex> g(g_done_mu);
            op.owner->completed.store(op.my_ticket);
        }
        g_done_cv.notify_all();
    }
}

Stream *new_stream(Ctx *ctx, unsigned flags, bool legacy) {
    Stream *s = new Stream;
    s->ctx = ctx;
    s->flags = flags;
    s->legacy = legacy;
    if (g_cfg.max_connections > 0) {
        static std::vector<Stream *> runners;
        static size_t next = 0;
        size_t i = next++ % size_t(g_cfg.max_connections);
        if (runners.size() <= i) {
            Stream *q = new Stream; /* a hardware queue, no stream of its own */
            q->hw = q;
            q->th = std::thread(stream_main, q);
            q->th.detach();
            runners.push_back(q);
        }
        s->hw = runners[i];
    } else {
        s->hw = s;
        s->th = std::thread(stream_main, s);
        s->th.detach();
    }
    g_streams.insert(s);
    return s;
}

/* Appends `op` to stream `s`'s queue; returns its ticket. No capture check (see enqueue). */
static uint64_t push(Stream *s, Op op) {
    {
        std::lock_guard<std::mutex> g(s->mu);
        op.my_ticket = ++s->submitted;
    }
    op.owner = s;
    uint64_t t = op.my_ticket;
    std::lock_guard<std::mutex> g(s->hw->mu);
    s->hw->q.push_back(std::move(op));
    s->hw->cv.notify_one();
    return t;
}

uint64_t tail(Stream *s) {
    std::lock_guard<std::mutex> g(s->mu);
    return s->submitted;
}

/* Enqueues `op` on `s` (resolved, g_mu held): into the capture's graph while `s` captures, else
 * on the queue, after the legacy stream's implicit synchronisation with blocking streams. */
uint64_t enqueue(Stream *s, Op op) {
    if (s->capturing) {
        s->cap_graph->nodes.push_back(std::move(op));
        return 0;
    }
    if (s->legacy) {
        for (Stream *o : g_streams)
            if (o != s && o->alive && !o->legacy && o->ctx == s->ctx &&
                !(o->flags & CU_STREAM_NON_BLOCKING)) {
                uint64_t t = tail(o);
                if (o->completed.load() < t) {
                    Op w;
                    w.kind = Op::WaitTicket;
                    w.on = o;
                    w.ticket = t;
                    push(s, std::move(w));
                }
            }
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && g_legacy) {
        uint64_t t = tail(g_legacy);
        if (g_legacy->completed.load() < t) {
            Op w;
            w.kind = Op::WaitTicket;
            w.on = g_legacy;
            w.ticket = t;
            push(s, std::move(w));
        }
    }
    return push(s, std::move(op));
}

void wait_ticket(Stream *s, uint64_t t) {
    std::unique_lock<std::mutex> g(g_done_mu);
    g_done_cv.wait(g, [&] { return s->completed.load() >= t; });
}

/* Resolves a stream handle (g_mu held): NULL / CU_STREAM_LEGACY are the legacy stream of the
 * current context; CU_STREAM_PER_THREAD is refused (libple's callers do not use it here). */
CUresult resolve_stream(CUstream h, Stream **out) {
    if (h == nullptr || h == CU_STREAM_LEGACY) {
        Ctx *c = current_ctx();
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        if (!g_legacy) g_legacy = new_stream(&g_primary, 0, true);
        *out = g_legacy;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) return CUDA_ERROR_NOT_SUPPORTED;
    Stream *s = reinterpret_cast<Stream *>(h);
    if (g_streams.count(s) && !s->alive)
        return misuse(CUDA_ERROR_INVALID_HANDLE, "a stream call", "the stream was destroyed");
    if (!g_streams.count(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = s;
    return CUDA_SUCCESS;
}

bool any_capture_blocking() {
    for (Stream *o : g_streams)
        if (o->alive && o->capturing && !(o->flags & CU_STREAM_NON_BLOCKING)) return true;
    return false;
}

/* Whether the calling thread may make a "potentially unsafe" call now (g_mu held), per
 * cuStreamBeginCapture's modes; if not, the captures that forbid it are invalidated. */
bool unsafe_call_allowed() {
    if (t_cap_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return true;
    bool ok = true;
    for (Stream *o : g_streams) {
        if (!o->alive || !o->capturing || o->cap_mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        bool mine = o->cap_thread == std::this_thread::get_id();
        bool forbids = mine || (o->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                t_cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (forbids) {
            o->cap_invalid = true;
            ok = false;
        }
    }
    return ok;
}

/* ---- memory ---------------------------------------------------------------------------- */

/* The live allocation or mapping holding [p, p + n), or null. Device-accessible memory only:
 * device allocations, host allocations (mapped: UVA), accessible VMM mappings. */
const Alloc *find_alloc(uintptr_t p, size_t n, bool *is_freed) {
    if (is_freed) *is_freed = false;
    auto it = g_allocs.upper_bound(p);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    const Alloc &a = it->second;
    if (p < a.base || p - a.base >= a.size) return nullptr;
    if (a.freed) {
        if (is_freed) *is_freed = true;
        return nullptr;
    }
    if (n > a.size - (p - a.base)) return nullptr;
    return &a;
}

const Mapping *find_map(uintptr_t p, size_t n) {
    auto it = g_maps.upper_bound(p);
    if (it == g_maps.begin()) return nullptr;
    --it;
    const Mapping &m = it->second;
    if (p < m.base || p - m.base >= m.size) return nullptr;
    if (n > m.size - (p - m.base)) return nullptr;
    return &m;
}

/* Whether [p, p + n) is memory the emulated device may access (VMM: within accessible
 * mappings, possibly several back to back). */
bool device_accessible(uintptr_t p, size_t n) {
    if (n == 0) n = 1;
    const Alloc *a = find_alloc(p, n, nullptr);
    if (a && a->kind == MemKind::Device) return true;
    if (a && a->kind == MemKind::Host) return a->host_flags & CU_MEMHOSTALLOC_DEVICEMAP;
    while (n) { /* inside a VMM reservation: accessible mappings only */
        auto it = g_maps.upper_bound(p);
        if (it == g_maps.begin()) return false;
        --it;
        const Mapping &m = it->second;
        if (p < m.base || p - m.base >= m.size || !m.access) return false;
        size_t here = m.size - (p - m.base);
        if (here >= n) return true;
        p += here;
        n -= here;
    }
    return true;
}

CUresult misuse(CUresult r, const char *call, const char *what) {
    fprintf(stderr, "cuda-emu: misuse: %s: %s\n", call, what);
    return r;
}

static void *map_anon(size_t n) {
    void *p = mmap(nullptr, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}

/* A freed allocation stays reserved, inaccessible: a kernel or copy that touches it faults here
 * (reported by the SIGSEGV handler) instead of reading reused memory. */
void quarantine(Alloc &a) {
    mprotect(reinterpret_cast<void *>(a.base), a.size, PROT_NONE);
    madvise(reinterpret_cast<void *>(a.base), a.size, MADV_DONTNEED);
    a.freed = true;
}

static void on_segv(int sig, siginfo_t *si, void *) {
    uintptr_t p = reinterpret_cast<uintptr_t>(si->si_addr);
    for (auto &kv : g_allocs) { /* no lock: the process is about to die */
        const Alloc &a = kv.second;
        if (a.freed && p >= a.base && p - a.base < a.size) {
            char msg[160];
            int n = snprintf(msg, sizeof msg,
                             "cuda-emu: illegal address %#lx: inside a freed allocation "
                             "(%#lx, %zu B) — use after cuMemFree/cuMemFreeHost\n",
                             (unsigned long)p, (unsigned long)a.base, a.size);
            if (write(2, msg, size_t(n)) < 0) {}
            break;
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

} // namespace emu

using namespace emu;

#define LOCK std::lock_guard<std::mutex> lock_(g_mu)
#define NEED_INIT                                                                                  \
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX                                                                                   \
    NEED_INIT;                                                                                     \
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

EMU_API CUresult CUDAAPI cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    if (!g_inited) {
        g_cfg.stream_mem_ops = env_int("PLE_EMU_STREAM_MEM_OPS", 1) != 0;
        g_cfg.sm_count = env_int("PLE_EMU_SM_COUNT", 4);
        if (g_cfg.sm_count < 1) g_cfg.sm_count = 1;
        int cc = env_int("PLE_EMU_CC", 90);
        g_cfg.cc_major = cc / 10;
        g_cfg.cc_minor = cc % 10;
        g_cfg.driver_version = env_int("PLE_EMU_DRIVER_VERSION", 12090);
        g_cfg.max_connections = env_int("CUDA_DEVICE_MAX_CONNECTIONS", 0);
        g_primary.primary = true;
        g_ctxs.insert(&g_primary);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, nullptr);
        g_inited = true;
    }
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = g_inited ? g_cfg.driver_version : env_int("PLE_EMU_DRIVER_VERSION", 12090);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDeviceGetCount(int *n) {
    NEED_INIT;
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = 1;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, size_t(len), "libple CUDA emulator (CPU%s)",
             g_cfg.stream_mem_ops ? "" : ", no 64-bit stream mem ops");
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    NEED_INIT;
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = g_cfg.cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = g_cfg.cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = g_cfg.sm_count; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: *v = g_cfg.stream_mem_ops; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: *v = g_cfg.stream_mem_ops; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    NEED_INIT;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    LOCK;
    g_primary.refs++;
    g_primary.alive = true;
    *c = reinterpret_cast<CUcontext>(&g_primary);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d) {
    NEED_INIT;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    LOCK;
    if (g_primary.refs <= 0)
        return misuse(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease", "no retain left");
    /* the primary context stays usable at refs 0 only until reset; the emulator never resets it,
     * but a release without a retain is misuse */
    g_primary.refs--;
    return CUDA_SUCCESS;
}

static CUresult check_ctx(CUcontext c, Ctx **out) {
    Ctx *x = reinterpret_cast<Ctx *>(c);
    if (!x || !g_ctxs.count(x)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!x->alive || (x->primary && x->refs <= 0)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = x;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext c) {
    NEED_INIT;
    LOCK;
    Ctx *x;
    if (CUresult r = check_ctx(c, &x)) return r;
    t_ctx_stack.push_back(x);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *c) {
    NEED_INIT;
    if (t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (c) *c = reinterpret_cast<CUcontext>(t_ctx_stack.back());
    t_ctx_stack.pop_back();
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) {
    NEED_INIT;
    LOCK;
    if (!c) {
        if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
        return CUDA_SUCCESS;
    }
    Ctx *x;
    if (CUresult r = check_ctx(c, &x)) return r;
    if (t_ctx_stack.empty())
        t_ctx_stack.push_back(x);
    else
        t_ctx_stack.back() = x;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *c) {
    NEED_INIT;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = reinterpret_cast<CUcontext>(current_ctx());
    return CUDA_SUCCESS;
}

/* A second, non-primary context: what an engine on another context would pass (misuse tests). */
EMU_API CUresult CUDAAPI cuCtxCreate(CUcontext *c, unsigned int, CUdevice d) {
    NEED_INIT;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    LOCK;
    Ctx *x = new Ctx;
    x->refs = 1;
    x->alive = true;
    g_ctxs.insert(x);
    t_ctx_stack.push_back(x);
    *c = reinterpret_cast<CUcontext>(x);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuCtxDestroy(CUcontext c) {
    NEED_INIT;
    LOCK;
    Ctx *x;
    if (CUresult r = check_ctx(c, &x)) return r;
    if (x->primary) return CUDA_ERROR_INVALID_CONTEXT;
    x->alive = false;
    for (auto it = t_ctx_stack.begin(); it != t_ctx_stack.end();)
        it = *it == x ? t_ctx_stack.erase(it) : it + 1;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuCtxSynchronize(void) {
    NEED_CTX;
    std::vector<std::pair<Stream *, uint64_t>> w;
    {
        LOCK;
        if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        Ctx *c = current_ctx();
        for (Stream *s : g_streams)
            if (s->ctx == c || (s->legacy && c)) w.push_back({s, tail(s)});
    }
    for (auto &p : w) wait_ticket(p.first, p.second);
    return CUDA_SUCCESS;
}

/* ---- memory ---------------------------------------------------------------------------- */

EMU_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr *p, size_t n) {
    NEED_CTX;
    if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    void *m = map_anon(n);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    Alloc a;
    a.base = reinterpret_cast<uintptr_t>(m);
    a.size = n;
    a.kind = MemKind::Device;
    a.ctx = current_ctx();
    g_allocs[a.base] = a;
    *p = a.base;
    return CUDA_SUCCESS;
}

static CUresult free_alloc(uintptr_t p, MemKind kind) {
    auto it = g_allocs.find(p);
    if (it != g_allocs.end() && it->second.freed)
        return misuse(CUDA_ERROR_INVALID_VALUE, kind == MemKind::Host ? "cuMemFreeHost" : "cuMemFree",
                      "memory freed twice");
    if (it == g_allocs.end() || it->second.kind != kind) return CUDA_ERROR_INVALID_VALUE;
    quarantine(it->second);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemFree(CUdeviceptr p) {
    NEED_CTX;
    if (p == 0) return CUDA_SUCCESS;
    /* cuMemFree synchronises with the device's work (as the real driver's does, implicitly) */
    std::vector<std::pair<Stream *, uint64_t>> w;
    {
        LOCK;
        if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        for (Stream *s : g_streams) w.push_back({s, tail(s)});
    }
    for (auto &x : w) wait_ticket(x.first, x.second);
    LOCK;
    return free_alloc(p, MemKind::Device);
}

EMU_API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t n, unsigned int flags) {
    NEED_CTX;
    if (!pp || n == 0 || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    void *m = map_anon(n);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    Alloc a;
    a.base = reinterpret_cast<uintptr_t>(m);
    a.size = n;
    a.kind = MemKind::Host;
    a.host_flags = flags;
    a.ctx = current_ctx();
    g_allocs[a.base] = a;
    *pp = m;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int flags) {
    NEED_CTX;
    if (!d || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    const Alloc *a = find_alloc(reinterpret_cast<uintptr_t>(p), 1, nullptr);
    if (!a || a->kind != MemKind::Host || !(a->host_flags & CU_MEMHOSTALLOC_DEVICEMAP))
        return CUDA_ERROR_INVALID_VALUE;
    *d = reinterpret_cast<uintptr_t>(p); /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemFreeHost(void *p) {
    NEED_CTX;
    std::vector<std::pair<Stream *, uint64_t>> w;
    {
        LOCK;
        if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        for (Stream *s : g_streams) w.push_back({s, tail(s)});
    }
    for (auto &x : w) wait_ticket(x.first, x.second);
    LOCK;
    return free_alloc(reinterpret_cast<uintptr_t>(p), MemKind::Host);
}

EMU_API CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    NEED_CTX;
    LOCK;
    const Alloc *a = find_alloc(p, 1, nullptr);
    if (a && a->kind == MemKind::Device) {
        if (base) *base = a->base;
        if (size) *size = a->size;
        return CUDA_SUCCESS;
    }
    if (const Mapping *m = find_map(p, 1)) { /* a VMM mapping: its own range, one chunk */
        if (base) *base = m->base;
        if (size) *size = m->size;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_FOUND;
}

EMU_API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
    NEED_INIT;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    const Alloc *a = find_alloc(p, 1, nullptr);
    if (a && a->kind == MemKind::VmmReserve) a = nullptr; /* a reservation: its mappings count */
    const Mapping *m = a ? nullptr : find_map(p, 1);
    if (!a && !m) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned *>(data) =
            (a && a->kind == MemKind::Host) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int *>(data) = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext *>(data) =
            reinterpret_cast<CUcontext>(a && a->ctx ? a->ctx : &g_primary);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr *>(data) = p; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ---- copies and memsets ------------------------------------------------------------------ */

/* A synchronous call on the legacy stream: enqueue, wait. */
static CUresult legacy_sync(Op op) {
    Stream *s;
    uint64_t t;
    {
        LOCK;
        if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        if (any_capture_blocking()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        if (CUresult r = resolve_stream(nullptr, &s)) return r;
        t = enqueue(s, std::move(op));
    }
    wait_ticket(s, t);
    return CUDA_SUCCESS;
}

static Op copy_op(uintptr_t dst, uintptr_t src, size_t n) {
    Op op;
    op.kind = Op::Copy;
    op.dst = dst;
    op.src = src;
    op.bytes = n;
    return op;
}

/* src/dst checks: device side inside device-accessible memory (g_mu held) */
static bool dev_ok(uintptr_t p, size_t n) { return p && device_accessible(p, n); }

EMU_API CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
    NEED_CTX;
    if (n == 0) return CUDA_SUCCESS;
    {
        LOCK;
        if (!src || !dev_ok(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    }
    return legacy_sync(copy_op(dst, reinterpret_cast<uintptr_t>(src), n));
}

EMU_API CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
    NEED_CTX;
    if (n == 0) return CUDA_SUCCESS;
    {
        LOCK;
        if (!dst || !dev_ok(src, n)) return CUDA_ERROR_INVALID_VALUE;
    }
    return legacy_sync(copy_op(reinterpret_cast<uintptr_t>(dst), src, n));
}

EMU_API CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char b, size_t n) {
    NEED_CTX;
    if (n == 0) return CUDA_SUCCESS;
    {
        LOCK;
        if (!dev_ok(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    }
    Op op;
    op.kind = Op::Memset;
    op.dst = dst;
    op.bytes = n;
    op.byte = b;
    return legacy_sync(std::move(op));
}

static CUresult async_copy(CUstream h, Op op, bool host_src) {
    NEED_CTX;
    LOCK;
    Stream *s;
    if (CUresult r = resolve_stream(h, &s)) return r;
    if (s->ctx != current_ctx() && !s->legacy) return CUDA_ERROR_INVALID_HANDLE;
    if (host_src) {
        const Alloc *a = find_alloc(op.src, op.bytes, nullptr);
        if (!a || a->kind != MemKind::Host) { /* pageable: staged now, as the driver does */
            auto v = std::make_shared<std::vector<unsigned char>>(op.bytes);
            memcpy(v->data(), reinterpret_cast<const void *>(op.src), op.bytes);
            op.staged = v;
        }
    }
    enqueue(s, std::move(op));
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
    if (n == 0) return CUDA_SUCCESS;
    {
        LOCK;
        if (!src || !dev_ok(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    }
    return async_copy(h, copy_op(dst, reinterpret_cast<uintptr_t>(src), n), true);
}

EMU_API CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    if (n == 0) return CUDA_SUCCESS;
    {
        LOCK;
        if (!dev_ok(dst, n) || !dev_ok(src, n)) return CUDA_ERROR_INVALID_VALUE;
    }
    return async_copy(h, copy_op(dst, src, n), false);
}

EMU_API CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream h) {
    if (n == 0) return CUDA_SUCCESS;
    {
        LOCK;
        if (!dst || !dev_ok(src, n)) return CUDA_ERROR_INVALID_VALUE;
    }
    return async_copy(h, copy_op(reinterpret_cast<uintptr_t>(dst), src, n), false);
}
