"""pytest of the Python API around the bindings: the exception classes against the library's own
status names and against real failures, `Step.done()` and `Step` as a context manager (checked by
what the ring then accepts), `Table.closed`, the `info`/`stats()` dataclasses, log routing into
`logging`, and the GPU calls' refusals on a CPU handle (their GPU paths: test_gpu_emulated.py, on
the emulated driver; no real GPU was available to these tests)."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import logging
import os
import pickle
import subprocess
import time

import numpy as np
import pytest

import ple
from ple import _errors, _lib
from test_ple import BASE, SEED, SHARDS, TWO, _ple_bin





# the builtin each status must also be, from the issue (not from the package's own table)
BUILTIN = {
    "PLE_E_INVALID_ARGUMENT": ValueError,
    "PLE_E_IO": OSError,
    "PLE_E_TIMEOUT": TimeoutError,
    "PLE_E_STATE": ValueError,
    "PLE_E_OUT_OF_MEMORY": MemoryError,
}


def test_status_codes_are_the_librarys():
    named = {}
    for code in range(-64, 65):
        name = _lib.status_name(code)
        if name != "unknown status":
            named[code] = name
    assert named == {int(s): s.c_name for s in ple.Status}
    assert named[0] == "PLE_OK" and named[-4] == "PLE_E_TIMEOUT"


def test_every_status_has_its_class_and_builtin():
    for s in ple.Status:
        if s is ple.Status.OK:
            continue
        e = _errors.error_for(int(s), s.c_name, "why")
        assert isinstance(e, ple.PleError) and isinstance(e, RuntimeError)
        assert type(e) is not ple.PleError, s  # each known status has its own class
        assert (e.status, e.name, e.message, str(e)) == (s, s.c_name, "why", f"{s.c_name}: why")
        if s.c_name in BUILTIN:
            assert isinstance(e, BUILTIN[s.c_name]), s
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and (back.status, back.name, back.message) == (e.status, e.name, e.message)
    assert not isinstance(_errors.error_for(-3, "PLE_E_FORMAT", "x"), (ValueError, OSError))
    # a code newer than the package: still a PleError, with the library's name
    e = _errors.error_for(-99, "PLE_E_NEW", "later")
    assert type(e) is ple.PleError and e.status == -99
    # an OS error in the message gives errno; ENOENT is FileNotFoundError
    e = _errors.error_for(-2, "PLE_E_IO", "reading x: Permission denied (os error 13)")
    assert type(e) is ple.PleIOError and e.errno == errno.EACCES
    e = _errors.error_for(-2, "PLE_E_IO", "opening x: No such file or directory (os error 2)")
    assert isinstance(e, FileNotFoundError) and e.errno == errno.ENOENT


def test_real_failures_raise_the_matching_builtin(table_dir, tmp_path):
    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=2) as t:
        with pytest.raises(ValueError) as e:
            t.submit([248320], [0])
        assert type(e.value) is ple.PleInvalidArgumentError and e.value.status == -1
        with pytest.raises(ValueError) as e:
            t.wait(999)
        assert type(e.value) is ple.PleStateError and e.value.name == "PLE_E_STATE"
    missing = str(tmp_path / "no-such-table")
    with pytest.raises(FileNotFoundError) as e:
        ple.Table(missing)
    assert isinstance(e.value, ple.PleIOError) and e.value.name == "PLE_E_IO"
    assert e.value.errno == errno.ENOENT and "no-such-table" in e.value.message
    with pytest.raises(FileNotFoundError):
        ple.pack(str(tmp_path / "no-such-checkpoint"), str(tmp_path / "out"))
    # a full ring under "wait" times out after wait_timeout_us: a TimeoutError
    with ple.Table(table_dir, max_in_flight=1, wait_timeout_us=1000, ring_full_policy="wait") as t:
        first = t.submit(**TWO)
        with pytest.raises(TimeoutError) as e:
            t.submit(**TWO)
        assert type(e.value) is ple.PleTimeoutError and e.value.status == ple.Status.TIMEOUT
        # release waits for its step up to the same 1 ms: wait for it first (a slow machine)
        first.wait(10_000_000)
        first.release()
        again = t.submit(**TWO)  # the slot is free again
        again.wait(10_000_000)
        again.release()


def test_a_closed_table_raises_the_state_error(table_dir):
    t = ple.Table(table_dir)
    assert not t.closed
    t.close()
    assert t.closed
    for call in (lambda: t.submit([1], [0]), t.stats, lambda: t.wait(1), t.check_device):
        with pytest.raises(ValueError, match="the table is closed") as e:
            call()
        assert type(e.value) is ple.PleStateError
        assert (e.value.status, e.value.name) == (ple.Status.STATE, "PLE_E_STATE")
    t.close()  # a second close is a no-op
    with ple.Table(table_dir) as t2:
        assert not t2.closed
    assert t2.closed


def test_done_polls_without_raising(table_dir):
    rng = np.random.default_rng(1)
    n = 8192
    pending_seen = 0
    with ple.Table(table_dir, max_tokens_per_step=n, num_threads=1) as t:
        for i in range(20):
            s = t.submit(rng.integers(0, 248000, n).astype(np.int32), np.arange(n, dtype=np.int32),
                         request_ids=[i + 1], query_start=[0, n])  # fmt: skip
            pending_seen += not s.done()  # hashing and gathering 8192 tokens takes a while
            s.wait()
            assert s.done() and s.done()  # complete: True, and polling changes nothing
            s.release()
            assert s.done()  # a released step is still a submitted, complete step
        assert pending_seen > 0
        t.close()
        with pytest.raises(ple.PleStateError):
            s.done()


def test_step_as_a_context_manager_releases_it(table_dir):
    # one ring slot and "error" on a full ring: a step not released makes the next submit fail
    with ple.Table(table_dir, max_in_flight=1, ring_full_policy="error") as t:
        s = t.submit(**TWO)
        with pytest.raises(ple.PleStateError):
            t.submit(**TWO)
        s.release()
        with t.submit(**TWO) as s:
            assert s.packed_rows().shape == (8, 16, 90) and not s.consumed
        assert s.consumed
        with pytest.raises(ple.PleStateError):
            s.release()  # the block released it: a second release is refused
        with t.submit(**TWO) as s:
            got = s.dequant_cpu()
        assert got.shape == (8, 2560) and s.consumed  # consumed inside: no second release at exit
        with pytest.raises(KeyError):
            with t.submit(**TWO):
                raise KeyError("the exception in flight")
        t.submit(**TWO).release()  # the step of the failed block was released
        with t.submit(**TWO) as s:
            t.close()  # closed inside the block: nothing to release, no error
    with pytest.raises(AttributeError):
        s.other = 1  # __slots__
    assert not hasattr(s, "__dict__")


def test_info_and_stats_are_frozen_dataclasses_that_read_as_mappings(table_dir):
    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=2) as t:
        i = t.info
        assert isinstance(i, ple.TableInfo) and dataclasses.is_dataclass(i)
        assert (i.format, i.row_bytes, i.num_heads, i.head_dim) == ("nvfp4", 90, 16, 160)
        assert all(i[f.name] == getattr(i, f.name) for f in dataclasses.fields(i))
        assert list(i) == [f.name for f in dataclasses.fields(i)] and len(i) == 25
        assert (i.embed_dim, i.heads_per_ngram, i.ple_layer_index) == (2560, 8, 0)
        assert json.loads(json.dumps({**i}))["source_name"] == i.source_name
        with pytest.raises(dataclasses.FrozenInstanceError):
            i.row_bytes = 1  # type: ignore[misc]
        with pytest.raises(KeyError):
            i["no_such_field"]
        t.submit(**TWO).dequant_cpu()
        s = t.stats()
        assert isinstance(s, ple.Counters) and s.decode_tokens == s["decode_tokens"] == 8
        assert list(s) == _lib.COUNTER_FIELDS and dict(s)["decode_rows"] == 8 * 16
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.decode_rows = 0  # type: ignore[misc]
        # the ctypes struct is built from the dataclass: one more field there is one more here
        assert [f for f, _ in _lib.ple_counters._fields_][1:] == [f.name for f in dataclasses.fields(s)]


def _wait_for(records, text, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hits = [r for r in records if text in r.getMessage()]
        if hits:
            return hits
        time.sleep(0.01)
    return []


def test_log_messages_reach_the_ple_logger(table_dir):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("ple")
    h = Keep(level=1)
    logger.addHandler(h)
    old = logger.level
    logger.setLevel(1)
    try:
        ple.log_to_python("debug")
        with ple.Table(table_dir) as t:
            with pytest.raises(ple.PleError):
                t.submit([248321], [0])  # PLE_LOG_DEBUG logs every error returned, with its text
            hits = _wait_for(records, "248321")
            assert hits, [r.getMessage() for r in records]
            assert all(r.name == "ple" and r.levelno == logging.DEBUG for r in hits)
            ple.log_to_python("error")  # debug messages are no longer delivered
            with pytest.raises(ple.PleError):
                t.submit([248322], [0])
            ple.log_to_python(None)  # returns once the old callback is done: nothing comes after
            n = len(records)
            with pytest.raises(ple.PleError):
                t.submit([248323], [0])
            time.sleep(0.2)
            assert len(records) == n
            assert not [r for r in records if "248322" in r.getMessage() or "248323" in r.getMessage()]
        seen = []
        ple.set_log_callback(lambda level, msg: seen.append((level, msg)), "debug")
        with pytest.raises(ple.PleError):
            ple.Table(table_dir, shard_count=17)
        deadline = time.monotonic() + 10
        while not any("shard_count" in m for _, m in seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any(level == 4 and "shard_count" in m for level, m in seen), seen
        with pytest.raises(ValueError, match="max_level"):
            ple.set_log_callback(print, "loud")  # type: ignore[arg-type]

        def broken(level, msg):
            raise RuntimeError("a broken callback")

        ple.set_log_callback(broken, "debug")  # its exception goes to the "ple" logger, not into libple
        with pytest.raises(ple.PleError):
            ple.Table(table_dir, shard_count=18)
        hits = _wait_for(records, "ple log callback failed")
        assert hits and hits[0].levelno == logging.ERROR and "shard_count" in hits[0].getMessage()
        assert hits[0].exc_info[0] is RuntimeError
    finally:
        ple.log_to_python(None)
        logger.removeHandler(h)
        logger.setLevel(old)


class FakeCuda:
    """A device array at an address nothing may write: libple must refuse before using it."""

    __cuda_array_interface__ = {"data": (0x1000, False), "shape": (8, 2560), "typestr": "<f4", "version": 3}


def test_gpu_calls_on_a_cpu_handle_raise_cuda_unavailable(table_dir):
    # no GPU on this machine: only the refusals are checked, not the CUDA Graph or device paths
    with ple.Table(table_dir) as t:
        assert t.info.device_wait_supported is False
        for call in (
            t.check_device,
            lambda: t.graph_prepare(None, 1),
            lambda: t.dequant_fuse_graph(FakeCuda(), 0),
            lambda: t.dequant_fuse_graph(FakeCuda(), None, capacity_tokens=4, dtype="bf16", accumulate=True),
        ):
            with pytest.raises(ple.PleCudaUnavailableError) as e:
                call()
            assert e.value.status == ple.Status.CUDA_UNAVAILABLE and "cuda_device" in e.value.message
        with pytest.raises(ValueError, match="capacity_tokens 9"):
            t.dequant_fuse_graph(FakeCuda(), 0, capacity_tokens=9)  # more than out's 8 rows
        with pytest.raises(TypeError, match="CUDA stream"):
            t.graph_prepare(object(), 1)  # type: ignore[arg-type]
    if os.environ.get("PLE_CUDA_EMU"):
        return  # test_gpu_emulated.py opens GPU handles; libple keeps a failed driver load for good
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:  # no CUDA driver: a GPU handle is refused
        with pytest.raises(ple.PleCudaUnavailableError):
            ple.Table(table_dir, cuda_device=0)


def _public_callables():
    import inspect

    for n in ple.__all__:
        o = getattr(ple, n)
        if inspect.isfunction(o):
            yield n, o
        elif inspect.isclass(o) and not issubclass(o, BaseException):
            for m, f in vars(o).items():
                if not m.startswith("_") and inspect.isfunction(f):
                    yield f"{n}.{m}", f


def test_public_functions_have_numpydoc_sections():
    import inspect

    seen, missing = 0, []
    for name, f in _public_callables():
        seen += 1
        doc = inspect.getdoc(f) or ""
        sig = inspect.signature(f)
        if not doc:
            missing.append((name, "docstring"))
        if [p for p in sig.parameters if p not in ("self", "cls")] and "Parameters\n----------" not in doc:
            missing.append((name, "Parameters"))
        if sig.return_annotation not in ("None", None, inspect.Signature.empty) and "Returns\n-------" not in doc:
            missing.append((name, "Returns"))
    assert seen >= 20 and not missing, missing
