"""`Step`: one submitted engine step, the future `Table.submit` returns."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Optional, Type, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ._errors import PleTimeoutError
from ._types import DeviceOutput, HostOutput, StreamLike

if TYPE_CHECKING:
    from .table import Table

O = TypeVar("O", bound=HostOutput)


class Step:
    """One submitted engine step: ``table.submit(...)`` returns it. Its methods are the table's for
    its `seq`.

    Used as a context manager, it releases the step on exit unless it was consumed
    (``dequant_*``) or released already; a `packed_rows` view is valid inside the block only.
    Garbage-collected unconsumed (and not handed to CUDA Graph replays by `Table.graph_prepare`),
    it is released before the table's next submit, so a dropped step never holds a ring slot;
    a `packed_rows` view keeps its step alive.

    Attributes
    ----------
    table : Table
        The table it was submitted to.
    seq : int
        Its sequence number.
    num_tokens : int
        Its number of tokens (rows of its output).
    """

    __slots__ = ("table", "seq", "num_tokens", "consumed")

    def __init__(self, table: "Table", seq: int, num_tokens: int):
        self.table, self.seq, self.num_tokens = table, seq, num_tokens
        #: True once `dequant_cpu`, `dequant_fuse` or `release` returned for this step
        self.consumed = False

    def done(self) -> bool:
        """Whether the step is complete (``ple_wait`` with a 0 timeout): never blocks, never
        raises a timeout.

        Returns
        -------
        bool
            True when its rows are staged, False while it is still pending.

        Raises
        ------
        PleError
            The step failed (its own error), or the table is closed (`PleStateError`).
        """
        try:
            self.table.wait(self, 0)
        except PleTimeoutError:
            return False
        return True

    def wait(self, timeout_us: Optional[int] = None) -> None:
        """Blocks until the step is complete; see `Table.wait`.

        Parameters
        ----------
        timeout_us : int, optional
            None: the handle's ``wait_timeout_us``; 0: poll; ``2**64 - 1``: forever.

        Raises
        ------
        PleTimeoutError
            The step was not complete in time.
        PleError
            The step failed (its own error), or the table is closed.
        """
        self.table.wait(self, timeout_us)

    def packed_rows(self) -> np.ndarray:
        """A read-only view of the step's staged rows; see `Table.packed_rows`.

        Returns
        -------
        numpy.ndarray
            ``[num_tokens, heads, row_bytes]`` uint8, valid until the step is consumed.
        """
        return self.table.packed_rows(self)

    @overload
    def dequant_cpu(self, out: None = None, *, dtype: npt.DTypeLike = ..., accumulate: bool = ...) -> np.ndarray: ...
    @overload
    def dequant_cpu(self, out: O, *, dtype: npt.DTypeLike = ..., accumulate: bool = ...) -> O: ...

    def dequant_cpu(
        self, out: Optional[HostOutput] = None, *, dtype: npt.DTypeLike = np.float32, accumulate: bool = False
    ) -> HostOutput:
        """Dequantises the step into host memory and releases it; see `Table.dequant_cpu`.

        Parameters
        ----------
        out : numpy.ndarray or CPU torch tensor, optional
            ``[>= num_tokens, >= info.embed_dim]`` (or flat) float32/float16/bfloat16; None: a new array.
        dtype : numpy dtype, default float32
            The new array's dtype when `out` is None.
        accumulate : bool, default False
            Add into `out` instead of overwriting it.

        Returns
        -------
        numpy.ndarray or torch.Tensor
            `out`, or the new ``[num_tokens, info.embed_dim]`` array.
        """
        if out is None:
            return self.table.dequant_cpu(self, dtype=dtype, accumulate=accumulate)
        return self.table.dequant_cpu(self, out, dtype=dtype, accumulate=accumulate)

    def dequant_fuse(
        self,
        out: DeviceOutput,
        stream: StreamLike = None,
        *,
        dtype: object = None,
        accumulate: bool = False,
    ) -> None:
        """Enqueues the step's dequantisation into device memory; see `Table.dequant_fuse`.

        Parameters
        ----------
        out : torch CUDA tensor or ``__cuda_array_interface__`` array
            ``[>= num_tokens, >= info.embed_dim]`` device output.
        stream : CUDA stream, optional
            Where the kernel is enqueued (None: the legacy default stream).
        dtype : dtype or name, optional
            The element type where `out` cannot name it (bfloat16 behind the interface).
        accumulate : bool, default False
            Add into `out` instead of overwriting it.
        """
        self.table.dequant_fuse(self, out, stream, dtype=dtype, accumulate=accumulate)

    def release(self) -> None:
        """Releases the step's staging slot without dequantising it; see `Table.release_step`.

        Raises
        ------
        PleStateError
            The step was consumed or released already, or the table is closed.
        """
        self.table.release_step(self)

    def __enter__(self) -> "Step":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Releases the step unless it was consumed or its table is closed (nothing to release
        through it then). While an exception propagates, a failing release does not replace it."""
        if self.consumed or self.table.closed:
            return
        if exc is None:
            self.release()
            return
        try:
            self.release()
        except Exception:  # noqa: BLE001 - the exception in flight is the one to report
            pass

    def __del__(self) -> None:
        """A step garbage-collected before it was consumed is released before the table's next
        submit (nobody can consume it any more); its table may be closed or closing."""
        if not self.consumed:
            try:
                self.table._orphan(self.seq)
            except Exception:  # interpreter shutdown: the table's attributes may be gone
                pass

    def __repr__(self) -> str:
        return f"Step(seq={self.seq}, num_tokens={self.num_tokens})"
