"""Hugging Face transformers' Qwen4Exp (model type ``qwen4_exp``) with its n-gram table served by libple.

    import ple.transformers
    model = ple.transformers.from_pretrained("/models/qwen4-exp", "/nvme/ple-table")
    # or, for a model already loaded: ple.transformers.offload(model, "/nvme/ple-table")

`offload` replaces every ``Qwen4ExpTextNGramEmbedding`` by an `OffloadedNGramEmbedding`: the same
call ``(input_ids, past_key_values)``, the same n-gram context in the cache (conv state 2), the
same ``[batch, seq, ple_embed_dim]`` output, with the rows read from the packed table instead of an
``nn.Embedding`` holding the whole weight. torch and transformers are needed here only; ``import
ple`` works without them.
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised in the venv without torch
    raise ImportError("ple.transformers needs PyTorch (the 'torch' package): pip install torch") from e
try:
    import transformers
    from transformers.models.qwen4_exp import modeling_qwen4_exp as _qwen4
except ImportError as e:  # pragma: no cover
    raise ImportError(
        "ple.transformers needs Hugging Face transformers with Qwen4Exp (the 'transformers' package, "
        f"5.23 or later): pip install 'transformers>=5.23' ({e})"
    ) from e

from ._pack import pack
from ._types import PathLike
from .step import Step
from .table import Table

NGramEmbedding = _qwen4.Qwen4ExpTextNGramEmbedding
__all__ = ["OffloadedNGramEmbedding", "offload", "from_pretrained", "NGramEmbedding"]

# a submitted step with the first and end token of the batch it holds
_Submitted = Tuple[Step, int, int]

# the index of a table set with one table per PLE layer (`ple pack` of a checkpoint with several)
LAYERS_FILE = "layers.json"


class OffloadedNGramEmbedding(torch.nn.Module):
    """A ``Qwen4ExpTextNGramEmbedding`` whose rows come from a libple table.

    The n-gram context protocol is the module's: the ``context_len`` tokens before the call are
    the cache's conv state 2 (EOS before the first call), and the call appends its tokens to it
    (a first call shorter than ``context_len`` is EOS-padded on the left). Each row of the batch is
    one request in libple's stateless mode, its context those tokens, so libple keeps no history.
    The hash buffers stay (small, persistent: the state dict keeps its keys but the weight's);
    ``_dtype_probe`` is an empty non-persistent buffer that follows ``model.to(dtype)``."""

    def __init__(self, source: Any, table: Table, dtype: "torch.dtype", cuda_device: int):
        super().__init__()
        self.layer_idx = source.layer_idx
        self.ngram_size = source.ngram_size
        self.context_len = source.context_len
        self.eos_token_id = int(source.eos_token_id)
        self.ple_embed_dim = source.ngram_heads * source.ngram_embedding.embedding_dim
        for name in ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets"):
            self.register_buffer(name, _buffer_values(source, name).clone())
        self.register_buffer("_dtype_probe", torch.empty(0, dtype=dtype), persistent=False)
        self.table = table
        self._cuda_device = cuda_device
        self._max_tokens = table.max_tokens_per_step
        self._in_flight = max(1, table.max_in_flight)
        self._ahead: Optional[Tuple[np.ndarray, List[_Submitted]]] = None  # submitted by `prefetch`
        self._prefetch_hook: Any = None

    def extra_repr(self) -> str:
        return f"table={self.table.path!r}, layer_idx={self.layer_idx}, ple_embed_dim={self.ple_embed_dim}"

    def _history(self, input_ids: "torch.Tensor", past_key_values: Any) -> np.ndarray:
        """`[batch, context_len + seq]` int32: the context the module would read, then the tokens."""
        k = self.context_len
        cached = past_key_values.get_conv_state(self.layer_idx, state_idx=2) if past_key_values is not None else None
        if cached is not None:
            previous = cached[:, -k:]  # a cache recording its past holds more; the last k count
        else:
            previous = input_ids.new_full((input_ids.shape[0], k), self.eos_token_id)
        return torch.cat([previous.to(input_ids.device), input_ids], dim=-1).to("cpu", torch.int32).numpy()

    def prefetch(self, input_ids: Optional["torch.Tensor"], past_key_values: Any) -> None:
        """Submits the lookup of `input_ids` ahead of `forward` (a pre-hook on an earlier decoder
        layer calls it), so libple gathers while that layer computes. `forward` uses these steps
        only if it is called with the same tokens and context, else releases them; inputs that
        need more steps than the ring holds are not prefetched.

        Parameters
        ----------
        input_ids : torch.Tensor, optional
            ``[batch, seq]`` the tokens `forward` will get (None or empty: nothing is prefetched).
        past_key_values : transformers.Cache, optional
            The cache `forward` will get (its conv state 2 is the n-gram context).
        """
        self._release_ahead()
        if input_ids is None or input_ids.numel() == 0:
            return
        if -(-input_ids.numel() // self._max_tokens) > self._in_flight:
            return
        history = self._history(input_ids.long(), past_key_values)
        self._ahead = (history, list(self._submit(history)))

    def _release_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            for step, _, _ in ahead[1]:
                step.release()

    def forward(self, input_ids: "torch.Tensor", past_key_values: Any) -> "torch.Tensor":
        """The n-gram embeddings of `input_ids`, as the replaced module computes them, and the
        module's cache update.

        Parameters
        ----------
        input_ids : torch.Tensor
            ``[batch, seq]`` token ids.
        past_key_values : transformers.Cache, optional
            The model's cache: its conv state 2 holds the n-gram context and is updated.

        Returns
        -------
        torch.Tensor
            ``[batch, seq, ple_embed_dim]`` in the module's dtype, on `input_ids`' device (fused
            on the table's CUDA device, else dequantised on the CPU and copied).
        """
        input_ids = input_ids.long()
        k = self.context_len
        history = self._history(input_ids, past_key_values)
        if past_key_values is not None:  # the module's cache update, as it makes it
            to_cache = input_ids
            first = past_key_values.get_conv_state(self.layer_idx, state_idx=2) is None
            if first and input_ids.shape[1] < k:  # the cache would pad with zeros, the model with EOS
                to_cache = torch.nn.functional.pad(to_cache, (k - input_ids.shape[1], 0), value=self.eos_token_id)
            past_key_values.update_conv_state(to_cache, self.layer_idx, state_idx=2, conv_kernel_size=k)
        batch, seq = input_ids.shape
        dev = input_ids.device
        fuse = dev.type == "cuda" and dev.index == self._cuda_device
        # CPU rows for any device but the table's CUDA device; copied over below
        at = dev if fuse or dev.type == "cpu" else torch.device("cpu")
        out = torch.empty((batch, seq, self.ple_embed_dim), dtype=self._dtype_probe.dtype, device=at)
        flat = out.view(batch * seq, self.ple_embed_dim)
        stream = torch.cuda.current_stream(out.device) if fuse else None
        ahead, self._ahead = self._ahead, None
        if ahead is not None and np.array_equal(ahead[0], history):
            for item in ahead[1]:
                self._consume(item, flat, stream)
        else:
            for step, _, _ in ahead[1] if ahead is not None else ():
                step.release()
            if batch * seq:
                self._lookup(history, flat, stream)
        return out if out.device == dev else out.to(dev)

    def _submit(self, history: np.ndarray) -> Iterator[_Submitted]:
        """Submits the rows of `history[:, k:]` (row-major) in steps of at most
        max_tokens_per_step tokens; yields `(step, first_token, end_token)` as each is submitted.
        Each row is one request in stateless mode; a step starting inside a row takes its context
        from the tokens before it."""
        k = self.context_len
        batch, width = history.shape
        seq = width - k
        tokens = np.ascontiguousarray(history[:, k:]).reshape(-1)
        # positions k.. in each row: the context tokens stand for positions 0..k-1 of the request
        positions = np.tile(np.arange(k, width, dtype=np.int32), batch)
        n = batch * seq
        for start in range(0, n, self._max_tokens):
            end = min(n, start + self._max_tokens)
            first, last = start // seq, (end - 1) // seq
            rows = np.arange(first, last + 1)
            spans = np.clip(np.arange(first, last + 2) * seq, start, end) - start
            a = start - first * seq  # first token of the first row in this step
            ctx = np.stack([history[first, a : a + k]] + [history[r, :k] for r in rows[1:]])
            step = self.table.submit(
                tokens[start:end], positions[start:end], request_ids=rows.astype(np.uint64),
                query_start=spans.astype(np.uint32), context=ctx.reshape(-1),
            )  # fmt: skip
            yield step, start, end

    def _lookup(self, history: np.ndarray, out: "torch.Tensor", stream: Any) -> None:
        """All rows into `out`; a step is dequantised once the ring is full, so the next one is
        gathered meanwhile."""
        pending: Deque[_Submitted] = deque()
        for item in self._submit(history):
            pending.append(item)
            if len(pending) >= self._in_flight:
                self._consume(pending.popleft(), out, stream)
        while pending:
            self._consume(pending.popleft(), out, stream)

    @staticmethod
    def _consume(item: _Submitted, out: "torch.Tensor", stream: Any) -> None:
        step, start, end = item
        if stream is None:
            step.dequant_cpu(out[start:end])
        else:
            step.dequant_fuse(out[start:end], stream)


def _buffer_values(module: Any, name: str) -> "torch.Tensor":
    """The module's hash buffer on the CPU; recomputed the module's way when it is still on the meta
    device (a model built with empty weights whose buffers were never loaded)."""
    b = getattr(module, name)
    if b.device.type != "meta":
        return b.detach().to("cpu", torch.long)
    if name == "layer_multipliers":
        return _qwen4._build_layer_multipliers(
            module.unigram_vocab_size, module.ngram_size, module.ple_layer_index, module.seed
        )
    vals = module.head_vocab_sizes if name == "ngram_heads_vocab_sizes" else module.head_offsets
    return torch.tensor(vals, dtype=torch.long)


def _module_dtype(module: Any, model: Any) -> "torch.dtype":
    """The module's output dtype: its weight's, or the model's for a weight never materialised."""
    w = module.ngram_embedding.weight
    if w.device.type != "meta" and w.is_floating_point():
        return w.dtype
    return getattr(model, "dtype", None) or torch.float32


def _module_device(module: Any, model: Any) -> "torch.device":
    """Where the module's output goes: its weight's device, or the model's first materialised
    parameter's for a weight never materialised."""
    w = module.ngram_embedding.weight
    if w.device.type != "meta":
        return w.device
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


def _crt(residues: List[int], moduli: List[int]) -> Tuple[int, int]:
    """x mod prod(moduli) with x = residues[i] mod moduli[i] (pairwise coprime: the head sizes are
    distinct primes)."""
    x, m = 0, 1
    for r, p in zip(residues, moduli):
        x += m * ((r - x) * pow(m, -1, p) % p)
        m *= p
    return x, m


def table_hash_params(table: Table) -> Dict[str, Any]:
    """The hash parameters the table computes with, read back through `ngram_ids`: probes at
    position k with stateless context give the head offsets (all-zero window), and each
    multiplier modulo every head size (one 1 in the window); the multipliers follow by the
    Chinese remainder theorem over the head sizes (exact when their product exceeds 2**63).

    Parameters
    ----------
    table : Table
        The open table.

    Returns
    -------
    dict
        ``ngram_heads_offsets``, ``ngram_heads_vocab_sizes``, ``layer_multipliers`` (an int, or
        ``"x (mod m)"`` where the head sizes do not pin it down), and the residues behind them;
        of any geometry the table has.
    """
    i = table.info
    k = i.ngram_size - 1
    hpn = i.heads_per_ngram
    # probe 0: all zero; probe 1: the token 1; probe 1 + j: context token j (ctx_j, j back) 1
    probes = [[0] * (k + 1) for _ in range(k + 2)]  # (token, ctx1, ..., ctxk)
    for j in range(1, k + 2):
        probes[j][j - 1] = 1
    toks = [p[0] for p in probes]
    ctx = [c for p in probes for c in reversed(p[1:])]  # oldest first
    ids = table.ngram_ids(toks, [k] * len(probes), request_ids=range(len(probes)),
                          query_start=range(len(probes) + 1), context=ctx).astype(object)  # fmt: skip
    offsets = [int(x) for x in ids[0]]
    sizes = [offsets[h + 1] - offsets[h] for h in range(len(offsets) - 1)] + [i.addressed_rows - offsets[-1]]
    res = [[int(ids[j][h]) - offsets[h] for h in range(len(offsets))] for j in range(1, k + 2)]
    # the token's multiplier reaches every head; ctx_j's the heads of orders j - 1 and up
    heads = [range(len(sizes))] + [range((j - 1) * hpn, len(sizes)) for j in range(1, k + 1)]
    mults = []
    for r, hs in zip(res, heads):
        x, m = _crt([r[h] for h in hs], [sizes[h] for h in hs])
        mults.append(x if m > 2**63 else f"{x} (mod {m})")
    return {
        "ngram_heads_offsets": offsets,
        "ngram_heads_vocab_sizes": sizes,
        "layer_multipliers": mults,
        "_residues": res,  # per multiplier, its residue modulo every head's size
        "_heads": heads,  # the heads whose residues say something about it
    }


def validate(table: Table, module: Any, name: str = "n-gram module") -> None:
    """Checks that the table serves the module: its shape and its hash parameters.

    Parameters
    ----------
    table : Table
        The open table.
    module : Qwen4ExpTextNGramEmbedding
        The model's n-gram module.
    name : str, default "n-gram module"
        The module's name in messages.

    Raises
    ------
    ValueError
        Naming the first field where the table and the module disagree, with both values.
    """
    i = table.info
    emb = module.ngram_embedding
    want = [
        ("vocab_size", i.vocab_size, module.unigram_vocab_size),
        ("eos_token_id", i.eos_token_id, int(module.eos_token_id)),
        ("ngram_size", i.ngram_size, module.ngram_size),
        ("num_heads", i.num_heads, module.ngram_heads),
        ("head_dim", i.head_dim, emb.embedding_dim),
        ("ple_embed_dim", i.embed_dim, module.ngram_heads * emb.embedding_dim),
        ("ple_layer_index", i.ple_layer_index, int(module.ple_layer_index)),
    ]
    for field, tv, mv in want:
        if tv != mv:
            raise ValueError(f"{table.path}: {field} differs: table {tv}, model ({name}) {mv}")
    got = table_hash_params(table)
    sizes = [int(x) for x in _buffer_values(module, "ngram_heads_vocab_sizes")]
    offsets = [int(x) for x in _buffer_values(module, "ngram_heads_offsets")]
    for field, mv in (("ngram_heads_vocab_sizes", sizes), ("ngram_heads_offsets", offsets)):
        if got[field] != mv:
            raise ValueError(f"{table.path}: {field} differ: table {got[field]}, model ({name}) {mv}")
    mults = [int(x) for x in _buffer_values(module, "layer_multipliers")]
    for j, (m, r, hs) in enumerate(zip(mults, got["_residues"], got["_heads"])):
        if any(m % sizes[h] != r[h] for h in hs):
            raise ValueError(
                f"{table.path}: layer_multipliers differ (hash seed or ple_layer_index): table "
                f"{got['layer_multipliers']}, model ({name}) {mults} (first at index {j})"
            )
    if i.total_rows != emb.num_embeddings:  # the same heads, other padding
        raise ValueError(
            f"{table.path}: total_rows differs: table {i.total_rows}, model ({name}) {emb.num_embeddings}"
        )


def _ngram_modules(model: Any) -> List[Tuple[str, Any]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, NGramEmbedding)]


def _layer_tables(table_dir: str, found: List[Tuple[str, Any]]) -> List[Tuple[str, Any, str]]:
    """``(name, module, table directory)`` for each n-gram module: `table_dir` itself when it holds
    one table (a model with one PLE layer), else the directory its ``layers.json`` gives the
    module's ``ple_layer_index`` (docs/FORMAT.md, "Several PLE layers")."""
    index_path = os.path.join(table_dir, LAYERS_FILE)
    if not os.path.exists(index_path):
        if len(found) > 1:
            raise ValueError(
                f"ple_layer_ids: the model has {len(found)} PLE layers ({', '.join(n for n, _ in found)}), but "
                f"{table_dir} holds no {LAYERS_FILE} (one table per PLE layer: `ple pack CHECKPOINT DIR`)"
            )
        return [(found[0][0], found[0][1], table_dir)]
    with open(index_path) as f:
        index = json.load(f)
    dirs = {int(e["ple_layer_index"]): os.path.join(table_dir, e["dir"]) for e in index["layers"]}
    out = []
    for name, module in found:
        k = int(module.ple_layer_index)
        if k not in dirs:
            raise ValueError(
                f"{table_dir}: ple_layer_index differs: no table for ple_layer_index {k} ({name}); "
                f"{LAYERS_FILE} lists {sorted(dirs)}"
            )
        out.append((name, module, dirs[k]))
    return out


def offload(model: Any, table_dir: PathLike, **table_options: Any) -> Any:
    """Replaces each of the model's ``Qwen4ExpTextNGramEmbedding`` modules (one per PLE layer)
    with an `OffloadedNGramEmbedding` reading its layer's table. Every table is validated against
    its module first; on a mismatch the model is left unchanged.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A Qwen4Exp model holding one n-gram module per PLE layer.
    table_dir : str or os.PathLike
        The packed table (a model with one PLE layer), or the directory `ple pack` writes for a
        checkpoint with several: ``layer-K/`` per layer and ``layers.json``, each module served by
        the table of its ``ple_layer_index``.
    **table_options
        `ple.Table` options (`TableOptions`), for every layer's table; ``cuda_device`` defaults
        to the module's CUDA device, if any.

    Returns
    -------
    transformers.PreTrainedModel
        `model`, changed in place.

    Raises
    ------
    ValueError
        The model holds no n-gram module, `table_dir` has no table for one of its PLE layers, or a
        table differs from its module (the message names the field and both values).
    PleError
        A table does not open (`PleNotFoundError`, `PleFormatError`, ...).
    """
    found = _ngram_modules(model)
    if not found:
        raise ValueError(f"{type(model).__name__} holds no Qwen4ExpTextNGramEmbedding: nothing to offload")
    served: List[Tuple[str, Any, Table, Dict[str, Any]]] = []
    try:
        for name, module, path in _layer_tables(os.fspath(table_dir), found):
            opts = dict(table_options)
            dev = _module_device(module, model)
            if "cuda_device" not in opts and dev.type == "cuda":
                opts["cuda_device"] = dev.index or 0
            table = Table(path, **opts)
            served.append((name, module, table, opts))
            validate(table, module, name)
    except BaseException:
        for _, _, table, _ in served:
            table.close()
        raise
    for name, module, table, opts in served:
        new = OffloadedNGramEmbedding(module, table, _module_dtype(module, model), int(opts.get("cuda_device", -1)))
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
        earlier = _first_decoder_layer_before(model, name)
        if earlier is not None:
            new._prefetch_hook = earlier.register_forward_pre_hook(
                lambda _m, _args, kw, new=new: new.prefetch(kw.get("ple_input_ids"), kw.get("past_key_values")),
                with_kwargs=True,
            )
    return model


def _first_decoder_layer_before(model: Any, name: str) -> Any:
    """The first decoder layer when the module sits in a later one (`...layers.{i}...`, i > 0),
    else None. Its forward gets `ple_input_ids` and `past_key_values` by keyword."""
    parts = name.split(".")
    for j in range(1, len(parts)):
        if parts[j].isdigit() and int(parts[j]) > 0:
            layers = model.get_submodule(".".join(parts[:j]))
            if isinstance(layers, torch.nn.ModuleList):
                return layers[0]
    return None


class _WeightNotLoaded(torch.nn.Module):
    """Stands in for a ``Qwen4ExpTextNGramEmbedding``'s ``ngram_embedding`` while transformers
    loads the rest of the model: its shape, and no parameter (so the loader expects no weight,
    leaves the checkpoint's shards unread, and initialises nothing)."""

    def __init__(self, emb: "torch.nn.Embedding"):
        super().__init__()
        self.num_embeddings, self.embedding_dim = emb.num_embeddings, emb.embedding_dim
        self.weight = torch.empty((emb.num_embeddings, emb.embedding_dim), device="meta", dtype=emb.weight.dtype)

    def forward(self, *_: Any) -> None:
        raise RuntimeError("the n-gram weight was not loaded: this model's n-gram table is served by ple.transformers")


# checkpoint tensors of the n-gram weight: the shards, their block and global scales (NVFP4
# `shard_{i}.weight_scale[_2]`), an FP8 checkpoint's `weight_scale`
_SHARD_KEYS = r"ngram_embedding\.(weight\w*|shard_\d+\.\w+)$"


def _without_ngram_weight(cls: Any) -> Any:  # a transformers model class (Any to mypy)
    """A subclass of `cls` whose instances swap each n-gram module's ``nn.Embedding`` for a
    `_WeightNotLoaded` right after construction (on the meta device, inside from_pretrained),
    and ignore the checkpoint's n-gram tensors."""

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, config, *args, **kwargs)
        for _, m in _ngram_modules(self):
            m.ngram_embedding = _WeightNotLoaded(m.ngram_embedding)

    ignore = list(getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or []) + [_SHARD_KEYS]
    attrs = {"__init__": __init__, "_keys_to_ignore_on_load_unexpected": ignore, "__module__": cls.__module__}
    return type(cls.__name__, (cls,), attrs)


def _progress_bar() -> Any:
    """A tqdm bar for `pack`'s progress, opened at the first call that shows bytes still to
    write: a table `pack` reuses (one call, all written) shows none."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    bar: List[Any] = []

    def cb(done: int, total: int) -> None:
        if not bar:
            if done >= total:
                return
            bar.append(tqdm(total=total, unit="B", unit_scale=True, desc="ple pack"))
        if bar[0].total != total:
            bar[0].total = total
        bar[0].update(done - bar[0].n)

    def close() -> None:
        if bar:
            bar[0].close()

    cb.close = close  # type: ignore[attr-defined]
    return cb


def from_pretrained(
    checkpoint_dir: PathLike,
    table_dir: Optional[PathLike] = None,
    *,
    model_class: Any = None,
    table_options: Optional[Dict[str, Any]] = None,
    progress: bool = True,
    **kwargs: Any,
) -> Any:
    """Loads a Qwen4Exp checkpoint with transformers without the n-gram weight, packs its n-gram
    table when `table_dir` holds no table of this checkpoint yet, and offloads (`offload`).

    The model is built by transformers on the meta device as usual; each n-gram module's
    ``nn.Embedding`` is replaced before loading by a stand-in without parameters, and the
    checkpoint's ``ngram_embedding.shard_*`` tensors are ignored keys, so they are never read.
    The table is opened with ``checkpoint_dir`` set, so a table packed from another checkpoint
    is refused. ``save_pretrained`` of a float32 or bfloat16 model writes the weight as F32 or
    BF16 row shards: they pack exactly, as row format ``f32`` or ``bf16``.

    Parameters
    ----------
    checkpoint_dir : str or os.PathLike
        The checkpoint (a local directory).
    table_dir : str or os.PathLike, optional
        Where the table is (or is packed to; one table per PLE layer, ``layer-K/``, for a
        checkpoint with several); default ``<checkpoint_dir>/ple-table``.
    model_class : type, optional
        The model class; default the one ``AutoModelForCausalLM`` picks for the config.
    table_options : dict, optional
        `ple.Table` options (`TableOptions`).
    progress : bool, default True
        A progress bar while it packs (none when the table is already there: ``ple_pack``
        checks it against the checkpoint and reuses it without writing).
    **kwargs
        Passed to the class's ``from_pretrained`` (``dtype``, ``device_map``, ...).

    Returns
    -------
    transformers.PreTrainedModel
        The model, its n-gram modules served by libple.

    Raises
    ------
    ValueError, PleError
        As in `offload`, and `ple.pack`'s errors.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    table_dir = os.path.join(checkpoint_dir, "ple-table") if table_dir is None else os.fspath(table_dir)
    if model_class is None:
        config = transformers.AutoConfig.from_pretrained(checkpoint_dir)
        model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    cb = _progress_bar() if progress else None
    try:
        pack(checkpoint_dir, table_dir, progress=cb)  # a table of this checkpoint already there is kept
    finally:
        if cb is not None:
            cb.close()
    model = _without_ngram_weight(model_class).from_pretrained(checkpoint_dir, **kwargs)
    model.__class__ = model_class
    opts = {"checkpoint_dir": checkpoint_dir, **(table_options or {})}
    return offload(model, table_dir, **opts)
