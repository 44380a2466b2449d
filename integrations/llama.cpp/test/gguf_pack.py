"""`ple pack MODEL.gguf` against `ple pack CHECKPOINT` on the same model (test.sh runs it with the
torch venv's python):

  gguf_pack.py LLAMA_CPP_SRC PLE_BIN DATA WORK

DATA/hf is make_model.py's tiny Qwen4Exp checkpoint (F32 n-gram shards, save_pretrained) and
DATA/model.gguf its conversion by the tree's convert_hf_to_gguf.py (--outtype f32). The checkpoint's
table is the expectation: the F32 GGUF packs to the same rows byte for byte, the F16 and BF16
conversions to those values rounded by numpy / ml_dtypes (F16 into F32 rows, BF16 into BF16 rows);
a Q8_0 conversion is refused naming the type, and a truncated GGUF leaves no table.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import ml_dtypes as ml
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert import convert  # noqa: E402

src, ple_bin, data, work = sys.argv[1:5]
os.makedirs(work, exist_ok=True)


def pack(source: str, name: str) -> tuple[dict, np.ndarray]:
    out = os.path.join(work, name)
    subprocess.run([ple_bin, "pack", source, out], check=True, stdout=subprocess.DEVNULL)
    meta = json.load(open(os.path.join(out, "table.json")))
    return meta, np.fromfile(os.path.join(out, "table.rows"), np.uint8)


def refused(source: str, name: str, needle: str) -> None:
    out = os.path.join(work, name)
    p = subprocess.run([ple_bin, "pack", source, out], capture_output=True, text=True)
    assert p.returncode != 0, f"{source} packed"
    assert "format error" in p.stderr and needle in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(out, "table.json")), f"{out} holds a table"
    print(f"gguf_pack: {os.path.basename(source)} refused: {p.stderr.strip()[:160]}")


ck_meta, ck_rows = pack(os.path.join(data, "hf"), "t-ck")
assert ck_meta["row_format"] == "f32", ck_meta["row_format"]
values = ck_rows.view("<f4")

meta, rows = pack(os.path.join(data, "model.gguf"), "t-f32")
assert meta["row_format"] == "f32" and meta["hash"] == ck_meta["hash"], meta
assert np.array_equal(rows, ck_rows), "the F32 GGUF's rows differ from the checkpoint's"
print(f"gguf_pack: F32 GGUF: {meta['total_rows']} rows byte-identical to the checkpoint's table")

for outtype, fmt, want in [
    ("f16", "f32", values.astype(np.float16).astype("<f4").view(np.uint8)),
    ("bf16", "bf16", values.astype(ml.bfloat16).view("<u2").view(np.uint8)),
]:
    g = os.path.join(work, f"model-{outtype}.gguf")
    convert(src, os.path.join(data, "hf"), g, outtype, 248320, 248044)
    meta, rows = pack(g, f"t-{outtype}")
    assert meta["row_format"] == fmt and meta["hash"] == ck_meta["hash"], meta
    assert np.array_equal(rows, want), f"the {outtype} GGUF's rows differ from the rounded checkpoint values"
    print(f"gguf_pack: {outtype} GGUF: {fmt} rows equal to the checkpoint's values rounded to {outtype}")
    os.remove(g)

g = os.path.join(work, "model-q8_0.gguf")
convert(src, os.path.join(data, "hf"), g, "q8_0", 248320, 248044)
refused(g, "t-q8", "is Q8_0")
os.remove(g)

cut = os.path.join(work, "model-cut.gguf")
shutil.copyfile(os.path.join(data, "model.gguf"), cut)
os.truncate(cut, os.path.getsize(cut) - 1000)
refused(cut, "t-cut", "truncated GGUF")
print("gguf_pack: OK")
