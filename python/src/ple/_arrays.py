"""Array plumbing without importing torch: host inputs (numpy, anything with ``__dlpack__`` on the
CPU, sequences), host outputs (numpy arrays, CPU torch tensors) and device outputs (torch CUDA
tensors, anything with ``__cuda_array_interface__``), and CUDA stream handles."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple, cast

import numpy as np

from ._lib import DTYPE_BF16, DTYPE_F16, DTYPE_F32, PLE_EMBED_DIM
from ._types import ArrayLike, CudaArrayInterface, DeviceOutput, HostOutput, StreamLike, TensorLike

if TYPE_CHECKING:
    if sys.version_info >= (3, 10):
        from typing import TypeGuard
    else:
        from typing_extensions import TypeGuard

_DTYPE_BY_NAME = {
    "float32": DTYPE_F32, "f32": DTYPE_F32, "torch.float32": DTYPE_F32, "<f4": DTYPE_F32,
    "float16": DTYPE_F16, "f16": DTYPE_F16, "torch.float16": DTYPE_F16, "<f2": DTYPE_F16,
    "bfloat16": DTYPE_BF16, "bf16": DTYPE_BF16, "torch.bfloat16": DTYPE_BF16,
}  # fmt: skip
ITEMSIZE = {DTYPE_F32: 4, DTYPE_F16: 2, DTYPE_BF16: 2}


def dtype_code(dtype: object) -> int:
    """The `PLE_DTYPE_*` code of a numpy/torch dtype or a name ("f32", "float16", "bf16", ...)."""
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype)  # torch.float32, ...
    else:
        try:
            name = np.dtype(dtype).name  # type: ignore[call-overload]  # numpy dtypes and scalar types, ml_dtypes.bfloat16
        except TypeError:
            name = str(dtype)
    try:
        return _DTYPE_BY_NAME[name]
    except KeyError:
        raise TypeError(f"output dtype {dtype!r} is not float32, float16 or bfloat16") from None


def _is_torch(x: object) -> "TypeGuard[TensorLike]":
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def host_input(x: ArrayLike, dtype: type, name: str) -> np.ndarray:
    """A 1-D C-contiguous array of `dtype` over `x`: the caller's memory when it already has that
    layout (numpy arrays, CPU torch tensors through DLPack), else a converted copy."""
    if isinstance(x, np.ndarray):
        a = x
    elif _is_torch(x) or hasattr(x, "__dlpack__"):
        dev = getattr(x, "device", None)
        if dev is not None and getattr(dev, "type", "cpu") != "cpu":
            raise TypeError(f"{name} must be on the CPU (got a tensor on {dev})")
        a = np.from_dlpack(x.detach() if _is_torch(x) else x)  # type: ignore[attr-defined,arg-type]
    else:
        a = np.asarray(x)
    if a.ndim != 1:
        a = a.reshape(-1)
    if a.dtype != dtype or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=dtype)
    return a


@dataclass
class OutDesc:
    """An output buffer: address, rows, row stride in elements, `PLE_DTYPE_*` code."""

    ptr: int
    rows: int
    stride: int
    dtype: int


def _desc(
    ptr: int, shape: Sequence[int], strides_el: Optional[Tuple[int, ...]], dtype: int, what: str
) -> OutDesc:
    if len(shape) == 1:
        if shape[0] % PLE_EMBED_DIM:
            raise ValueError(f"{what}: 1-D output of {shape[0]} elements is not whole rows of {PLE_EMBED_DIM}")
        if strides_el is not None and strides_el[0] != 1:
            raise ValueError(f"{what}: a 1-D output must be contiguous")
        return OutDesc(ptr, shape[0] // PLE_EMBED_DIM, PLE_EMBED_DIM, dtype)
    if len(shape) != 2:
        raise ValueError(f"{what}: output must be 1-D or 2-D [tokens, >= {PLE_EMBED_DIM}], got shape {shape}")
    rows, cols = shape
    if cols < PLE_EMBED_DIM:
        raise ValueError(f"{what}: rows of {cols} elements are shorter than {PLE_EMBED_DIM}")
    row_stride, col_stride = strides_el if strides_el is not None else (cols, 1)
    if col_stride != 1 or (rows > 1 and row_stride < PLE_EMBED_DIM):
        raise ValueError(f"{what}: each row must be contiguous (strides {strides_el})")
    return OutDesc(ptr, rows, max(row_stride, PLE_EMBED_DIM), dtype)


def host_output(out: HostOutput) -> OutDesc:
    """Describes a writable host output: a numpy array or a CPU torch tensor."""
    if _is_torch(out):
        if out.device.type != "cpu":
            raise TypeError(f"dequant_cpu needs a CPU output, got a tensor on {out.device}")
        return _desc(out.data_ptr(), tuple(out.shape), tuple(out.stride()), dtype_code(out.dtype), "out")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array or a CPU torch tensor, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    code = dtype_code(out.dtype)
    strides = tuple(s // out.itemsize for s in out.strides)
    if any(s * out.itemsize != b for s, b in zip(strides, out.strides)):
        raise ValueError("out's strides are not whole elements")
    return _desc(out.ctypes.data, out.shape, strides, code, "out")


def device_output(out: DeviceOutput, dtype: object = None) -> OutDesc:
    """Describes a device output: a torch CUDA tensor, or any object with
    ``__cuda_array_interface__`` (its typestr gives the dtype unless `dtype` is passed, as it
    must be for bfloat16, which the interface cannot name)."""
    if _is_torch(out):
        if out.device.type != "cuda":
            raise TypeError(f"dequant_fuse needs a CUDA output, got a tensor on {out.device}")
        return _desc(out.data_ptr(), tuple(out.shape), tuple(out.stride()), dtype_code(out.dtype), "out")
    cai = getattr(cast(CudaArrayInterface, out), "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError("out must be a torch CUDA tensor or have __cuda_array_interface__")
    code = dtype_code(dtype if dtype is not None else cai["typestr"])
    item = ITEMSIZE[code]
    strides = cai.get("strides")
    el = None if strides is None else tuple(s // item for s in strides)
    if cai["data"][1]:
        raise ValueError("out is read-only (__cuda_array_interface__ data is marked read-only)")
    return _desc(int(cai["data"][0]), tuple(cai["shape"]), el, code, "out")


def stream_handle(stream: StreamLike) -> int:
    """A raw `cudaStream_t` from None (the legacy default stream, 0), an int, a
    `torch.cuda.Stream` (`.cuda_stream`), a CuPy stream (`.ptr`) or an object with
    ``__cuda_stream__`` (returning `(version, handle)`)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    raise TypeError(f"cannot take a CUDA stream handle from {type(stream).__name__}")
