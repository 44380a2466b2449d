#!/usr/bin/env python3
"""The Python package's GPU path (`Step.dequant_fuse`) on the CUDA driver found as libcuda.so.1
(emulated.sh runs it on the emulated driver): device buffers made with the driver API through
ctypes and handed over by `__cuda_array_interface__`, a raw stream handle, every wait mode and
dtype, accumulate; each result bit-identical to `dequant_cpu` of the same step.

Usage: emulated_python.py TABLE_DIR   (PYTHONPATH=python/src, PLE_LIBRARY=libple.so)
"""
import ctypes
import sys

import ml_dtypes
import numpy as np

import ple

D = 2560
cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what):
    if r != 0:
        sys.exit(f"emulated_python: {what} -> CUresult {r}")


class DeviceArray:
    """`rows` x 2560 elements of `np_dtype` in device memory (cuMemAlloc)."""

    def __init__(self, rows, np_dtype):
        self.shape, self.np_dtype = (rows, D), np.dtype(np_dtype)
        self.nbytes = rows * D * self.np_dtype.itemsize
        self.ptr = ctypes.c_uint64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes)), "cuMemAlloc")
        # bfloat16 has no typestr: "<u2", and dequant_fuse is told dtype="bfloat16"
        typestr = "<f4" if self.np_dtype == np.float32 else "<f2" if self.np_dtype == np.float16 else "<u2"
        self.__cuda_array_interface__ = {"data": (self.ptr.value, False), "shape": self.shape,
                                         "typestr": typestr, "version": 3}  # fmt: skip

    def upload(self, a):
        a = np.ascontiguousarray(a)
        ck(cu.cuMemcpyHtoD_v2(self.ptr, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(self.nbytes)), "HtoD")

    def download(self):
        a = np.empty(self.shape, self.np_dtype)
        ck(cu.cuMemcpyDtoH_v2(a.ctypes.data_as(ctypes.c_void_p), self.ptr, ctypes.c_size_t(self.nbytes)), "DtoH")
        return a

    def free(self):
        ck(cu.cuMemFree_v2(self.ptr), "cuMemFree")


def main(table_dir):
    ck(cu.cuInit(0), "cuInit")
    dev, ctx, stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    ck(cu.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ck(cu.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    rng = np.random.default_rng(5)
    checked = 0
    for mode in ("auto", "host", "spin_kernel"):
        with ple.Table(table_dir, cuda_device=0, wait_mode=mode, max_tokens_per_step=512) as t:
            for np_dtype, acc in ((np.float32, False), (np.float16, True), (ml_dtypes.bfloat16, False),
                                  (ml_dtypes.bfloat16, True)):  # fmt: skip
                n = int(rng.integers(1, 300))
                tokens = rng.integers(0, 248320, n).astype(np.int32)
                positions = np.arange(n, dtype=np.int32)
                step, twin = t.submit(tokens, positions), t.submit(tokens, positions)
                out = DeviceArray(n, np_dtype)
                # finite random starting values (what accumulate adds to)
                init = rng.standard_normal((n, D)).astype(np.float32).astype(np_dtype)
                out.upload(init)
                is_bf16 = np.dtype(np_dtype) == np.dtype(ml_dtypes.bfloat16)
                step.dequant_fuse(out, stream.value, dtype="bfloat16" if is_bf16 else None, accumulate=acc)
                ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
                got = out.download()
                host = init.copy()
                twin.dequant_cpu(host, accumulate=acc)
                if got.tobytes() != host.tobytes():
                    sys.exit(f"emulated_python: FAIL: {mode} {np.dtype(np_dtype).name} acc {acc} n {n}: "
                             "dequant_fuse differs from dequant_cpu")  # fmt: skip
                out.free()
                checked += 1
    print(f"emulated_python: {checked} dequant_fuse calls bit-identical to dequant_cpu on '{name.value.decode()}'")


if __name__ == "__main__":
    main(sys.argv[1])
