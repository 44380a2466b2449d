/* A CPU engine's step loop with libple.
 *
 *   cpu_engine <table_dir>
 *
 * One prefill chunk for request 1, then decode steps for three requests, one of them verifying
 * speculative drafts and rolling back the rejected ones. Steps are pipelined: step N+1 is submitted
 * before step N is consumed (the ring holds max_in_flight = 2 steps). The PLE embeddings are added
 * into the engine's hidden-state buffer with PLE_FUSE_ACCUMULATE. Exits non-zero on any error.
 */
#include <ple.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                   \
    do {                                                                                            \
        ple_status s_ = (call);                                                                     \
        if (s_ != PLE_OK) {                                                                         \
            fprintf(stderr, "%s failed: %s: %s\n", #call, ple_status_name(s_), ple_last_error_message()); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* The engine's per-step hidden state the PLE embedding is added to, `dim` = ple_info.embed_dim
 * (the table's num_heads * head_dim) floats per token. */
static float *hidden;
static size_t dim;

static void consume(ple_handle *h, uint64_t seq, uint32_t num_tokens) {
    /* ple_dequant_cpu waits for the step, adds its rows into `hidden`, and frees its ring slot. */
    memset(hidden, 0, sizeof(float) * num_tokens * dim);
    TRY(ple_dequant_cpu(h, seq, hidden, PLE_DTYPE_F32, dim, PLE_FUSE_ACCUMULATE));
    double sum = 0;
    for (size_t i = 0; i < (size_t)num_tokens * dim; i++) sum += hidden[i] * hidden[i];
    printf("step %3llu: %4u tokens, |ple| = %.3f\n", (unsigned long long)seq, num_tokens, sum);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s TABLE_DIR\n", argv[0]);
        return 2;
    }
    if (ple_abi_version() != PLE_ABI_VERSION) {
        fprintf(stderr, "libple ABI %u, header %u\n", ple_abi_version(), (unsigned)PLE_ABI_VERSION);
        return 1;
    }
    ple_options opts;
    TRY(ple_options_default(&opts));
    opts.max_tokens_per_step = 1024;
    opts.max_in_flight = 2;
    ple_handle *h = NULL;
    TRY(ple_open(argv[1], &opts, &h));
    ple_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    TRY(ple_table_info(h, &info));
    const int32_t eos = info.eos_token_id; /* also the BOS of this model family */
    dim = info.embed_dim;
    hidden = malloc(sizeof(float) * 1024 * dim);

    /* Prefill: request 1, a 512-token chunk starting with BOS (= EOS), tracked mode (context NULL:
     * libple remembers each request's recent tokens by position). */
    enum { P = 512 };
    int32_t toks[P], pos[P];
    for (int i = 0; i < P; i++) {
        toks[i] = i == 0 ? eos : (int32_t)((i * 2654435761u) % 200000u);
        pos[i] = i;
    }
    uint64_t r1 = 1;
    uint32_t qs1[2] = {0, P};
    ple_batch prefill = {toks, pos, P, &r1, qs1, 1, NULL};
    uint64_t seq = 1;
    TRY(ple_submit(h, &prefill, seq));
    uint64_t pending = seq;
    uint32_t pending_tokens = P;

    /* Decode: requests 1, 2, 3. Request 3 verifies 4 draft tokens per step; the engine accepts 2,
     * so the next step resubmits from the first rejected position (rollback). */
    int32_t next_pos[4] = {0, P, 0, 0};
    for (int step = 0; step < 6; step++) {
        int32_t dt[6], dp[6];
        uint64_t rid[3] = {1, 2, 3};
        uint32_t qs[4];
        uint32_t n = 0;
        for (int r = 0; r < 3; r++) {
            qs[r] = n;
            int len = r == 2 ? 4 : 1;
            for (int k = 0; k < len; k++) {
                dt[n] = (step == 0 && next_pos[r + 1] == 0 && k == 0) ? eos : 1000 + 37 * step + 11 * r + k;
                dp[n] = next_pos[r + 1] + k;
                n++;
            }
        }
        qs[3] = n;
        ple_batch d = {dt, dp, n, rid, qs, 3, NULL};
        TRY(ple_submit(h, &d, ++seq)); /* submitted while the previous step is still pending */
        consume(h, pending, pending_tokens);
        pending = seq;
        pending_tokens = n;
        next_pos[1] += 1;
        next_pos[2] += 1;
        next_pos[3] += 2; /* 2 of 4 drafts accepted: positions +2, +3 are resubmitted next step */
    }
    consume(h, pending, pending_tokens);

    ple_counters st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    TRY(ple_stats_residency(h, &st)); /* with the table's page-cache residency (a mincore pass) */
    printf("prefill: %llu steps %llu tokens; decode: %llu steps %llu tokens; unique pages %llu; "
           "gather %.3f ms; resident %llu of %llu pages\n",
           (unsigned long long)st.prefill_steps, (unsigned long long)st.prefill_tokens,
           (unsigned long long)st.decode_steps, (unsigned long long)st.decode_tokens,
           (unsigned long long)st.unique_pages, st.gather_ns / 1e6, (unsigned long long)st.resident_pages,
           (unsigned long long)st.table_pages);
    for (uint64_t r = 1; r <= 3; r++) TRY(ple_release_request(h, r));
    ple_close(h);
    free(hidden);
    return 0;
}
