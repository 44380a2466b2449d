"""Writes a Qwen4Exp GGUF holding a packed table's rows, with gguf-py (PyPI `gguf`, the writer
llama.cpp's convert_hf_to_gguf.py uses): the oracle of crates/ple-cli/tests/pack_gguf.rs.

  gguf_writer.py TABLE_DIR OUT.gguf TYPE [--layers N] [--drop KEY] [--want WANT.rows]

TABLE_DIR is an F32 or BF16 table (`ple pack`); TYPE is f32, f16, bf16 or q8_0: the rows as
float32 are stored as that ggml type in `per_layer_token_embd.weight` (ggml shape [head_dim, rows]),
after a small `token_embd.weight`, with the hash keys conversion/qwen4exp.py writes. --want writes
what libple must pack from it: the GGUF's values as F32 rows (f32, f16) or the BF16 bytes (bf16).
"""

from __future__ import annotations

import argparse
import json
import os

import gguf
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("table")
ap.add_argument("out")
ap.add_argument("type", choices=["f32", "f16", "bf16", "q8_0"])
ap.add_argument("--layers", type=int, default=1)
ap.add_argument("--drop", default=None)
ap.add_argument("--want", default=None)
a = ap.parse_args()

meta = json.load(open(os.path.join(a.table, "table.json")))
hd, rows, h = meta["head_dim"], meta["total_rows"], meta["hash"]
raw = np.fromfile(os.path.join(a.table, "table.rows"), np.uint8)
if meta["row_format"] == "f32":
    values = raw.view("<f4").reshape(rows, hd).astype(np.float32)
elif meta["row_format"] == "bf16":
    values = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(rows, hd)
else:
    raise SystemExit(f"{a.table}: {meta['row_format']} table: f32 or bf16 expected")

arch = "qwen4exp"
w = gguf.GGUFWriter(a.out, arch)


def u64s(key: str, values: list[int]) -> None:
    """As the fork's writer does (`_add_u64_array`): the multipliers need all 64 bits."""
    w.add_key_value(key, list(values), gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT64)


keys = {
    "ple.layers": lambda k: w.add_array(k, list(range(1, 1 + a.layers))),
    "ple.ngram_size": lambda k: w.add_uint32(k, h["ngram_size"]),
    "ple.heads_per_ngram": lambda k: w.add_uint32(k, h["heads_per_ngram"]),
    "ple.conv_kernel": lambda k: w.add_uint32(k, 4),
    "ple.eos_token_id": lambda k: w.add_uint32(k, h["eos_token_id"]),
    "embedding_length_per_layer_input": lambda k: w.add_uint32(k, hd),
    "ple.layer_multipliers": lambda k: u64s(k, h["multipliers"]),
    "ple.head_offsets": lambda k: u64s(k, h["offsets"]),
    "ple.head_vocab_sizes": lambda k: u64s(k, h["head_sizes"]),
}
w.add_block_count(2)
for k, add in keys.items():
    if k != a.drop:
        add(f"{arch}.{k}")
if a.drop != "tokenizer.ggml.tokens":
    w.add_token_list([f"t{i}" for i in range(h["vocab_size"])])
w.add_tensor("token_embd.weight", np.arange(64 * 7, dtype=np.float32).reshape(7, 64))
qt = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
      "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[a.type]  # fmt: skip
if a.type == "f32":
    data = values
elif a.type == "f16":
    data = values.astype(np.float16)
else:
    data = gguf.quants.quantize(values, qt)
w.add_tensor("per_layer_token_embd.weight", data, raw_dtype=qt if a.type in ("bf16", "q8_0") else None)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

if a.want:
    if a.type == "bf16":
        want = np.ascontiguousarray(data).view(np.uint8)
    else:
        want = np.ascontiguousarray(data, dtype=np.float32).astype("<f4").view(np.uint8)
    want.tofile(a.want)
