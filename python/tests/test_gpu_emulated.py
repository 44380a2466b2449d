"""The GPU calls of the Python API (`Table.check_device`, `graph_prepare`, `dequant_fuse_graph`)
against the emulated CUDA driver (``ffi-tests/gpu/emulated.sh --build`` makes
``target/cuda-emu/libcuda.so.1``; it runs libple's kernels on the CPU). Skipped unless
``PLE_CUDA_EMU`` names that file; then it is loaded before any table opens, so libple's
``dlopen("libcuda.so.1")`` finds it. Run this file in a pytest process of its own:

    ffi-tests/gpu/emulated.sh --build
    PLE_CUDA_EMU=target/cuda-emu/libcuda.so.1 PLE_BIN=target/release/ple \\
        PLE_LIBRARY=target/release/libple.so PYTHONPATH=python/src pytest python/tests/test_gpu_emulated.py

Expectations (an NVFP4 and an F32 table): each replay's output equals `dequant_cpu` of the same
step on a CPU handle, bit for bit; a step over the captured capacity is NaN and `check_device` raises `PleStateError` once.
Tables of other geometries (12 heads of 128, 16 of 64, NVFP4 rows of an odd byte count):
`dequant_fuse` equals `dequant_cpu`, bit for bit; a head dim the kernel cannot serve (not a
multiple of 8) is refused at open with a GPU, `PleUnsupportedError`."""

from __future__ import annotations

import ctypes
import os
import subprocess

import numpy as np
import pytest

import ple
from test_ple import BASE, SEED, SHARDS, _ple_bin

EMU = os.environ.get("PLE_CUDA_EMU")
pytestmark = pytest.mark.skipif(not EMU, reason="PLE_CUDA_EMU (the emulated CUDA driver) is not set")
D = 2560


class Cuda:
    """The few driver calls the test needs, on the emulated driver."""

    def __init__(self, path: str):
        self.cu = ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_GLOBAL)
        self.ck(self.cu.cuInit(0), "cuInit")
        dev, self.ctx, self.stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        self.ck(self.cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ck(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ck(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.ck(self.cu.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")

    @staticmethod
    def ck(r: int, what: str) -> None:
        assert r == 0, f"{what} -> CUresult {r}"

    def sync(self) -> None:
        self.ck(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")


class DeviceArray:
    """`rows` x `dim` float32 in device memory, handed over by ``__cuda_array_interface__``."""

    def __init__(self, cuda: Cuda, rows: int, dim: int = D):
        self.cuda, self.shape, self.nbytes = cuda, (rows, dim), rows * dim * 4
        self.ptr = ctypes.c_uint64()
        cuda.ck(cuda.cu.cuMemAlloc_v2(ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes)), "cuMemAlloc")
        self.__cuda_array_interface__ = {"data": (self.ptr.value, False), "shape": self.shape,
                                         "typestr": "<f4", "version": 3}  # fmt: skip

    def fill(self, value: float) -> None:
        a = np.full(self.shape, value, np.float32)
        self.cuda.ck(self.cuda.cu.cuMemcpyHtoD_v2(self.ptr, a.ctypes.data_as(ctypes.c_void_p),
                                                  ctypes.c_size_t(self.nbytes)), "HtoD")  # fmt: skip

    def get(self) -> np.ndarray:
        a = np.empty(self.shape, np.float32)
        self.cuda.ck(self.cuda.cu.cuMemcpyDtoH_v2(a.ctypes.data_as(ctypes.c_void_p), self.ptr,
                                                  ctypes.c_size_t(self.nbytes)), "DtoH")  # fmt: skip
        return a


@pytest.fixture(scope="module")
def cuda() -> Cuda:
    return Cuda(EMU)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=["nvfp4", "f32"])
def tdir(synth_table, request) -> str:
    return synth_table(request.param)


def test_check_device_and_a_captured_graph_on_the_emulated_driver(cuda, tdir):
    cap = 8
    rng = np.random.default_rng(7)
    stream = cuda.stream.value
    with ple.Table(tdir, cuda_device=0, wait_timeout_us=3_000_000) as gpu, ple.Table(tdir) as cpu:
        gpu.check_device()  # no device error yet: returns
        out = DeviceArray(cuda, cap)
        gpu.graph_prepare(stream, 1)  # the next replay consumes step 1
        with pytest.raises(ple.PleInvalidArgumentError, match="capacity"):
            gpu.dequant_fuse_graph(out, stream, capacity_tokens=0)
        graph, exec_ = ctypes.c_void_p(), ctypes.c_void_p()
        cuda.ck(cuda.cu.cuStreamBeginCapture_v2(cuda.stream, 0), "cuStreamBeginCapture")
        gpu.dequant_fuse_graph(out, stream)  # capacity: out's 8 rows
        cuda.ck(cuda.cu.cuStreamEndCapture(cuda.stream, ctypes.byref(graph)), "cuStreamEndCapture")
        cuda.ck(cuda.cu.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, ctypes.c_ulonglong(0)), "instantiate")
        for k, n in enumerate([5, 8, cap + 3, 2]):
            toks = rng.integers(0, 248320, n).astype(np.int32)
            pos = np.arange(n, dtype=np.int32)
            ids = dict(request_ids=[100 + k], query_start=[0, n])
            want = cpu.submit(toks, pos, **ids).dequant_cpu()
            out.fill(7.0)
            gpu.submit(toks, pos, **ids)  # seq k + 1: replay k consumes it
            cuda.ck(cuda.cu.cuGraphLaunch(exec_, cuda.stream), "cuGraphLaunch")
            cuda.sync()
            got = out.get()
            if n <= cap:
                gpu.check_device()
                np.testing.assert_array_equal(got[:n], want)
            else:  # over the captured capacity: NaN, and the device error once
                assert np.isnan(got).all()
                with pytest.raises(ple.PleStateError) as e:
                    gpu.check_device()
                assert e.value.status == ple.Status.STATE and e.value.message
                gpu.check_device()  # cleared
                gpu.graph_prepare(stream, k + 2)  # after a device error: prepare with the next step
        cuda.ck(cuda.cu.cuGraphExecDestroy(exec_), "cuGraphExecDestroy")
        cuda.ck(cuda.cu.cuGraphDestroy(graph), "cuGraphDestroy")


def _geometry_table(tmp_path, fmt: str, ngram: int, hpn: int, head_dim: int) -> str:
    ck, tab = str(tmp_path / "ckpt"), str(tmp_path / "table")
    args = ["synth-checkpoint", ck, "--format", fmt, "--base", "700", "--shards", "3", "--seed", "5",
            "--ngram-size", str(ngram), "--heads-per-ngram", str(hpn), "--head-dim", str(head_dim)]  # fmt: skip
    subprocess.run([_ple_bin(), *args], check=True, capture_output=True)
    subprocess.run([_ple_bin(), "pack", ck, tab], check=True, capture_output=True)
    return tab


@pytest.mark.parametrize("fmt, ngram, hpn, head_dim", [("nvfp4", 4, 4, 128), ("fp8", 2, 16, 64), ("nvfp4", 2, 5, 48)])
def test_other_geometries_dequant_on_the_device_as_on_the_cpu(cuda, tmp_path, fmt, ngram, hpn, head_dim):
    tab = _geometry_table(tmp_path, fmt, ngram, hpn, head_dim)
    rng = np.random.default_rng(11)
    with ple.Table(tab, cuda_device=0, wait_timeout_us=3_000_000) as gpu, ple.Table(tab) as cpu:
        dim = gpu.info.embed_dim
        assert (gpu.info.num_heads, gpu.info.head_dim, dim) == ((ngram - 1) * hpn, head_dim, (ngram - 1) * hpn * head_dim)
        for k, n in enumerate([1, 7, 40]):
            toks = rng.integers(0, 248320, n).astype(np.int32)
            pos = np.arange(n, dtype=np.int32)
            ids = dict(request_ids=[200 + k], query_start=[0, n])
            want = cpu.submit(toks, pos, **ids).dequant_cpu()
            assert want.shape == (n, dim) and np.isfinite(want).all() and want.any()
            out = DeviceArray(cuda, n, dim)
            out.fill(7.0)
            step = gpu.submit(toks, pos, **ids)
            gpu.dequant_fuse(step.seq, out, cuda.stream.value)
            cuda.sync()
            gpu.check_device()
            np.testing.assert_array_equal(out.get(), want)


def test_a_head_dim_the_kernel_cannot_serve_is_refused_with_a_gpu(cuda, tmp_path):
    tab = _geometry_table(tmp_path, "fp8", 3, 2, 12)  # 12: not a multiple of 8
    with ple.Table(tab) as cpu:  # the CPU path serves it
        assert cpu.info.head_dim == 12
        assert cpu.submit(np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32), request_ids=[1],
                          query_start=[0, 3]).dequant_cpu().shape == (3, 48)  # fmt: skip
    with pytest.raises(ple.PleUnsupportedError, match="head_dim 12"):
        ple.Table(tab, cuda_device=0)
