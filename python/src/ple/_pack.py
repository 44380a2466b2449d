"""`pack` (a checkpoint's PLE tensors into a table), `version`, and `batch_from_requests`."""

from __future__ import annotations

import ctypes
import os
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ._lib import PROGRESS_FN, check, lib, ple_pack_options
from ._types import OffsetsBatch, PathLike


def pack(
    checkpoint_dir: PathLike,
    out_dir: PathLike,
    *,
    force: bool = False,
    buffer_bytes: Optional[int] = None,
    progress: Optional[Callable[[int, int], object]] = None,
    shard: Optional[Tuple[int, int]] = None,
) -> None:
    """Packs a checkpoint's PLE tensors into a table (``ple_pack``).

    Parameters
    ----------
    checkpoint_dir : str or os.PathLike
        The checkpoint (safetensors shards and their index), or a llama.cpp Qwen4Exp GGUF file
        whose PLE tensor is F32, F16 or BF16 (docs/FORMAT.md, "GGUF sources").
    out_dir : str or os.PathLike
        The table directory to write (for a checkpoint with several PLE layers: ``layer-K/``
        per layer and ``layers.json`` in it; docs/FORMAT.md, "Several PLE layers").
    force : bool, default False
        Replace a table already there that was packed from another checkpoint.
    buffer_bytes : int, optional
        The write buffer; default libple's.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)``, called as it goes. An exception raised in it
        cancels the pack (no table is left behind) and is re-raised here.
    shard : (int, int), optional
        ``(K, N)``: write a shard table holding only head shard K of N's rows (open it with
        ``Table(out_dir, shard_count=N, shard_index=K)``).

    Raises
    ------
    PleNotFoundError
        `checkpoint_dir` does not exist.
    PleError
        libple refused or failed (`PleFormatError` for a malformed checkpoint or for a table of
        another checkpoint already in `out_dir` without `force`, `PleIOError`, ...).
    """
    o = ple_pack_options()
    check(lib.ple_pack_options_default(ctypes.byref(o)))
    o.force = int(bool(force))
    if shard is not None:
        o.shard_index, o.shard_count = (int(x) for x in shard)
    if buffer_bytes is not None:
        o.buffer_bytes = buffer_bytes
    raised: List[BaseException] = []

    def cb(done: int, total: int, _user: Optional[int]) -> int:
        try:
            assert progress is not None  # cb is passed only with a progress function
            progress(done, total)
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised after libple returns
            raised.append(e)
            return 1

    fn = PROGRESS_FN(cb) if progress is not None else PROGRESS_FN()
    src = os.fspath(checkpoint_dir)
    status = lib.ple_pack(os.fsencode(src), os.fsencode(out_dir), ctypes.byref(o), fn, None)
    if raised:
        raise raised[0]
    check(status, src)


def version() -> str:
    """libple's version.

    Returns
    -------
    str
        ``"MAJOR.MINOR.PATCH"`` (``ple_version_string``).
    """
    v: bytes = lib.ple_version_string()
    return v.decode()


def batch_from_requests(spans: Sequence[Tuple[int, int, Sequence[int]]]) -> OffsetsBatch:
    """The offsets-form arrays of one step, for ``table.submit(**batch)``.

    Parameters
    ----------
    spans : sequence of (int, int, sequence of int)
        ``(request_id, first_position, tokens)`` per request, in the step's order.

    Returns
    -------
    OffsetsBatch
        ``tokens`` and ``positions`` (int32), ``request_ids`` (uint64), ``query_start``
        (uint32), as `Table.submit` takes them.
    """
    toks: List[int] = []
    pos: List[int] = []
    ids: List[int] = []
    qs = [0]
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
