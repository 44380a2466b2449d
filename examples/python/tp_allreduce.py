#!/usr/bin/env python3
"""Tensor-parallel PLE through the engine's own all-reduce, checked bit for bit.

    python examples/python/tp_allreduce.py TABLE_DIR [N]      (ple synth-table TABLE_DIR makes one)

Spawns N ranks (default 2) with torch.multiprocessing; each initialises torch.distributed (NCCL
where a GPU is present, gloo on the CPU) and opens head shard `rank` of N of the table: it hashes,
reads and caches only its heads' rows (round-robin: heads rank, rank + N, ..., so every rank holds
bigram and trigram heads alike and reads alike). Every rank runs the same engine steps (prefill chunks,
then decode, in tracked mode), dequantises its shard into a [tokens, 2560] buffer (its heads'
columns; -0.0 elsewhere, the additive identity) and all-reduces it (sum). Rank 0 also runs a
single unsharded handle over the same steps and checks that every all-reduced output equals it
bit for bit, in float32, bfloat16 and float16, and prints each rank's rows, storage reads and
cache hits (gathered over the process group). A mismatch raises, and the example exits non-zero.
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ple

EOS = 248044
VOCAB = 248320
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def schedule(steps: int, seed: int = 7):
    """The engine's steps, the same on every rank: three requests' prompts in chunks of 24, then
    decode steps (one token per request; the 'sampled' tokens are drawn from `seed`)."""
    rng = np.random.default_rng(seed)
    prompts = {rid: [EOS] + rng.integers(0, VOCAB, n - 1).tolist() for rid, n in [(1, 61), (2, 9), (3, 30)]}
    done = {rid: 0 for rid in prompts}
    for _ in range(steps):
        ids, toks, pos, qs = [], [], [], [0]
        for rid, p in prompts.items():
            take = p[done[rid] : done[rid] + 24] if done[rid] < len(p) else [int(rng.integers(0, VOCAB))]
            if done[rid] >= len(p):
                p.append(take[0])
            ids.append(rid)
            toks += take
            pos += range(done[rid], done[rid] + len(take))
            qs.append(len(toks))
            done[rid] += len(take)
        yield {
            "tokens": np.asarray(toks, np.int32),
            "positions": np.asarray(pos, np.int32),
            "request_ids": np.asarray(ids, np.uint64),
            "query_start": np.asarray(qs, np.uint32),
        }


def dequant(table: ple.Table, step: ple.Step, dtype, device) -> torch.Tensor:
    out = torch.empty((step.num_tokens, table.info.embed_dim), dtype=dtype, device=device)
    if device.type == "cuda":
        step.dequant_fuse(out, torch.cuda.current_stream(), dtype=dtype)
    else:
        step.dequant_cpu(out=out)
    return out


def rank_main(rank: int, world: int, table_dir: str, port: int, steps: int) -> None:
    gpu = torch.cuda.is_available()
    dist.init_process_group(
        "nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if gpu else torch.device("cpu")
    opts = dict(max_tokens_per_step=256, num_threads=1, cuda_device=device.index if gpu else -1)
    # ---- the lines a TP engine needs: one shard per rank, then its usual all-reduce ----
    table = ple.Table(table_dir, shard_count=world, shard_index=rank, **opts)
    whole = ple.Table(table_dir, **opts) if rank == 0 else None
    for i, batch in enumerate(schedule(steps)):
        dtype = DTYPES[i % len(DTYPES)]
        step = table.submit(**batch)  # right after sampling: libple gathers this rank's rows
        part = dequant(table, step, dtype, device)  # in the embedding layer
        dist.all_reduce(part)  # sum over ranks: the whole [tokens, 2560] PLE embedding
        # ---- the check: the all-reduced output is the unsharded handle's, bit for bit ----
        if whole is not None:
            ref = dequant(whole, whole.submit(**batch), dtype, device)
            if not torch.equal(part.view(BITS[dtype]), ref.view(BITS[dtype])):
                bad = (part.view(BITS[dtype]) != ref.view(BITS[dtype])).sum().item()
                raise AssertionError(f"step {i} ({dtype}): {bad} elements differ from the unsharded output")
    st = table.stats()
    mine = torch.tensor(
        [st["prefill_rows"] + st["decode_rows"], st["storage_reads"], st["cache_hits"]], dtype=torch.int64, device=device
    )
    counts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(counts, mine)
    if whole is not None:
        ws = whole.stats()
        whole_rows = ws["prefill_rows"] + ws["decode_rows"]
        per_rank = [[int(x) for x in c.tolist()] for c in counts]
        rows = [r[0] for r in per_rank]
        assert sum(rows) == whole_rows, f"the ranks' rows {rows} add up to the whole's {whole_rows}"
        print(
            f"tp_allreduce: {world} ranks ({'nccl' if gpu else 'gloo'}), {steps} steps in float32, bfloat16 and "
            f"float16: every all-reduced output equals the unsharded handle's bit for bit; rows per rank "
            f"{rows} (whole table: {whole_rows})"
        )
        for r, (n, reads, hits) in enumerate(per_rank):
            print(f"  rank {r}/{world}: {n} rows, {reads} storage reads, {hits} cache hits")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    world = int(argv[2]) if len(argv) == 3 else 2
    steps = int(os.environ.get("PLE_TP_STEPS", "12"))
    mp.spawn(rank_main, args=(world, argv[1], free_port(), steps), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
