"""Side by side: stock llama.cpp's lazy PLE path (the table in the GGUF as BF16 or Q4_0, mmapped,
madvise(WILLNEED) per ubatch, page-faulted by get_rows) against the fork (--ple-table: libple's
NVFP4 table, its default I/O mode and row cache), with llama-bench, alternating configurations.

  bench.py BIN_DIR DATA_DIR THREADS

cold: every file of every configuration dropped from the page cache (posix_fadvise DONTNEED) before
each run, one repetition, no warm-up; steady: llama-bench's warm-up, then 3 repetitions, same process.
PLE_BENCH_ROUNDS rounds (default 3), alternating the configurations; each cell is the median round
(tokens/s: median, then min-max). Bytes read from storage and peak RSS from the median round's
rusage (ru_inblock x 512, ru_maxrss); they include loading the model's other weights (132 MiB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

bin_dir, data, threads = sys.argv[1], sys.argv[2], sys.argv[3]
bench = os.path.join(bin_dir, "llama-bench")
table = os.path.join(data, "table")
nople = os.path.join(data, "model-nople.gguf")
configs = [  # name, llama-bench arguments, environment
    ("stock BF16, lazy", ["-m", os.path.join(data, "model-bf16.gguf"), "-lzm", "on"], {}),
    ("stock Q4_0, lazy", ["-m", os.path.join(data, "model-q4_0.gguf"), "-lzm", "on"], {}),
    ("fork NVFP4, libple AUTO (MMAP here, no cache)", ["-m", nople, "--ple-table", table], {}),
    ("fork NVFP4, libple DIRECT + 256 MiB row cache", ["-m", nople, "--ple-table", table],
     {"LLAMA_PLE_IO": "direct", "LLAMA_PLE_CACHE_MB": "256"}),
]
files = [os.path.join(data, f) for f in ("model-bf16.gguf", "model-q4_0.gguf", "model-nople.gguf")]
files.append(os.path.join(table, "table.rows"))
tests = [
    ("prompt 512 tokens", ["-p", "512", "-n", "0"]),
    ("prompt 2048 tokens", ["-p", "2048", "-n", "0"]),
    ("decode, 1 sequence (32 tokens)", ["-p", "0", "-n", "32"]),
    # llama-batched-bench: 8 sequences, 128-token prompts each, then 32 decode steps of all 8
    ("decode, 8 sequences (32 steps after 128-token prompts)", None),
]


def evict():
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def run(args, env):
    p = subprocess.Popen([bench, "-t", threads, "-o", "json", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env={**os.environ, **env})
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"llama-bench {' '.join(args)} failed ({status})")
    r = json.loads(out)[0]
    return r["avg_ts"], r["stddev_ts"], ru.ru_inblock * 512, ru.ru_maxrss * 1024


def run_batched(args, env):
    """llama-batched-bench (common arguments: -lzm, --ple-table work as in llama-cli); its own -m."""
    a = [x for x in args if x not in ("-r", "1", "3", "--no-warmup")]
    p = subprocess.Popen([os.path.join(bin_dir, "llama-batched-bench"), "-t", threads, "-c", "4096", "-b", "2048",
                          "-ub", "512", "-npp", "128", "-ntg", "32", "-npl", "8", "--output-format", "jsonl", *a],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    out = p.stdout.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"llama-batched-bench {' '.join(a)} failed ({status})")
    r = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return r["speed_tg"], 0.0, ru.ru_inblock * 512, ru.ru_maxrss * 1024


ROUNDS = int(os.environ.get("PLE_BENCH_ROUNDS", "3"))
print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
for mode in ("cold", "steady"):
    for tname, targs in tests:
        res = {c[0]: [] for c in configs}
        for _ in range(ROUNDS):  # alternating: every configuration once per round
            for cname, cargs, cenv in configs:
                go = run if targs is not None else run_batched
                if mode == "cold":
                    evict()
                    res[cname].append(go([*cargs, *(targs or []), "-r", "1", "--no-warmup"], cenv))
                else:  # llama-batched-bench: no warm-up or repetitions, only the page cache is warm
                    res[cname].append(go([*cargs, *(targs or []), "-r", "3"], cenv))
        for cname, _, _ in configs:
            r = sorted(res[cname])
            ts = [x[0] for x in r]
            med = r[len(r) // 2]
            print(f"| {mode} | {tname} | {cname} | {med[0]:.1f} ({ts[0]:.1f}-{ts[-1]:.1f}) "
                  f"| {med[2] / 2**20:.1f} | {med[3] / 2**20:.0f} |", flush=True)
print(f"load average at end: {os.getloadavg()}", file=sys.stderr)
