/*
 * The emulated CUDA driver's state (a test double: target/cuda-emu/libcuda.so.1, never linked
 * into libple). One device, "device memory" is host memory, every stream an in-order queue run by
 * an OS thread of its own. Handles are pointers to the objects below, checked against the live
 * sets before use (an unknown or destroyed handle is CUDA_ERROR_INVALID_HANDLE, not a crash).
 * Objects are never freed (a destroyed one is marked dead), so work still queued behind a destroy
 * stays valid, as the CUDA documents destroy semantics.
 */
#ifndef PLE_EMU_H
#define PLE_EMU_H

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_runtime.h"

namespace emu {

struct Ctx {
    bool primary = false;
    int refs = 0;      /* primary: retains; other: 1 until destroyed */
    bool alive = false;
};

/* An allocation the emulated device knows. */
enum class MemKind { Device, Host, VmmReserve };
struct Alloc {
    uintptr_t base = 0;
    size_t size = 0;
    MemKind kind = MemKind::Device;
    unsigned host_flags = 0; /* cuMemHostAlloc flags */
    Ctx *ctx = nullptr;
    bool freed = false;
};

/* A physical VMM allocation (cuMemCreate): a memfd mapped with cuMemMap. */
struct Phys {
    int fd = -1;
    size_t size = 0;
    int refs = 0; /* the creator's + retains + mappings */
};
struct Mapping { /* one cuMemMap range */
    uintptr_t base = 0;
    size_t size = 0;
    Phys *phys = nullptr;
    bool access = false; /* cuMemSetAccess READWRITE */
};

struct Stream;
struct Event;
struct Function;
struct Graph;

/* One unit of work on a stream (or a node of a captured graph). */
struct Op {
    enum Kind { Kernel, Copy, Memset, Record, WaitValue64, WaitTicket, HostFn } kind = Kernel;
    /* Kernel */
    Function *fn = nullptr;
    emu_dim3 grid{1, 1, 1}, block{1, 1, 1};
    std::vector<unsigned char> params;
    /* Copy / Memset */
    uintptr_t dst = 0, src = 0;
    size_t bytes = 0;
    unsigned char byte = 0;
    std::shared_ptr<std::vector<unsigned char>> staged; /* pageable source copied at enqueue */
    /* Record */
    Event *ev = nullptr;
    uint64_t ev_gen = 0;
    /* WaitValue64 */
    uintptr_t addr = 0;
    uint64_t value = 0;
    unsigned flags = 0;
    /* WaitTicket: until `on` completed `ticket` */
    Stream *on = nullptr;
    uint64_t ticket = 0;
    /* HostFn */
    CUhostFn host_fn = nullptr;
    void *user = nullptr;
    /* set at enqueue: the stream it belongs to and its ticket there */
    Stream *owner = nullptr;
    uint64_t my_ticket = 0;
};

struct Graph {
    std::vector<Op> nodes;
    bool alive = true;
};
struct GraphExec {
    std::vector<Op> nodes;
    bool alive = true;
};

struct Stream {
    Ctx *ctx = nullptr;
    unsigned flags = 0;
    bool legacy = false;
    bool alive = true;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Op> q;
    bool stop = false;
    uint64_t submitted = 0;              /* under mu */
    std::atomic<uint64_t> completed{0};
    std::thread th;
    /* the hardware queue that runs this stream's work: the stream itself (its own thread), or,
     * under CUDA_DEVICE_MAX_CONNECTIONS=N, one of N queues shared round-robin by all streams
     * (work of streams sharing one runs in submission order: CUDA's false dependencies) */
    Stream *hw = nullptr;
    /* capture (under g_mu) */
    bool capturing = false;
    bool cap_invalid = false;
    CUstreamCaptureMode cap_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    std::thread::id cap_thread;
    Graph *cap_graph = nullptr;
};

struct Event {
    Ctx *ctx = nullptr;
    unsigned flags = 0;
    bool alive = true;
    /* the last record: stream and ticket (0: never recorded, or recorded and complete) */
    Stream *s = nullptr;
    uint64_t ticket = 0;
    uint64_t gen = 0;      /* records so far */
    double time_ms = 0;    /* when the last record executed */
    bool captured = false; /* last recorded into a capture */
};

struct Module {
    Ctx *ctx = nullptr;
    bool alive = true;
    std::vector<Function *> fns;
};

struct Function {
    Module *mod = nullptr;
    std::string name;
    const emu_host_kernel *host = nullptr;
    std::vector<std::pair<size_t, size_t>> params; /* (size, align) from the PTX */
    unsigned maxntid = 0;                           /* .maxntid of the PTX, 0: none */
};

/* the global lock: registries, capture state, allocations */
extern std::mutex g_mu;
/* completion of any op (stream->completed advanced); with g_done_mu */
extern std::mutex g_done_mu;
extern std::condition_variable g_done_cv;

/* the calling thread's current context, or null (no lock needed) */
Ctx *current_ctx();

/* executes a launch on the calling thread (emu_exec.cpp) */
void run_kernel(const Op &op);

/* emulator settings (from the environment at cuInit) */
struct Config {
    int stream_mem_ops = 1; /* PLE_EMU_STREAM_MEM_OPS=0: the GB10 case (attribute 0, waits refused) */
    int sm_count = 4;       /* PLE_EMU_SM_COUNT */
    int cc_major = 9, cc_minor = 0;
    int driver_version = 12090;
    int max_connections = 0; /* CUDA_DEVICE_MAX_CONNECTIONS; 0: unset, a queue per stream */
};
extern Config g_cfg;

double now_ms();

} // namespace emu

#endif
