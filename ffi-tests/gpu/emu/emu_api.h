/* What the emulated driver's entry-point files share (cuda_emu.cpp, emu_launch.cpp). */
#ifndef PLE_EMU_API_H
#define PLE_EMU_API_H

#include "emu.h"

#define EMU_API extern "C" __attribute__((visibility("default")))

namespace emu {

extern std::set<Ctx *> g_ctxs;
extern std::set<Stream *> g_streams;
extern std::set<Event *> g_events;
extern Ctx g_primary;
extern bool g_inited;
extern Stream *g_legacy;
extern thread_local CUstreamCaptureMode t_cap_mode;

Stream *new_stream(Ctx *ctx, unsigned flags, bool legacy);
uint64_t enqueue(Stream *s, Op op);
void wait_ticket(Stream *s, uint64_t t);
uint64_t tail(Stream *s); /* tickets submitted to `s` so far */
CUresult resolve_stream(CUstream h, Stream **out);
bool any_capture_blocking();
bool unsafe_call_allowed();
bool device_accessible(uintptr_t p, size_t n);

/* allocations and VMM state (cuda_emu.cpp; all under g_mu) */
extern std::map<uintptr_t, Alloc> g_allocs;
extern std::set<Phys *> g_phys;
extern std::map<uintptr_t, Mapping> g_maps;
const Alloc *find_alloc(uintptr_t p, size_t n, bool *is_freed);
const Mapping *find_map(uintptr_t p, size_t n);
void quarantine(Alloc &a);

/* Reports a call a real driver may not survive (a double free, a destroyed handle, a release
 * without a retain) on stderr as "cuda-emu: misuse: ..." (emulated.sh fails a run that printed
 * one), and returns `r`, the error the call returns. */
CUresult misuse(CUresult r, const char *call, const char *what);

} // namespace emu

#endif
