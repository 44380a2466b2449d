"""`ple.transformers` on a real Hugging Face model: a tiny random `Qwen4ExpForCausalLM` (2 layers,
hidden 64, the real vocabulary and ple_embed_dim 2560, ngram_vocab_size_base 2000) whose n-gram
weight is the rows of a generated NVFP4 checkpoint packed by libple, decoded with ml_dtypes. The
expectation is always the model's own `Qwen4ExpTextNGramEmbedding` holding that weight in RAM.

Needs torch and transformers (scripts/test.sh runs this file in scripts/torch-venv.sh's venv with
PLE_EXPECT_TORCH=1: there a missing package fails; elsewhere the file is skipped)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

if os.environ.get("PLE_EXPECT_TORCH"):
    import torch  # noqa: F401 - a missing torch fails here
    import transformers  # noqa: F401
else:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import DynamicCache, Qwen4ExpForCausalLM, Qwen4ExpTextConfig  # noqa: E402

import ple  # noqa: E402
import ple.transformers as pt  # noqa: E402

ml = pytest.importorskip("ml_dtypes")

EOS = 248044
BASE, SHARDS = 2000, 4


def config(**over) -> Qwen4ExpTextConfig:
    kw = dict(
        vocab_size=248320, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, hc_count=2, hc_lowrank=8, ple_layer_ids=[2], ple_embed_dim=2560,
        ngram_vocab_size_base=BASE, split_ngram_parts=SHARDS, eos_token_id=EOS, pad_token_id=EOS,
        layer_types=["indexed_attention", "linear_attention"], indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
    )  # fmt: skip
    kw.update(over)
    return Qwen4ExpTextConfig(**kw)


def _ple_bin() -> str:
    b = os.environ.get("PLE_BIN") or shutil.which("ple")
    if not b or not os.access(b, os.X_OK):
        pytest.fail("the tests make their checkpoints with the ple CLI: set PLE_BIN=<path to ple>")
    return b


@pytest.fixture(scope="session")
def table_dir(tmp_path_factory) -> str:
    """A generated NVFP4 checkpoint (the model's hash constants, base 2000) packed by libple."""
    root = tmp_path_factory.mktemp("hf")
    ck, tab = str(root / "ckpt"), str(root / "table")
    args = ["synth-checkpoint", ck, "--base", str(BASE), "--shards", str(SHARDS), "--seed", "11"]
    subprocess.run([_ple_bin(), *args], check=True, capture_output=True)
    ple.pack(ck, tab)
    return tab


@pytest.fixture(scope="session")
def weight(table_dir) -> torch.Tensor:
    """The table's rows decoded with ml_dtypes: e2m1 codes (low nibble first) x e4m3 block scale
    per 16 x the global scale, [rows, 160] float32."""
    with ple.Table(table_dir) as t:
        scale, rows = t.info["global_scale"], t.info["total_rows"]
    raw = np.fromfile(os.path.join(table_dir, "table.rows"), np.uint8).reshape(rows, 90)
    c = np.empty((rows, 160), np.uint8)
    c[:, 0::2], c[:, 1::2] = raw[:, :80] & 0x0F, raw[:, :80] >> 4
    v = c.view(ml.float4_e2m1fn).astype(np.float32)
    s = np.ascontiguousarray(raw[:, 80:]).view(ml.float8_e4m3fn).astype(np.float32)
    return torch.from_numpy(v * np.repeat(s, 16, axis=1) * np.float32(scale))


def model_with(weight: torch.Tensor, cfg=None) -> Qwen4ExpForCausalLM:
    """The tiny model, seeded, with `weight` as its n-gram weight and a random PLE conv (zero at
    init, which would hide the PLE branch's context from the logits)."""
    torch.manual_seed(0)
    m = Qwen4ExpForCausalLM(cfg or config()).eval()
    ple_layer = m.model.layers[1].ple
    with torch.no_grad():
        ple_layer.ple_embedding.ngram_embedding.weight.copy_(weight)
        ple_layer.conv1d.weight.normal_()
    return m


# three left-padded prompts (pad = EOS, as generate() pads), EOS inside two of them
PROMPTS = torch.tensor([
    [EOS, EOS, EOS, 9707, 11, EOS, 13, 14, 15],
    [EOS, EOS, 101, 102, 103, EOS, EOS, 106, 107],
    [5, 6, 7, 8, 9, 10, EOS, 12, 13],
])  # fmt: skip
MASK = (torch.arange(PROMPTS.shape[1])[None] >= torch.tensor([[3], [2], [0]])).long()


def greedy(model, new_tokens=12):
    return model.generate(PROMPTS, attention_mask=MASK, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, output_logits=True, return_dict_in_generate=True)  # fmt: skip


def assert_same_generation(a, b):
    assert torch.equal(a.sequences, b.sequences)
    assert len(a.logits) == len(b.logits) >= 12
    for i, (x, y) in enumerate(zip(a.logits, b.logits)):
        assert x.dtype == y.dtype and torch.equal(x, y), f"logits of generated token {i} differ"


def ngram_tensors(model) -> list:
    """Names of parameters and buffers that could hold the n-gram weight: its name, or its shape (2-D
    rows one head wide, more than 1000 of them, and not the vocabulary's rows: the token embedding
    and the LM head have those, and the hidden size may equal a head's width)."""
    c = model.config
    emb = c.ple_embed_dim // ((c.ngram_size - 1) * c.heads_per_ngram)
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [n for n, t in named if "ngram_embedding" in n or (
        t.ndim == 2 and t.shape[-1] == emb and 1000 < t.shape[0] != c.vocab_size)]


@pytest.fixture(scope="module")
def reference(weight):
    return greedy(model_with(weight))


@pytest.mark.parametrize("max_tokens_per_step", [8192, 7])
def test_generate_gives_the_in_ram_models_logits_bit_for_bit(weight, table_dir, reference, max_tokens_per_step):
    """f32 greedy generate of 12 tokens; 7 tokens per step splits the 27-token prompt step across
    and inside rows (each piece takes its context from the tokens before it)."""
    model = model_with(weight)
    assert ngram_tensors(model)  # the in-RAM model does hold it
    assert pt.offload(model, table_dir, max_tokens_per_step=max_tokens_per_step) is model
    assert ngram_tensors(model) == []
    mod = model.model.layers[1].ple.ple_embedding
    assert isinstance(mod, pt.OffloadedNGramEmbedding)
    out = greedy(model)
    assert_same_generation(reference, out)
    s = mod.table.stats()
    assert s["prefill_tokens"] + s["decode_tokens"] == PROMPTS.numel() + 11 * 3  # the last token is never fed
    # one step for the prompt, or ceil(27 / 7) = 4; then one per generated token but the last
    assert s["prefill_steps"] + s["decode_steps"] == (1 if max_tokens_per_step > 27 else 4) + 11


def test_the_ngram_branch_matters_to_the_logits(weight, reference):
    """The comparison above could not miss a wrong row: other rows give other logits."""
    out = greedy(model_with(weight.roll(1, dims=0)))
    assert not torch.equal(reference.logits[0], out.logits[0])


def test_calls_with_a_cache_give_the_modules_embedding(weight, table_dir):
    """Module level, against the model's module in step: a first input shorter than the context
    (EOS-padded in the cache), then chunks of any size, EOS anywhere; the cache's n-gram state
    ends the same."""
    cfg = config()
    ref, off = model_with(weight, cfg), pt.offload(model_with(weight, cfg), table_dir, max_tokens_per_step=5)
    a, b = ref.model.layers[1].ple.ple_embedding, off.model.layers[1].ple.ple_embedding
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 400, size=(2, 40))
    toks[rng.random(toks.shape) < 0.15] = EOS
    toks = torch.from_numpy(toks)
    ca, cb = DynamicCache(config=cfg), DynamicCache(config=cfg)
    at = 0
    for i, n in enumerate([1, 1, 3, 2, 9, 1, 7, 16]):
        if i % 3 == 1:  # prefetched with the right tokens: those steps are used
            b.prefetch(toks[:, at : at + n], cb)
        if i % 3 == 2:  # prefetched with other tokens: released, looked up again
            b.prefetch(toks[:, at : at + n].flip(0), cb)  # the rows swapped
        ea, eb = a(toks[:, at : at + n], ca), b(toks[:, at : at + n], cb)
        assert eb.shape == (2, n, 2560) and eb.dtype == torch.float32
        assert torch.equal(ea, eb), f"tokens {at}..{at + n}"
        assert torch.equal(ca.get_conv_state(1, state_idx=2), cb.get_conv_state(1, state_idx=2))
        at += n
    assert torch.equal(a(toks, None), b(toks, None))  # no cache: the whole sequence from EOS context
    # steps submitted (seq numbers): <= 5 tokens each, 20 for the calls with a cache and 16 without;
    # a hit adds none, a miss its own (2 + 1); inputs needing more than 2 steps are not prefetched
    assert b.table._last_seq == 20 + 16 + 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_models_get_the_modules_embedding_exactly(weight, table_dir, dtype):
    ref = model_with(weight).to(dtype)
    off = pt.offload(model_with(weight).to(dtype), table_dir)
    a, b = ref.model.layers[1].ple.ple_embedding, off.model.layers[1].ple.ple_embedding
    ea, eb = a(PROMPTS, None), b(PROMPTS, None)
    assert eb.dtype == dtype and torch.equal(ea.view(torch.int16), eb.view(torch.int16))
    assert_same_generation(greedy(ref), greedy(off))
    # a model converted after offload follows: the output dtype is the model's
    off.to(torch.float32)
    assert b(PROMPTS, None).dtype == torch.float32


def _wrapped(cfg, n=1) -> torch.nn.Module:
    """`n` bare n-gram modules in a container (offload finds them by type, wherever they sit)."""
    return torch.nn.ModuleDict({f"m{i}": pt.NGramEmbedding(cfg, cfg.ple_embed_dim, layer_idx=1) for i in range(n)})


@pytest.mark.parametrize(
    "over, field",
    [
        ({"seed": 99}, "layer_multipliers differ"),
        ({"vocab_size": 151936}, "vocab_size differs: table 248320, model"),
        ({"eos_token_id": 151643, "pad_token_id": 151643}, "eos_token_id differs: table 248044, model"),
        ({"ngram_vocab_size_base": 3000}, r"ngram_heads_vocab_sizes differ: table \[2003, .*model .*\[3001, "),
        ({"make_ngram_vocab_size_divisible_by": 512}, "total_rows differs: table 33024, model .* 33280"),
    ],
)
def test_a_table_for_another_model_is_refused(table_dir, over, field):
    m = _wrapped(config(**over))
    with pytest.raises(ValueError, match=field):
        pt.offload(m, table_dir)
    assert isinstance(m["m0"], pt.NGramEmbedding)  # left unchanged


def test_the_tables_hash_parameters_read_back(table_dir):
    """The multipliers recovered from the table's ids are the model's, and so are the offsets."""
    with ple.Table(table_dir) as t:
        got = pt.table_hash_params(t)
    ref = pt.NGramEmbedding(config(), 2560, layer_idx=1)
    assert got["layer_multipliers"] == ref.layer_multipliers.tolist() == [23703573157769, 20109073645365, 8052911324071]
    assert got["ngram_heads_offsets"] == ref.ngram_heads_offsets.tolist()
    assert got["ngram_heads_vocab_sizes"] == ref.ngram_heads_vocab_sizes.tolist()


def test_several_ple_layers_need_a_table_per_layer(table_dir):
    with pytest.raises(ValueError, match="ple_layer_ids: the model has 2 PLE layers .* holds no layers.json"):
        pt.offload(_wrapped(config(), 2), table_dir)
    with pytest.raises(ValueError, match="no Qwen4ExpTextNGramEmbedding"):
        pt.offload(torch.nn.Linear(2, 2), table_dir)


def test_from_pretrained_never_loads_the_weight_and_matches_transformers(weight, tmp_path):
    """A saved bf16 checkpoint (transformers writes the n-gram weight as BF16 shards, which libple
    packs); from_pretrained packs it, loads the rest, and generates what transformers' own load
    generates. A table of another checkpoint is refused."""
    ck = str(tmp_path / "ckpt")
    model_with(weight).to(torch.bfloat16).save_pretrained(ck)
    ref = Qwen4ExpForCausalLM.from_pretrained(ck)
    tab = str(tmp_path / "table")
    model = pt.from_pretrained(ck, tab, progress=False)
    assert type(model) is Qwen4ExpForCausalLM and model.dtype == torch.bfloat16
    assert ngram_tensors(model) == [] and os.path.exists(os.path.join(tab, "table.json"))
    assert all(p.device.type == "cpu" for p in model.parameters())
    sd_ref, sd = ref.state_dict(), model.state_dict()
    assert set(sd_ref) - set(sd) == {"model.layers.1.ple.ple_embedding.ngram_embedding.weight"}
    assert all(torch.equal(sd_ref[k], v) for k, v in sd.items())
    assert_same_generation(greedy(ref), greedy(model))
    f32 = pt.from_pretrained(ck, tab, progress=False, dtype=torch.float32)  # the table is reused
    assert f32.model.layers[1].ple.ple_embedding(PROMPTS, None).dtype == torch.float32
    other = str(tmp_path / "other")
    model_with(weight.roll(1, dims=0)).to(torch.bfloat16).save_pretrained(other)
    with pytest.raises(ple.PleError, match="refusing to replace"):
        pt.from_pretrained(other, tab, progress=False)


def test_from_pretrained_on_a_packed_table_opens_it_without_packing(weight, tmp_path, capfd):
    """The first load packs (tqdm's "ple pack" bar on stderr); a second load of the same checkpoint
    leaves table.rows as it is (same inode, same mtime) and shows no bar. The checks stay: a table
    whose row file no longer fits its metadata is packed again, and the model still gets the
    module's rows."""
    ck, tab = str(tmp_path / "ckpt"), str(tmp_path / "table")
    model_with(weight).to(torch.bfloat16).save_pretrained(ck)
    rows = os.path.join(tab, "table.rows")
    capfd.readouterr()
    pt.from_pretrained(ck, tab)
    assert "ple pack" in capfd.readouterr().err
    before = os.stat(rows)
    again = pt.from_pretrained(ck, tab)
    after = os.stat(rows)
    assert "ple pack" not in capfd.readouterr().err
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    emb = again.model.layers[1].ple.ple_embedding
    assert isinstance(emb, pt.OffloadedNGramEmbedding)
    want = model_with(weight).to(torch.bfloat16).model.layers[1].ple.ple_embedding(PROMPTS, None)
    assert torch.equal(emb(PROMPTS, None), want)
    del again, emb
    os.truncate(rows, before.st_size - 90)  # no longer the table its metadata describes
    pt.from_pretrained(ck, tab)
    assert "ple pack" in capfd.readouterr().err
    assert os.path.getsize(rows) == before.st_size


@pytest.mark.parametrize("dtype, row_format", [(torch.float32, "f32"), (torch.bfloat16, "bf16")])
def test_a_save_pretrained_checkpoint_packs_exactly_and_offload_gives_its_logits(tmp_path, dtype, row_format):
    """A tiny random model (its own random n-gram weight: the real PLE shape, 16 heads x 160) saved
    by save_pretrained in float32 or bfloat16, split over several files: transformers writes the
    weight as split_ngram_parts row shards of that dtype (F32 or BF16, no quantisation). `ple pack`
    keeps every value: the row file is the model's tensor bit for bit, row format f32 or bf16; and
    the model offloaded onto that table generates the in-RAM model's logits exactly."""
    def fresh():
        torch.manual_seed(1)
        m = Qwen4ExpForCausalLM(config()).eval()
        with torch.no_grad():
            m.model.layers[1].ple.conv1d.weight.normal_()  # zero at init would hide the context
        return m.to(dtype)

    model = fresh()
    w = model.model.layers[1].ple.ple_embedding.ngram_embedding.weight.detach()
    assert w.dtype == dtype and w.shape == (33024, 160) and w.std() > 0
    ck, tab = str(tmp_path / "ckpt"), str(tmp_path / "table")
    model.save_pretrained(ck, max_shard_size="20MB" if dtype == torch.float32 else "10MB")
    files = [f for f in os.listdir(ck) if f.endswith(".safetensors")]
    assert len(files) > 1 and os.path.exists(os.path.join(ck, "model.safetensors.index.json"))
    subprocess.run([_ple_bin(), "pack", ck, tab], check=True, capture_output=True)
    with open(os.path.join(tab, "table.json")) as f:
        meta = json.load(f)
    assert (meta["row_format"], meta["row_bytes"], meta["global_scale"]) == (row_format, 160 * w.element_size(), 1.0)
    assert meta["total_rows"] == w.shape[0]
    bits = {torch.float32: (np.uint32, torch.int32), torch.bfloat16: (np.uint16, torch.int16)}[dtype]
    rows = np.fromfile(os.path.join(tab, "table.rows"), np.dtype(bits[0]).newbyteorder("<")).reshape(w.shape)
    np.testing.assert_array_equal(rows, w.view(bits[1]).numpy().view(bits[0]))
    reference = greedy(model)
    off = pt.offload(fresh(), tab)
    assert ngram_tensors(off) == []
    assert_same_generation(reference, greedy(off))
    # the n-gram module itself, too: the offloaded embedding is the in-RAM module's, exactly
    a, b = model.model.layers[1].ple.ple_embedding, off.model.layers[1].ple.ple_embedding
    assert torch.equal(a(PROMPTS, None).view(bits[1]), b(PROMPTS, None).view(bits[1]))


def two_layer_model() -> Qwen4ExpForCausalLM:
    """A tiny random model with two PLE layers (ple_layer_ids [1, 3]: decoder layers 0 and 2, its
    ple_layer_index 0 and 1, each with its own head sizes and multipliers), the real PLE shape."""
    cfg = config(num_hidden_layers=3, layer_types=["linear_attention", "indexed_attention", "linear_attention"],
                 ple_layer_ids=[1, 3])  # fmt: skip
    torch.manual_seed(2)
    m = Qwen4ExpForCausalLM(cfg).eval()
    with torch.no_grad():
        for i in (0, 2):
            m.model.layers[i].ple.conv1d.weight.normal_()  # zero at init would hide the context
    return m


def test_a_model_with_two_ple_layers_is_served_a_table_per_layer(tmp_path):
    """`ple pack` of a save_pretrained checkpoint with two PLE layers writes layer-0/ and layer-1/
    (each the layer's weight bit for bit) and layers.json; offload and from_pretrained serve both
    layers and generate the in-RAM model's logits exactly; a layer's table is refused for the other
    layer, naming the field; `--layer K` packs one layer into the directory itself; a killed
    pack's temporary index is removed."""
    model = two_layer_model()
    mods = [model.model.layers[i].ple.ple_embedding for i in (0, 2)]
    assert [m.ple_layer_index for m in mods] == [0, 1]
    assert mods[0].head_vocab_sizes != mods[1].head_vocab_sizes
    assert not torch.equal(mods[0].layer_multipliers, mods[1].layer_multipliers)
    ck, tab = str(tmp_path / "ckpt"), str(tmp_path / "table")
    model.save_pretrained(ck)
    os.makedirs(tab)
    stale = os.path.join(tab, ".layers.json.tmp-4000000")  # left by a killed pack
    with open(stale, "w") as f:
        f.write("{")
    ple.pack(ck, tab)
    assert not os.path.exists(stale)
    with open(os.path.join(tab, "layers.json")) as f:
        index = json.load(f)
    assert [(e["ple_layer_index"], e["dir"], e["decoder_layer"]) for e in index["layers"]] == [
        (0, "layer-0", 0), (1, "layer-1", 2)]  # fmt: skip
    for k in (0, 1):
        with ple.Table(os.path.join(tab, f"layer-{k}")) as t:
            assert t.info.ple_layer_index == k
    assert not os.path.exists(os.path.join(tab, "table.json"))
    for k, m in enumerate(mods):
        w = m.ngram_embedding.weight.detach()
        rows = np.fromfile(os.path.join(tab, f"layer-{k}", "table.rows"), "<u4").reshape(w.shape)
        np.testing.assert_array_equal(rows, w.view(torch.int32).numpy().view(np.uint32))
    with pytest.raises(ple.PleFormatError, match="holds the tables of 2 PLE layers"):
        ple.Table(tab)
    # without config.json: the layers in decoder-layer order, each recording its own index
    bare = tmp_path / "bare"
    shutil.copytree(ck, bare, ignore=shutil.ignore_patterns("config.json", "generation_config.json"))
    ple.pack(str(bare), str(tmp_path / "bare-table"))
    for k in (0, 1):
        layer = tmp_path / "bare-table" / f"layer-{k}"
        with ple.Table(str(layer)) as t:
            assert t.info.ple_layer_index == k
            pt.validate(t, mods[k])
        with open(layer / "table.rows", "rb") as f1, open(os.path.join(tab, f"layer-{k}", "table.rows"), "rb") as f2:
            assert f1.read() == f2.read()

    reference = greedy(model)
    off = pt.offload(two_layer_model(), tab, max_tokens_per_step=7)
    assert ngram_tensors(off) == []
    served = [off.model.layers[i].ple.ple_embedding for i in (0, 2)]
    assert [os.path.basename(m.table.path) for m in served] == ["layer-0", "layer-1"]
    assert_same_generation(reference, greedy(off))
    for a, b in zip(mods, served):  # each module's embedding, exactly
        assert torch.equal(a(PROMPTS, None), b(PROMPTS, None))

    # a set whose layers.json gives each layer the other's table: refused by name, model unchanged
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    os.symlink(os.path.join(tab, "layer-1"), swapped / "layer-0")
    os.symlink(os.path.join(tab, "layer-0"), swapped / "layer-1")
    shutil.copy(os.path.join(tab, "layers.json"), swapped / "layers.json")
    m = two_layer_model()
    with pytest.raises(ValueError, match=r"ple_layer_index differs: table 1, model \(model.layers.0.*\) 0"):
        pt.offload(m, str(swapped))
    assert all(isinstance(m.model.layers[i].ple.ple_embedding, pt.NGramEmbedding) for i in (0, 2))
    # a set without one of the model's layers
    index["layers"] = index["layers"][:1]
    with open(swapped / "layers.json", "w") as f:
        json.dump(index, f)
    with pytest.raises(ValueError, match="no table for ple_layer_index 1"):
        pt.offload(m, str(swapped))

    # one layer: `ple pack --layer 1` writes that layer's table into the directory itself
    one = str(tmp_path / "one")
    subprocess.run([_ple_bin(), "pack", ck, one, "--layer", "1"], check=True, capture_output=True)
    with open(os.path.join(one, "table.rows"), "rb") as f1, open(os.path.join(tab, "layer-1", "table.rows"), "rb") as f2:
        assert f1.read() == f2.read()
    with ple.Table(one) as t:
        assert t.info.ple_layer_index == 1
        pt.validate(t, mods[1])
        with pytest.raises(ValueError, match="ple_layer_index differs: table 1, model"):
            pt.validate(t, mods[0])
        # the same table claiming layer 0 is still refused: its hash is layer 1's
        mods[0].ple_layer_index = 1
        with pytest.raises(ValueError, match=r"ngram_heads_vocab_sizes differ: table \[2129, .*\[2003, "):
            pt.validate(t, mods[0])
        mods[0].ple_layer_index = 0
    # all layers into a directory holding one table: refused, unless forced
    with pytest.raises(ple.PleFormatError, match="holds a single table"):
        ple.pack(ck, one)
    ple.pack(ck, one, force=True)
    assert sorted(os.listdir(one)) == ["layer-0", "layer-1", "layers.json"]
    # and back: one layer into a directory holding a set, likewise
    again = [_ple_bin(), "pack", ck, one, "--layer", "0"]
    refused = subprocess.run(again, capture_output=True, text=True)
    assert refused.returncode != 0 and "holds the tables of 2 PLE layers" in refused.stderr
    subprocess.run(again + ["--force"], check=True, capture_output=True)
    assert sorted(os.listdir(one)) == ["table.json", "table.rows"]
    bad = subprocess.run([_ple_bin(), "pack", ck, str(tmp_path / "none"), "--layer", "2"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no PLE layer with ple_layer_index 2" in bad.stderr

    # from_pretrained: packs (here: reuses) both layers, loads without the weights, same logits
    loaded = pt.from_pretrained(ck, tab, progress=False)
    assert ngram_tensors(loaded) == []
    assert_same_generation(reference, greedy(loaded))
