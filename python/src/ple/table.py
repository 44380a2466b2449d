"""`Table` (an open libple handle), `Step` (one submitted engine step) and `pack`."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays
from ._lib import (
    COUNTER_FIELDS,
    FORMATS,
    FUSE_ACCUMULATE,
    PLE_EMBED_DIM,
    PLE_NUM_HEADS,
    PREFETCH,
    PROGRESS_FN,
    RING_FULL,
    WAIT_MODE,
    IO_MODE,
    IO_BACKENDS,
    PleError,
    check,
    lib,
    ple_batch,
    ple_counters,
    ple_info,
    ple_options,
    ple_pack_options,
    ple_token_batch,
)

ArrayLike = Any  # numpy array, CPU torch tensor, anything with __dlpack__, or a sequence
PathLike = Union[str, "os.PathLike[str]"]


class _Handle:
    """Owns one `ple_handle`; closed when the last owner (the table, a packed_rows view) goes."""

    def __init__(self, ptr: int):
        self.ptr: Optional[int] = ptr

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            try:
                lib.ple_close(ptr)
            except Exception:  # interpreter shutdown: the module's globals may be gone
                pass


class Step:
    """One submitted engine step (`seq`, `num_tokens`); its methods are the table's for this seq."""

    def __init__(self, table: "Table", seq: int, num_tokens: int):
        self.table, self.seq, self.num_tokens = table, seq, num_tokens

    def wait(self, timeout_us: Optional[int] = None) -> None:
        self.table.wait(self, timeout_us)

    def packed_rows(self) -> np.ndarray:
        return self.table.packed_rows(self)

    def dequant_cpu(self, out: Any = None, *, dtype: Any = np.float32, accumulate: bool = False) -> Any:
        return self.table.dequant_cpu(self, out, dtype=dtype, accumulate=accumulate)

    def dequant_fuse(self, out: Any, stream: Any = None, *, dtype: Any = None, accumulate: bool = False) -> None:
        self.table.dequant_fuse(self, out, stream, dtype=dtype, accumulate=accumulate)

    def release(self) -> None:
        self.table.release_step(self)

    def __repr__(self) -> str:
        return f"Step(seq={self.seq}, num_tokens={self.num_tokens})"


def _seq(step: Union[Step, int]) -> int:
    return step.seq if isinstance(step, Step) else int(step)


_OPTION_ENUMS = {
    "prefetch_policy": PREFETCH,
    "ring_full_policy": RING_FULL,
    "wait_mode": WAIT_MODE,
    "io_mode": IO_MODE,
}
_PATH_OPTIONS = ("config_json_path", "checkpoint_dir")


class Table:
    """An open PLE table (`ple_open`); use as a context manager.

    Options are `ple_options` fields by name: `max_tokens_per_step`, `max_in_flight`,
    `num_threads`, `prefetch_policy` ("auto"/"always"/"never"), `prefetch_min_rows`,
    `ring_full_policy` ("wait"/"error"), `wait_timeout_us`, `history_window`, `cuda_device`,
    `wait_mode` ("auto"/"host"/"stream_op"/"spin_kernel"), `config_json_path`, `checkpoint_dir`,
    `cache_bytes` (default `PLE_CACHE_AUTO`, 2**64 - 1: a 256 MiB row cache for a DIRECT handle,
    none for MMAP; 0 = none; `info()["cache_bytes"]` says what the handle got), `io_mode`
    ("auto"/"mmap"/"direct"), `shard_count` and `shard_index` (a head shard for one of
    `shard_count` tensor/data-parallel ranks: the handle reads only heads
    `[info["shard_first_head"], + info["shard_heads"])`, `packed_rows` has that many rows per
    token, and `dequant_*` write -0.0 in the other heads' columns, so an all-reduce (sum) of every
    rank's output is the whole table's output bit for bit), `ahead_max_rows` (the bound of
    `prefetch_ahead`'s queue; 0 = the row cache's capacity), `resident_bytes_max` (MMAP: the
    most bytes of the table kept in the page cache; 0 = no cap).
    """

    def __init__(self, path: PathLike, **options: Any):
        o = ple_options()
        check(lib.ple_options_default(ctypes.byref(o)))
        keep = []
        for k, v in options.items():
            if k not in dict(ple_options._fields_) or k == "struct_size":
                raise TypeError(f"unknown option {k!r}")
            if k in _OPTION_ENUMS and isinstance(v, str):
                try:
                    v = _OPTION_ENUMS[k][v]
                except KeyError:
                    raise ValueError(f"{k} must be one of {sorted(_OPTION_ENUMS[k])}, got {v!r}") from None
            if k in _PATH_OPTIONS and v is not None:
                v = os.fsencode(v)
                keep.append(v)
            setattr(o, k, v)
        ptr = ctypes.c_void_p()
        check(lib.ple_open(os.fsencode(path), ctypes.byref(o), ctypes.byref(ptr)))
        self._h: Optional[_Handle] = _Handle(ptr.value)
        self._wait_timeout_us = int(o.wait_timeout_us)
        self.max_tokens_per_step = int(o.max_tokens_per_step)  # the options the handle was opened with
        self.max_in_flight = int(o.max_in_flight)
        self._last_seq = 0
        self.path = os.fspath(path)
        self.info = self._info()

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Closes the table. Live `packed_rows` views keep the handle open until they are gone."""
        self._h = None

    def __enter__(self) -> "Table":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def _ptr(self) -> int:
        if self._h is None:
            raise PleError(-5, "PLE_E_STATE", "the table is closed")
        return self._h.ptr  # type: ignore[return-value]

    # -- facts ------------------------------------------------------------------------------
    def _info(self) -> Dict[str, Any]:
        i = ple_info()
        i.struct_size = ctypes.sizeof(ple_info)
        check(lib.ple_table_info(self._ptr, ctypes.byref(i)))
        d = {f: getattr(i, f) for f, _ in ple_info._fields_ if f != "struct_size"}
        d["format"] = FORMATS.get(i.format, i.format)
        d["source_name"] = i.source_name.decode("utf-8", "replace")
        d["source_fingerprint"] = i.source_fingerprint.decode("ascii", "replace")
        d["device_wait_supported"] = bool(i.device_wait_supported)
        d["io_mode"] = {v: k for k, v in IO_MODE.items()}.get(i.io_mode, i.io_mode)
        d["io_backend"] = IO_BACKENDS.get(i.io_backend, i.io_backend)
        return d

    def stats(self) -> Dict[str, int]:
        """The handle's cumulative counters (`ple_stats`) by name; times are nanoseconds."""
        c = ple_counters()
        c.struct_size = ctypes.sizeof(ple_counters)
        check(lib.ple_stats(self._ptr, ctypes.byref(c)))
        return {f: getattr(c, f) for f in COUNTER_FIELDS}

    # -- batches ----------------------------------------------------------------------------
    def _batch(
        self,
        tokens: ArrayLike,
        positions: ArrayLike,
        request_ids: Optional[ArrayLike],
        query_start: Optional[ArrayLike],
        token_request_ids: Optional[ArrayLike],
        context: Optional[ArrayLike],
    ) -> tuple:
        toks = _arrays.host_input(tokens, np.int32, "tokens")
        pos = _arrays.host_input(positions, np.int32, "positions")
        n = toks.size
        if pos.size != n:
            raise ValueError(f"{n} tokens but {pos.size} positions")
        ctx = None if context is None else _arrays.host_input(context, np.int32, "context")
        keep = [toks, pos, ctx]
        cptr = None if ctx is None else ctx.ctypes.data
        if token_request_ids is not None:
            if request_ids is not None or query_start is not None:
                raise TypeError("pass token_request_ids, or request_ids with query_start, not both")
            tid = _arrays.host_input(token_request_ids, np.uint64, "token_request_ids")
            if tid.size != n:
                raise ValueError(f"{n} tokens but {tid.size} token_request_ids")
            keep.append(tid)
            b = ple_token_batch(ctypes.sizeof(ple_token_batch), toks.ctypes.data, pos.ctypes.data,
                                tid.ctypes.data, n, cptr)  # fmt: skip
            return b, keep, n
        if request_ids is None:
            request_ids = [0]
        rid = _arrays.host_input(request_ids, np.uint64, "request_ids")
        qs = _arrays.host_input([0, n] if query_start is None else query_start, np.uint32, "query_start")
        if qs.size != rid.size + 1:
            raise ValueError(f"{rid.size} requests need {rid.size + 1} query_start offsets, got {qs.size}")
        keep += [rid, qs]
        b = ple_batch(toks.ctypes.data, pos.ctypes.data, n, rid.ctypes.data, qs.ctypes.data,
                      rid.size, cptr)  # fmt: skip
        return b, keep, n

    def submit(
        self,
        tokens: ArrayLike,
        positions: ArrayLike,
        *,
        request_ids: Optional[ArrayLike] = None,
        query_start: Optional[ArrayLike] = None,
        token_request_ids: Optional[ArrayLike] = None,
        context: Optional[ArrayLike] = None,
        seq: Optional[int] = None,
    ) -> Step:
        """Submits one engine step and returns it (the work runs on libple's worker).

        Offsets form (vLLM `query_start_loc`, SGLang `extend_start_loc`): `request_ids`
        `[num_requests]` and `query_start` `[num_requests + 1]`; with neither, all tokens are one
        request with id 0. Per-token form (llama.cpp): `token_request_ids` `[num_tokens]`, tokens
        in any order, rows in that order. `context` (stateless mode): `[num_requests][ngram_size
        - 1]`, the tokens before each request's span; None = tracked mode. int32 (tokens,
        positions, context), uint64 (ids) and uint32 (query_start) C-contiguous inputs are read
        in place; others are converted. `seq` defaults to one more than the last submitted."""
        b, keep, n = self._batch(tokens, positions, request_ids, query_start, token_request_ids, context)
        s = self._last_seq + 1 if seq is None else int(seq)
        fn = lib.ple_submit_tokens if isinstance(b, ple_token_batch) else lib.ple_submit
        check(fn(self._ptr, ctypes.byref(b), s))
        del keep  # libple copied the batch
        self._last_seq = s
        return Step(self, s, n)

    def prefetch_ahead(
        self,
        tokens: ArrayLike,
        positions: ArrayLike,
        *,
        request_ids: Optional[ArrayLike] = None,
        query_start: Optional[ArrayLike] = None,
        token_request_ids: Optional[ArrayLike] = None,
        context: Optional[ArrayLike] = None,
    ) -> None:
        """Reads the rows of tokens known ahead of their step in the background
        (`ple_prefetch_ahead`): a prompt's later chunks at request admission, the drafts of the
        next verify step. Same arguments as `submit` (no `seq`: nothing is submitted); returns at
        once, changes no tracked history, may be longer than `max_tokens_per_step`. Counted in
        `stats()["ahead_*"]`."""
        b, keep, _ = self._batch(tokens, positions, request_ids, query_start, token_request_ids, context)
        fn = lib.ple_prefetch_ahead_tokens if isinstance(b, ple_token_batch) else lib.ple_prefetch_ahead
        check(fn(self._ptr, ctypes.byref(b)))
        del keep  # libple hashed the batch during the call

    def ngram_ids(
        self,
        tokens: ArrayLike,
        positions: ArrayLike,
        *,
        request_ids: Optional[ArrayLike] = None,
        query_start: Optional[ArrayLike] = None,
        token_request_ids: Optional[ArrayLike] = None,
        context: Optional[ArrayLike] = None,
    ) -> np.ndarray:
        """The 16 row ids of every token, `[num_tokens, 16]` int64 (arguments as `submit`); no
        side effects: tracked history is read, not changed."""
        b, keep, n = self._batch(tokens, positions, request_ids, query_start, token_request_ids, context)
        out = np.empty((n, PLE_NUM_HEADS), np.int64)
        fn = lib.ple_ngram_ids_tokens if isinstance(b, ple_token_batch) else lib.ple_ngram_ids
        check(fn(self._ptr, ctypes.byref(b), out.ctypes.data))
        return out

    def release_request(self, request_id: int) -> None:
        """Forgets a request's tracked history (unknown ids are fine)."""
        check(lib.ple_release_request(self._ptr, request_id))

    # -- steps ------------------------------------------------------------------------------
    def wait(self, step: Union[Step, int], timeout_us: Optional[int] = None) -> None:
        """Blocks until the step is complete. `timeout_us`: None = the handle's
        `wait_timeout_us`, 0 = poll (PLE_E_TIMEOUT at once if not done), 2**64 - 1 = forever."""
        t = self._wait_timeout_us if timeout_us is None else timeout_us
        check(lib.ple_wait(self._ptr, _seq(step), t))

    def packed_rows(self, step: Union[Step, int]) -> np.ndarray:
        """A read-only numpy view `[num_tokens, heads, row_bytes]` uint8 of the step's staged rows
        (waits for the step; `heads` is 16, or a head shard's `info["shard_heads"]`). Valid until the step is consumed (`dequant_*`, `release_step`):
        after that libple may reuse the memory for a later step. The view keeps the handle open."""
        rows = ctypes.POINTER(ctypes.c_uint8)()
        n = ctypes.c_uint32()
        check(lib.ple_packed_rows(self._ptr, _seq(step), ctypes.byref(rows), ctypes.byref(n)))
        rb = self.info["row_bytes"]
        heads = self.info["shard_heads"]
        size = n.value * heads * rb
        if size == 0:
            return np.empty((0, heads, rb), np.uint8)
        buf = (ctypes.c_uint8 * size).from_address(ctypes.addressof(rows.contents))
        buf.handle = self._h  # the staging memory lives as long as the handle
        a = np.frombuffer(buf, np.uint8).reshape(n.value, heads, rb)
        a.flags.writeable = False
        return a

    def release_step(self, step: Union[Step, int]) -> None:
        """Releases the step's staging slot without dequantising it."""
        check(lib.ple_release_step(self._ptr, _seq(step)))

    def dequant_cpu(
        self, step: Union[Step, int], out: Any = None, *, dtype: Any = np.float32, accumulate: bool = False
    ) -> Any:
        """Dequantises the step's rows into host `out` (`[>= num_tokens, >= 2560]` or flat, numpy
        or CPU torch; float32/float16/bfloat16, rows contiguous, any row stride) and releases the
        step. With `out` None, returns a new `[num_tokens, 2560]` array of `dtype` (float32, or
        float16). `accumulate` adds into `out`."""
        n = step.num_tokens if isinstance(step, Step) else None
        if out is None:
            if n is None:
                raise TypeError("pass out= when the step is given by seq")
            out = np.zeros((n, PLE_EMBED_DIM), dtype)
        d = _arrays.host_output(out)
        if n is not None and d.rows < n:
            raise ValueError(f"out holds {d.rows} rows, the step has {n} tokens")
        flags = FUSE_ACCUMULATE if accumulate else 0
        check(lib.ple_dequant_cpu(self._ptr, _seq(step), d.ptr, d.dtype, d.stride, flags))
        return out

    def dequant_fuse(
        self,
        step: Union[Step, int],
        out: Any,
        stream: Any = None,
        *,
        dtype: Any = None,
        accumulate: bool = False,
    ) -> None:
        """Enqueues the step's dequantisation into device `out` (a torch CUDA tensor or anything
        with ``__cuda_array_interface__``) on `stream` (`torch.cuda.current_stream()`, a CuPy
        stream, a raw `cudaStream_t` int, or None for the default stream). Needs a handle opened
        with `cuda_device >= 0`. `dtype` names the element type where the interface cannot
        (bfloat16)."""
        d = _arrays.device_output(out, dtype)
        if isinstance(step, Step) and d.rows < step.num_tokens:
            raise ValueError(f"out holds {d.rows} rows, the step has {step.num_tokens} tokens")
        flags = FUSE_ACCUMULATE if accumulate else 0
        s = _arrays.stream_handle(stream)
        check(lib.ple_dequant_fuse(self._ptr, s, _seq(step), d.ptr, d.dtype, d.stride, flags))

    def __repr__(self) -> str:
        state = "closed" if self._h is None else "open"
        return f"Table({self.path!r}, {self.info['format']}, {state})"


def pack(
    checkpoint_dir: PathLike,
    out_dir: PathLike,
    *,
    force: bool = False,
    buffer_bytes: Optional[int] = None,
    progress: Optional[Callable[[int, int], Any]] = None,
    shard: Optional[Tuple[int, int]] = None,
) -> None:
    """Packs a checkpoint's PLE tensors into a table (`ple_pack`). `progress(done_bytes,
    total_bytes)` is called as it goes; an exception raised in it cancels the pack (no table is
    left behind) and is re-raised here. `shard=(K, N)` writes a shard table holding only head
    shard K of N's rows (open it with `Table(out_dir, shard_count=N, shard_index=K)`)."""
    o = ple_pack_options()
    check(lib.ple_pack_options_default(ctypes.byref(o)))
    o.force = int(bool(force))
    if shard is not None:
        o.shard_index, o.shard_count = (int(x) for x in shard)
    if buffer_bytes is not None:
        o.buffer_bytes = buffer_bytes
    raised: list = []

    def cb(done: int, total: int, _user: Any) -> int:
        try:
            progress(done, total)  # type: ignore[misc]
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised after libple returns
            raised.append(e)
            return 1

    fn = PROGRESS_FN(cb) if progress is not None else PROGRESS_FN()
    status = lib.ple_pack(os.fsencode(checkpoint_dir), os.fsencode(out_dir), ctypes.byref(o), fn, None)
    if raised:
        raise raised[0]
    check(status)


def version() -> str:
    """libple's version string."""
    return lib.ple_version_string().decode()


def batch_from_requests(spans: Sequence[tuple]) -> Dict[str, np.ndarray]:
    """Offsets-form arrays from `(request_id, first_position, tokens)` spans, for `submit(**...)`."""
    toks, pos, ids, qs = [], [], [], [0]
    for rid, p, t in spans:
        t = list(t)
        ids.append(rid)
        toks += t
        pos += range(p, p + len(t))
        qs.append(len(toks))
    return {
        "tokens": np.asarray(toks, np.int32),
        "positions": np.asarray(pos, np.int32),
        "request_ids": np.asarray(ids, np.uint64),
        "query_start": np.asarray(qs, np.uint32),
    }
