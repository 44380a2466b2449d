/*
 * The emulated driver's streams, events, modules (libple's PTX mapped to the host build of the same
 * kernels by entry name), kernel launches, stream capture and graphs, error texts.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emu_api.h"

using namespace emu;

#define LOCK std::lock_guard<std::mutex> lock_(g_mu)
#define NEED_INIT                                                                                  \
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX                                                                                   \
    NEED_INIT;                                                                                     \
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT

namespace {
std::set<Module *> g_modules;
std::set<Function *> g_functions;
std::set<Graph *> g_graphs;
std::set<GraphExec *> g_execs;

/* a stream of the current context (or the legacy stream) */
CUresult own_stream(CUstream h, Stream **s) {
    if (CUresult r = resolve_stream(h, s)) return r;
    if (!(*s)->legacy && (*s)->ctx != current_ctx()) return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}
} // namespace

/* ---- streams ------------------------------------------------------------------------------ */

EMU_API CUresult CUDAAPI cuStreamCreate(CUstream *h, unsigned int flags) {
    NEED_CTX;
    if (!h || (flags & ~unsigned(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    *h = reinterpret_cast<CUstream>(new_stream(current_ctx(), flags, false));
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuStreamDestroy(CUstream h) {
    NEED_INIT;
    LOCK;
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
    Stream *s;
    if (CUresult r = resolve_stream(h, &s)) return r;
    if (s->capturing) s->cap_invalid = true;
    s->alive = false; /* queued work still runs; the stream's own thread ends after it */
    if (s->hw != s) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> g(s->mu);
    s->stop = true;
    s->cv.notify_one();
    return CUDA_SUCCESS;
}

static CUresult sync_allowed(Stream *s) {
    if (s->capturing) {
        s->cap_invalid = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->legacy && any_capture_blocking()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuStreamSynchronize(CUstream h) {
    NEED_INIT;
    Stream *s;
    uint64_t t;
    {
        LOCK;
        if (CUresult r = resolve_stream(h, &s)) return r;
        if (CUresult r = sync_allowed(s)) return r;
        std::lock_guard<std::mutex> g(s->mu);
        t = s->submitted;
    }
    wait_ticket(s, t);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuStreamQuery(CUstream h) {
    NEED_INIT;
    LOCK;
    Stream *s;
    if (CUresult r = resolve_stream(h, &s)) return r;
    if (CUresult r = sync_allowed(s)) return r;
    std::lock_guard<std::mutex> g(s->mu);
    return s->completed.load() >= s->submitted ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EMU_API CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext *c) {
    NEED_INIT;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Stream *s;
    if (CUresult r = resolve_stream(h, &s)) return r;
    *c = reinterpret_cast<CUcontext>(s->legacy ? current_ctx() : s->ctx);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st) {
    NEED_INIT;
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Stream *s;
    if (CUresult r = resolve_stream(h, &s)) return r;
    if (s->legacy) {
        if (any_capture_blocking()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        *st = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    *st = !s->capturing   ? CU_STREAM_CAPTURE_STATUS_NONE
          : s->cap_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                           : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuStreamWaitValue64(CUstream h, CUdeviceptr addr, cuuint64_t value,
                                             unsigned int flags) {
    NEED_CTX;
    if (!g_cfg.stream_mem_ops) return CUDA_ERROR_NOT_SUPPORTED;
    unsigned op = flags & ~unsigned(CU_STREAM_WAIT_VALUE_FLUSH);
    if (op > CU_STREAM_WAIT_VALUE_NOR || addr % 8) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    if (!device_accessible(addr, 8)) return CUDA_ERROR_INVALID_VALUE;
    Stream *s;
    if (CUresult r = own_stream(h, &s)) return r;
    Op o;
    o.kind = Op::WaitValue64;
    o.addr = addr;
    o.value = value;
    o.flags = op;
    enqueue(s, std::move(o));
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuLaunchHostFunc(CUstream h, CUhostFn fn, void *user) {
    NEED_CTX;
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Stream *s;
    if (CUresult r = own_stream(h, &s)) return r;
    Op o;
    o.kind = Op::HostFn;
    o.host_fn = fn;
    o.user = user;
    enqueue(s, std::move(o));
    return CUDA_SUCCESS;
}

/* ---- events ------------------------------------------------------------------------------- */

static CUresult live_event(CUevent h, Event **e) {
    Event *x = reinterpret_cast<Event *>(h);
    if (x && g_events.count(x) && !x->alive)
        return misuse(CUDA_ERROR_INVALID_HANDLE, "an event call", "the event was destroyed");
    if (!x || !g_events.count(x)) return CUDA_ERROR_INVALID_HANDLE;
    *e = x;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuEventCreate(CUevent *h, unsigned int flags) {
    NEED_CTX;
    if (!h || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Event *e = new Event;
    e->ctx = current_ctx();
    e->flags = flags;
    g_events.insert(e);
    *h = reinterpret_cast<CUevent>(e);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuEventDestroy(CUevent h) {
    NEED_INIT;
    LOCK;
    Event *e;
    if (CUresult r = live_event(h, &e)) return r;
    e->alive = false; /* a pending record still completes */
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuEventRecord(CUevent h, CUstream hs) {
    NEED_INIT;
    LOCK;
    Event *e;
    Stream *s;
    if (CUresult r = live_event(h, &e)) return r;
    if (CUresult r = resolve_stream(hs, &s)) return r;
    if (!s->legacy && s->ctx != e->ctx) return CUDA_ERROR_INVALID_HANDLE;
    if (s->capturing) { /* a captured event orders captured work; it is no node */
        e->captured = true;
        return CUDA_SUCCESS;
    }
    e->captured = false;
    Op o;
    o.kind = Op::Record;
    o.ev = e;
    o.ev_gen = ++e->gen;
    e->s = s;
    e->ticket = enqueue(s, std::move(o));
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuEventQuery(CUevent h) {
    NEED_INIT;
    LOCK;
    Event *e;
    if (CUresult r = live_event(h, &e)) return r;
    if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (e->captured) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!e->s || e->s->completed.load() >= e->ticket) return CUDA_SUCCESS;
    return CUDA_ERROR_NOT_READY;
}

EMU_API CUresult CUDAAPI cuEventSynchronize(CUevent h) {
    NEED_INIT;
    Stream *s;
    uint64_t t;
    {
        LOCK;
        Event *e;
        if (CUresult r = live_event(h, &e)) return r;
        if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        if (!e->s) return CUDA_SUCCESS;
        s = e->s;
        t = e->ticket;
    }
    wait_ticket(s, t);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hs, CUevent h, unsigned int flags) {
    NEED_INIT;
    if (flags & ~1u) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Event *e;
    Stream *s;
    if (CUresult r = live_event(h, &e)) return r;
    if (CUresult r = resolve_stream(hs, &s)) return r;
    if (!e->s) return CUDA_SUCCESS;
    Op o;
    o.kind = Op::WaitTicket;
    o.on = e->s;
    o.ticket = e->ticket;
    enqueue(s, std::move(o));
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b) {
    NEED_INIT;
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Event *x, *y;
    if (CUresult r = live_event(a, &x)) return r;
    if (CUresult r = live_event(b, &y)) return r;
    if ((x->flags | y->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!x->s || !y->s) return CUDA_ERROR_INVALID_HANDLE;
    if (x->s->completed.load() < x->ticket || y->s->completed.load() < y->ticket)
        return CUDA_ERROR_NOT_READY;
    *ms = float(y->time_ms - x->time_ms);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return elapsed(ms, a, b); }
EMU_API CUresult CUDAAPI cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return elapsed(ms, a, b); }

/* ---- modules: libple's PTX, run by the host build of the same kernels -------------------- */

namespace {

void put_log(std::string *log, const std::string &m) {
    if (log->empty()) *log = m;
}

/* the minimum emulated driver version for a PTX ISA (the CUDA release that introduced it) */
int driver_for_isa(int major, int minor) {
    if (major < 8) return 11000;
    static const int v8[] = {12000, 12010, 12020, 12030, 12040, 12050, 12070, 12080, 12090};
    if (major == 8 && minor < 9) return v8[minor];
    return 13000;
}

/* Parses `.entry NAME(.param ..., ...)` and `.maxntid` of each entry. */
CUresult parse_ptx(const std::string &ptx, Module *m, std::string *log) {
    size_t v = ptx.find(".version ");
    size_t t = ptx.find(".target sm_");
    if (v == std::string::npos || t == std::string::npos) {
        put_log(log, "not a PTX image (no .version / .target)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    int maj = 0, min = 0, sm = 0;
    sscanf(ptx.c_str() + v, ".version %d.%d", &maj, &min);
    sscanf(ptx.c_str() + t, ".target sm_%d", &sm);
    if (driver_for_isa(maj, min) > g_cfg.driver_version) {
        put_log(log, "PTX ISA " + std::to_string(maj) + "." + std::to_string(min) +
                         " is newer than this (emulated) driver");
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    if (sm > g_cfg.cc_major * 10 + g_cfg.cc_minor) {
        put_log(log, "PTX for sm_" + std::to_string(sm) + " on an older device");
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    size_t pos = 0;
    while ((pos = ptx.find(".entry ", pos)) != std::string::npos) {
        pos += 7;
        size_t paren = ptx.find('(', pos);
        size_t close = ptx.find(')', paren);
        size_t body = ptx.find('{', close);
        if (paren == std::string::npos || close == std::string::npos || body == std::string::npos) {
            put_log(log, "malformed .entry");
            return CUDA_ERROR_INVALID_PTX;
        }
        Function *f = new Function;
        f->mod = m;
        f->name = ptx.substr(pos, paren - pos);
        while (!f->name.empty() && isspace((unsigned char)f->name.back())) f->name.pop_back();
        std::string plist = ptx.substr(paren + 1, close - paren - 1);
        size_t q = 0;
        while ((q = plist.find(".param", q)) != std::string::npos) {
            size_t end = plist.find(',', q);
            std::string p = plist.substr(q, end == std::string::npos ? std::string::npos : end - q);
            q += 6;
            size_t align = 0, size = 0;
            size_t a = p.find(".align ");
            if (a != std::string::npos) align = strtoul(p.c_str() + a + 7, nullptr, 10);
            size_t br = p.find('[');
            if (br != std::string::npos) {
                size = strtoul(p.c_str() + br + 1, nullptr, 10);
            } else {
                static const char *ty[] = {".u64", ".s64", ".b64", ".f64", ".u32", ".s32", ".b32", ".f32"};
                for (int i = 0; i < 8; i++)
                    if (p.find(ty[i]) != std::string::npos) size = i < 4 ? 8 : 4;
            }
            if (!size) {
                put_log(log, "unparsed parameter of " + f->name + ": " + p);
                return CUDA_ERROR_INVALID_PTX;
            }
            f->params.push_back({size, align ? align : size});
        }
        std::string attrs = ptx.substr(close, body - close);
        size_t mx = attrs.find(".maxntid ");
        if (mx != std::string::npos) f->maxntid = unsigned(strtoul(attrs.c_str() + mx + 9, nullptr, 10));
        for (size_t i = 0; i < emu_host_kernel_count; i++)
            if (f->name == emu_host_kernels[i].name) f->host = &emu_host_kernels[i];
        if (!f->host) {
            put_log(log, "cuda-emu: PTX entry " + f->name +
                             " has no host build (ffi-tests/gpu/emu/host_kernels.cpp)");
            return CUDA_ERROR_INVALID_PTX;
        }
        size_t total = 0;
        for (auto &p : f->params) total = (total + p.second - 1) / p.second * p.second + p.first;
        if (f->params.size() != 1 || total != f->host->param_bytes) {
            put_log(log, "cuda-emu: " + f->name + ": the PTX's parameters (" +
                             std::to_string(total) + " B) differ from the host build's (" +
                             std::to_string(f->host->param_bytes) + " B)");
            return CUDA_ERROR_INVALID_PTX;
        }
        m->fns.push_back(f);
        pos = body;
    }
    return CUDA_SUCCESS;
}

} // namespace

EMU_API CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n,
                                            CUjit_option *opts, void **vals) {
    NEED_CTX;
    if (!mod || !image || (n && (!opts || !vals))) return CUDA_ERROR_INVALID_VALUE;
    char *logbuf = nullptr;
    size_t logsize = 0;
    for (unsigned i = 0; i < n; i++) {
        if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) logbuf = static_cast<char *>(vals[i]);
        if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) logsize = reinterpret_cast<uintptr_t>(vals[i]);
    }
    LOCK;
    if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    Module *m = new Module;
    m->ctx = current_ctx();
    std::string log;
    CUresult r = parse_ptx(static_cast<const char *>(image), m, &log);
    if (logbuf && logsize) {
        snprintf(logbuf, logsize, "%s", log.c_str());
    }
    if (r != CUDA_SUCCESS) return r; /* the half-parsed module leaks: a test double */
    g_modules.insert(m);
    for (Function *f : m->fns) g_functions.insert(f);
    *mod = reinterpret_cast<CUmodule>(m);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuModuleGetFunction(CUfunction *f, CUmodule hm, const char *name) {
    NEED_CTX;
    if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Module *m = reinterpret_cast<Module *>(hm);
    if (!g_modules.count(m) || !m->alive) return CUDA_ERROR_INVALID_HANDLE;
    for (Function *x : m->fns)
        if (x->name == name) {
            *f = reinterpret_cast<CUfunction>(x);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

EMU_API CUresult CUDAAPI cuModuleUnload(CUmodule hm) {
    NEED_INIT;
    LOCK;
    Module *m = reinterpret_cast<Module *>(hm);
    if (g_modules.count(m) && !m->alive)
        return misuse(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload", "the module was unloaded");
    if (!g_modules.count(m)) return CUDA_ERROR_INVALID_HANDLE;
    m->alive = false; /* launches already queued still run (their Function stays) */
    return CUDA_SUCCESS;
}

static CUresult live_function(CUfunction h, Function **f) {
    Function *x = reinterpret_cast<Function *>(h);
    if (x && g_functions.count(x) && !x->mod->alive)
        return misuse(CUDA_ERROR_INVALID_HANDLE, "a kernel call", "its module was unloaded");
    if (!x || !g_functions.count(x)) return CUDA_ERROR_INVALID_HANDLE;
    *f = x;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *nb, CUfunction h, int bs,
                                                                     size_t smem) {
    NEED_CTX;
    if (!nb || bs <= 0) return CUDA_ERROR_INVALID_VALUE;
    (void)smem;
    LOCK;
    Function *f;
    if (CUresult r = live_function(h, &f)) return r;
    if (f->maxntid && unsigned(bs) > f->maxntid) {
        *nb = 0;
        return CUDA_SUCCESS;
    }
    *nb = bs >= 256 ? 2 : 4; /* a few resident blocks: the grid strides, as on a device */
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuLaunchKernel(CUfunction h, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned smem, CUstream hs,
                                        void **params, void **extra) {
    NEED_CTX;
    LOCK;
    Function *f;
    if (CUresult r = live_function(h, &f)) return r;
    if (f->mod->ctx != current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = uint64_t(bx) * by * bz;
    if (threads > 1024 || (f->maxntid && threads > f->maxntid)) return CUDA_ERROR_INVALID_VALUE;
    if (smem > 48 * 1024) return CUDA_ERROR_INVALID_VALUE;
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    if (!f->params.empty() && !params) return CUDA_ERROR_INVALID_VALUE;
    Stream *s;
    if (CUresult r = own_stream(hs, &s)) return r;
    Op o;
    o.kind = Op::Kernel;
    o.fn = f;
    o.grid = {gx, gy, gz};
    o.block = {bx, by, bz};
    size_t off = 0;
    for (size_t i = 0; i < f->params.size(); i++) {
        auto [size, align] = f->params[i];
        off = (off + align - 1) / align * align;
        o.params.resize(off + size);
        memcpy(o.params.data() + off, params[i], size); /* copied now, as the driver does */
        off += size;
    }
    enqueue(s, std::move(o));
    return CUDA_SUCCESS;
}

/* ---- stream capture and graphs ---------------------------------------------------------- */

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode) {
    NEED_CTX;
    LOCK;
    Stream *s;
    if (CUresult r = own_stream(h, &s)) return r;
    if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    s->capturing = true;
    s->cap_invalid = false;
    s->cap_mode = mode;
    s->cap_thread = std::this_thread::get_id();
    s->cap_graph = new Graph;
    g_graphs.insert(s->cap_graph);
    return CUDA_SUCCESS;
}

#undef cuStreamBeginCapture
EMU_API CUresult CUDAAPI cuStreamBeginCapture(CUstream h) { return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL); }
EMU_API CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
    return begin_capture(h, mode);
}

EMU_API CUresult CUDAAPI cuStreamEndCapture(CUstream h, CUgraph *g) {
    NEED_INIT;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Stream *s;
    if (CUresult r = resolve_stream(h, &s)) return r;
    if (!s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->cap_thread != std::this_thread::get_id())
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    s->capturing = false;
    if (s->cap_invalid) {
        *g = nullptr;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = reinterpret_cast<CUgraph>(s->cap_graph);
    s->cap_graph = nullptr;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    NEED_INIT;
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = t_cap_mode;
    t_cap_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph hg, unsigned long long flags) {
    NEED_CTX;
    if (!e || flags) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    Graph *g = reinterpret_cast<Graph *>(hg);
    if (!g_graphs.count(g) || !g->alive) return CUDA_ERROR_INVALID_VALUE;
    GraphExec *x = new GraphExec;
    x->nodes = g->nodes;
    g_execs.insert(x);
    *e = reinterpret_cast<CUgraphExec>(x);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec he, CUstream hs) {
    NEED_CTX;
    LOCK;
    GraphExec *x = reinterpret_cast<GraphExec *>(he);
    if (!g_execs.count(x) || !x->alive) return CUDA_ERROR_INVALID_HANDLE;
    Stream *s;
    if (CUresult r = own_stream(hs, &s)) return r;
    if (s->capturing) return CUDA_ERROR_NOT_SUPPORTED;
    for (const Op &n : x->nodes) {
        if (n.kind == Op::Kernel && !n.fn->mod->alive) return CUDA_ERROR_INVALID_HANDLE;
    }
    for (const Op &n : x->nodes) enqueue(s, n);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuGraphDestroy(CUgraph hg) {
    NEED_INIT;
    LOCK;
    Graph *g = reinterpret_cast<Graph *>(hg);
    if (!g_graphs.count(g) || !g->alive) return CUDA_ERROR_INVALID_VALUE;
    g->alive = false;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec he) {
    NEED_INIT;
    LOCK;
    GraphExec *x = reinterpret_cast<GraphExec *>(he);
    if (!g_execs.count(x) || !x->alive) return CUDA_ERROR_INVALID_HANDLE;
    x->alive = false; /* a launch already queued still runs */
    return CUDA_SUCCESS;
}

/* ---- error texts ------------------------------------------------------------------------ */

namespace {
struct ErrText {
    CUresult r;
    const char *name, *text;
};
const ErrText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
};
} // namespace

EMU_API CUresult CUDAAPI cuGetErrorName(CUresult r, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (const ErrText &e : kErrors)
        if (e.r == r) {
            *s = e.name;
            return CUDA_SUCCESS;
        }
    *s = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

EMU_API CUresult CUDAAPI cuGetErrorString(CUresult r, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (const ErrText &e : kErrors)
        if (e.r == r) {
            *s = e.text;
            return CUDA_SUCCESS;
        }
    *s = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}
