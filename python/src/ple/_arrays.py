"""Array plumbing without importing torch: host inputs (numpy, anything with ``__dlpack__`` on the
CPU, sequences), host outputs (numpy arrays, CPU torch tensors) and device outputs (torch CUDA
tensors, anything with ``__cuda_array_interface__``), and CUDA stream handles."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, cast

import numpy as np

from ._errors import invalid_argument
from ._lib import DTYPE_BF16, DTYPE_F16, DTYPE_F32
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


# the C type each input dtype stands for, for messages
_C_NAME = {np.dtype(np.int32): "int32_t", np.dtype(np.uint32): "uint32_t", np.dtype(np.uint64): "uint64_t"}


def _c_name(dtype: "np.dtype[Any]") -> str:
    return _C_NAME.get(dtype, dtype.name)


def _iinfo(dtype: "np.dtype[Any]") -> "np.iinfo[Any]":
    return np.iinfo(cast("np.dtype[np.integer[Any]]", dtype))


def _at(name: str, shape: Tuple[int, ...], flat: int) -> str:
    """`name[i]` (or `name[i, j]`) of the element at C-order index `flat`."""
    idx = np.unravel_index(flat, shape)
    return f"{name}[{', '.join(str(int(i)) for i in idx)}]"


def _from_objects(a: np.ndarray, dtype: "np.dtype[Any]", name: str) -> np.ndarray:
    """An object array (Python ints beyond int64, mixed sequences) checked element by element."""
    info = np.iinfo(dtype)
    flat = a.reshape(-1)
    for i, v in enumerate(flat):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise invalid_argument(f"{_at(name, a.shape, i)} = {v!r} is not an integer")
        if not int(info.min) <= int(v) <= int(info.max):
            raise invalid_argument(
                f"{_at(name, a.shape, i)} = {int(v)} does not fit {_c_name(dtype)} [{info.min}, {info.max}]"
            )
    return np.array([int(v) for v in flat], dtype).reshape(a.shape)


def host_input(x: ArrayLike, dtype: type, name: str, *, max_ndim: int = 1) -> np.ndarray:
    """A C-contiguous array of `dtype` holding exactly the values of `x`: the caller's memory when
    it already has that layout (numpy arrays, CPU torch tensors through DLPack), else a copy.

    `x` must be an integer array (or sequence of ints) of 1 to `max_ndim` dimensions whose every
    value fits `dtype`; anything else (floats, bools, values out of range, a wrong rank) raises
    `PleInvalidArgumentError` naming `name`, the index and the value. Nothing is cast that would
    change a value. An empty input of any element type is an empty array."""
    want = np.dtype(dtype)
    if isinstance(x, np.ndarray):
        a = x
    elif _is_torch(x) or hasattr(x, "__dlpack__"):
        dev = getattr(x, "device", None)
        if dev is not None and getattr(dev, "type", "cpu") != "cpu":
            raise TypeError(f"{name} must be on the CPU (got a tensor on {dev})")
        a = np.from_dlpack(x.detach() if _is_torch(x) else x)  # type: ignore[attr-defined,arg-type]
    else:
        try:
            a = np.asarray(x)
        except (OverflowError, ValueError):  # ints beyond int64/uint64, ragged nesting
            a = np.array(x, dtype=object)
        if a.dtype.kind not in "iuO" and a.size:
            # numpy turns Python ints it cannot hold in one integer dtype (2**64 - 1 beside -1 or 0)
            # into floats: such a sequence is judged int by int instead
            objs = np.array(x, dtype=object)
            if all(isinstance(v, int) and not isinstance(v, bool) for v in objs.reshape(-1)):
                a = objs
    if a.ndim == 0 or a.ndim > max_ndim:
        rank = "1-D" if max_ndim == 1 else f"1-D to {max_ndim}-D"
        raise invalid_argument(f"{name} must be a {rank} array, got shape {a.shape}")
    if a.size == 0:
        return np.empty(a.shape, want)
    if a.dtype == object:
        return _from_objects(a, want, name)
    if a.dtype.kind not in "iu":
        flat = a.reshape(-1)
        bad = 0
        if a.dtype.kind in "fc":  # point at the first value that is not a whole number, if any
            frac = np.flatnonzero(flat != np.round(flat.real))
            bad = int(frac[0]) if frac.size else 0
        raise invalid_argument(
            f"{name} must be integers ({_c_name(want)}), got a {a.dtype} array: "
            f"{_at(name, a.shape, bad)} = {flat[bad].item()!r}"
        )
    lim, src = _iinfo(want), _iinfo(a.dtype)
    out = np.zeros(a.shape, bool)
    # each bound is compared only where the source type reaches past it, so it fits the source type
    if src.min < lim.min:
        out |= a < np.array(lim.min, a.dtype)
    if src.max > lim.max:
        out |= a > np.array(lim.max, a.dtype)
    if out.any():
        i = int(np.flatnonzero(out.reshape(-1))[0])
        raise invalid_argument(
            f"{_at(name, a.shape, i)} = {int(a.reshape(-1)[i])} does not fit {_c_name(want)} "
            f"[{lim.min}, {lim.max}]"
        )
    if a.dtype != want or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=want)  # every value fits: a lossless conversion
    return a


def host_int(v: object, name: str, lo: int, hi: int) -> int:
    """`v` as a Python int when it is an integer (not a bool) in ``[lo, hi]``, else
    `PleInvalidArgumentError` naming `name` and the value."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise invalid_argument(f"{name} must be an integer, got {v!r}")
    i = int(v)
    if not lo <= i <= hi:
        raise invalid_argument(f"{name} = {i} is outside [{lo}, {hi}]")
    return i


@dataclass
class OutDesc:
    """An output buffer: address, rows, row stride in elements, `PLE_DTYPE_*` code."""

    ptr: int
    rows: int
    stride: int
    dtype: int


def _desc(
    ptr: int, shape: Sequence[int], strides_el: Optional[Tuple[int, ...]], dtype: int, what: str, dim: int
) -> OutDesc:
    """`dim`: elements of one token's embedding (the table's ``info.embed_dim``)."""
    if len(shape) in (1, 2) and shape[0] == 0:
        # no rows: nothing to lay out (the strides of an empty array say nothing); the caller
        # refuses 0 rows against the step's tokens
        return OutDesc(ptr, 0, dim, dtype)
    if len(shape) == 1:
        if shape[0] % dim:
            raise ValueError(f"{what}: 1-D output of {shape[0]} elements is not whole rows of {dim}")
        if strides_el is not None and strides_el[0] != 1:
            raise ValueError(f"{what}: a 1-D output must be contiguous")
        return OutDesc(ptr, shape[0] // dim, dim, dtype)
    if len(shape) != 2:
        raise ValueError(f"{what}: output must be 1-D or 2-D [tokens, >= {dim}], got shape {shape}")
    rows, cols = shape
    if cols < dim:
        raise ValueError(f"{what}: rows of {cols} elements are shorter than {dim}")
    row_stride, col_stride = strides_el if strides_el is not None else (cols, 1)
    if col_stride != 1 or (rows > 1 and row_stride < dim):
        raise ValueError(f"{what}: each row must be contiguous (strides {strides_el})")
    return OutDesc(ptr, rows, max(row_stride, dim), dtype)


def host_output(out: HostOutput, dim: int) -> OutDesc:
    """Describes a writable host output: a numpy array or a CPU torch tensor."""
    if _is_torch(out):
        if out.device.type != "cpu":
            raise TypeError(f"dequant_cpu needs a CPU output, got a tensor on {out.device}")
        return _desc(out.data_ptr(), tuple(out.shape), tuple(out.stride()), dtype_code(out.dtype), "out", dim)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array or a CPU torch tensor, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    code = dtype_code(out.dtype)
    strides = tuple(s // out.itemsize for s in out.strides)
    if any(s * out.itemsize != b for s, b in zip(strides, out.strides)):
        raise ValueError("out's strides are not whole elements")
    return _desc(out.ctypes.data, out.shape, strides, code, "out", dim)


def device_output(out: DeviceOutput, dim: int, dtype: object = None) -> OutDesc:
    """Describes a device output: a torch CUDA tensor, or any object with
    ``__cuda_array_interface__`` (its typestr gives the dtype unless `dtype` is passed, as it
    must be for bfloat16, which the interface cannot name)."""
    if _is_torch(out):
        if out.device.type != "cuda":
            raise TypeError(f"dequant_fuse needs a CUDA output, got a tensor on {out.device}")
        return _desc(out.data_ptr(), tuple(out.shape), tuple(out.stride()), dtype_code(out.dtype), "out", dim)
    cai = getattr(cast(CudaArrayInterface, out), "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError("out must be a torch CUDA tensor or have __cuda_array_interface__")
    code = dtype_code(dtype if dtype is not None else cai["typestr"])
    item = ITEMSIZE[code]
    strides = cai.get("strides")
    el = None if strides is None else tuple(s // item for s in strides)
    if cai["data"][1]:
        raise ValueError("out is read-only (__cuda_array_interface__ data is marked read-only)")
    return _desc(int(cai["data"][0]), tuple(cai["shape"]), el, code, "out", dim)


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
