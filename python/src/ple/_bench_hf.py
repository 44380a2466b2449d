"""``python -m ple bench-hf WORK_DIR``: a tiny Qwen4ExpForCausalLM (2 layers, hidden 64, the real
vocabulary and ple_embed_dim) whose n-gram table is >= 1 GiB, generating with the table served by
libple (`ple.transformers`), with the weight in RAM (transformers alone) and with accelerate's disk
offload of that weight. Every run is its own process (peak RSS = its VmHWM):

- load: peak RSS while loading; the baseline is the same model with a 33,024-row table.
- generate: prompt P tokens x batch B (random ids, some EOS), N new tokens, greedy; cold (the
  table's and checkpoint's pages dropped from the page cache with POSIX_FADV_DONTNEED just before)
  then warm (the same again). Prefill = the first forward; decode = the others, per step; the
  n-gram module's own time per call is timed by hooks (the module holding the nn.Embedding, or
  the offloaded module plus its submission ahead from the first decoder layer's pre-hook).

Needs torch and transformers. The checkpoints (bf16, written by save_pretrained) and the BF16
table packed from one of them are kept in WORK_DIR and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List

EOS = 248044


def _config(base: int) -> Any:
    import transformers

    return transformers.Qwen4ExpTextConfig(
        vocab_size=248320, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, hc_count=2, hc_lowrank=8, ple_layer_ids=[2], ple_embed_dim=2560,
        ngram_vocab_size_base=base, split_ngram_parts=128, eos_token_id=EOS, pad_token_id=EOS,
        layer_types=["indexed_attention", "linear_attention"], indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
    )  # fmt: skip


def _paths(work: str, base: int) -> Dict[str, str]:
    return {
        "big": os.path.join(work, f"ckpt-base{base}"),
        "small": os.path.join(work, "ckpt-base2000"),
        "table": os.path.join(work, f"table-base{base}"),
    }


def _rss() -> Dict[str, int]:
    """VmHWM (peak RSS), VmRSS, RssAnon and RssFile of this process, bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _evict(paths: List[str]) -> None:
    """Drops the files' clean pages from the page cache (POSIX_FADV_DONTNEED; no root needed)."""
    for root in paths:
        for d, _, files in os.walk(root):
            for n in files:
                fd = os.open(os.path.join(d, n), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _write_checkpoint(path: str, base: int) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen4ExpForCausalLM._from_config(_config(base), dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].ple.conv1d.weight.normal_()
    model.save_pretrained(path)


def _load(mode: str, p: Dict[str, str], work: str) -> Any:
    import torch
    import transformers

    if mode == "small":
        return transformers.AutoModelForCausalLM.from_pretrained(p["small"])
    if mode == "ram":
        return transformers.AutoModelForCausalLM.from_pretrained(p["big"])
    if mode == "offload":
        import ple.transformers

        return ple.transformers.from_pretrained(p["big"], p["table"], progress=False)
    if mode == "offload-pack":  # into a fresh table directory: the load includes packing
        import ple.transformers

        return ple.transformers.from_pretrained(p["big"], os.path.join(work, "table-fresh"), progress=False)
    if mode in ("disk", "disk-layer"):  # accelerate's disk offload: of the weight, or of its decoder layer
        with torch.device("meta"):
            meta = transformers.Qwen4ExpForCausalLM(transformers.AutoConfig.from_pretrained(p["big"]))
        ngram = "model.layers.1.ple.ple_embedding.ngram_embedding"
        if mode == "disk":  # every module holding tensors on the CPU, the n-gram weight on disk
            dmap = {
                n: "disk" if n == ngram else "cpu"
                for n, m in meta.named_modules()
                if n and any(True for _ in [*m.parameters(recurse=False), *m.buffers(recurse=False)])
            }
        else:
            dmap = {"lm_head": "cpu", **{f"model.{n}": "cpu" for n, _ in meta.model.named_children() if n != "layers"}}
            dmap.update({f"model.layers.{i}": "disk" if ngram.startswith(f"model.layers.{i}.") else "cpu"
                         for i in range(len(meta.model.layers))})  # fmt: skip
        return transformers.AutoModelForCausalLM.from_pretrained(
            p["big"], device_map=dmap, offload_folder=os.path.join(work, f"{mode}-offload")
        )
    raise ValueError(mode)


def _timed_generate(model: Any, ids: Any, new_tokens: int) -> Dict[str, Any]:
    """One greedy generate, with each model forward and each n-gram lookup timed by hooks."""
    import torch

    import ple.transformers as pt

    calls: List[List[float]] = []
    lookups: List[float] = []
    ngram = [m for m in model.modules() if isinstance(m, (pt.NGramEmbedding, pt.OffloadedNGramEmbedding))][0]
    h = [
        model.register_forward_pre_hook(lambda *_: calls.append([time.perf_counter()])),
        model.register_forward_hook(lambda *_: calls[-1].append(time.perf_counter())),
        ngram.register_forward_pre_hook(lambda *_: lookups.append(-time.perf_counter())),
        ngram.register_forward_hook(lambda *_: lookups.__setitem__(-1, lookups[-1] + time.perf_counter())),
    ]
    ahead: List[float] = []  # offload: the lookups submitted from the first decoder layer's pre-hook
    if isinstance(ngram, pt.OffloadedNGramEmbedding):
        submit = ngram.prefetch

        def timed(*args: Any) -> None:
            t = time.perf_counter()
            submit(*args)
            ahead.append(time.perf_counter() - t)

        ngram.prefetch = timed  # type: ignore[method-assign,assignment]
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)  # fmt: skip
    wall = time.perf_counter() - t0
    for x in h:
        x.remove()
    if ahead:
        del ngram.prefetch
    lookups = [x + y for x, y in zip(lookups, ahead)] if ahead else lookups
    fwd = [b - a for a, b in calls]
    batch = ids.shape[0]
    decode = sum(fwd[1:])
    return {
        "wall_s": wall,
        "tokens_per_s": batch * new_tokens / wall,
        "prefill_s": fwd[0],
        "decode_steps": len(fwd) - 1,
        "decode_step_ms": 1e3 * decode / max(1, len(fwd) - 1),
        "decode_tokens_per_s": batch * (len(fwd) - 1) / decode if decode else 0.0,
        "ngram_prefill_ms": 1e3 * lookups[0],
        "ngram_decode_step_ms": 1e3 * sum(lookups[1:]) / max(1, len(lookups) - 1),
        "tokens": out[:, ids.shape[1] :].tolist(),
    }


def _child(a: argparse.Namespace) -> int:
    """One measured run: `--child load:MODE` or `--child gen:MODE`; prints one JSON line."""
    kind, mode = a.child.split(":")
    p = _paths(a.work_dir, a.base)
    if kind == "write":
        _write_checkpoint(p[mode], a.base if mode == "big" else 2000)
        return 0
    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    res: Dict[str, Any] = {"mode": mode, "kind": kind}
    base = _rss()["VmHWM"]  # python + torch + transformers, before the model
    _evict([p["big"], p["small"], p["table"]])
    t0 = time.perf_counter()
    try:
        model = _load(mode, p, a.work_dir)
    except Exception as e:  # noqa: BLE001 - reported, e.g. a disk offload transformers refuses
        res["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(res))
        return 0
    res.update(load_s=time.perf_counter() - t0, rss_before_load=base, load=_rss())
    if kind == "gen":
        rng = np.random.default_rng(1)
        ids = rng.integers(0, 248000, size=(a.batch, a.prompt))
        ids[rng.random(ids.shape) < 0.02] = EOS
        ids = torch.from_numpy(ids)
        _evict([p["big"], p["table"]])
        res["cold"] = _timed_generate(model, ids, a.new_tokens)
        res["warm"] = _timed_generate(model, ids, a.new_tokens)
        res["end"] = _rss()
        emb = [m for m in model.modules() if hasattr(m, "table")]
        if emb:
            s = emb[0].table.stats()
            res["libple"] = {k: s[k] for k in ("prefill_steps", "decode_steps", "decode_step_ns", "prefill_step_ns",
                                                "wait_ns", "storage_read_bytes", "major_faults")}  # fmt: skip
    print(json.dumps(res))
    return 0


def _run(a: argparse.Namespace, spec: str) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "ple", "bench-hf", a.work_dir, "--child", spec, "--base", str(a.base),
           "--prompt", str(a.prompt), "--new-tokens", str(a.new_tokens), "--batch", str(a.batch),
           "--threads", str(a.threads)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{spec} failed:\n{r.stderr[-4000:]}")
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m ple bench-hf", description=__doc__.splitlines()[0])
    ap.add_argument("work_dir")
    ap.add_argument("--base", type=int, default=220_000, help="ngram_vocab_size_base (rows ~ 16 x base)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a core left for libple's worker)")
    ap.add_argument("--modes", default="ram,offload,disk,disk-layer")
    ap.add_argument("--rounds", type=int, default=2, help="generate runs per mode, the modes in turn")
    ap.add_argument("--no-load", action="store_true", help="skip the load measurements")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a)
    os.makedirs(a.work_dir, exist_ok=True)
    p = _paths(a.work_dir, a.base)
    for which in ("big", "small"):
        if not os.path.exists(os.path.join(p[which], "config.json")):
            print(f"writing {p[which]} ...", flush=True)
            _run(a, f"write:{which}")
    import ple

    ple.pack(p["big"], p["table"])
    table_bytes = os.path.getsize(os.path.join(p["table"], "table.rows"))
    print(f"table: {p['table']} ({_gib(table_bytes)}, {table_bytes} B), bf16 model; prompt {a.prompt} x batch "
          f"{a.batch}, {a.new_tokens} new tokens, {a.threads} torch threads")  # fmt: skip
    results: Dict[str, Any] = {"table_bytes": table_bytes, "args": vars(a)}

    if not a.no_load:
        print("\nload (peak RSS of the process, above the 33,024-row model's):")
        loads = {m: _run(a, f"load:{m}") for m in ("small", "ram", "offload", "offload-pack")}
        results["load"] = loads
        small = loads["small"]["load"]["VmHWM"]
        for m, r in loads.items():
            d = r["load"]["VmHWM"] - small
            print(f"  {m:13s} peak {_gib(r['load']['VmHWM'])}  +{_gib(d)} = {d / table_bytes:6.1%} of the table  "
                  f"({r['load_s']:.1f} s)")  # fmt: skip
        shutil.rmtree(os.path.join(a.work_dir, "table-fresh"), ignore_errors=True)

    print("\ngenerate (tok/s = batch x new tokens / wall; decode: the model's forwards after the first; "
          f"{a.rounds} rounds, the modes in turn):")  # fmt: skip
    modes = a.modes.split(",")
    gens: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
    for rnd in range(a.rounds):
        for m in modes:
            if gens[m] and "error" in gens[m][0]:
                continue
            gens[m].append(r := _run(a, f"gen:{m}"))
            if "error" in r:
                print(f"  {m:10s} refused: {r['error']}")
                continue
            for phase in ("cold", "warm"):
                g = r[phase]
                print(f"  {rnd} {m:10s} {phase}: {g['tokens_per_s']:6.1f} tok/s, prefill {g['prefill_s']:.2f} s, "
                      f"decode {g['decode_step_ms']:6.2f} ms/step ({g['decode_tokens_per_s']:5.1f} tok/s), n-gram "
                      f"{g['ngram_prefill_ms']:7.2f} ms prefill, {g['ngram_decode_step_ms']:.3f} ms/step")  # fmt: skip
            print(f"  {rnd} {m:10s} peak RSS {_gib(r['end']['VmHWM'])} (anon {_gib(r['end']['RssAnon'])}, file "
                  f"{_gib(r['end']['RssFile'])} at the end)")  # fmt: skip
    results["generate"] = gens
    ok = {m: [r for r in rs if "error" not in r] for m, rs in gens.items()}
    if ok.get("ram") and ok.get("offload"):
        ram, off = ok["ram"], ok["offload"]
        saved = max(r["end"]["VmHWM"] for r in ram) - max(r["end"]["VmHWM"] for r in off)
        ratios = [o["warm"]["decode_tokens_per_s"] / r["warm"]["decode_tokens_per_s"] for r, o in zip(ram, off)]
        best = max(o["warm"]["decode_tokens_per_s"] for o in off) / max(r["warm"]["decode_tokens_per_s"] for r in ram)
        step = min(o["warm"]["decode_step_ms"] for o in off) - min(r["warm"]["decode_step_ms"] for r in ram)
        ngram = [(r["warm"]["ngram_decode_step_ms"], o["warm"]["ngram_decode_step_ms"]) for r, o in zip(ram, off)]
        same = all(o["warm"]["tokens"] == ram[0]["warm"]["tokens"] for o in off)
        print(f"\noffload vs in-RAM: peak RSS {_gib(saved)} lower = {saved / table_bytes:.1%} of the table (target >= "
              f"90%); warm decode {', '.join(f'{x:.3f}x' for x in ratios)} per round, best vs best {best:.3f}x "
              f"(target >= 0.9x); decode step best vs best {step:+.2f} ms; the n-gram module per decode step "
              f"(in-RAM, offload) {', '.join(f'{x:.2f}/{y:.2f} ms' for x, y in ngram)}; same tokens: {same}")  # fmt: skip
        results["summary"] = {"rss_saved_fraction": saved / table_bytes, "warm_decode_ratios": ratios,
                              "best_ratio": best, "same_tokens": same}  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
