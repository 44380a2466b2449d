// A llama.cpp fork's step with libple: the fork's own `llama_batch` (the real type, from the real
// llama.h) handed to libple in per-token form, without sorting or copying it by request.
//
//   llama_batch_example <table_dir>
//
// Mapping (see docs/INTEGRATION.md, "llama.cpp forks"):
//   token[i], pos[i]             -> ple_token_batch.tokens / .positions (read in place)
//   seq_id[i][0]                 -> token_request_ids[i]
//   n_seq_id[i] > 1              -> the token's rows are the same in each of its sequences (they
//                                   share the prefix up to it: that is what lets llama.cpp share
//                                   its KV cells), so it is submitted once, under seq_id[i][0]
//   context (stateless mode)     -> per sequence, in order of first appearance in the batch, the
//                                   2 tokens before its lowest position, from the fork's own
//                                   per-sequence token history (which also covers sequences that
//                                   start from a shared prefix or from llama_memory_seq_cp)
//
// Every step is also submitted in the offsets form (grouped by sequence and sorted, on a second
// handle): the ids, packed rows and dequantised rows must be those rows in the batch's order.
// Exits non-zero on any mismatch or error.
#include "batch_alloc.h"
#include <llama.h>
#include <ple-cpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

static void expect(bool ok, const char *what, int step) {
    if (!ok) {
        std::fprintf(stderr, "step %d: %s\n", step, what);
        std::exit(1);
    }
}

static const llama_token EOS = 248044;
static const int K = 2;  // ngram_size - 1

// The fork's per-sequence token history, by position.
using History = std::map<llama_seq_id, std::vector<llama_token>>;

// The per-token form of `lb`, stateless: ids and context arrays the caller keeps alive.
struct PerToken {
    std::vector<uint64_t> req;
    std::vector<int32_t> ctx;
    ple_token_batch tb{};
};

static llama_token at(const History &h, llama_seq_id s, llama_pos p) {
    if (p < 0) return EOS;
    auto it = h.find(s);
    if (it == h.end() || (size_t)p >= it->second.size()) {
        std::fprintf(stderr, "sequence %d: position %d is not in the history\n", s, p);
        std::exit(1);
    }
    return it->second[p];
}

static void to_ple(const llama_batch &lb, const History &h, PerToken &out) {
    int n = lb.n_tokens;
    out.req.resize(n);
    std::vector<llama_seq_id> first;  // sequences in order of first appearance
    std::map<llama_seq_id, llama_pos> lowest;
    for (int i = 0; i < n; i++) {
        llama_seq_id s = lb.seq_id[i][0];
        out.req[i] = (uint64_t)s;
        if (!lowest.count(s)) {
            first.push_back(s);
            lowest[s] = lb.pos[i];
        }
        lowest[s] = std::min(lowest[s], lb.pos[i]);
    }
    out.ctx.clear();
    for (llama_seq_id s : first)
        for (int j = K; j >= 1; j--) out.ctx.push_back(at(h, s, lowest[s] - j));
    out.tb.struct_size = sizeof(ple_token_batch);
    out.tb.tokens = lb.token;  // llama_token is int32_t, llama_pos is int32_t: read in place
    out.tb.positions = lb.pos;
    out.tb.token_request_ids = out.req.data();
    out.tb.num_tokens = (uint32_t)n;
    out.tb.context = out.ctx.data();
}

// After the step: every sequence a token belongs to gets it in its history.
static void record(const llama_batch &lb, History &h) {
    for (int i = 0; i < lb.n_tokens; i++)
        for (int j = 0; j < lb.n_seq_id[i]; j++) {
            auto &v = h[lb.seq_id[i][j]];
            if (v.size() <= (size_t)lb.pos[i]) v.resize(lb.pos[i] + 1, EOS);
            v[lb.pos[i]] = lb.token[i];
        }
}

// The offsets form of the same tokens: what a fork would build without ple_submit_tokens.
struct Offsets {
    std::vector<int32_t> tokens, positions, ctx;
    std::vector<uint64_t> ids;
    std::vector<uint32_t> qs;
    std::vector<int> perm;  // perm[g] = batch index of grouped token g
    ple_batch b{};
};

static void to_offsets(const llama_batch &lb, const History &h, Offsets &o) {
    int n = lb.n_tokens;
    std::vector<llama_seq_id> order;
    for (int i = 0; i < n; i++)
        if (std::find(order.begin(), order.end(), lb.seq_id[i][0]) == order.end())
            order.push_back(lb.seq_id[i][0]);
    o.perm.resize(n);
    for (int i = 0; i < n; i++) o.perm[i] = i;
    auto rank = [&](int i) { return std::find(order.begin(), order.end(), lb.seq_id[i][0]) - order.begin(); };
    std::stable_sort(o.perm.begin(), o.perm.end(), [&](int a, int b) {
        return rank(a) != rank(b) ? rank(a) < rank(b) : lb.pos[a] < lb.pos[b];
    });
    o.tokens.clear(), o.positions.clear(), o.ids.clear(), o.qs.assign(1, 0), o.ctx.clear();
    for (int g = 0; g < n; g++) {
        int i = o.perm[g];
        if (g > 0 && lb.seq_id[o.perm[g - 1]][0] != lb.seq_id[i][0]) o.qs.push_back(g);
        if (g == 0 || lb.seq_id[o.perm[g - 1]][0] != lb.seq_id[i][0]) {
            o.ids.push_back((uint64_t)lb.seq_id[i][0]);
            for (int j = K; j >= 1; j--) o.ctx.push_back(at(h, lb.seq_id[i][0], lb.pos[i] - j));
        }
        o.tokens.push_back(lb.token[i]);
        o.positions.push_back(lb.pos[i]);
    }
    o.qs.push_back(n);
    o.b = ple_batch{o.tokens.data(), o.positions.data(), (uint32_t)n, o.ids.data(), o.qs.data(),
                    (uint32_t)o.ids.size(), o.ctx.data()};
}

static ple_handle_ptr open_handle(const char *dir) {
    ple_options o = ple::default_options();
    o.max_tokens_per_step = 64;
    o.num_threads = 2;
    return ple::open(dir, &o);
}

static void check_step(ple_handle *ht, ple_handle *ho, const llama_batch &lb, History &hist, int step) {
    PerToken pt;
    Offsets of;
    to_ple(lb, hist, pt);
    to_offsets(lb, hist, of);
    const ple_info info = ple::table_info(ht);
    size_t n = (size_t)lb.n_tokens, H = info.num_heads, DIM = info.embed_dim;
    std::vector<int64_t> it(n * H), io(n * H);
    ple::check(ple_ngram_ids_tokens(ht, &pt.tb, it.data()));
    ple::check(ple_ngram_ids(ho, &of.b, io.data()));
    for (size_t g = 0; g < n; g++)
        expect(!std::memcmp(&it[of.perm[g] * H], &io[g * H], H * 8), "ids differ from the offsets form", step);

    uint64_t seq = (uint64_t)step;
    ple::check(ple_submit_tokens(ht, &pt.tb, seq));
    ple::check(ple_submit(ho, &of.b, seq));
    const uint8_t *rt, *ro;
    uint32_t nt, no;
    ple::check(ple_packed_rows(ht, seq, &rt, &nt));
    ple::check(ple_packed_rows(ho, seq, &ro, &no));
    expect(nt == n && no == n, "row counts", step);
    size_t tb = H * info.row_bytes;
    for (size_t g = 0; g < n; g++)
        expect(!std::memcmp(rt + of.perm[g] * tb, ro + g * tb, tb), "packed rows out of order", step);

    // the PLE addend of each batch token, in the batch's order (what the fork adds to the token
    // embedding of row i of its graph input)
    std::vector<float> et(n * DIM), eo(n * DIM);
    ple::check(ple_dequant_cpu(ht, seq, et.data(), PLE_DTYPE_F32, DIM, 0));
    ple::check(ple_dequant_cpu(ho, seq, eo.data(), PLE_DTYPE_F32, DIM, 0));
    for (size_t g = 0; g < n; g++)
        expect(!std::memcmp(&et[of.perm[g] * DIM], &eo[g * DIM], DIM * 4), "embeddings out of order", step);

    int shared = 0;
    for (size_t i = 0; i < n; i++) shared += lb.n_seq_id[i] > 1;
    std::printf("step %d: %zu tokens of %zu sequences (%d shared by several), rows in batch order\n", step, n,
                of.ids.size(), shared);
    record(lb, hist);
}

static void run(const char *table_dir) {
    ple_handle_ptr t_handle = open_handle(table_dir), o_handle = open_handle(table_dir);
    ple_handle *ht = t_handle.get(), *ho = o_handle.get();
    History hist;
    Batch batch(64, 4);
    llama_batch &lb = batch.b;

    // 1: a system prompt shared by sequences 0..2 (llama.cpp's `parallel` example): n_seq_id = 3
    lb.n_tokens = 0;
    for (int p = 0; p < 6; p++) batch.add(p == 0 ? EOS : 100 + p, p, {0, 1, 2}, false);
    check_step(ht, ho, lb, hist, 1);
    // n_seq_id > 1: the ids of a shared token are the same whichever of its sequences names it
    {
        int32_t t[6], pos[6];
        uint64_t req1[6];
        for (int i = 0; i < 6; i++) t[i] = lb.token[i], pos[i] = lb.pos[i], req1[i] = 1;
        int32_t ctx[4] = {EOS, EOS, EOS, EOS};
        ple_token_batch as1{sizeof(ple_token_batch), t, pos, req1, 6, ctx};
        std::vector<int64_t> a(6 * 16), b(6 * 16);
        ple::check(ple_ngram_ids_tokens(ht, &as1, a.data()));
        for (int i = 0; i < 6; i++) req1[i] = 0;
        ple::check(ple_ngram_ids_tokens(ht, &as1, b.data()));
        expect(a == b, "a shared token's ids depend on the sequence named", 1);
    }

    // 2: each sequence's own prompt, added round-robin (tokens interleaved across sequences)
    lb.n_tokens = 0;
    int len[3] = {4, 3, 2};
    for (int j = 0; j < 4; j++)
        for (int s : {1, 0, 2})
            if (j < len[s]) batch.add(200 + 10 * s + j, 6 + j, {s}, j == len[s] - 1);
    check_step(ht, ho, lb, hist, 2);

    // 3: one decode token for each of 2, 0, 1, and a new sequence 3 whose prompt comes in reverse
    lb.n_tokens = 0;
    batch.add(320, 8, {2}, true);
    batch.add(302, 10, {0}, true);
    for (int p = 2; p >= 0; p--) batch.add(p == 0 ? EOS : 400 + p, p, {3}, p == 2);
    batch.add(311, 9, {1}, true);
    check_step(ht, ho, lb, hist, 3);

    // 4: speculative verification for sequence 0 (an EOS among the drafts), decode for 3 and 1
    lb.n_tokens = 0;
    batch.add(303, 11, {0}, true);
    batch.add(403, 3, {3}, true);
    batch.add(EOS, 12, {0}, true);
    batch.add(312, 10, {1}, true);
    batch.add(304, 13, {0}, true);
    check_step(ht, ho, lb, hist, 4);

    // a batch the per-token rules refuse: sequence 2 twice at one position
    lb.n_tokens = 0;
    batch.add(321, 9, {2}, true);
    batch.add(322, 9, {2}, true);
    PerToken bad;
    to_ple(lb, hist, bad);
    expect(ple_submit_tokens(ht, &bad.tb, 5) == PLE_E_INVALID_ARGUMENT, "duplicate position accepted", 5);
    std::printf("refused as expected: %s\n", ple_last_error_message());

    std::printf("llama_batch example: per-token rows identical to the offsets form\n");
}  // the handles close here

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s TABLE_DIR\n", argv[0]);
        return 2;
    }
    try {
        run(argv[1]);
    } catch (const ple::error &e) {
        std::fprintf(stderr, "libple: %s\n", e.what());
        return 1;
    }
    return 0;
}
