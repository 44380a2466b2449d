"""ctypes declarations of libple's C API (include/ple.h): the versioned structs, the functions, and
`check`, which turns a failed status into its exception (`_errors`). Struct layouts mirror the
header field for field; the versioned structs carry `struct_size`, so a library with more
(appended) fields still accepts them."""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_float,
    c_int32,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, Dict, List, Optional, Tuple

from ._errors import PleError as PleError  # re-exported: `_lib.PleError` predates `_errors`
from ._errors import error_for
from ._facts import Counters, field_names

c_int32_p = POINTER(c_int32)
c_uint64_p = POINTER(c_uint64)
c_uint32_p = POINTER(c_uint32)

# Maxima of a table's geometry (`ple.h`); a table's own is `Table.info` (num_heads, head_dim,
# embed_dim)
PLE_MAX_HEADS = 64
PLE_MAX_HEAD_DIM = 4096
PLE_MAX_EMBED_DIM = 32768
# `cache_bytes` default: a 256 MiB row cache for a DIRECT handle, none for MMAP (`ple.h`)
PLE_CACHE_AUTO = 2**64 - 1

DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
FUSE_ACCUMULATE = 1
FORMATS = {1: "nvfp4", 2: "fp8", 3: "bf16", 4: "f32"}
PREFETCH = {"auto": 0, "always": 1, "never": 2}
RING_FULL = {"wait": 0, "error": 1}
WAIT_MODE = {"auto": 0, "host": 1, "stream_op": 2, "spin_kernel": 3}
IO_MODE = {"auto": 0, "mmap": 1, "direct": 2}
IO_BACKENDS = {0: "mmap", 1: "io_uring", 2: "pread_pool"}
LOG_LEVELS = {"error": 1, "warn": 2, "info": 3, "debug": 4, "trace": 5}
WAIT_FOREVER = (1 << 64) - 1


class ple_options(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens_per_step", c_uint32),
        ("max_in_flight", c_uint32),
        ("num_threads", c_uint32),
        ("prefetch_policy", c_int32),
        ("prefetch_min_rows", c_uint32),
        ("ring_full_policy", c_int32),
        ("wait_timeout_us", c_uint64),
        ("history_window", c_uint32),
        ("cuda_device", c_int32),
        ("wait_mode", c_int32),
        ("config_json_path", c_char_p),
        ("checkpoint_dir", c_char_p),
        ("cache_bytes", c_uint64),
        ("io_mode", c_int32),
        ("shard_count", c_uint32),
        ("shard_index", c_uint32),
        ("ahead_max_rows", c_uint64),
        ("resident_bytes_max", c_uint64),
        ("sigbus_handler", c_int32),
    ]


class ple_pack_options(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("force", c_int32),
        ("buffer_bytes", c_uint64),
        ("shard_count", c_uint32),
        ("shard_index", c_uint32),
    ]


class ple_batch(Structure):
    _fields_ = [
        ("tokens", c_void_p),
        ("positions", c_void_p),
        ("num_tokens", c_uint32),
        ("request_ids", c_void_p),
        ("query_start", c_void_p),
        ("num_requests", c_uint32),
        ("context", c_void_p),
    ]


class ple_token_batch(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("tokens", c_void_p),
        ("positions", c_void_p),
        ("token_request_ids", c_void_p),
        ("num_tokens", c_uint32),
        ("context", c_void_p),
    ]


class ple_info(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("format", c_int32),
        ("row_bytes", c_uint32),
        ("total_rows", c_uint64),
        ("addressed_rows", c_uint64),
        ("num_heads", c_uint32),
        ("head_dim", c_uint32),
        ("ngram_size", c_uint32),
        ("vocab_size", c_uint32),
        ("eos_token_id", c_int32),
        ("global_scale", c_float),
        ("file_size", c_uint64),
        ("device_wait_supported", c_int32),
        ("source_name", c_char * 256),
        ("source_fingerprint", c_char * 72),
        ("io_mode", c_int32),
        ("io_backend", c_int32),
        ("cache_bytes", c_uint64),
        ("shard_index", c_uint32),
        ("shard_count", c_uint32),
        ("shard_first_head", c_uint32),
        ("shard_heads", c_uint32),
        ("shard_head_stride", c_uint32),
        ("embed_dim", c_uint32),
        ("heads_per_ngram", c_uint32),
        ("ple_layer_index", c_uint32),
    ]


# the ple_counters fields after struct_size, in order: `Counters`' fields (their one home)
COUNTER_FIELDS = field_names(Counters)


class ple_counters(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(f, c_uint64) for f in COUNTER_FIELDS]


PROGRESS_FN = CFUNCTYPE(c_int32, c_uint64, c_uint64, c_void_p)
LOG_FN = CFUNCTYPE(None, c_int32, c_char_p, c_void_p)


def _find_library() -> str:
    env = os.environ.get("PLE_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libple.so")
    if os.path.exists(here):
        return here
    return "libple.so.0.3"  # an installed libple on the loader's path


# every function of ple.h: name -> (restype, argtypes); tests/test_lib_signatures.py checks each
# against the header's prototype. A handle (`struct ple_handle *`) is an opaque c_void_p.
_HANDLE = c_void_p
SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "ple_status_name": (c_char_p, [c_int32]),
    "ple_version_string": (c_char_p, []),
    "ple_abi_version": (c_uint32, []),
    "ple_last_error_message": (c_char_p, []),
    "ple_options_default": (c_int32, [POINTER(ple_options)]),
    "ple_open": (c_int32, [c_char_p, POINTER(ple_options), POINTER(c_void_p)]),
    "ple_close": (None, [_HANDLE]),
    "ple_table_info": (c_int32, [_HANDLE, POINTER(ple_info)]),
    "ple_stats": (c_int32, [_HANDLE, POINTER(ple_counters)]),
    "ple_stats_residency": (c_int32, [_HANDLE, POINTER(ple_counters)]),
    "ple_submit": (c_int32, [_HANDLE, POINTER(ple_batch), c_uint64]),
    "ple_submit_tokens": (c_int32, [_HANDLE, POINTER(ple_token_batch), c_uint64]),
    "ple_prefetch_ahead": (c_int32, [_HANDLE, POINTER(ple_batch)]),
    "ple_prefetch_ahead_tokens": (c_int32, [_HANDLE, POINTER(ple_token_batch)]),
    "ple_submit_ids": (c_int32, [_HANDLE, c_void_p, c_uint32, c_uint32, c_uint64]),
    "ple_prefetch_ahead_ids": (c_int32, [_HANDLE, c_void_p, c_uint32]),
    "ple_wait": (c_int32, [_HANDLE, c_uint64, c_uint64]),
    "ple_packed_rows": (c_int32, [_HANDLE, c_uint64, POINTER(POINTER(c_uint8)), c_uint32_p]),
    "ple_release_step": (c_int32, [_HANDLE, c_uint64]),
    "ple_dequant_cpu": (c_int32, [_HANDLE, c_uint64, c_void_p, c_int32, c_size_t, c_uint32]),
    "ple_dequant_fuse": (
        c_int32,
        [_HANDLE, c_void_p, c_uint64, c_void_p, c_int32, c_size_t, c_uint32],
    ),
    "ple_ngram_ids": (c_int32, [_HANDLE, POINTER(ple_batch), c_void_p]),
    "ple_ngram_ids_tokens": (c_int32, [_HANDLE, POINTER(ple_token_batch), c_void_p]),
    "ple_release_request": (c_int32, [_HANDLE, c_uint64]),
    "ple_set_log_callback": (c_int32, [LOG_FN, c_int32, c_void_p]),
    "ple_check_device": (c_int32, [_HANDLE]),
    "ple_graph_prepare": (c_int32, [_HANDLE, c_void_p, c_uint64]),
    "ple_dequant_fuse_graph": (
        c_int32,
        [_HANDLE, c_void_p, c_uint32, c_void_p, c_int32, c_size_t, c_uint32],
    ),
    "ple_pack_options_default": (c_int32, [POINTER(ple_pack_options)]),
    "ple_pack": (
        c_int32,
        [c_char_p, c_char_p, POINTER(ple_pack_options), PROGRESS_FN, c_void_p],
    ),
}


def _declare(lib: ctypes.CDLL) -> None:
    for name, (res, args) in SIGNATURES.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


lib = ctypes.CDLL(_find_library())
_declare(lib)


def status_name(status: int) -> str:
    """The C name of a status code (``ple_status_name``: ``"PLE_E_IO"``, ...)."""
    name: bytes = lib.ple_status_name(status)
    return name.decode()


def check(status: int, path: Optional[str] = None) -> None:
    """Raises the `PleError` subclass of `status` for a status other than ``PLE_OK`` (0), with
    ``ple_last_error_message()``; `path` (the path the call opened) as in `error_for`."""
    if status != 0:
        msg = (lib.ple_last_error_message() or b"").decode("utf-8", "replace")
        raise error_for(status, status_name(status), msg, path)
