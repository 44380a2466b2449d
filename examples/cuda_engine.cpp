// A CUDA engine's step loop with libple.
//
//   cuda_engine <table_dir>
//
// The engine owns its CUDA context (the runtime's primary context) and its stream; libple retains
// the same primary context and only enqueues work on the engine's stream. Each step: submit the
// batch, then ple_dequant_fuse adds the step's PLE embeddings (bf16) into the engine's device
// buffer on the engine's stream, ordered after the rows are on the device without blocking the
// host where the GPU supports it. One prefill chunk, then decode steps for two requests.
//
// Errors: a call's status reports what it was asked; a step that fails after ple_dequant_fuse
// returned (device-wait modes enqueue before the step is complete) is reported by
// ple_check_device (its kernel filled the step's tokens with NaN) and by ple_wait(seq), which
// returns PLE_OK for a consumed step that completed.
#include <cuda_runtime.h>
#include <ple.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define TRY(call)                                                                                   \
    do {                                                                                            \
        ple_status s_ = (call);                                                                     \
        if (s_ != PLE_OK) {                                                                         \
            std::fprintf(stderr, "%s failed: %s: %s\n", #call, ple_status_name(s_), ple_last_error_message()); \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)
#define CUDA_TRY(call)                                                                              \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                 \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

static const int DIM = PLE_EMBED_DIM;

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s TABLE_DIR\n", argv[0]);
        return 2;
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("no CUDA device: nothing to do\n");
        return 0;
    }
    CUDA_TRY(cudaSetDevice(0));
    cudaStream_t stream;
    CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    ple_options opts;
    TRY(ple_options_default(&opts));
    opts.cuda_device = 0;
    opts.wait_mode = PLE_WAIT_AUTO;  // stream memory op where supported, else spin kernel
    opts.max_tokens_per_step = 2048;
    ple_handle *h = nullptr;
    TRY(ple_open(argv[1], &opts, &h));
    ple_info info{};
    info.struct_size = sizeof info;
    TRY(ple_table_info(h, &info));
    const int32_t EOS = info.eos_token_id;

    void *hidden = nullptr;  // the engine's [tokens][2560] bf16 activations
    CUDA_TRY(cudaMalloc(&hidden, sizeof(uint16_t) * 2048 * DIM));
    CUDA_TRY(cudaMemsetAsync(hidden, 0, sizeof(uint16_t) * 2048 * DIM, stream));

    // Prefill: one 2048-token chunk for request 1.
    std::vector<int32_t> toks(2048), pos(2048);
    for (int i = 0; i < 2048; i++) {
        toks[i] = i == 0 ? EOS : (int32_t)((i * 2654435761u) % 200000u);
        pos[i] = i;
    }
    uint64_t r1 = 1;
    uint32_t qs1[2] = {0, 2048};
    ple_batch prefill = {toks.data(), pos.data(), 2048, &r1, qs1, 1, nullptr};
    uint64_t seq = 1;
    TRY(ple_submit(h, &prefill, seq));
    TRY(ple_dequant_fuse(h, stream, seq, hidden, PLE_DTYPE_BF16, DIM, PLE_FUSE_ACCUMULATE));

    // Decode: requests 1 and 2, one token each per step.
    for (int step = 0; step < 8; step++) {
        int32_t dt[2] = {1000 + step, step == 0 ? EOS : 2000 + step};
        int32_t dp[2] = {2048 + step, step};
        uint64_t rid[2] = {1, 2};
        uint32_t qs[3] = {0, 1, 2};
        ple_batch d = {dt, dp, 2, rid, qs, 2, nullptr};
        TRY(ple_submit(h, &d, ++seq));
        TRY(ple_dequant_fuse(h, stream, seq, hidden, PLE_DTYPE_BF16, DIM, 0));
        // ... the engine's layer-1 kernels would consume `hidden` here, on the same stream ...
    }
    CUDA_TRY(cudaStreamSynchronize(stream));
    TRY(ple_check_device(h));  // a kernel that could not consume its step (NaN-filled)
    for (uint64_t s = 1; s <= seq; s++) TRY(ple_wait(h, s, 0));  // polls: each consumed step succeeded

    ple_counters st{};
    st.struct_size = sizeof st;
    TRY(ple_stats(h, &st));
    std::printf("%llu prefill + %llu decode steps; copy %.3f ms; host waited %.3f ms\n",
                (unsigned long long)st.prefill_steps, (unsigned long long)st.decode_steps, st.copy_ns / 1e6,
                st.wait_ns / 1e6);
    ple_close(h);
    CUDA_TRY(cudaFree(hidden));
    CUDA_TRY(cudaStreamDestroy(stream));
    return 0;
}
