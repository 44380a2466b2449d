// The arrays llama_batch_init() allocates, for examples that do not link libllama.
#pragma once
#include <llama.h>

#include <vector>

// What llama_batch_init(n_tokens, 0, n_seq_max) allocates (that function lives in libllama, which
// this example does not link): the same arrays, filled the way the fork's scheduler fills them.
struct Batch {
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;
    llama_batch b{};
    int cap, n_seq_max;
    Batch(int cap_, int n_seq_max_) : cap(cap_), n_seq_max(n_seq_max_) {
        b.token = new llama_token[cap];
        b.pos = new llama_pos[cap];
        b.n_seq_id = new int32_t[cap];
        b.seq_id = new llama_seq_id *[cap];
        for (int i = 0; i < cap; i++) b.seq_id[i] = new llama_seq_id[n_seq_max];
        b.logits = new int8_t[cap];
    }
    ~Batch() {
        for (int i = 0; i < cap; i++) delete[] b.seq_id[i];
        delete[] b.token;
        delete[] b.pos;
        delete[] b.n_seq_id;
        delete[] b.seq_id;
        delete[] b.logits;
    }
    // common_batch_add(batch, token, pos, seq_ids, logits)
    void add(llama_token t, llama_pos p, std::vector<llama_seq_id> seqs, bool logits) {
        int i = b.n_tokens++;
        b.token[i] = t;
        b.pos[i] = p;
        b.n_seq_id[i] = (int32_t)seqs.size();
        for (size_t j = 0; j < seqs.size(); j++) b.seq_id[i][j] = seqs[j];
        b.logits[i] = logits;
    }
};
