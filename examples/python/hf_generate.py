"""Greedy generation with Hugging Face transformers' Qwen4Exp, the n-gram table served by libple.

    python examples/python/hf_generate.py CHECKPOINT_DIR [--table-dir DIR] [--prompt TEXT] [--max-new-tokens N]
    python examples/python/hf_generate.py --tiny DIR --check    # scripts/test.sh

The two lines that matter:

    import ple.transformers
    model = ple.transformers.from_pretrained(checkpoint_dir, table_dir)   # packs the table once

`--tiny DIR` first writes a tiny random bf16 Qwen4ExpForCausalLM checkpoint to DIR (no tokenizer:
the prompt is token ids). `--check` also loads the checkpoint with transformers alone (the n-gram
weight in RAM) and exits 1 unless both generate the same tokens.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import transformers

import ple.transformers

EOS = 248044


def write_tiny_checkpoint(path: str) -> None:
    cfg = transformers.Qwen4ExpTextConfig(
        vocab_size=248320, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, hc_count=2, hc_lowrank=8, ple_layer_ids=[2], ple_embed_dim=2560,
        ngram_vocab_size_base=2000, split_ngram_parts=4, eos_token_id=EOS, pad_token_id=EOS,
        layer_types=["indexed_attention", "linear_attention"], indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen4ExpForCausalLM(cfg)
    with torch.no_grad():
        model.model.layers[1].ple.conv1d.weight.normal_()  # zero at init: let the n-gram context show
    model.to(torch.bfloat16).save_pretrained(path)


def prompt_ids(checkpoint_dir: str, text: str) -> dict:
    try:
        tok = transformers.AutoTokenizer.from_pretrained(checkpoint_dir)
    except (OSError, ValueError):  # no tokenizer (the tiny checkpoint): two prompts of token ids
        ids = torch.tensor([[EOS, EOS, 9707, 11, 1879, EOS, 13], [101, 102, 103, 104, 105, 106, 107]])
        mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])  # the first is left-padded, EOS inside
        return {"input_ids": ids, "attention_mask": mask}
    tok.padding_side = "left"
    return dict(tok([text], return_tensors="pt", padding=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint_dir", nargs="?")
    p.add_argument("--tiny", metavar="DIR", help="write a tiny random checkpoint to DIR and use it")
    p.add_argument("--table-dir", help="packed table (default CHECKPOINT_DIR/ple-table; packed if absent)")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--check", action="store_true", help="compare with transformers' own in-RAM model")
    a = p.parse_args()
    ckpt = a.checkpoint_dir
    if a.tiny:
        write_tiny_checkpoint(a.tiny)
        ckpt = a.tiny
    if not ckpt:
        p.error("give CHECKPOINT_DIR or --tiny DIR")

    model = ple.transformers.from_pretrained(ckpt, a.table_dir)
    inputs = prompt_ids(ckpt, a.prompt)
    kw = dict(max_new_tokens=a.max_new_tokens, min_new_tokens=a.max_new_tokens, do_sample=False)
    out = model.generate(**inputs, **kw)
    (emb,) = [m for m in model.modules() if isinstance(m, ple.transformers.OffloadedNGramEmbedding)]
    new = out[:, inputs["input_ids"].shape[1] :]
    print(f"generated {new.shape[1]} tokens per prompt, the n-gram rows read from {emb.table.path}")
    for row in new.tolist():
        print(" ", row)
    if a.check:
        ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt).generate(**inputs, **kw)
        if not torch.equal(ref, out):
            print("MISMATCH: transformers alone generated", ref[:, inputs["input_ids"].shape[1] :].tolist())
            return 1
        print("same tokens as transformers with the n-gram weight in RAM")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
