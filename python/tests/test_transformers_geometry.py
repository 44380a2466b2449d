"""`ple.transformers` on tiny random `Qwen4ExpForCausalLM` models of three PLE geometries (the
shipped n-gram 3 x 8 heads x 160, n-gram 4 x 4 heads x 128, n-gram 2 x 16 heads x 64): each model,
saved by save_pretrained in float32 (its own random n-gram weight as F32 row shards), is packed
by `ple pack` and offloaded; the expectation is always the in-RAM model itself:

- the offloaded model generates the in-RAM model's logits bit for bit;
- the table records the model's geometry (table.json, `Table.info`);
- the ids path (`submit_ids` of the rows `ngram_ids` gives) stages and dequantises what the
  token path does, bit for bit;
- a table of another geometry is refused by `offload` (ValueError naming the field), the model
  left as it was, and at open with another model's config.json (`PleFormatError`).

Needs torch and transformers (scripts/test.sh runs it in scripts/torch-venv.sh's venv with
PLE_EXPECT_TORCH=1: there a missing package fails; elsewhere the file is skipped)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Dict, Tuple

import numpy as np
import pytest

if os.environ.get("PLE_EXPECT_TORCH"):
    import torch  # noqa: F401 - a missing torch fails here
    import transformers  # noqa: F401
else:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

import torch  # noqa: E402
from test_transformers import PROMPTS, _ple_bin, assert_same_generation, config, greedy, ngram_tensors  # noqa: E402
from transformers import Qwen4ExpForCausalLM  # noqa: E402

import ple  # noqa: E402
import ple.transformers as pt  # noqa: E402

# (ngram_size, heads_per_ngram, head_dim)
SHAPES = [(3, 8, 160), (4, 4, 128), (2, 16, 64)]


def shape_config(ngram: int, hpn: int, hd: int):
    return config(ngram_size=ngram, heads_per_ngram=hpn, ple_embed_dim=(ngram - 1) * hpn * hd)


def fresh(ngram: int, hpn: int, hd: int) -> Qwen4ExpForCausalLM:
    torch.manual_seed(2)
    m = Qwen4ExpForCausalLM(shape_config(ngram, hpn, hd)).eval()
    with torch.no_grad():
        m.model.layers[1].ple.conv1d.weight.normal_()  # zero at init would hide the context
    return m


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Dict[Tuple[int, int, int], str]:
    """Per shape: the saved float32 checkpoint packed by `ple pack` (the table's directory)."""
    out = {}
    for s in SHAPES:
        root = tmp_path_factory.mktemp("geom-" + "x".join(map(str, s)))
        ck, tab = str(root / "ckpt"), str(root / "table")
        fresh(*s).save_pretrained(ck)
        subprocess.run([_ple_bin(), "pack", ck, tab], check=True, capture_output=True)
        out[s] = tab
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "ngram{}x{}x{}".format(*s))
def test_offload_gives_the_in_ram_models_logits_for_every_geometry(packed, shape):
    ngram, hpn, hd = shape
    tab = packed[shape]
    with open(os.path.join(tab, "table.json")) as f:
        meta = json.load(f)
    heads = (ngram - 1) * hpn
    assert (meta["ngram_size"], meta["heads_per_ngram"], meta["num_heads"], meta["head_dim"]) == (ngram, hpn, heads, hd)
    assert (meta["row_format"], meta["row_bytes"], meta["ple_layer_index"]) == ("f32", 4 * hd, 0)
    with ple.Table(tab) as t:
        i = t.info
        assert (i.ngram_size, i.heads_per_ngram, i.num_heads, i.head_dim, i.embed_dim) == (
            ngram, hpn, heads, hd, heads * hd)  # fmt: skip
    model = fresh(*shape)
    reference = greedy(model)
    off = pt.offload(fresh(*shape), tab)
    # no n-gram weight left in the model, by name or by shape (n-gram 2: the head width is the hidden size)
    assert ngram_tensors(off) == [] and ngram_tensors(model)
    assert_same_generation(reference, greedy(off))
    a, b = model.model.layers[1].ple.ple_embedding, off.model.layers[1].ple.ple_embedding
    ea, eb = a(PROMPTS, None), b(PROMPTS, None)
    assert eb.shape == (*PROMPTS.shape, heads * hd)
    assert torch.equal(ea.view(torch.int32), eb.view(torch.int32))


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "ngram{}x{}x{}".format(*s))
def test_the_ids_path_gives_the_token_paths_rows_for_other_geometries(packed, shape):
    rng = np.random.default_rng(5)
    with ple.Table(packed[shape]) as t:
        heads, dim = t.info.num_heads, t.info.embed_dim
        for n in (1, 9, 33):
            toks = rng.integers(0, 248320, n).astype(np.int32)
            pos = np.arange(n, dtype=np.int32) + 4
            ctx = rng.integers(0, 248320, shape[0] - 1).astype(np.int32)
            kw = dict(request_ids=[n], query_start=[0, n], context=ctx)
            ids = t.ngram_ids(toks, pos, **kw)
            assert ids.shape == (n, heads)
            by_tok = t.submit(toks, pos, **kw)
            rows_tok = t.packed_rows(by_tok.seq).tobytes()
            out_tok = t.dequant_cpu(by_tok.seq)
            by_ids = t.submit_ids(ids)
            rows_ids = t.packed_rows(by_ids.seq).tobytes()
            out_ids = t.dequant_cpu(by_ids.seq)
            assert rows_tok == rows_ids and len(rows_tok) == n * heads * t.info.row_bytes
            assert out_tok.shape == out_ids.shape == (n, dim)
            assert np.array_equal(out_tok.view(np.uint32), out_ids.view(np.uint32))


def test_a_table_of_another_geometry_is_refused(packed):
    """Every pairing of a model with another shape's table: ValueError naming the first field
    that differs, the model's n-gram module left in place."""
    for ms in SHAPES:
        for ts in SHAPES:
            if ms == ts:
                continue
            m = fresh(*ms)
            with pytest.raises(ValueError, match=r"(ngram_size|num_heads|head_dim) differs: table"):
                pt.offload(m, packed[ts])
            assert isinstance(m.model.layers[1].ple.ple_embedding, pt.NGramEmbedding)


def test_a_table_opened_with_another_geometrys_config_is_refused(packed):
    """`config_json_path` (``ple_options.config_json_path``): the table opens with its own
    model's config.json and is refused with another's (`PleFormatError` naming the field)."""
    for ts in SHAPES:
        own = os.path.join(os.path.dirname(packed[ts]), "ckpt", "config.json")
        with ple.Table(packed[ts], config_json_path=own) as t:
            assert t.info.ngram_size == ts[0]
        for ms in SHAPES:
            if ms != ts:
                other = os.path.join(os.path.dirname(packed[ms]), "ckpt", "config.json")
                with pytest.raises(ple.PleFormatError, match=r"(ngram_size|heads_per_ngram|head_dim) is .* in the table but"):
                    ple.Table(packed[ts], config_json_path=other)
