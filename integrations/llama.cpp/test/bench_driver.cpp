// Bench driver: decodes real text (token ids from a file) through llama.h and times each llama_decode.
//
//   ple-bench-driver MODEL.gguf TOKENS.i32 TEST [--ple-table DIR] [--lazy] [--threads N] [--warm N] [--again] [--node-time]
//
// TOKENS.i32: little-endian int32 token ids (bench.sh writes the test kit's corpus stream there).
// Every run first decodes the text's first token alone (not timed): the model's weights are then in.
// TEST: prompt:P  one sequence's P-token prompt in one llama_decode (n_ubatch 512: P/512 ubatches);
//       decode:S[:N]  S sequences, a 16-token prompt each (one batch, not timed), then N (default 32) timed decode steps
//                 of S tokens (each sequence's next token of the text: teacher-forced, not sampled).
// --warm N: first N tokens of the file prefilled (2,048-token prompts, each then dropped from the KV
// cache), not timed: the steady state's warm-up. The test's tokens follow the warm-up's in the file.
// --again: the test runs twice on the same tokens (the KV cache cleared between); the second pass's
// rows are then in memory (the page cache, or libple's row cache): the resident baseline, paired
// with the first pass in the same process ("ms_first", "read_bytes_first").
// --node-time: the wall time of the graph node that gathers the PLE rows, through the scheduler's eval
// callback: every node from the token embedding ("model.input_embed") to "ple_embd" is computed
// on its own and timed, the token embedding's own time left out. For stock llama.cpp that is its
// get_rows of per_layer_token_embd (the page faults of the lazy table; the madvise(WILLNEED) calls
// of set_input are not in it); with --ple-table it would be layer 0 as well, so it is for stock only.
// Reported as "node_ms" (and "node_ms_first") per pass's timed part.
// Prints one JSON line: the timed llama_decode calls, ubatches, tokens, wall ms of the (last) pass,
// and the bytes the process read from storage meanwhile (/proc/self/io read_bytes: page faults,
// O_DIRECT and io_uring reads of all its threads). Writes "ple-bench-driver: first" and
// "ple-bench-driver: measure" to stderr right before each pass's timed part (first: --again's first
// pass), and "ple-bench-driver: stop" right after it (libple's per-ubatch counter lines,
// LLAMA_PLE_STATS=1, are logged to stderr too: bench.py splits them there).
// Exit 1 when a llama_decode fails, 2 on bad arguments or a model that does not load.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using clk = std::chrono::steady_clock;

// --node-time: the scheduler asks, in graph order, whether each node is to be observed; every node
// from the token embedding to "ple_embd" is, so each is computed alone between its two callbacks
struct node_timer {
    bool             active = false; // between "model.input_embed" and "ple_embd" of the current graph
    clk::time_point  asked;
    double           ms = 0;         // the PLE gather's wall time, accumulated
};

static bool on_eval(ggml_tensor * t, bool ask, void * user_data) {
    auto * nt = static_cast<node_timer *>(user_data);
    const bool embed = strcmp(t->name, "model.input_embed") == 0;
    if (ask) {
        nt->active = nt->active || embed; // a new graph starts with the token embedding
        nt->asked  = clk::now();
        return nt->active;
    }
    if (!embed) {
        nt->ms += std::chrono::duration<double, std::milli>(clk::now() - nt->asked).count();
    }
    if (strcmp(t->name, "ple_embd") == 0) {
        nt->active = false;
    }
    return true;
}

static long long read_bytes() { // the process's storage reads so far (task I/O accounting)
    long long v = -1;
    if (FILE * f = fopen("/proc/self/io", "r")) {
        char line[128];
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "read_bytes: %lld", &v) == 1) { break; }
        }
        fclose(f);
    }
    return v;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKENS.i32 prompt:P|decode:S[:N] [--ple-table DIR] [--lazy] [--threads N] [--warm N]\n", argv[0]);
        return 2;
    }
    const char * table = nullptr;
    bool lazy = false, again = false, node_time = false;
    int threads = 2;
    long warm = 0;
    for (int i = 4; i < argc; ++i) {
        if (!strcmp(argv[i], "--ple-table") && i + 1 < argc)    { table = argv[++i]; }
        else if (!strcmp(argv[i], "--lazy"))                   { lazy = true; }
        else if (!strcmp(argv[i], "--node-time"))              { node_time = true; }
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) { threads = atoi(argv[++i]); }
        else if (!strcmp(argv[i], "--warm") && i + 1 < argc)    { warm = atol(argv[++i]); }
        else if (!strcmp(argv[i], "--again"))                  { again = true; }
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    const std::string test = argv[3];
    const bool prompt = test.rfind("prompt:", 0) == 0;
    if (!prompt && test.rfind("decode:", 0) != 0) { fprintf(stderr, "TEST must be prompt:P or decode:S\n"); return 2; }
    const int arg = atoi(test.c_str() + 7);
    if (arg <= 0 || arg > 16384) { fprintf(stderr, "TEST %s: P or S out of range\n", test.c_str()); return 2; }
    const char * colon = strchr(test.c_str() + 7, ':');
    const int steps = colon && !prompt ? atoi(colon + 1) : 32; // decode steps
    if (steps <= 0 || steps > 4096) { fprintf(stderr, "TEST %s: N out of range\n", test.c_str()); return 2; }

    std::vector<llama_token> text;
    if (FILE * f = fopen(argv[2], "rb")) {
        int32_t t;
        while (fread(&t, sizeof t, 1, f) == 1) { text.push_back(t); }
        fclose(f);
    }
    const int n_seq = prompt ? 1 : arg;
    const long need = warm + (prompt ? arg : n_seq * (16 + steps + 1));
    if ((long) text.size() < need) { fprintf(stderr, "%s: %zu tokens, %ld needed\n", argv[2], text.size(), need); return 2; }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers  = 0;
    mp.ple_table_dir = table;
    if (lazy) { mp.lazy_mode = LLAMA_LAZY_MODE_ON; } // stock: the table read on demand (llama-bench -lzm on)
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "ple-bench-driver: the model did not load\n"); return 2; }

    const int n_batch = prompt ? std::max(arg, 2048) : 2048;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_batch + (32 + steps) * n_seq;
    cp.n_batch         = n_batch;
    cp.n_ubatch        = 512;
    cp.n_seq_max       = n_seq;
    cp.kv_unified      = true; // one KV buffer: the warm-up's 2,048-token prompts fit whatever n_seq is
    cp.n_threads       = threads;
    cp.n_threads_batch = threads;
    node_timer nt;
    if (node_time) {
        cp.cb_eval           = on_eval;
        cp.cb_eval_user_data = &nt;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "ple-bench-driver: no context\n"); return 2; }
    llama_memory_t mem = llama_get_memory(ctx);

    llama_batch batch = llama_batch_init(n_batch, 0, 1);
    std::vector<llama_pos> pos(n_seq, 0);
    auto add = [&](llama_token t, int s, bool logits) {
        const int i = batch.n_tokens++;
        batch.token[i] = t; batch.pos[i] = pos[s]++; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = s; batch.logits[i] = logits;
    };
    auto decode = [&]() {
        const int rc = llama_decode(ctx, batch);
        if (rc != 0) { fprintf(stderr, "ple-bench-driver: llama_decode returned %d\n", rc); exit(1); }
    };

    // one token decoded first, as llama-bench's warm-up does: the model's mmapped weights (the output
    // matrix above all) are faulted in here, not in the timed part; its 16 PLE rows stay cached
    batch.n_tokens = 0;
    add(text[0], 0, true);
    decode();
    llama_memory_clear(mem, true);

    long at = 0; // next token of the text
    for (; at < warm;) { // warm-up: 2,048-token prompts of one sequence, each dropped afterwards
        batch.n_tokens = 0;
        pos[0] = 0;
        for (int k = 0; k < 2048 && at < warm; ++k) { add(text[at++], 0, false); }
        batch.logits[batch.n_tokens - 1] = true;
        decode();
        llama_memory_clear(mem, true);
    }

    double ms = 0, ms_first = -1, node_ms_first = -1;
    int calls = 0, ubatches = 0;
    long tokens = 0, rb = 0, rb_first = -1;
    const long first = at; // the test's first token
    for (int pass = again ? 0 : 1; pass < 2; ++pass) {
        const bool timed = pass == 1;
        llama_memory_clear(mem, true);
        std::fill(pos.begin(), pos.end(), 0);
        at = first;
        ms = 0;
        if (prompt) {
            batch.n_tokens = 0;
            for (int k = 0; k < arg; ++k) { add(text[at++], 0, k == arg - 1); }
            fprintf(stderr, "ple-bench-driver: %s\n", timed ? "measure" : "first");
            nt.ms = 0;
            const long long r0 = read_bytes();
            const auto t0 = clk::now();
            decode();
            ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
            rb = read_bytes() - r0;
            fprintf(stderr, "ple-bench-driver: stop\n");
            calls = 1, ubatches = (arg + 511) / 512, tokens = arg;
        } else {
            std::vector<long> next(n_seq);
            const long span = 16 + steps;
            batch.n_tokens = 0;
            for (int s = 0; s < n_seq; ++s) { // each sequence's own stretch of the text
                next[s] = at + s * span;
                for (int k = 0; k < 16; ++k) { add(text[next[s]++], s, k == 15); }
            }
            decode();
            fprintf(stderr, "ple-bench-driver: %s\n", timed ? "measure" : "first");
            nt.ms = 0;
            const long long r0 = read_bytes();
            for (int step = 0; step < steps; ++step) {
                batch.n_tokens = 0;
                for (int s = 0; s < n_seq; ++s) { add(text[next[s]++], s, true); }
                const auto t0 = clk::now();
                decode();
                ms += std::chrono::duration<double, std::milli>(clk::now() - t0).count();
            }
            rb = read_bytes() - r0;
            fprintf(stderr, "ple-bench-driver: stop\n");
            calls = steps, ubatches = steps, tokens = (long) steps * n_seq;
        }
        if (!timed) { ms_first = ms, rb_first = rb, node_ms_first = nt.ms; }
    }
    printf("{\"test\": \"%s\", \"warm\": %ld, \"again\": %d, \"calls\": %d, \"ubatches\": %d, \"tokens\": %ld, \"ms\": %.3f, \"read_bytes\": %ld, "
           "\"ms_first\": %.3f, \"read_bytes_first\": %ld, \"node_ms\": %.3f, \"node_ms_first\": %.3f}\n",
           test.c_str(), warm, (int) again, calls, ubatches, tokens, ms, rb, ms_first, rb_first,
           node_time ? nt.ms : -1.0, node_time ? node_ms_first : -1.0);
    fflush(stdout);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
