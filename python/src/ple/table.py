"""`Table`: an open libple handle, its steps, and their dequantisation."""

from __future__ import annotations

import ctypes
import os
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Type, TypeVar, Union, overload

import numpy as np
import numpy.typing as npt

from . import _arrays
from ._errors import PleStateError, Status, invalid_argument
from ._facts import Counters, TableInfo, field_names
from ._lib import (
    COUNTER_FIELDS,
    FORMATS,
    FUSE_ACCUMULATE,
    IO_BACKENDS,
    IO_MODE,
    PREFETCH,
    RING_FULL,
    WAIT_MODE,
    check,
    lib,
    ple_batch,
    ple_counters,
    ple_info,
    ple_options,
    ple_token_batch,
)
from ._types import ArrayLike, DeviceOutput, HostOutput, PathLike, StreamLike, TableOptions
from .step import Step

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

O = TypeVar("O", bound=HostOutput)
StepRef = Union[Step, int]  # a step, or its seq
_Batch = Tuple[Union[ple_batch, ple_token_batch], List[Optional[np.ndarray]], int]


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


U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1


def _seq(step: StepRef) -> int:
    return step.seq if isinstance(step, Step) else _arrays.host_int(step, "seq", 0, U64_MAX)


_OPTION_ENUMS: Dict[str, Dict[str, int]] = {
    "prefetch_policy": PREFETCH,
    "ring_full_policy": RING_FULL,
    "wait_mode": WAIT_MODE,
    "io_mode": IO_MODE,
}
_PATH_OPTIONS = ("config_json_path", "checkpoint_dir")
_OPTION_NAMES = {name for name, *_ in ple_options._fields_} - {"struct_size"}
_INT_RANGE = {
    ctypes.c_int32: (-(2**31), 2**31 - 1),
    ctypes.c_uint32: (0, 2**32 - 1),
    ctypes.c_uint64: (0, 2**64 - 1),
}
# the integer fields of `ple_options` and the range of each one's C type
_INT_OPTIONS = {f[0]: _INT_RANGE[f[1]] for f in ple_options._fields_ if f[1] in _INT_RANGE}


class Table:
    """An open PLE table (``ple_open``); a context manager that closes it.

    Parameters
    ----------
    path : str or os.PathLike
        The table directory (``ple pack``'s output).
    **options
        ``ple_options`` fields by name (`TableOptions`; ``ple.h`` documents each), the rest keep
        their defaults: ``max_tokens_per_step``, ``max_in_flight``, ``num_threads``,
        ``prefetch_policy`` ("auto"/"always"/"never"), ``prefetch_min_rows``,
        ``ring_full_policy`` ("wait"/"error"), ``wait_timeout_us``, ``history_window``,
        ``cuda_device``, ``wait_mode`` ("auto"/"host"/"stream_op"/"spin_kernel"),
        ``config_json_path``, ``checkpoint_dir``, ``cache_bytes`` (default `PLE_CACHE_AUTO`: a
        256 MiB row cache for a DIRECT handle, none for MMAP; 0 = none; ``info.cache_bytes``
        says what the handle got), ``io_mode`` ("auto"/"mmap"/"direct"), ``shard_count`` and
        ``shard_index`` (a head shard for one of ``shard_count`` tensor/data-parallel ranks: the
        handle reads only heads ``shard_index, shard_index + shard_count, ...`` (round-robin:
        ``info.shard_first_head + j * info.shard_head_stride`` for ``j < info.shard_heads``),
        `packed_rows` has that many rows per token, and ``dequant_*`` write -0.0 in the other
        heads' columns, so an all-reduce (sum) of every rank's output is the whole table's
        output bit for bit), ``ahead_max_rows`` (the bound of `prefetch_ahead`'s queue; 0 = the
        row cache's capacity), ``resident_bytes_max`` (MMAP: the most bytes of the table kept
        in the page cache; 0 = no cap), ``sigbus_handler`` (1, the default: MMAP mode may
        install libple's SIGBUS handler; 0: none is installed, the handle runs DIRECT and MMAP is
        refused).

    Raises
    ------
    TypeError
        An unknown option.
    ValueError
        An enum-valued option that is none of its names.
    PleNotFoundError
        `path` does not exist.
    PleError
        libple refused to open it (`PleFormatError`, `PleInvalidArgumentError`, ...).

    Attributes
    ----------
    path : str
        The table directory.
    info : TableInfo
        Facts about the table and the handle (``ple_table_info``).
    max_tokens_per_step, max_in_flight : int
        The options the handle was opened with.
    """

    def __init__(self, path: PathLike, **options: "Unpack[TableOptions]"):
        o = ple_options()
        check(lib.ple_options_default(ctypes.byref(o)))
        keep = []
        for k, v in options.items():
            if k not in _OPTION_NAMES:
                raise TypeError(f"unknown option {k!r}")
            if k in _OPTION_ENUMS and isinstance(v, str):
                try:
                    v = _OPTION_ENUMS[k][v]
                except KeyError:
                    raise ValueError(f"{k} must be one of {sorted(_OPTION_ENUMS[k])}, got {v!r}") from None
            if k in _PATH_OPTIONS and v is not None:
                v = os.fsencode(v)  # type: ignore[arg-type]
                keep.append(v)
            elif k in _INT_OPTIONS:  # ctypes would wrap an out-of-range int silently
                lo, hi = _INT_OPTIONS[k]
                v = _arrays.host_int(v, k, lo, hi)
            setattr(o, k, v)
        ptr = ctypes.c_void_p()
        self.path = os.fspath(path)
        check(lib.ple_open(os.fsencode(path), ctypes.byref(o), ctypes.byref(ptr)), self.path)
        assert ptr.value is not None  # PLE_OK sets the handle
        self._h: Optional[_Handle] = _Handle(ptr.value)
        self._wait_timeout_us = int(o.wait_timeout_us)
        self.max_tokens_per_step = int(o.max_tokens_per_step)
        self.max_in_flight = int(o.max_in_flight)
        self._last_seq = 0
        # the steps submitted through this table and not consumed yet: seq -> num_tokens
        self._live: Dict[int, int] = {}
        # the seqs of live steps whose `Step` was garbage-collected: released before the next submit
        self._orphans: List[int] = []
        # graph_prepare's base_seq: steps from it on are consumed by graph replays, not by a `Step`
        self._graph_base: Optional[int] = None
        self.info: TableInfo = self._info()

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Closes the table (a second close is a no-op): every step not consumed is released with
        the handle. Live `packed_rows` views keep the handle open until they are gone."""
        self._h = None
        self._live.clear()
        self._orphans.clear()

    def _consumed(self, step: StepRef) -> None:
        seq = _seq(step)
        self._live.pop(seq, None)
        if isinstance(step, Step):
            step.consumed = True

    def _orphan(self, seq: int) -> None:
        """`Step.__del__`: a step nobody can reach any more is released before the next submit, so
        its ring slot never blocks one. Deferred rather than released here: a finaliser may run
        between another libple call and its read of the thread's last error message. Steps
        handed to graph replays (from `graph_prepare`'s base_seq on) are theirs to consume."""
        if self._h is None or seq not in self._live:
            return
        if self._graph_base is not None and seq >= self._graph_base:
            return
        self._orphans.append(seq)

    def _release_orphans(self) -> None:
        while self._orphans:
            seq = self._orphans.pop()
            if self._live.pop(seq, None) is not None:
                # PLE_E_STATE (released meanwhile) or the step's own failure: nobody is left to tell
                lib.ple_release_step(self._ptr, seq)

    @property
    def closed(self) -> bool:
        """True once `close` was called (or the ``with`` block ended)."""
        return self._h is None

    def __enter__(self) -> "Table":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    @property
    def _ptr(self) -> int:
        h = self._h
        if h is None or h.ptr is None:
            raise PleStateError(Status.STATE, Status.STATE.c_name, "the table is closed")
        return h.ptr

    # -- facts ------------------------------------------------------------------------------
    def _info(self) -> TableInfo:
        i = ple_info()
        i.struct_size = ctypes.sizeof(ple_info)
        check(lib.ple_table_info(self._ptr, ctypes.byref(i)))
        d = {f: getattr(i, f) for f in field_names(TableInfo)}
        d["format"] = FORMATS.get(i.format, i.format)
        d["source_name"] = i.source_name.decode("utf-8", "replace")
        d["source_fingerprint"] = i.source_fingerprint.decode("ascii", "replace")
        d["device_wait_supported"] = bool(i.device_wait_supported)
        d["io_mode"] = {v: k for k, v in IO_MODE.items()}.get(i.io_mode, i.io_mode)
        d["io_backend"] = IO_BACKENDS.get(i.io_backend, i.io_backend)
        return TableInfo(**d)

    def stats(self, *, residency: bool = False) -> Counters:
        """The handle's cumulative counters (``ple_stats``): cheap enough to read every step.

        Parameters
        ----------
        residency : bool
            Also measure the table's page-cache residency (``resident_pages``, a mincore pass
            whose time grows with the table) and ``mem_available_bytes``
            (``ple_stats_residency``); without it both are 0.

        Returns
        -------
        Counters
            One int per ``ple_counters`` field (also readable as a mapping by name); times are
            nanoseconds.

        Raises
        ------
        PleStateError
            The table is closed.
        """
        c = ple_counters()
        c.struct_size = ctypes.sizeof(ple_counters)
        check((lib.ple_stats_residency if residency else lib.ple_stats)(self._ptr, ctypes.byref(c)))
        return Counters(**{f: int(getattr(c, f)) for f in COUNTER_FIELDS})

    # -- batches ----------------------------------------------------------------------------
    def _batch(
        self,
        tokens: ArrayLike,
        positions: ArrayLike,
        request_ids: Optional[ArrayLike],
        query_start: Optional[ArrayLike],
        token_request_ids: Optional[ArrayLike],
        context: Optional[ArrayLike],
    ) -> _Batch:
        toks = _arrays.host_input(tokens, np.int32, "tokens")
        pos = _arrays.host_input(positions, np.int32, "positions")
        n = toks.size
        if pos.size != n:
            raise invalid_argument(f"{n} tokens but {pos.size} positions")
        ctx = None if context is None else _arrays.host_input(context, np.int32, "context", max_ndim=2)
        keep = [toks, pos, ctx]
        cptr = None if ctx is None else ctx.ctypes.data
        if token_request_ids is not None:
            if request_ids is not None or query_start is not None:
                raise TypeError("pass token_request_ids, or request_ids with query_start, not both")
            tid = _arrays.host_input(token_request_ids, np.uint64, "token_request_ids")
            if tid.size != n:
                raise invalid_argument(f"{n} tokens but {tid.size} token_request_ids")
            self._check_context(ctx, np.unique(tid).size)
            keep.append(tid)
            tb = ple_token_batch(ctypes.sizeof(ple_token_batch), toks.ctypes.data, pos.ctypes.data,
                                 tid.ctypes.data, n, cptr)  # fmt: skip
            return tb, keep, n
        if request_ids is None:
            request_ids = [0]
        rid = _arrays.host_input(request_ids, np.uint64, "request_ids")
        qs = _arrays.host_input([0, n] if query_start is None else query_start, np.uint32, "query_start")
        if qs.size != rid.size + 1:
            raise invalid_argument(f"{rid.size} requests need {rid.size + 1} query_start offsets, got {qs.size}")
        self._check_context(ctx, rid.size)
        keep += [rid, qs]
        b = ple_batch(toks.ctypes.data, pos.ctypes.data, n, rid.ctypes.data, qs.ctypes.data,
                      rid.size, cptr)  # fmt: skip
        return b, keep, n

    def _check_context(self, ctx: Optional[np.ndarray], num_requests: int) -> None:
        """Stateless mode: libple reads ``num_requests × (ngram_size - 1)`` context tokens."""
        if ctx is None:
            return
        want = num_requests * (self.info.ngram_size - 1)
        if ctx.size != want:
            raise invalid_argument(
                f"context holds {ctx.size} tokens; {num_requests} requests need {want} "
                f"({self.info.ngram_size - 1} each)"
            )

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
        """Submits one engine step (``ple_submit``); the work runs on libple's worker.

        Inputs are integer arrays (numpy, CPU tensors, sequences of ints) whose values fit their
        C types: int32 (tokens, positions, context), uint64 (ids), uint32 (query_start). Such
        arrays, C-contiguous and of exactly those dtypes, are read in place; others are copied,
        never with a value changed: a float, a value out of range (a negative request id, a token
        past 2**31) or a wrong rank raises `PleInvalidArgumentError`.

        A `Step` garbage-collected before it was consumed is released before the next submit:
        keep it (or a `packed_rows` view of it) while its rows are wanted.

        Parameters
        ----------
        tokens, positions : array_like
            ``[num_tokens]`` token ids and their positions in their requests.
        request_ids, query_start : array_like, optional
            Offsets form (vLLM ``query_start_loc``, SGLang ``extend_start_loc``):
            ``[num_requests]`` ids and ``[num_requests + 1]`` offsets into `tokens`. With neither
            (and no `token_request_ids`), all tokens are one request with id 0.
        token_request_ids : array_like, optional
            Per-token form (llama.cpp): ``[num_tokens]`` ids, tokens in any order, rows in that
            order. Not with the offsets form.
        context : array_like, optional
            Stateless mode: ``[num_requests][ngram_size - 1]``, the tokens before each request's
            span. None: tracked mode (libple remembers each request's last tokens).
        seq : int, optional
            The step's sequence number; default one more than the last submitted.

        Returns
        -------
        Step
            The submitted step.

        Raises
        ------
        PleInvalidArgumentError
            Inputs that are not integer arrays of the right rank, values that do not fit their C
            type, arrays of mismatched lengths (each named, with the index and the value), or a
            batch libple refuses (a token outside the vocabulary, a position repeated, ...).
        TypeError
            Both batch forms at once.
        PleStateError
            A full ring under ``ring_full_policy="error"``, a `seq` not above the last one
            submitted, or a closed table.
        PleTimeoutError
            A full ring that did not free a slot in ``wait_timeout_us``.
        """
        b, keep, n = self._batch(tokens, positions, request_ids, query_start, token_request_ids, context)
        s = self._last_seq + 1 if seq is None else _arrays.host_int(seq, "seq", 0, U64_MAX)
        self._release_orphans()
        if isinstance(b, ple_token_batch):
            check(lib.ple_submit_tokens(self._ptr, ctypes.byref(b), s))
        else:
            check(lib.ple_submit(self._ptr, ctypes.byref(b), s))
        del keep  # libple copied the batch
        self._last_seq = s
        self._live[s] = n
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
        (``ple_prefetch_ahead``): a prompt's later chunks at request admission, the drafts of the
        next verify step. Returns at once, changes no tracked history, may be longer than
        ``max_tokens_per_step``. Counted in ``stats().ahead_*``.

        Parameters
        ----------
        tokens, positions, request_ids, query_start, token_request_ids, context
            As in `submit` (no `seq`: nothing is submitted).

        Raises
        ------
        TypeError, ValueError, PleError
            As in `submit`.
        """
        b, keep, _ = self._batch(tokens, positions, request_ids, query_start, token_request_ids, context)
        if isinstance(b, ple_token_batch):
            check(lib.ple_prefetch_ahead_tokens(self._ptr, ctypes.byref(b)))
        else:
            check(lib.ple_prefetch_ahead(self._ptr, ctypes.byref(b)))
        del keep  # libple hashed the batch during the call

    def _ids(self, ids: ArrayLike) -> Tuple[np.ndarray, int]:
        """`ids` as a C-contiguous ``[num_tokens, num_heads]`` int64 array, and num_tokens."""
        a = _arrays.host_input(ids, np.int64, "ids", max_ndim=2)
        heads = self.info.num_heads
        if a.ndim != 2 or a.shape[1] != heads:
            raise invalid_argument(f"ids must be a [num_tokens, {heads}] array, got shape {a.shape}")
        if a.shape[0] > U32_MAX:
            raise invalid_argument(f"ids holds {a.shape[0]} tokens, more than {U32_MAX}")
        return a, int(a.shape[0])

    def submit_ids(self, ids: ArrayLike, *, prefill: bool = False, seq: Optional[int] = None) -> Step:
        """Submits one engine step given by the row ids the engine computed itself
        (``ple_submit_ids``), instead of tokens: the same rows, bit for bit, as a batch whose
        tokens hash to these ids, through the same cache, I/O and views. Tracked history is
        neither read nor changed.

        Parameters
        ----------
        ids : array_like
            ``[num_tokens, num_heads]`` whole-table row ids (as `ngram_ids` gives them), integers;
            head ``h``'s in its rows of the table's hash. 1 to ``max_tokens_per_step`` tokens.
        prefill : bool
            Count the step's rows as prefill rows (else decode rows).
        seq : int, optional
            As in `submit`.

        Returns
        -------
        Step
            The submitted step.

        Raises
        ------
        PleInvalidArgumentError
            Ids that are not integers of the right shape, or an id outside its head's rows
            (named with its token, head and value): nothing is read, no slot taken.
        PleStateError, PleTimeoutError
            As in `submit`.
        """
        a, n = self._ids(ids)
        s = self._last_seq + 1 if seq is None else _arrays.host_int(seq, "seq", 0, U64_MAX)
        self._release_orphans()
        check(lib.ple_submit_ids(self._ptr, a.ctypes.data, n, 1 if prefill else 0, s))
        self._last_seq = s
        self._live[s] = n
        return Step(self, s, n)

    def prefetch_ahead_ids(self, ids: ArrayLike) -> None:
        """Reads the rows of ``[num_tokens, num_heads]`` row ids known ahead of their step in the
        background (``ple_prefetch_ahead_ids``), as `prefetch_ahead` does for tokens; the ids are
        checked as `submit_ids` checks them.

        Parameters
        ----------
        ids : array_like
            As in `submit_ids` (any number of tokens).

        Raises
        ------
        PleInvalidArgumentError
            As in `submit_ids`.
        """
        a, n = self._ids(ids)
        check(lib.ple_prefetch_ahead_ids(self._ptr, a.ctypes.data, n))

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
        """The row ids of every token (``ple_ngram_ids``), without side effects: tracked history
        is read, not changed.

        Parameters
        ----------
        tokens, positions, request_ids, query_start, token_request_ids, context
            As in `submit`.

        Returns
        -------
        numpy.ndarray
            ``[num_tokens, info.num_heads]`` int64.

        Raises
        ------
        TypeError, ValueError, PleError
            As in `submit`.
        """
        b, keep, n = self._batch(tokens, positions, request_ids, query_start, token_request_ids, context)
        out = np.empty((n, self.info.num_heads), np.int64)
        if isinstance(b, ple_token_batch):
            check(lib.ple_ngram_ids_tokens(self._ptr, ctypes.byref(b), out.ctypes.data))
        else:
            check(lib.ple_ngram_ids(self._ptr, ctypes.byref(b), out.ctypes.data))
        return out

    def release_request(self, request_id: int) -> None:
        """Forgets a request's tracked history (``ple_release_request``; unknown ids are fine).

        Parameters
        ----------
        request_id : int
            The request's id.

        Raises
        ------
        PleStateError
            The table is closed.
        """
        check(lib.ple_release_request(self._ptr, _arrays.host_int(request_id, "request_id", 0, U64_MAX)))

    # -- steps ------------------------------------------------------------------------------
    def wait(self, step: StepRef, timeout_us: Optional[int] = None) -> None:
        """Blocks until the step is complete (``ple_wait``).

        Parameters
        ----------
        step : Step or int
            The step, or its seq.
        timeout_us : int, optional
            None: the handle's ``wait_timeout_us``; 0: poll; ``2**64 - 1``: forever.

        Raises
        ------
        PleTimeoutError
            The step was not complete in time (`Step.done` polls without raising).
        PleStateError
            A seq never submitted, or the table closed (also while waiting).
        PleError
            The step failed: its own error.
        """
        t = self._wait_timeout_us if timeout_us is None else _arrays.host_int(timeout_us, "timeout_us", 0, U64_MAX)
        check(lib.ple_wait(self._ptr, _seq(step), t))

    def packed_rows(self, step: StepRef) -> np.ndarray:
        """A read-only view of the step's staged rows (``ple_packed_rows``; waits for the step).

        Parameters
        ----------
        step : Step or int
            The step, or its seq.

        Returns
        -------
        numpy.ndarray
            ``[num_tokens, heads, row_bytes]`` uint8 (``heads`` is ``info.num_heads``, or a head shard's
            ``info.shard_heads``). Valid until the step is consumed (``dequant_*``,
            `release_step`): libple then reuses the memory. The view keeps the handle open.

        Raises
        ------
        PleError
            As in `wait`.
        """
        rows = ctypes.POINTER(ctypes.c_uint8)()
        n = ctypes.c_uint32()
        check(lib.ple_packed_rows(self._ptr, _seq(step), ctypes.byref(rows), ctypes.byref(n)))
        rb = self.info.row_bytes
        heads = self.info.shard_heads
        size = n.value * heads * rb
        if size == 0:
            return np.empty((0, heads, rb), np.uint8)
        buf = (ctypes.c_uint8 * size).from_address(ctypes.addressof(rows.contents))
        buf.handle = self._h  # type: ignore[attr-defined]  # the staging lives as long as the handle
        buf.step = step  # type: ignore[attr-defined]  # and the step is not released before the view goes
        a = np.frombuffer(memoryview(buf), np.uint8).reshape(n.value, heads, rb)
        a.flags.writeable = False
        return a

    def release_step(self, step: StepRef) -> None:
        """Releases the step's staging slot without dequantising it (``ple_release_step``).

        Parameters
        ----------
        step : Step or int
            The step, or its seq.

        Raises
        ------
        PleStateError
            The step was consumed or released already, never submitted, or the table is closed.
        """
        check(lib.ple_release_step(self._ptr, _seq(step)))
        self._consumed(step)

    @overload
    def dequant_cpu(
        self, step: Step, out: None = None, *, dtype: npt.DTypeLike = ..., accumulate: bool = ...
    ) -> np.ndarray: ...
    @overload
    def dequant_cpu(self, step: StepRef, out: O, *, dtype: npt.DTypeLike = ..., accumulate: bool = ...) -> O: ...

    def dequant_cpu(
        self,
        step: StepRef,
        out: Optional[HostOutput] = None,
        *,
        dtype: npt.DTypeLike = np.float32,
        accumulate: bool = False,
    ) -> HostOutput:
        """Dequantises the step's rows into host memory and releases the step
        (``ple_dequant_cpu``; waits for the step).

        Parameters
        ----------
        step : Step or int
            The step, or its seq (then `out` is needed unless this table submitted it).
        out : numpy.ndarray or CPU torch tensor, optional
            ``[>= num_tokens, >= info.embed_dim]`` or flat; float32, float16 or bfloat16; rows contiguous,
            any row stride. None: a new array.
        dtype : numpy dtype, default float32
            The new array's dtype (float32, float16, ml_dtypes.bfloat16) when `out` is None.
        accumulate : bool, default False
            Add into `out` instead of overwriting it.

        Returns
        -------
        numpy.ndarray or torch.Tensor
            `out`, or the new ``[num_tokens, info.embed_dim]`` array.

        Raises
        ------
        TypeError, ValueError
            `out` of the wrong kind, dtype, shape or strides.
        PleError
            As in `wait` (the step is then not consumed).
        """
        n = self._num_tokens(step)
        if out is None:
            if n is None:
                raise TypeError("pass out= when the step is given by a seq this table did not submit")
            out = np.zeros((n, self.info.embed_dim), dtype)
        d = _arrays.host_output(out, self.info.embed_dim)
        self._check_rows(d.rows, n)
        flags = FUSE_ACCUMULATE if accumulate else 0
        check(lib.ple_dequant_cpu(self._ptr, _seq(step), d.ptr, d.dtype, d.stride, flags))
        self._consumed(step)
        return out

    def _num_tokens(self, step: StepRef) -> Optional[int]:
        """The step's tokens: its `Step`'s, or those this table submitted under its seq."""
        return step.num_tokens if isinstance(step, Step) else self._live.get(_seq(step))

    @staticmethod
    def _check_rows(rows: int, n: Optional[int]) -> None:
        if n is not None and rows < n:
            raise ValueError(f"out holds {rows} rows, the step has {n} tokens")
        if rows == 0:
            raise ValueError("out holds 0 rows; a step has at least 1 token")

    def dequant_fuse(
        self,
        step: StepRef,
        out: DeviceOutput,
        stream: StreamLike = None,
        *,
        dtype: object = None,
        accumulate: bool = False,
    ) -> None:
        """Enqueues the step's dequantisation into device memory on `stream`
        (``ple_dequant_fuse``). Needs a handle opened with ``cuda_device >= 0``. A step that
        cannot be consumed fills its output with NaN and raises a device error: `check_device`.

        Parameters
        ----------
        step : Step or int
            The step, or its seq.
        out : torch CUDA tensor or ``__cuda_array_interface__`` array
            ``[>= num_tokens, >= info.embed_dim]`` device memory of the handle's device.
        stream : CUDA stream, optional
            ``torch.cuda.current_stream()``, a CuPy stream, a raw ``cudaStream_t`` int, or None
            (the legacy default stream).
        dtype : dtype or name, optional
            The element type where `out`'s interface cannot name it (bfloat16).
        accumulate : bool, default False
            Add into `out` instead of overwriting it.

        Raises
        ------
        TypeError, ValueError
            `out` or `stream` of the wrong kind, shape or dtype.
        PleCudaUnavailableError
            The handle has no CUDA device.
        PleError
            libple refused (a pending device error, a bad address, ...).
        """
        d = _arrays.device_output(out, self.info.embed_dim, dtype)
        self._check_rows(d.rows, self._num_tokens(step))
        flags = FUSE_ACCUMULATE if accumulate else 0
        s = _arrays.stream_handle(stream)
        check(lib.ple_dequant_fuse(self._ptr, s, _seq(step), d.ptr, d.dtype, d.stride, flags))
        self._consumed(step)

    # -- the GPU side: CUDA Graph mode and device errors ----------------------------------------
    def graph_prepare(self, stream: StreamLike, base_seq: int) -> None:
        """CUDA Graph mode, step 1 (``ple_graph_prepare``): enqueues on `stream` "the next graph
        replay consumes step `base_seq`". Call it outside capture; then capture
        `dequant_fuse_graph` once and replay it once per step, submitting steps ``base_seq``,
        ``base_seq + 1``, ... in order.

        Parameters
        ----------
        stream : CUDA stream
            The engine's stream, not capturing.
        base_seq : int
            The step the next replay consumes (after the last one a replay consumed).

        Raises
        ------
        PleCudaUnavailableError
            The handle has no CUDA device.
        PleInvalidArgumentError
            `stream` is capturing, or `base_seq` was consumed already.
        """
        base = _arrays.host_int(base_seq, "base_seq", 0, U64_MAX)
        check(lib.ple_graph_prepare(self._ptr, _arrays.stream_handle(stream), base))
        self._graph_base = base if self._graph_base is None else min(self._graph_base, base)

    def dequant_fuse_graph(
        self,
        out: DeviceOutput,
        stream: StreamLike,
        *,
        capacity_tokens: Optional[int] = None,
        dtype: object = None,
        accumulate: bool = False,
    ) -> None:
        """CUDA Graph mode, step 2 (``ple_dequant_fuse_graph``): enqueues a device wait for the
        current graph step, its dequantisation into `out` and the advance to the next step, with
        no step number baked in: capture this call once after `graph_prepare`. A step larger
        than the capacity fills `out` with NaN and raises a device error (`check_device`).

        Parameters
        ----------
        out : torch CUDA tensor or ``__cuda_array_interface__`` array
            Device memory holding `capacity_tokens` rows, alive as long as the graph is replayed.
        stream : CUDA stream
            The capturing stream.
        capacity_tokens : int, optional
            The most tokens a replayed step may have; default all of `out`'s rows.
        dtype : dtype or name, optional
            The element type where `out`'s interface cannot name it (bfloat16).
        accumulate : bool, default False
            Add into `out` instead of overwriting it.

        Raises
        ------
        ValueError
            `capacity_tokens` is more than `out` holds.
        PleCudaUnavailableError
            The handle has no CUDA device.
        PleError
            libple refused (a pending device error, no `graph_prepare`, ...).
        """
        d = _arrays.device_output(out, self.info.embed_dim, dtype)
        cap = d.rows if capacity_tokens is None else _arrays.host_int(capacity_tokens, "capacity_tokens", 0, 2**32 - 1)
        if cap > d.rows:
            raise ValueError(f"capacity_tokens {cap}: out holds {d.rows} rows")
        flags = FUSE_ACCUMULATE if accumulate else 0
        s = _arrays.stream_handle(stream)
        check(lib.ple_dequant_fuse_graph(self._ptr, s, cap, d.ptr, d.dtype, d.stride, flags))

    def check_device(self) -> None:
        """Raises (and clears) the first error the handle's kernels raised on the device since
        the last call (``ple_check_device``): a device wait that timed out, a step that failed
        on the host, a graph step over capacity, a wait cut short by `close`. The affected
        kernels filled their output with NaN. Synchronise the stream first.

        Raises
        ------
        PleTimeoutError, PleStateError, PleError
            The device error, as its status's exception.
        PleCudaUnavailableError
            The handle has no CUDA device.
        """
        check(lib.ple_check_device(self._ptr))

    def __repr__(self) -> str:
        state = "closed" if self._h is None else "open"
        return f"Table({self.path!r}, {self.info.format}, {state})"
