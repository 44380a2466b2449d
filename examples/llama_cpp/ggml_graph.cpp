// The PLE embedding in a ggml graph, as a llama.cpp fork's input layer would use it: a ggml tensor
// filled by ple_dequant_cpu for a real llama_batch (per-token form) and added to the token
// embeddings (ggml_get_rows) in a graph computed by ggml's CPU backend.
//
//   ggml_graph_example <table_dir>
//
// Checked element by element against the token embedding plus the step's rows dequantised into a
// plain buffer from the offsets form of the same tokens (an f32 add, so exactly equal).
// Exits non-zero on any mismatch or error.
#include "batch_alloc.h"
#include <ggml-cpu.h>
#include <ggml.h>
#include <llama.h>
#include <ple-cpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

static const llama_token EOS = 248044;
static int DIM = 0;  // the table's embed_dim (ple_info), set once the table is open
static const int N_VOCAB = 64;  // the stand-in token embedding's rows (token id % 64)

struct ggml_context_deleter {
    void operator()(ggml_context *c) const noexcept { ggml_free(c); }
};

static int run(const char *table_dir) {
    ple_options o = ple::default_options();
    o.max_tokens_per_step = 64;
    ple_handle_ptr handle = ple::open(table_dir, &o);  // closed when run returns or throws
    ple_handle *h = handle.get();
    DIM = (int)ple::table_info(h).embed_dim;

    // a prompt step for two sequences, added interleaved (as a scheduler filling slots would)
    Batch batch(16, 1);
    llama_batch &lb = batch.b;
    for (int p = 0; p < 5; p++) {
        batch.add(p == 0 ? EOS : 1000 + p, p, {0}, p == 4);
        if (p < 3) batch.add(p == 0 ? EOS : 2000 + p, p, {1}, p == 2);
    }
    const int n = lb.n_tokens;
    std::vector<uint64_t> req(n);
    for (int i = 0; i < n; i++) req[i] = (uint64_t)lb.seq_id[i][0];
    ple_token_batch tb{sizeof(ple_token_batch), lb.token, lb.pos, req.data(), (uint32_t)n, nullptr};

    ggml_init_params ip{(size_t)64 << 20, nullptr, false};
    std::unique_ptr<ggml_context, ggml_context_deleter> ctx_owner(ggml_init(ip));  // freed on return or throw
    ggml_context *ctx = ctx_owner.get();
    ggml_tensor *tok_embd = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, DIM, N_VOCAB);
    ggml_tensor *inp_tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_tensor *ple = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, DIM, n);
    ggml_set_name(ple, "ple_embd");
    float *te = (float *)tok_embd->data;
    for (int r = 0; r < N_VOCAB; r++)
        for (int j = 0; j < DIM; j++) te[(size_t)r * DIM + j] = (float)((r * 31 + j * 7) % 97 - 48) / 64.0f;
    for (int i = 0; i < n; i++) ((int32_t *)inp_tokens->data)[i] = lb.token[i] % N_VOCAB;

    // the PLE rows of the batch, in the batch's token order, straight into the ggml tensor
    ple::check(ple_submit_tokens(h, &tb, 1));
    ple::check(ple_dequant_cpu(h, 1, ple->data, PLE_DTYPE_F32, ple->nb[1] / sizeof(float), 0));

    ggml_tensor *inpL = ggml_add(ctx, ggml_get_rows(ctx, tok_embd, inp_tokens), ple);
    ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, inpL);
    if (ggml_graph_compute_with_ctx(ctx, gf, 2) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "ggml_graph_compute_with_ctx failed\n");
        return 1;
    }

    // reference: the offsets form (sequence 0's 5 tokens, then sequence 1's 3) on the same handle,
    // resubmitting the same positions (tracked history is replaced by the same tokens)
    std::vector<int> perm(n);
    for (int i = 0; i < n; i++) perm[i] = i;
    std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return req[a] < req[b]; });
    std::vector<int32_t> tok(n), pos(n);
    for (int g = 0; g < n; g++) tok[g] = lb.token[perm[g]], pos[g] = lb.pos[perm[g]];
    uint64_t ids[2] = {0, 1};
    uint32_t qs[3] = {0, 5, (uint32_t)n};
    ple_batch ob{tok.data(), pos.data(), (uint32_t)n, ids, qs, 2, nullptr};
    std::vector<float> rows((size_t)n * DIM);
    ple::check(ple_submit(h, &ob, 2));
    ple::check(ple_dequant_cpu(h, 2, rows.data(), PLE_DTYPE_F32, DIM, 0));
    size_t bad = 0;
    const float *out = (const float *)inpL->data;
    for (int g = 0; g < n; g++) {
        int i = perm[g];
        const float *e = te + (size_t)(lb.token[i] % N_VOCAB) * DIM;
        for (int j = 0; j < DIM; j++) bad += out[(size_t)i * DIM + j] != e[j] + rows[(size_t)g * DIM + j];
    }
    double norm = 0;
    for (int j = 0; j < n * DIM; j++) norm += (double)((float *)ple->data)[j] * ((float *)ple->data)[j];
    if (bad || norm == 0) {
        std::fprintf(stderr, "ggml graph: %zu of %d elements differ (|ple|^2 = %g)\n", bad, n * DIM, norm);
        return 1;
    }
    std::printf("ggml graph: %d tokens, inpL = get_rows(tok_embd) + ple (|ple|^2 = %.3f) matches\n", n, norm);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s TABLE_DIR\n", argv[0]);
        return 2;
    }
    try {
        return run(argv[1]);
    } catch (const ple::error &e) {
        std::fprintf(stderr, "libple: %s\n", e.what());
        return 1;
    }
}
