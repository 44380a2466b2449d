/*
 * The emulated driver's virtual memory management (cuMemCreate, cuMemAddressReserve, cuMemMap,
 * cuMemSetAccess, ...): a physical allocation is a memfd, a mapping maps it into a reservation.
 */
#include <sys/mman.h>
#include <unistd.h>

#include "emu_api.h"

using namespace emu;

#define LOCK std::lock_guard<std::mutex> lock_(g_mu)
#define NEED_INIT                                                                                  \
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX                                                                                   \
    NEED_INIT;                                                                                     \
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT

/* ---- VMM ------------------------------------------------------------------------------- */

static const size_t VMM_GRANULARITY = 2u << 20;

EMU_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                       CUmemAllocationGranularity_flags) {
    NEED_INIT;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
                                     const CUmemAllocationProp *prop, unsigned long long flags) {
    NEED_CTX;
    if (!h || !prop || flags || n == 0 || n % VMM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("cuda-emu-vmm", 0);
    if (fd < 0 || ftruncate(fd, off_t(n)) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    LOCK;
    Phys *p = new Phys;
    p->fd = fd;
    p->size = n;
    p->refs = 1;
    g_phys.insert(p);
    *h = reinterpret_cast<CUmemGenericAllocationHandle>(p);
    return CUDA_SUCCESS;
}

static void phys_unref(Phys *p) {
    if (--p->refs == 0) {
        close(p->fd);
        g_phys.erase(p);
        delete p;
    }
}

EMU_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h) {
    NEED_INIT;
    LOCK;
    Phys *p = reinterpret_cast<Phys *>(h);
    if (!g_phys.count(p)) return CUDA_ERROR_INVALID_VALUE;
    phys_unref(p);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t n, size_t align, CUdeviceptr addr,
                                             unsigned long long flags) {
    NEED_INIT;
    if (!ptr || n == 0 || n % VMM_GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    (void)addr;
    size_t al = align ? align : VMM_GRANULARITY;
    void *m = mmap(nullptr, n + al, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t b = (reinterpret_cast<uintptr_t>(m) + al - 1) / al * al;
    LOCK;
    Alloc a;
    a.base = b;
    a.size = n;
    a.kind = MemKind::VmmReserve;
    g_allocs[b] = a;
    *ptr = b;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr p, size_t n) {
    NEED_INIT;
    LOCK;
    auto it = g_allocs.find(p);
    if (it == g_allocs.end() || it->second.kind != MemKind::VmmReserve || it->second.size != n ||
        it->second.freed)
        return CUDA_ERROR_INVALID_VALUE;
    for (auto &kv : g_maps)
        if (kv.first >= p && kv.first - p < n) return CUDA_ERROR_INVALID_VALUE; /* still mapped */
    quarantine(it->second);
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
                                  unsigned long long flags) {
    NEED_INIT;
    LOCK;
    Phys *ph = reinterpret_cast<Phys *>(h);
    if (!g_phys.count(ph) || flags || off + n > ph->size || n % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    const Alloc *a = find_alloc(p, n, nullptr);
    if (!a || a->kind != MemKind::VmmReserve) return CUDA_ERROR_INVALID_VALUE;
    for (auto &kv : g_maps)
        if (kv.first < p + n && p < kv.first + kv.second.size) return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap(reinterpret_cast<void *>(p), n, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, off_t(off));
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    Mapping mp;
    mp.base = p;
    mp.size = n;
    mp.phys = ph;
    ph->refs++;
    g_maps[p] = mp;
    return CUDA_SUCCESS;
}

EMU_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr p, size_t n) {
    NEED_INIT;
    std::vector<std::pair<Stream *, uint64_t>> w;
    {
        LOCK;
        for (Stream *s : g_streams) w.push_back({s, tail(s)});
    }
    for (auto &x : w) wait_ticket(x.first, x.second); /* cuMemUnmap synchronises */
    LOCK;
    bool any = false;
    for (auto it = g_maps.begin(); it != g_maps.end();) {
        if (it->first >= p && it->first + it->second.size <= p + n) {
            mmap(reinterpret_cast<void *>(it->first), it->second.size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
            phys_unref(it->second.phys);
            it = g_maps.erase(it);
            any = true;
        } else {
            ++it;
        }
    }
    return any ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EMU_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t count) {
    NEED_INIT;
    if (!d || count == 0) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    int prot = d[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : d[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READ     ? PROT_READ
                                                                 : PROT_NONE;
    size_t covered = 0;
    for (auto &kv : g_maps)
        if (kv.first >= p && kv.first + kv.second.size <= p + n) {
            mprotect(reinterpret_cast<void *>(kv.first), kv.second.size, prot);
            kv.second.access = prot & PROT_WRITE;
            covered += kv.second.size;
        }
    return covered == n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Counted as a "potentially unsafe" call under a stream capture: a driver may count it so (it
 * takes a reference on a physical allocation), and the emulator takes the strict reading. */
EMU_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    NEED_INIT;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    LOCK;
    if (!unsafe_call_allowed()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    const Mapping *m = find_map(reinterpret_cast<uintptr_t>(addr), 1);
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    m->phys->refs++;
    *h = reinterpret_cast<CUmemGenericAllocationHandle>(m->phys);
    return CUDA_SUCCESS;
}
