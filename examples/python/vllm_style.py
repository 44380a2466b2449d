#!/usr/bin/env python3
"""Where a vLLM/SGLang-style model runner calls libple, runnable on the CPU with numpy.

    python examples/python/vllm_style.py TABLE_DIR      (ple synth-table TABLE_DIR makes one)

The engine loop of a continuous-batching server, reduced to what matters here:

1. the scheduler decides the next step's tokens: flattened `input_ids`, `positions`, and the
   offsets `query_start_loc` of each request (vLLM's names; SGLang: `extend_start_loc`);
2. right after sampling (as soon as the step's tokens are known) the runner calls
   `table.submit(...)`: libple hashes and gathers the PLE rows on its own thread while the
   model's forward pass starts;
3. in the embedding layer the forward pass adds the PLE rows into the token embeddings:
   `step.dequant_cpu(out=hidden, accumulate=True)` on the CPU, or on a GPU handle
   (`cuda_device=0`) `step.dequant_fuse(hidden, torch.cuda.current_stream(), accumulate=True)`,
   which orders the kernel on the model's stream with no host sync.

With torch installed the hidden states are a torch tensor (CPU here); without it, numpy.
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

import ple

EOS = 248044
VOCAB = 248320

try:
    import torch
except ImportError:  # the example runs with numpy alone
    torch = None


class TinyModel:
    """A stand-in for the model: a token embedding, then the PLE addend (layer 0's input)."""

    def __init__(self, table: ple.Table, hidden_size: Optional[int] = None):
        self.table = table
        hidden_size = hidden_size or table.info.embed_dim  # the PLE addend's width: the table's
        rng = np.random.default_rng(0)
        self.embed = rng.standard_normal((1024, hidden_size), dtype=np.float32) * 0.02

    def forward(self, input_ids: np.ndarray, step: ple.Step) -> "np.ndarray":
        hidden = self.embed[input_ids % self.embed.shape[0]]  # [num_tokens, hidden]
        if torch is not None:
            hidden = torch.from_numpy(hidden)
            # GPU runner: step.dequant_fuse(hidden, torch.cuda.current_stream(), accumulate=True)
        # the PLE embedding layer: wait for libple's rows and add them in place
        step.dequant_cpu(out=hidden, accumulate=True)
        return hidden


def schedule(requests: dict, chunk: int) -> dict:
    """One step's flattened batch: each request's next `chunk` prompt tokens, or 1 decode token."""
    ids, toks, pos, qsl = [], [], [], [0]
    for rid, r in requests.items():
        take = r["prompt"][r["done"] : r["done"] + chunk] if r["done"] < len(r["prompt"]) else [r["next"]]
        ids.append(rid)
        toks += take
        pos += range(r["done"], r["done"] + len(take))
        qsl.append(len(toks))
    return {
        "input_ids": np.asarray(toks, np.int32),
        "positions": np.asarray(pos, np.int32),
        "query_start_loc": np.asarray(qsl, np.uint32),
        "req_ids": np.asarray(ids, np.uint64),
    }


def main(table_dir: str) -> int:
    rng = np.random.default_rng(1)
    requests = {
        rid: {"prompt": [EOS] + rng.integers(0, VOCAB, n - 1).tolist(), "done": 0, "next": None}
        for rid, n in [(101, 40), (102, 7), (103, 19)]
    }
    with ple.Table(table_dir, max_tokens_per_step=256, max_in_flight=2) as table:
        model = TinyModel(table)
        batch = schedule(requests, chunk=16)
        for it in range(8):
            # (2) submit as soon as the step's tokens are known: libple works while we go on
            step = table.submit(
                batch["input_ids"],
                batch["positions"],
                request_ids=batch["req_ids"],
                query_start=batch["query_start_loc"],
            )
            # (3) the forward pass; its embedding layer consumes the step
            hidden = model.forward(batch["input_ids"], step)
            # sampling: the last token of each request's span gives its next token
            qsl = batch["query_start_loc"]
            for i, rid in enumerate(batch["req_ids"].tolist()):
                r = requests[rid]
                r["done"] += int(qsl[i + 1] - qsl[i])
                last = hidden[int(qsl[i + 1]) - 1]
                r["next"] = int(abs(float(last.sum())) * 1e6) % VOCAB
            print(f"step {it}: {len(batch['input_ids']):3d} tokens, |hidden| = {float((hidden ** 2).sum()):.2f}")
            batch = schedule(requests, chunk=16)
        for rid in requests:  # a finished request: forget its tracked history
            table.release_request(rid)
        s = table.stats()
        print(f"prefill steps {s['prefill_steps']}, decode steps {s['decode_steps']}, rows {s['prefill_rows'] + s['decode_rows']}")
        assert s["failed_steps"] == 0
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
