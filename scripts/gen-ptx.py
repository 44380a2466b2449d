#!/usr/bin/env python3
"""Compiles kernels/ple_kernels.cu to PTX with NVRTC (ctypes on libnvrtc from PyPI's
nvidia-cuda-nvrtc-cu12, pinned below) and writes it to kernels/ple_kernels.ptx, which crates/ple-core/src/dequant/gpu/layout.rs
embeds. The PTX targets compute_80, so the driver JIT-compiles it for sm_80 ... sm_121.

Usage: scripts/gen-ptx.py [--out PATH] [--src PATH]

The NVRTC version is pinned so the output is deterministic (scripts/check-kernels.sh regenerates it
and compares byte for byte). It also fixes the PTX ISA version in the file's `.version` line, and
the driver must support that ISA: NVRTC 12.2 emits ISA 8.2, loadable by drivers of CUDA 12.2 or
newer (Linux driver >= 535). Changing the pin changes that requirement: update docs and
crates/ple-core/src/dequant/gpu/layout.rs (PTX_ISA, MIN_DRIVER) together.
"""
import argparse
import ctypes
import os
import sys

# Keep in sync with scripts/check-kernels.sh and crates/ple-core/src/dequant/gpu/layout.rs.
NVRTC_WHEEL = "nvidia-cuda-nvrtc-cu12==12.2.140"
NVRTC_VERSION = (12, 2)
OPTIONS = [
    "--gpu-architecture=compute_80",
    "--fmad=false",  # no FMA contraction: the dequant rule is mul_rn then add_rn
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--std=c++17",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_libnvrtc():
    try:
        import nvidia.cuda_nvrtc as pkg  # noqa: F401
    except ImportError:
        sys.exit(f"gen-ptx: the Python package is missing: pip install '{NVRTC_WHEEL}'")
    paths = list(getattr(pkg, "__path__", []))
    for base in paths:
        lib = os.path.join(base, "lib")
        if os.path.isdir(lib):
            for name in sorted(os.listdir(lib)):
                if name.startswith("libnvrtc.so"):
                    return os.path.join(lib, name)
    sys.exit(f"gen-ptx: no libnvrtc.so under {paths}")


def check(nvrtc, res, what, prog=None):
    if res == 0:
        return
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    msg = nvrtc.nvrtcGetErrorString(res).decode()
    log = ""
    if prog is not None:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
    sys.exit(f"gen-ptx: {what} failed: {msg}\n{log}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=os.path.join(ROOT, "kernels", "ple_kernels.cu"))
    ap.add_argument("--out", default=os.path.join(ROOT, "kernels", "ple_kernels.ptx"))
    args = ap.parse_args()

    nvrtc = ctypes.CDLL(find_libnvrtc())
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(nvrtc, nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    if (major.value, minor.value) != NVRTC_VERSION:
        sys.exit(
            f"gen-ptx: NVRTC {major.value}.{minor.value} found, {NVRTC_VERSION[0]}.{NVRTC_VERSION[1]}"
            f" required (pip install '{NVRTC_WHEEL}')"
        )

    with open(args.src, "rb") as f:
        src = f.read()
    prog = ctypes.c_void_p()
    check(
        nvrtc,
        nvrtc.nvrtcCreateProgram(
            ctypes.byref(prog), src, b"ple_kernels.cu", 0, None, None
        ),
        "nvrtcCreateProgram",
    )
    opts = (ctypes.c_char_p * len(OPTIONS))(*[o.encode() for o in OPTIONS])
    res = nvrtc.nvrtcCompileProgram(prog, len(OPTIONS), opts)
    check(nvrtc, res, "nvrtcCompileProgram", prog)
    # Warnings fail the build too: the kernels must compile cleanly.
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    if size.value > 1:
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        sys.exit(f"gen-ptx: NVRTC printed diagnostics:\n{buf.value.decode(errors='replace')}")
    check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    ptx = buf.value  # without the trailing NUL
    with open(args.out, "wb") as f:
        f.write(ptx)
    print(f"gen-ptx: {args.src} -> {args.out} ({len(ptx)} bytes, NVRTC {major.value}.{minor.value})")


if __name__ == "__main__":
    main()
