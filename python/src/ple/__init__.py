"""Python bindings of libple (ctypes over the bundled ``libple.so``): serve the n-gram (PLE)
embedding table of Qwen3.8-Flash-Next-style models from NVMe.

    import ple
    with ple.Table("/nvme/ple-table", max_tokens_per_step=8192) as t:
        step = t.submit(tokens, positions, request_ids=ids, query_start=qsl)
        emb = step.dequant_cpu()                       # [num_tokens, 2560] float32
        # or, on a GPU handle: step.dequant_fuse(hidden, torch.cuda.current_stream())
"""

from ._lib import PLE_CACHE_AUTO, PLE_EMBED_DIM, PLE_NUM_HEADS, PleError
from .table import Step, Table, batch_from_requests, pack, version

__all__ = [
    "PLE_CACHE_AUTO",
    "PLE_EMBED_DIM",
    "PLE_NUM_HEADS",
    "PleError",
    "Step",
    "Table",
    "batch_from_requests",
    "pack",
    "version",
]
__version__ = "0.1.0"
