"""Bench inputs: the test's tiny Qwen4Exp (OUT/test-data/model.gguf) re-keyed to a larger NVFP4 table.

  make_bench_gguf.py LLAMA_CPP_SRC MODEL.gguf TABLE_DIR OUT_DIR [nople|bf16|q4_0 ...]

Writes OUT_DIR/model-bf16.gguf and OUT_DIR/model-q4_0.gguf (per_layer_token_embd = the table's rows
decoded from NVFP4, stored as BF16 / Q4_0: what stock llama.cpp can carry) and OUT_DIR/model-nople.gguf
(no PLE tensor, for --ple-table), all three with the table's hash keys (or those named). Streams the rows
in chunks straight into the GGUF: the disk holds each GGUF once, nothing more.
"""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes as ml
import numpy as np

src, model, tab, out = sys.argv[1:5]
sys.path.insert(0, os.path.join(src, "gguf-py"))
import gguf  # noqa: E402
from gguf.quants import quantize  # noqa: E402

os.makedirs(out, exist_ok=True)
meta = json.load(open(os.path.join(tab, "table.json")))
rows, scale = meta["total_rows"], np.float32(meta["global_scale"])
raw = np.memmap(os.path.join(tab, "table.rows"), np.uint8, "r", shape=(rows, 90))
CHUNK = 1 << 18


def decoded(a, b):
    r = np.asarray(raw[a:b])
    c = np.empty((b - a, 160), np.uint8)
    c[:, 0::2], c[:, 1::2] = r[:, :80] & 0x0F, r[:, :80] >> 4
    v = c.view(ml.float4_e2m1fn).astype(np.float32)
    s = np.ascontiguousarray(r[:, 80:]).view(ml.float8_e4m3fn).astype(np.float32)
    return v * np.repeat(s, 16, axis=1) * scale


class Encoded:
    """The table's rows as BF16 (320 B) or Q4_0 (90 B) bytes, encoded chunk by chunk as GGUFWriter writes
    them (its `tofile`), so no copy of the encoded tensor is kept in memory or on disk."""

    def __init__(self, kind):
        self.kind, width = kind, (320 if kind == "bf16" else 90)
        self.shape, self.dtype, self.nbytes = (rows, width), np.dtype(np.uint8), rows * width

    def tofile(self, f):
        for a in range(0, rows, CHUNK):
            b = min(rows, a + CHUNK)
            x = decoded(a, b)
            if self.kind == "bf16":
                f.write(x.astype(ml.bfloat16).tobytes())
            else:
                f.write(quantize(x, gguf.GGMLQuantizationType.Q4_0).tobytes())


r = gguf.GGUFReader(model)
arch = r.fields["general.architecture"].contents()
rekey = {
    f"{arch}.ple.layer_multipliers": meta["hash"]["multipliers"],
    f"{arch}.ple.head_vocab_sizes": meta["hash"]["head_sizes"],
    f"{arch}.ple.head_offsets": meta["hash"]["offsets"],
}


def write(name, ple):
    path = os.path.join(out, name)
    w = gguf.GGUFWriter(path + ".tmp", arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        val = rekey.get(k, f.contents())
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, val, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k, val, vt)
    for t in r.tensors:
        if t.name == "per_layer_token_embd.weight":
            if ple is not None:
                data, qtype = ple
                w.add_tensor(t.name, data, raw_dtype=qtype)  # uint8 [rows, row bytes]: the byte shape
            continue
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)


which = sys.argv[5:] or ["nople", "bf16", "q4_0"]  # optional: which GGUFs to write (one process each)
if "nople" in which:
    write("model-nople.gguf", None)
for k, q in (("bf16", gguf.GGMLQuantizationType.BF16), ("q4_0", gguf.GGMLQuantizationType.Q4_0)):
    if k in which:
        write(f"model-{k}.gguf", (Encoded(k), q))
print("make_bench_gguf: done", out)
