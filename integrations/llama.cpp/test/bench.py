"""Side by side: stock llama.cpp's lazy PLE path (the table in the GGUF as BF16 or Q4_0, mmapped,
madvise(WILLNEED) per ubatch, page-faulted by get_rows) against the fork (--ple-table: libple's NVFP4
table, MMAP or DIRECT + row cache, read-ahead across a batch's ubatches), through ple-bench-driver
(test/bench_driver.cpp) over the test kit's corpus, alternating configurations.

  bench.py BIN_DIR DATA_DIR THREADS TOKENS.i32

Each run is one process in its own memory cgroup (v1 memory controller or v2, as mounted), started
after every file of every configuration was dropped from the page cache (posix_fadvise DONTNEED);
with PLE_BENCH_COLD=table (the default; "all" skips it), cold and resident runs then get every model file read
back into the page cache but for the PLE table's bytes (the GGUF's per_layer_token_embd; the fork's
table.rows stays out), so that only the table is cold: weights a 1-token warm-up does not touch
(a MoE model's other experts) would otherwise fault in during the timed part of both sides. Those
pages are read by this script, so a cgroup's peak memory then leaves them out.
- cold: the test straight away (its table reads all come from storage);
- resident: the test twice on the same tokens, the second timed (its rows then in memory); the
  first pass starts as a cold run does, and is paired with the second (below);
- steady: the cgroup's memory (RSS + page cache, so stock's pages and the fork's row cache alike)
  limited to PLE_BENCH_MEM_MB (default 1024); PLE_BENCH_WARM corpus tokens (default 8192) prefilled
  first, then the test on the text that follows (timed), then the same tokens once more (paired).
Tests (PLE_BENCH_TESTS): prompt:P (one P-token prompt, n_ubatch 512), decode:S[:N] (N steps, default 32, of S
sequences).
PLE_BENCH_ROUNDS rounds (default 3): every configuration of every test and mode once per round.
PLE_BENCH_CONFIGS (default all): comma-separated name prefixes of the configurations to run, e.g.
"stock BF16,fork DIRECT". PLE_BENCH_LATE=1 adds the fork DIRECT with LLAMA_PLE_EARLY=0 (patch 0009 off:
each ubatch submits its step when llama.cpp sets its inputs, not at llama_decode entry).

Per cell, the median round and the min-max: ms per ubatch (a decode step is one ubatch) and
tokens/s; the PLE time per ubatch: for the fork, its own count (LLAMA_PLE_STATS=1: wall time in
libple's submit and wait per ubatch, patch 0008), for stock its own two parts: the madvise(WILLNEED)
calls that start its reads in set_input (LLAMA_PLE_STATS=1, patch 0011) and the wall time of its
gather node (the driver's --node-time: get_rows of the lazy table, its page faults), and for every
configuration the exposed PLE time = median
ms per ubatch minus the median of the same configuration and test in the resident mode (two
processes' medians), and paired: each run's first pass minus its repeat of the same tokens, per
ubatch (the median over rounds; for the fork, its own PLE time's difference beside): one process,
one memory state, so what differs is where the rows come from; storage
bytes read per token in the timed part (/proc/self/io read_bytes of the driver); peak memory of the
cgroup (RSS + page cache charged to it). Prints markdown tables; load averages to stderr."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

bin_dir, data, threads, tokens = sys.argv[1:5]
drv = os.path.join(bin_dir, "ple-bench-driver")
table = os.path.join(data, "table")
nople = os.path.join(data, "model-nople.gguf")
ROUNDS = int(os.environ.get("PLE_BENCH_ROUNDS", "3"))
MEM_MB = int(os.environ.get("PLE_BENCH_MEM_MB", "1024"))
CACHE_MB = int(os.environ.get("PLE_BENCH_CACHE_MB", "512"))
WARM = int(os.environ.get("PLE_BENCH_WARM", "8192"))
TESTS = os.environ.get("PLE_BENCH_TESTS", "prompt:512 prompt:2048 decode:1 decode:8").split()
MODES = os.environ.get("PLE_BENCH_MODES", "cold resident steady").split()
stats_env = {"LLAMA_PLE_STATS": "1"}
configs = [  # name, driver arguments, environment
    ("stock BF16", ["--lazy", "--node-time"], os.path.join(data, "model-bf16.gguf"), stats_env),
    ("stock Q4_0", ["--lazy", "--node-time"], os.path.join(data, "model-q4_0.gguf"), stats_env),
    ("fork MMAP", ["--ple-table", table], nople, {**stats_env, "LLAMA_PLE_IO": "mmap"}),
    (f"fork DIRECT + {CACHE_MB} MiB cache", ["--ple-table", table], nople,
     {**stats_env, "LLAMA_PLE_IO": "direct", "LLAMA_PLE_CACHE_MB": str(CACHE_MB)}),
]
if os.environ.get("PLE_BENCH_LATE") == "1":  # patch 0009 off: each ubatch submits its step in set_input
    configs.append((f"fork DIRECT + {CACHE_MB} MiB cache, late submit", ["--ple-table", table], nople,
                    {**stats_env, "LLAMA_PLE_IO": "direct", "LLAMA_PLE_CACHE_MB": str(CACHE_MB), "LLAMA_PLE_EARLY": "0"}))
CONFIGS = [p for p in os.environ.get("PLE_BENCH_CONFIGS", "").split(",") if p]
configs = [c for c in configs if os.path.exists(c[2]) and (not CONFIGS or any(c[0].startswith(p) for p in CONFIGS))]
if not configs:
    raise SystemExit(f"bench.py: no configuration matches PLE_BENCH_CONFIGS={','.join(CONFIGS)}")
files = sorted({c[2] for c in configs} | {os.path.join(table, "table.rows")})
COLD = os.environ.get("PLE_BENCH_COLD", "table")
if COLD not in ("all", "table"):
    raise SystemExit(f"bench.py: PLE_BENCH_COLD={COLD}: expected all or table")

V1 = "/sys/fs/cgroup/memory"
V2 = "/sys/fs/cgroup/unified" if os.path.exists("/sys/fs/cgroup/unified/cgroup.controllers") else "/sys/fs/cgroup"
v1 = os.path.isdir(V1)


def table_range(path):
    """(offset, bytes) of the PLE table's data in a GGUF, or None (the fork's GGUF has none)."""
    sys.path.insert(0, os.path.join(bin_dir, "..", "..", "src", "gguf-py"))  # OUT/build/bin -> OUT/src
    import gguf

    for t in gguf.GGUFReader(path).tensors:
        if t.name == "per_layer_token_embd.weight":
            return int(t.data_offset), int(t.n_bytes)
    return None


def read_into_cache(path, start, end):
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end:
            n = len(os.pread(fd, min(8 << 20, end - start), start))
            if n == 0:
                break
            start += n
    finally:
        os.close(fd)


models = sorted({c[2] for c in configs})
skip = {m: table_range(m) for m in models} if COLD == "table" else {}


def evict(mode):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    if COLD == "table" and mode != "steady":
        for m in models:
            size, r = os.path.getsize(m), skip[m]
            if r is None:
                read_into_cache(m, 0, size)
            else:
                read_into_cache(m, 0, r[0])
                read_into_cache(m, r[0] + r[1], size)


class Cgroup:
    """A memory cgroup for one run: its peak usage (RSS + page cache charged to it), an optional limit."""

    def __init__(self, limit_mb: int | None):
        self.path = os.path.join(V1 if v1 else V2, f"ple-bench-{os.getpid()}")
        os.mkdir(self.path)
        if limit_mb is not None:
            self.write("memory.limit_in_bytes" if v1 else "memory.max", str(limit_mb << 20))

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def enter(self):  # in the child, before exec
        self.write("cgroup.procs", str(os.getpid()))

    def peak_mb(self):
        name = "memory.max_usage_in_bytes" if v1 else "memory.peak"
        try:
            return int(open(os.path.join(self.path, name)).read()) / 2**20
        except OSError:
            return float("nan")

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def run(cfg, test, mode):
    name, args, model, env = cfg
    cmd = [drv, model, tokens, test, "--threads", threads, *args]
    if mode in ("resident", "steady"):
        cmd.append("--again")  # a repeat of the test's tokens, paired with its first pass
    if mode == "steady":
        cmd += ["--warm", str(WARM)]
    evict(mode)
    cg = Cgroup(MEM_MB if mode == "steady" else None)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, preexec_fn=cg.enter,
                           timeout=900)
        peak = cg.peak_mb()
    finally:
        cg.remove()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["peak_mb"] = peak
    # the fork's counters (cumulative, one line per ubatch) at each pass's start and stop marker
    last, marks = {}, []
    for line in p.stderr.splitlines():
        if line.startswith("ple-bench-driver: ") and line.split()[-1] in ("first", "measure", "stop"):
            marks.append(last)
        elif "llama_ple_stats:" in line:
            last = {k: int(v) for k, v in (kv.split("=") for kv in line.split("llama_ple_stats:")[1].split())}

    def own(a, b):  # PLE ms per ubatch, bytes read and hit rate between two snapshots
        d = {k: b[k] - a.get(k, 0) for k in b}
        hm = d["cache_hits"] + d["cache_misses"]
        return d["rows_ns"] / 1e6 / max(d["ubatches"], 1), d["read_bytes"], (d["cache_hits"] / hm if hm else None)

    ub = r["ubatches"]
    passes = [own(marks[i], marks[i + 1]) for i in range(0, len(marks) - 1, 2)] if last else []
    if r.get("node_ms", -1) >= 0:  # stock: its madvise time in set_input (stats lines) + its gather node's (--node-time)
        nodes = ([r["node_ms_first"]] if r.get("node_ms_first", -1) >= 0 else []) + [r["node_ms"]]
        passes = [(p[0] + n / ub, None, None) for p, n in zip(passes, nodes)] if len(passes) == len(nodes) else \
            [(n / ub, None, None) for n in nodes]
    if passes:
        r["ple_ms"], r["ple_read"], r["hit"] = passes[-1]
    if r.get("ms_first", -1) >= 0:
        # paired in one process: the first pass minus the repeat of the same tokens
        r["paired"] = (r["ms_first"] - r["ms"]) / ub
        if len(passes) == 2:
            r["paired_own"] = passes[0][0] - passes[1][0]
        if mode == "steady":  # the steady figures are the first pass's; the repeat is its baseline
            r["ms"], r["read_bytes"] = r["ms_first"], r["read_bytes_first"]
            if len(passes) == 2:
                r["ple_ms"], r["ple_read"], r["hit"] = passes[0]
    return r


def med(xs):
    return statistics.median(xs) if xs else float("nan")


res: dict = {}
print(f"load average at start: {os.getloadavg()}; cold: {COLD}", file=sys.stderr, flush=True)
for rnd in range(ROUNDS):
    for mode in MODES:
        for test in TESTS:
            for cfg in configs:  # alternating: every configuration once per round
                r = run(cfg, test, mode)
                res.setdefault((mode, test, cfg[0]), []).append(r)
    print(f"round {rnd + 1}: load average {os.getloadavg()}", file=sys.stderr, flush=True)
print(f"load average at end: {os.getloadavg()}", file=sys.stderr, flush=True)


def per_ubatch(r):
    return r["ms"] / r["ubatches"]


def cell(xs, fmt="{:.2f}"):
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})" if xs else "-"


summary = {}
print("| run | test | configuration | ms per ubatch | tokens/s | PLE ms per ubatch: own (fork: libple submit + wait; stock: madvise + gather node) | "
      "exposed PLE ms per ubatch (- resident) | paired: first pass - repeat (fork's own) | "
      "storage read per token (KiB) | row-cache hits | peak memory (MiB) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for mode in MODES:
    for test in TESTS:
        for cfg in configs:
            rs = res[(mode, test, cfg[0])]
            ms = [per_ubatch(r) for r in rs]
            ts = [r["tokens"] / r["ms"] * 1e3 for r in rs]
            own = [r["ple_ms"] for r in rs if "ple_ms" in r]
            base = res.get(("resident", test, cfg[0]))
            exposed = med(ms) - med([per_ubatch(r) for r in base]) if base and mode != "resident" else None
            rb = med([r["read_bytes"] / r["tokens"] / 1024 for r in rs])
            hits = [r["hit"] for r in rs if r.get("hit") is not None]
            paired = [r["paired"] for r in rs if "paired" in r]
            paired_own = [r["paired_own"] for r in rs if "paired_own" in r]
            summary[(mode, test, cfg[0])] = {"ms": med(ms), "own": med(own) if own else None, "exposed": exposed,
                                             "paired": med(paired) if paired else None,
                                             "paired_own": med(paired_own) if paired_own else None}
            pc = cell(paired) + (f" ({med(paired_own):.2f})" if paired_own else "") if paired else "-"
            print(f"| {mode} | {test} | {cfg[0]} | {cell(ms)} | {cell(ts, '{:.0f}')} | {cell(own)} | "
                  f"{'-' if exposed is None else f'{exposed:.2f}'} | {pc} | {rb:.2f} | "
                  f"{f'{100 * med(hits):.1f}%' if hits else '-'} | {med([r['peak_mb'] for r in rs]):.0f} |", flush=True)
json.dump({f"{m}|{t}|{c}": v for (m, t, c), v in summary.items()},
          open(os.environ.get("PLE_BENCH_JSON", os.devnull), "w"), indent=1)
