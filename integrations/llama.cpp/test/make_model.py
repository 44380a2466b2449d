"""Builds the fidelity test's inputs (run with the torch venv's python, scripts/torch-venv.sh):

  make_model.py LLAMA_CPP_SRC PLE_BIN OUT [big]

OUT/ckpt       a generated NVFP4 checkpoint (`ple synth-checkpoint`, base 2000, 4 shards)
OUT/table      its rows packed by `ple pack`
OUT/hf         a tiny random Qwen4ExpForCausalLM (transformers) whose n-gram weight holds exactly the
               table's rows, decoded from NVFP4 (e2m1 codes x e4m3 block scale x global scale)
OUT/model.gguf           OUT/hf converted by the tree's own convert_hf_to_gguf.py to F32
OUT/model-nople.gguf     the same GGUF without per_layer_token_embd.weight
OUT/ckpt-other, OUT/table-other   another checkpoint (base 1000) and its table: must be refused

`big`: the bench's model whose ubatch compute covers its PLE reads (bench.sh, PLE_BENCH_MODEL): hidden
1024, 4 layers, wider experts, converted to Q8_0 (F32 norms), OUT/hf removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes as ml
import numpy as np
import torch

src, ple_bin, out = sys.argv[1], sys.argv[2], sys.argv[3]
big = sys.argv[4:] == ["big"]
sys.path.insert(0, src)
sys.path.insert(0, os.path.join(src, "gguf-py"))
import gguf  # noqa: E402
from convert import convert  # noqa: E402
from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig  # noqa: E402

EOS, BASE, SHARDS = 248044, 2000, 4
os.makedirs(out, exist_ok=True)


def ple(*args):
    subprocess.run([ple_bin, *args], check=True, stdout=subprocess.DEVNULL)


def table(base, name, seed):
    ck, tab = os.path.join(out, "ckpt" + name), os.path.join(out, "table" + name)
    if not os.path.exists(os.path.join(tab, "table.json")):
        ple("synth-checkpoint", ck, "--base", str(base), "--shards", str(SHARDS), "--seed", str(seed))
        ple("pack", ck, tab)
    return tab


tab = table(BASE, "", 11)
table(1000, "-other", 12)

# the table's rows, decoded as libple's CPU dequant does (independently, with ml_dtypes)
meta = json.load(open(os.path.join(tab, "table.json")))
assert meta["row_format"] == "nvfp4" and meta["row_bytes"] == 90
rows = meta["total_rows"]
raw = np.fromfile(os.path.join(tab, "table.rows"), np.uint8).reshape(rows, 90)
c = np.empty((rows, 160), np.uint8)
c[:, 0::2], c[:, 1::2] = raw[:, :80] & 0x0F, raw[:, :80] >> 4
v = c.view(ml.float4_e2m1fn).astype(np.float32)
s = np.ascontiguousarray(raw[:, 80:]).view(ml.float8_e4m3fn).astype(np.float32)
weight = torch.from_numpy(v * np.repeat(s, 16, axis=1) * np.float32(meta["global_scale"]))

# the tiny model of python/tests/test_transformers.py, with what llama.cpp's graph assumes
size = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
    layer_types=["indexed_attention", "linear_attention"],
) if not big else dict(
    hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    linear_num_key_heads=8, linear_num_value_heads=8, linear_key_head_dim=128, linear_value_head_dim=128,
    moe_intermediate_size=512, shared_expert_intermediate_size=2048, num_experts=8,
    layer_types=["indexed_attention", "linear_attention"] * 2,
)  # fmt: skip
cfg = Qwen4ExpTextConfig(
    vocab_size=248320, **size,
    num_experts_per_tok=2, hc_count=2, hc_lowrank=8, ple_layer_ids=[2], ple_embed_dim=2560,
    ngram_vocab_size_base=BASE, split_ngram_parts=SHARDS, eos_token_id=EOS, pad_token_id=EOS,
    indexer_n_heads=2, indexer_kv_heads=1,
    indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
    output_gate_type="sigmoid", partial_rotary_factor=0.25,
)  # fmt: skip
torch.manual_seed(0)
m = Qwen4ExpForCausalLM(cfg).eval()
layer = m.model.layers[1].ple
with torch.no_grad():
    layer.ple_embedding.ngram_embedding.weight.copy_(weight)
    layer.conv1d.weight.normal_()  # zero at init, which would hide the PLE context from the logits
hf = os.path.join(out, "hf")
m.save_pretrained(hf)

convert(src, hf, os.path.join(out, "model.gguf"), "q8_0" if big else "f32", cfg.vocab_size, EOS)

# the same GGUF without the PLE table tensor
r = gguf.GGUFReader(os.path.join(out, "model.gguf"))
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(os.path.join(out, "model-nople.gguf"), arch)
for k, f in r.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture":
        continue
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
    else:
        w.add_key_value(k, f.contents(), vt)
for t in r.tensors:
    if t.name == "per_layer_token_embd.weight":
        continue
    w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
if big:
    import shutil

    shutil.rmtree(hf)
print("make_model: done", out)
