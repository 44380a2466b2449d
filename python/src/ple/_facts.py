"""`TableInfo` (``ple_table_info``) and `Counters` (``ple_stats``): frozen dataclasses read from
the C structs. Both also read as a mapping (``info["row_bytes"]``, ``dict(stats)``,
``json.dumps({**info})``), as `Table.info` and `Table.stats()` did when they were dicts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, TypeVar, Union, cast

from ._types import IoBackend, OpenIoMode, TableFormat

V = TypeVar("V", covariant=True)


class _FieldMapping(Mapping[str, V]):
    """Mapping access to a dataclass's fields, in declaration order."""

    def _names(self) -> Dict[str, None]:
        cls = type(self)
        names: Optional[Dict[str, None]] = cls.__dict__.get("_field_names")
        if names is None:  # once per class (dataclasses.fields is slow); a dict keeps the order
            names = dict.fromkeys(f.name for f in dataclasses.fields(cast(Any, self)))
            setattr(cls, "_field_names", names)
        return names

    def __getitem__(self, key: str) -> V:
        if key not in self._names():
            raise KeyError(key)
        return cast(V, getattr(self, key))

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


@dataclass(frozen=True)
class TableInfo(_FieldMapping[Union[int, float, str]]):
    """Facts about an open table (``ple_table_info``); ``ple.h``'s ``ple_info`` documents each.

    Attributes
    ----------
    format : {"nvfp4", "fp8", "bf16", "f32"}
        The row format.
    row_bytes : int
        Bytes per row (the shipped model's 160-element rows: 90, 160, 320 or 640).
    total_rows, addressed_rows : int
        Rows in the file (padded); rows the hash can address (the sum of the head sizes).
    num_heads, head_dim, ngram_size, vocab_size, eos_token_id : int
        The table's geometry (the shipped model: 16 heads of 160 elements, n-gram order 3) and
        its EOS / BOS id.
    global_scale : float
        The global dequantisation scale (1.0 for bf16 and f32).
    file_size : int
        Bytes of the row file.
    device_wait_supported : bool
        Whether device-side waiting is available on the handle's GPU.
    source_name, source_fingerprint : str
        The source checkpoint's name and the hex fingerprint of its index and shard headers.
    io_mode : {"mmap", "direct"}
        The I/O mode the handle opened with (``"auto"`` resolved).
    io_backend : {"mmap", "io_uring", "pread_pool"}
        How it reads.
    cache_bytes : int
        Bytes of the handle's row cache (`PLE_CACHE_AUTO` resolved; 0: none).
    shard_index, shard_count, shard_first_head, shard_heads, shard_head_stride : int
        The head shard served and its heads ``shard_first_head + j * shard_head_stride`` for
        ``j < shard_heads`` (round-robin: ``shard_index, shard_index + shard_count, ...``): 0 of
        1, heads 0..num_heads for the whole table. `total_rows` and `file_size` are the open file's.
    embed_dim : int
        Elements of one token's embedding, ``num_heads * head_dim`` (the width of `dequant_*`
        outputs).
    heads_per_ngram : int
        Heads per n-gram order (``num_heads = (ngram_size - 1) * heads_per_ngram``).
    ple_layer_index : int
        The PLE layer's index among the checkpoint's PLE layers (its hash depends on it).
    """

    format: TableFormat
    row_bytes: int
    total_rows: int
    addressed_rows: int
    num_heads: int
    head_dim: int
    ngram_size: int
    vocab_size: int
    eos_token_id: int
    global_scale: float
    file_size: int
    device_wait_supported: bool
    source_name: str
    source_fingerprint: str
    io_mode: OpenIoMode
    io_backend: IoBackend
    cache_bytes: int
    shard_index: int
    shard_count: int
    shard_first_head: int
    shard_heads: int
    shard_head_stride: int
    embed_dim: int
    heads_per_ngram: int
    ple_layer_index: int


@dataclass(frozen=True)
class Counters(_FieldMapping[int]):
    """A handle's cumulative counters (``ple_stats``), one int per ``ple_counters`` field in its
    order (``ple.h`` documents each); ``*_ns`` are nanoseconds. `_lib.COUNTER_FIELDS`, and so
    the ctypes struct, is made from these fields."""

    prefill_steps: int
    decode_steps: int
    prefill_tokens: int
    decode_tokens: int
    prefill_rows: int
    decode_rows: int
    unique_pages: int
    pages_prefetched: int
    prefetch_steps: int
    major_faults: int
    minor_faults: int
    storage_read_bytes: int
    hash_ns: int
    prefetch_ns: int
    gather_ns: int
    copy_ns: int
    wait_ns: int
    prefill_step_ns: int
    decode_step_ns: int
    timeouts: int
    failed_steps: int
    resident_pages: int
    table_pages: int
    mem_available_bytes: int
    queue_ns: int
    cache_hits: int
    cache_misses: int
    cache_bytes_used: int
    storage_reads: int
    ahead_asked: int
    ahead_read: int
    ahead_dropped: int
    ahead_cached: int
    ahead_hits: int
    abandoned_handles: int
    reaped_handles: int
    resident_dropped_bytes: int
    ahead_collisions: int

    @property
    def overall_hit_rate(self) -> float:
        """Step rows served by the row cache over all step rows (FBGEMM #5777's overall hit
        rate, as `ple bench` prints it); 0.0 before any row."""
        rows = self.prefill_rows + self.decode_rows
        return self.cache_hits / rows if rows else 0.0


def field_names(cls: type) -> List[str]:
    """The field names of one of these dataclasses, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)]
