"""The types of the public signatures: the enum-valued options as `Literal`s, `TableOptions` (the
keywords of `Table`), and the protocols of the arrays and streams the bindings accept without
importing torch or CuPy."""

from __future__ import annotations

import os
from typing import Any, Dict, Literal, Protocol, Sequence, Tuple, TypedDict, Union

import numpy as np
import numpy.typing as npt

PathLike = Union[str, "os.PathLike[str]"]

PrefetchPolicy = Literal["auto", "always", "never"]
RingFullPolicy = Literal["wait", "error"]
WaitMode = Literal["auto", "host", "stream_op", "spin_kernel"]
IoMode = Literal["auto", "mmap", "direct"]
OpenIoMode = Literal["mmap", "direct"]  # what `auto` resolved to
IoBackend = Literal["mmap", "io_uring", "pread_pool"]
TableFormat = Literal["nvfp4", "fp8", "bf16", "f32"]
LogLevel = Literal["error", "warn", "info", "debug", "trace"]


class SupportsDLPack(Protocol):
    """An array exporting ``__dlpack__`` (a CPU torch tensor, a JAX or CuPy host array)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> object: ...


#: a host input: a numpy array, a sequence of ints, or anything with ``__dlpack__`` on the CPU
ArrayLike = Union[npt.ArrayLike, SupportsDLPack]


class TensorLike(Protocol):
    """The part of a torch tensor the bindings read (no torch import): ``data_ptr()``, ``shape``,
    ``stride()``, ``dtype``, ``device``."""

    @property
    def shape(self) -> Sequence[int]: ...
    @property
    def dtype(self) -> object: ...
    @property
    def device(self) -> Any: ...  # torch.device: `.type` ("cpu", "cuda"), `.index`

    def data_ptr(self) -> int: ...
    def stride(self) -> Tuple[int, ...]: ...


class CudaArrayInterface(Protocol):
    """A device array described by ``__cuda_array_interface__`` (CuPy, Numba, ...)."""

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...


#: a host output of `dequant_cpu`: a numpy array or a CPU torch tensor
HostOutput = Union[np.ndarray, TensorLike]
#: a device output of `dequant_fuse`: a torch CUDA tensor or a ``__cuda_array_interface__`` array
DeviceOutput = Union[TensorLike, CudaArrayInterface]


class _TorchStream(Protocol):
    @property
    def cuda_stream(self) -> int: ...


class _CupyStream(Protocol):
    @property
    def ptr(self) -> int: ...


class _CudaStreamProtocol(Protocol):
    def __cuda_stream__(self) -> Tuple[int, int]: ...


#: a CUDA stream: None (the legacy default stream), a raw ``cudaStream_t`` int, a
#: ``torch.cuda.Stream``, a CuPy stream, or an object with ``__cuda_stream__``
StreamLike = Union[None, int, _TorchStream, _CupyStream, _CudaStreamProtocol]


class TableOptions(TypedDict, total=False):
    """The keywords of `Table`: ``ple_options`` fields by name (``ple.h`` documents each);
    an option not given keeps ``ple_options_default``'s value."""

    max_tokens_per_step: int
    max_in_flight: int
    num_threads: int
    prefetch_policy: Union[PrefetchPolicy, int]
    prefetch_min_rows: int
    ring_full_policy: Union[RingFullPolicy, int]
    wait_timeout_us: int
    history_window: int
    cuda_device: int
    wait_mode: Union[WaitMode, int]
    config_json_path: Union[PathLike, None]
    checkpoint_dir: Union[PathLike, None]
    cache_bytes: int
    io_mode: Union[IoMode, int]
    shard_count: int
    shard_index: int
    ahead_max_rows: int
    resident_bytes_max: int
    sigbus_handler: int


class OffsetsBatch(TypedDict):
    """`batch_from_requests`'s arrays, the keywords of the offsets form of `Table.submit`."""

    tokens: np.ndarray
    positions: np.ndarray
    request_ids: np.ndarray
    query_start: np.ndarray
