// Fidelity driver: one fixed decode script through llama.h, printing a 64-bit hash of every logit
// row it gets (bit patterns, so two runs print the same lines only if their logits are bit-identical).
//
//   fidelity MODEL.gguf [--ple-table DIR] [--break-table] [--threads N]
//
// The script: 3 sequences' prompts in one batch (n_ubatch 8 < the prompts, an EOS inside one), 32
// greedy decode steps of the 3 sequences together, then a rollback of 3 tokens of sequence 0
// (llama_memory_seq_rm) and a re-decode of other tokens there, and 4 more steps; then a fork:
// sequence 2 rolls back 3 tokens and takes 2 others, sequence 1 decodes alone up to sequence 2's
// position, takes a copy of sequence 2's cells instead of its own (llama_memory_seq_cp) and
// decodes one token (its predecessors are now sequence 2's), and 2 more steps of all three.
// F32 KV cache.
// --break-table truncates DIR/table.rows after the load: llama_decode must then return an error
// (exit 0 when it does, 1 when it does not). Exit 2 when the model does not load.
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

static const llama_token EOS = 248044;

static uint64_t fnv(const float * p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const auto * b = reinterpret_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n * sizeof(float); ++i) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [--ple-table DIR] [--break-table] [--threads N]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * table      = nullptr;
    bool break_table        = false;
    int  threads            = 2;
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "--ple-table") && i + 1 < argc) { table = argv[++i]; }
        else if (!strcmp(argv[i], "--break-table"))         { break_table = true; }
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) { threads = atoi(argv[++i]); }
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers  = 0;
    mp.ple_table_dir = table;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "fidelity: the model did not load\n");
        return 2;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = 512;
    cp.n_batch         = 256;
    cp.n_ubatch        = 8;
    cp.n_seq_max       = 3;
    cp.n_rs_seq        = 4;
    cp.n_threads       = threads;
    cp.n_threads_batch = threads;
    cp.type_k          = GGML_TYPE_F32;
    cp.type_v          = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "fidelity: no context\n");
        return 2;
    }
    llama_memory_t mem = llama_get_memory(ctx);

    if (break_table) {
        if (truncate((std::string(table) + "/table.rows").c_str(), 0) != 0) {
            perror("truncate");
            return 2;
        }
    }

    const int n_seq = 3;
    std::vector<std::vector<llama_token>> prompts = {
        { 9707, 11, 13, 14, 15, 101, 102, 103, 9707, 11, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23 },
        { 101, 102, 103, EOS, 106, 107, 5, 6, 7, 8, 9, 10, 200 },
        { 5, 6, 7, 8, 9, 10, 11, 12, 13, 1000, 2000, 3000, 4000, 5000, EOS, EOS, 7000 },
    };
    std::vector<llama_pos> pos(n_seq, 0);
    std::vector<llama_token> last(n_seq);
    int step = 0;

    llama_batch batch = llama_batch_init(256, 0, 1);
    // decodes `batch`, prints the hash of every output row, and the greedy token of each sequence
    // (its last output row) into last[]
    auto run = [&](const char * what) -> bool {
        const int rc = llama_decode(ctx, batch);
        if (rc != 0) {
            printf("%s: llama_decode returned %d\n", what, rc);
            return false;
        }
        int out = 0;
        for (int i = 0; i < batch.n_tokens; ++i) {
            if (!batch.logits[i]) { continue; }
            const float * l = llama_get_logits_ith(ctx, i);
            printf("%s step %d token %d (seq %d pos %d): %016llx\n", what, step, i, batch.seq_id[i][0], batch.pos[i],
                   (unsigned long long) fnv(l, n_vocab));
            int best = 0;
            for (int v = 1; v < n_vocab; ++v) { if (l[v] > l[best]) { best = v; } }
            last[batch.seq_id[i][0]] = best;
            ++out;
        }
        ++step;
        return true;
    };
    auto add = [&](llama_token t, int s, bool logits) {
        const int i = batch.n_tokens++;
        batch.token[i]     = t;
        batch.pos[i]       = pos[s]++;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = s;
        batch.logits[i]    = logits;
    };

    // the prompts, interleaved token by token across the sequences, every token's logits
    batch.n_tokens = 0;
    for (size_t k = 0; k < 20; ++k) {
        for (int s = 0; s < n_seq; ++s) {
            if (k < prompts[s].size()) { add(prompts[s][k], s, true); }
        }
    }
    if (!run("prompt")) { return break_table ? 0 : 1; }
    if (break_table) {
        printf("fidelity: llama_decode succeeded on a truncated table\n");
        return 1;
    }

    auto decode_steps = [&](int n, const char * what) -> bool {
        for (int k = 0; k < n; ++k) {
            batch.n_tokens = 0;
            for (int s = 0; s < n_seq; ++s) { add(last[s], s, true); }
            if (!run(what)) { return false; }
        }
        return true;
    };
    if (!decode_steps(32, "decode")) { return 1; }

    // rollback: sequence 0 forgets its last 3 tokens and takes others
    pos[0] -= 3;
    if (!llama_memory_seq_rm(mem, 0, pos[0], -1)) {
        printf("fidelity: llama_memory_seq_rm refused the rollback\n");
        return 1;
    }
    batch.n_tokens = 0;
    add(EOS, 0, true);
    add(4242, 0, true);
    add(4343, 0, true);
    if (!run("redecode")) { return 1; }
    if (!decode_steps(4, "after")) { return 1; }

    // fork: sequence 2 rolls back 3 tokens and takes 2 others there; sequence 1 decodes alone up to
    // sequence 2's next position, then drops its cells for a copy of sequence 2's (so its tokens'
    // predecessors change under it) and decodes one token
    pos[2] -= 3;
    if (!llama_memory_seq_rm(mem, 2, pos[2], -1)) {
        printf("fidelity: llama_memory_seq_rm refused the rollback of sequence 2\n");
        return 1;
    }
    batch.n_tokens = 0;
    add(4444, 2, true);
    add(4545, 2, true);
    if (!run("fork-seq2")) { return 1; }
    while (pos[1] < pos[2]) {
        batch.n_tokens = 0;
        add(last[1], 1, true);
        if (!run("fork-seq1")) { return 1; }
    }
    if (pos[1] != pos[2] || !llama_memory_seq_rm(mem, 1, -1, -1)) {
        printf("fidelity: sequence 1 is not at sequence 2's position, or llama_memory_seq_rm refused to clear it\n");
        return 1;
    }
    llama_memory_seq_cp(mem, 2, 1, -1, -1);
    batch.n_tokens = 0;
    add(last[1], 1, true);
    if (!run("fork-copy")) { return 1; }
    if (!decode_steps(2, "fork-after")) { return 1; }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    printf("fidelity: done, %d steps\n", step);
    return 0;
}
