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
// returns PLE_OK for a consumed step that completed. Every failed call throws (ple::check from
// ple-cpp.h, libple's C++ layer); the handle, the stream and the buffer are owned, so each way out
// of run() closes the handle first, then frees the CUDA objects.
#include <cuda_runtime.h>
#include <ple-cpp.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// CUDA errors throw too; the engine's CUDA objects are owned like the libple handle.
static void cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
}
struct stream_deleter {
    void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
struct device_deleter {
    void operator()(void *p) const noexcept { cudaFree(p); }
};

static size_t DIM = PLE_MAX_EMBED_DIM;  // the table's embed_dim once open (buffers sized by the maximum)

static int run(const char *table_dir) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("no CUDA device: nothing to do\n");
        return 0;
    }
    cuda_check(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t raw_stream;
    cuda_check(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    std::unique_ptr<CUstream_st, stream_deleter> stream(raw_stream);
    void *raw_hidden = nullptr;  // the engine's [tokens][2560] bf16 activations
    cuda_check(cudaMalloc(&raw_hidden, sizeof(uint16_t) * 2048 * DIM), "cudaMalloc");
    std::unique_ptr<void, device_deleter> hidden_buf(raw_hidden);
    void *hidden = hidden_buf.get();
    cuda_check(cudaMemsetAsync(hidden, 0, sizeof(uint16_t) * 2048 * DIM, stream.get()), "cudaMemsetAsync");

    ple_options opts = ple::default_options();
    opts.cuda_device = 0;
    opts.wait_mode = PLE_WAIT_AUTO;  // stream memory op where supported, else spin kernel
    opts.max_tokens_per_step = 2048;
    // Declared after the stream and the buffer, so it is closed before they are freed.
    ple_handle_ptr h = ple::open(table_dir, &opts);
    const int32_t EOS = ple::table_info(h.get()).eos_token_id;
    DIM = ple::table_info(h.get()).embed_dim;  // row stride of `hidden`: the table's width

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
    ple::check(ple_submit(h.get(), &prefill, seq));
    ple::check(ple_dequant_fuse(h.get(), stream.get(), seq, hidden, PLE_DTYPE_BF16, DIM, PLE_FUSE_ACCUMULATE));

    // Decode: requests 1 and 2, one token each per step.
    for (int step = 0; step < 8; step++) {
        int32_t dt[2] = {1000 + step, step == 0 ? EOS : 2000 + step};
        int32_t dp[2] = {2048 + step, step};
        uint64_t rid[2] = {1, 2};
        uint32_t qs[3] = {0, 1, 2};
        ple_batch d = {dt, dp, 2, rid, qs, 2, nullptr};
        ple::check(ple_submit(h.get(), &d, ++seq));
        ple::check(ple_dequant_fuse(h.get(), stream.get(), seq, hidden, PLE_DTYPE_BF16, DIM, 0));
        // ... the engine's layer-1 kernels would consume `hidden` here, on the same stream ...
    }
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    ple::check(ple_check_device(h.get()));  // a kernel that could not consume its step (NaN-filled)
    for (uint64_t s = 1; s <= seq; s++) ple::check(ple_wait(h.get(), s, 0));  // polls: each consumed step succeeded

    ple_counters st = ple::stats(h.get());
    std::printf("%llu prefill + %llu decode steps; copy %.3f ms; host waited %.3f ms\n",
                (unsigned long long)st.prefill_steps, (unsigned long long)st.decode_steps, st.copy_ns / 1e6,
                st.wait_ns / 1e6);
    return 0;  // closes the handle, then frees the buffer and the stream
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s TABLE_DIR\n", argv[0]);
        return 2;
    }
    try {
        return run(argv[1]);
    } catch (const ple::error &e) {  // e.status(): the PLE_E_* code; e.what(): "NAME: message"
        std::fprintf(stderr, "libple: %s\n", e.what());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
    }
    return 1;
}
