#!/usr/bin/env python3
"""Independent oracle for libple's n-gram row ids (docs/FORMAT.md#the-n-gram-hash), written from that page alone.

    hash_oracle.py --self-test     check this oracle against the published constants of docs/FORMAT.md
    hash_oracle.py DUMP.json       recompute every id in a dump written by tests/hash_oracle.rs and
                                   exit non-zero on the first mismatch

A dump is {"cases": [{"config": {...model constants...}, "params": {...library's hash params...},
"sequences": [[token, ...], ...], "ids": [[id, ...], ...]}]}, ids flat per sequence
([position][head]). Needs numpy.
"""

import json
import sys

import numpy as np

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB

SPEC_CONFIG = {
    "vocab_size": 248_320,
    "eos_token_id": 248_044,
    "ngram_size": 3,
    "heads_per_ngram": 8,
    "ngram_vocab_size_base": 20_000_000,
    "seed": 1234,
    "ple_layer_index": 0,
}
SPEC_MULTIPLIERS = [23703573157769, 20109073645365, 8052911324071]
SPEC_SIZES = [
    20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
    20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171,
]
SPEC_VECTOR = [
    16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897,
    169641436, 182022480, 209277433, 237891023, 256841529, 277007269, 290665954, 300984276,
]


def splitmix64(v):
    v = (v + GAMMA) & MASK64
    v = ((v ^ (v >> 30)) * M1) & MASK64
    v = ((v ^ (v >> 27)) * M2) & MASK64
    return v ^ (v >> 31)


def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def derive(cfg):
    """(multipliers, head_sizes, offsets) from the model constants, as docs/FORMAT.md#the-n-gram-hash states."""
    vocab, n, hpn = cfg["vocab_size"], cfg["ngram_size"], cfg["heads_per_ngram"]
    half = max(1, ((2**63 - 1) // vocab) // 2)
    base = cfg["seed"] + 10007 * cfg["ple_layer_index"]
    mults = [2 * (splitmix64((base + GAMMA * (i + 1)) & MASK64) % half) + 1 for i in range(n)]
    heads = (n - 1) * hpn
    skip = cfg["ple_layer_index"] * heads
    primes = []
    p = cfg["ngram_vocab_size_base"] - 1
    while len(primes) < skip + heads:
        p += 1
        if is_prime(p):
            primes.append(p)
    sizes = primes[skip:]
    offsets = [sum(sizes[:h]) for h in range(heads)]
    return mults, sizes, offsets


def contexts(seq, n, eos):
    """[len][n-1] context, ctx_1 first: ctx_k = t[p-k] if p-k >= s else EOS, s = one past the
    last EOS strictly before p (or 0)."""
    t = np.asarray(seq, dtype=np.int64)
    L = len(t)
    idx = np.arange(L)
    eos_at = np.where(t == eos, idx, -1)
    last_eos_upto = np.maximum.accumulate(eos_at) if L else eos_at  # last EOS at or before q
    s = np.zeros(L, dtype=np.int64)
    s[1:] = last_eos_upto[:-1] + 1  # strictly before p
    out = np.full((L, n - 1), eos, dtype=np.int64)
    for k in range(1, n):
        src = idx - k
        ok = (src >= 0) & (src >= s)
        out[ok, k - 1] = t[src[ok]]
    return out


def row_ids(seq, cfg, mults, sizes, offsets):
    """[len][heads] ids (int64, as the reference computes them)."""
    n, hpn, eos, vocab = cfg["ngram_size"], cfg["heads_per_ngram"], cfg["eos_token_id"], cfg["vocab_size"]
    t = np.asarray(seq, dtype=np.int64)
    assert ((t >= 0) & (t < vocab)).all(), "token outside the vocabulary"
    # With ids < vocab no int64 product overflows (the reference's signed arithmetic is exact).
    assert all(m * (vocab - 1) <= 2**63 - 1 for m in mults)
    ctx = contexts(seq, n, eos)
    m = np.asarray(mults, dtype=np.int64)
    out = np.zeros((len(t), (n - 1) * hpn), dtype=np.int64)
    mix = t * m[0]
    for order in range(n - 1):
        mix = mix ^ (ctx[:, order] * m[order + 1])
        for j in range(hpn):
            h = order * hpn + j
            out[:, h] = mix % sizes[h] + offsets[h]
    return out


def self_test():
    mults, sizes, offsets = derive(SPEC_CONFIG)
    assert mults == SPEC_MULTIPLIERS, mults
    assert sizes == SPEC_SIZES, sizes
    assert sum(sizes) == 320_001_446
    got = row_ids([9707], SPEC_CONFIG, mults, sizes, offsets)[0].tolist()
    assert got == SPEC_VECTOR, got
    e = SPEC_CONFIG["eos_token_id"]
    a, b, c, d = 11, 22, 33, 44
    ctx = contexts([a, b, e, c, d, e, e, a], 3, e).tolist()
    assert ctx == [[e, e], [a, e], [b, a], [e, e], [c, e], [d, c], [e, e], [e, e]], ctx


def check_dump(path):
    with open(path) as f:
        dump = json.load(f)
    total = 0
    for ci, case in enumerate(dump["cases"]):
        cfg = case["config"]
        mults, sizes, offsets = derive(cfg)
        lib = case["params"]
        for name, mine in (("multipliers", mults), ("head_sizes", sizes), ("offsets", offsets)):
            if lib[name] != mine:
                print(f"case {ci}: library {name} {lib[name]} != oracle {mine}", file=sys.stderr)
                return 1
        heads = len(sizes)
        for si, (seq, ids) in enumerate(zip(case["sequences"], case["ids"], strict=True)):
            want = row_ids(seq, cfg, mults, sizes, offsets)
            got = np.asarray(ids, dtype=np.int64).reshape(len(seq), heads)
            bad = np.argwhere(got != want)
            if len(bad):
                p, h = bad[0]
                print(
                    f"case {ci} sequence {si} position {p} head {h}: library {got[p, h]} != oracle "
                    f"{want[p, h]} (token {seq[p]}, context {contexts(seq, cfg['ngram_size'], cfg['eos_token_id'])[p].tolist()})",
                    file=sys.stderr,
                )
                return 1
            total += len(seq)
    print(f"hash oracle: {total} tokens in {len(dump['cases'])} configurations agree")
    return 0


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "--self-test":
        self_test()
        print("hash oracle self-test: published constants, test vector and context rule agree")
        return 0
    self_test()
    return check_dump(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
