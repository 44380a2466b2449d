"""Python bindings of libple (ctypes over the bundled ``libple.so``): serve the n-gram (PLE)
embedding table of Qwen3.8-Flash-Next-style models from NVMe.

    import ple
    with ple.Table("/nvme/ple-table", max_tokens_per_step=8192) as t:
        step = t.submit(tokens, positions, request_ids=ids, query_start=qsl)
        emb = step.dequant_cpu()                       # [num_tokens, info.embed_dim] float32
        # or, on a GPU handle: step.dequant_fuse(hidden, torch.cuda.current_stream())

Failures raise `PleError` subclasses that also derive from the matching builtin
(`PleTimeoutError` is a `TimeoutError`, `PleNotFoundError` a `FileNotFoundError`, ...).
"""

from ._errors import (
    PleCudaError,
    PleCudaUnavailableError,
    PleError,
    PleFormatError,
    PleInvalidArgumentError,
    PleIOError,
    PleNotFoundError,
    PleOutOfMemoryError,
    PlePanicError,
    PleStateError,
    PleTimeoutError,
    PleUnsupportedError,
    Status,
)
from ._facts import Counters, TableInfo
from ._lib import PLE_CACHE_AUTO, PLE_MAX_EMBED_DIM, PLE_MAX_HEAD_DIM, PLE_MAX_HEADS
from ._log import log_to_python, set_log_callback
from ._pack import batch_from_requests, pack, version
from ._types import TableOptions
from .step import Step
from .table import Table

__all__ = [
    "PLE_CACHE_AUTO",
    "PLE_MAX_EMBED_DIM",
    "PLE_MAX_HEAD_DIM",
    "PLE_MAX_HEADS",
    "Counters",
    "PleCudaError",
    "PleCudaUnavailableError",
    "PleError",
    "PleFormatError",
    "PleIOError",
    "PleInvalidArgumentError",
    "PleNotFoundError",
    "PleOutOfMemoryError",
    "PlePanicError",
    "PleStateError",
    "PleTimeoutError",
    "PleUnsupportedError",
    "Status",
    "Step",
    "Table",
    "TableInfo",
    "TableOptions",
    "batch_from_requests",
    "log_to_python",
    "pack",
    "set_log_callback",
    "version",
]
__version__ = "0.3.0"
