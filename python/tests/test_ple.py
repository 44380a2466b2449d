"""pytest of the `ple` package against independent expectations: rows read straight from the
table file, values decoded with ml_dtypes, the `ple` CLI's ids, per-token vs offsets form.

Fixture tables come from the `ple` CLI (`PLE_BIN`, or `ple` on PATH): `synth-table`,
`synth-checkpoint`. No Rust toolchain is needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ple
from ple import _arrays, _lib

from conftest import BASE, SEED, SHARDS
from conftest import ple_bin as _ple_bin

H, D = 16, 2560


@pytest.fixture()
def table(table_dir):
    with ple.Table(table_dir, max_tokens_per_step=256, num_threads=2) as t:
        yield t


def file_rows(table_dir: str, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` read from the table's row file (row r at r * 90, no header)."""
    raw = np.fromfile(os.path.join(table_dir, "table.rows"), np.uint8).reshape(-1, 90)
    return raw[ids.reshape(-1)].reshape(*ids.shape, 90)


def nvfp4_values(rows: np.ndarray, scale: float) -> np.ndarray:
    """[..., 90] NVFP4 rows -> [..., 160] float32: e2m1 codes (low nibble first) x e4m3 block
    scale per 16 elements x the global scale."""
    ml = pytest.importorskip("ml_dtypes")
    r = rows.reshape(-1, 90)
    c = np.empty((r.shape[0], 160), np.uint8)
    c[:, 0::2] = r[:, :80] & 0x0F
    c[:, 1::2] = r[:, :80] >> 4
    v = c.view(ml.float4_e2m1fn).astype(np.float32)
    s = np.ascontiguousarray(r[:, 80:]).view(ml.float8_e4m3fn).astype(np.float32)
    return (v * np.repeat(s, 16, axis=1) * np.float32(scale)).reshape(*rows.shape[:-1], 160)


TWO = ple.batch_from_requests([(7, 0, [11, 12, 13, 14, 15]), (9, 0, [21, 22, 23])])


def test_info_fields_line_up_with_the_header(table):
    i = table.info
    assert (i["format"], i["row_bytes"], i["num_heads"], i["head_dim"]) == ("nvfp4", 90, 16, 160)
    assert (i["ngram_size"], i["vocab_size"], i["eos_token_id"]) == (3, 248320, 248044)
    assert i["global_scale"] == 0.015625
    assert i["file_size"] == i["total_rows"] * 90
    # the two strings are the struct's last fields: they read right only if every offset does
    assert i["source_name"] == f"synthetic-nvfp4-seed{SEED}"
    assert i["source_fingerprint"] == f"synthetic:{SEED:016x}"
    o = _lib.ple_options()
    _lib.check(_lib.lib.ple_options_default(o))
    assert o.struct_size == _lib.ctypes.sizeof(_lib.ple_options)
    assert (o.max_tokens_per_step, o.max_in_flight, o.cuda_device) == (8192, 2, -1)
    assert o.cache_bytes == ple.PLE_CACHE_AUTO
    # a small table opens MMAP under AUTO, and AUTO gives an MMAP handle no row cache
    assert (i["io_mode"], i["io_backend"], i["cache_bytes"]) == ("mmap", "mmap", 0)


def test_a_row_cache_of_the_size_asked_for(table_dir):
    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=2, cache_bytes=8 << 20) as t:
        assert t.info["cache_bytes"] == 8 << 20
        for _ in range(2):
            t.submit(**TWO).release()
        s = t.stats()
        assert s["cache_hits"] + s["cache_misses"] == s["prefill_rows"] + s["decode_rows"]
        assert s["cache_hits"] >= 8 * 16  # the second step's rows were all cached
        # the same step twice into an empty cache: the second's 128 rows all hit, the first's
        # only a row it holds twice (each distinct row missed once)
        distinct = len(np.unique(t.ngram_ids(**TWO)))
        assert s.overall_hit_rate == s["cache_hits"] / 256
        assert 0.5 <= s.overall_hit_rate <= (256 - distinct) / 256


def test_prefetch_ahead_fills_the_cache_and_changes_no_history(table_dir):
    import time

    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=2, cache_bytes=8 << 20, io_mode="mmap") as t:
        ids_before = t.ngram_ids(**TWO)
        t.prefetch_ahead(**TWO)
        t.prefetch_ahead(**TWO, token_request_ids=None)
        deadline = time.monotonic() + 20
        while True:
            s = t.stats()
            if s["ahead_asked"] == s["ahead_read"] + s["ahead_dropped"] + s["ahead_cached"]:
                break
            assert time.monotonic() < deadline, s
            time.sleep(0.001)
        assert s["ahead_asked"] == 2 * 8 * 16
        assert np.array_equal(t.ngram_ids(**TWO), ids_before)  # no history change
        rows = t.submit(**TWO).packed_rows().copy()
        assert np.array_equal(rows.reshape(-1, rows.shape[-1]), file_rows(table_dir, ids_before.reshape(-1)))
        s = t.stats()
        assert s["cache_misses"] == 0 and s["ahead_hits"] == s["ahead_read"] > 0
        t.close()
        with pytest.raises(ple.PleError):
            t.prefetch_ahead(**TWO)


def test_packed_rows_are_the_table_rows_at_the_ids(table, table_dir):
    ids = table.ngram_ids(**TWO)
    step = table.submit(**TWO)
    rows = step.packed_rows()
    assert rows.shape == (8, 16, 90) and not rows.flags.writeable
    np.testing.assert_array_equal(rows, file_rows(table_dir, ids))
    step.release()


def test_submit_ids_gives_the_token_paths_rows_and_output_and_refuses_bad_ids(table_dir):
    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=2, cache_bytes=8 << 20, io_mode="mmap") as t:
        ids = t.ngram_ids(**TWO)
        a = t.submit(**TWO)
        rows_a, out_a = a.packed_rows().copy(), a.dequant_cpu()
        b = t.submit_ids(ids)
        rows_b = b.packed_rows().copy()
        np.testing.assert_array_equal(rows_b, rows_a)
        np.testing.assert_array_equal(rows_b, file_rows(table_dir, ids))
        np.testing.assert_array_equal(b.dequant_cpu().view(np.uint32), out_a.view(np.uint32))
        # a list of lists and a CPU-order copy of another integer dtype read the same
        c = t.submit_ids(ids.astype(np.uint32).tolist(), prefill=True)
        np.testing.assert_array_equal(c.packed_rows(), rows_a)
        c.release()
        assert t.stats()["prefill_rows"] >= 8 * 16
        # read ahead by ids
        t.prefetch_ahead_ids(ids)
        assert t.stats()["ahead_asked"] == 8 * 16
        # bad ids: outside its head (named with token, head, value), wrong shape, not integers
        bad = ids.copy()
        bad[1, 9] = -5
        rows_before = t.stats()["prefill_rows"] + t.stats()["decode_rows"]
        for call in (lambda: t.submit_ids(bad), lambda: t.prefetch_ahead_ids(bad)):
            with pytest.raises(ple.PleInvalidArgumentError) as e:
                call()
            assert "ids[1][9] = -5 (token 1, head 9)" in e.value.message
        for wrong in (ids[:, :15], ids.reshape(-1), ids.astype(np.float64), np.empty((0, 16), np.int64)):
            with pytest.raises(ple.PleInvalidArgumentError):
                t.submit_ids(wrong)
        assert t.stats()["prefill_rows"] + t.stats()["decode_rows"] == rows_before


def test_dequant_cpu_matches_an_ml_dtypes_decode(table, table_dir):
    ids = table.ngram_ids(**TWO)
    want = nvfp4_values(file_rows(table_dir, ids), table.info["global_scale"]).reshape(8, D)
    got = table.submit(**TWO).dequant_cpu()
    assert got.dtype == np.float32 and got.shape == (8, D)
    np.testing.assert_array_equal(got, want)
    # f16 into every other row of a wider buffer, then accumulate on top
    buf = np.full((16, D + 64), 7, np.float16)
    out = buf[::2]
    table.submit(**TWO).dequant_cpu(out)
    np.testing.assert_array_equal(out[:, :D], want.astype(np.float16))
    assert (out[:, D:] == 7).all() and (buf[1::2] == 7).all()
    table.submit(**TWO).dequant_cpu(out, accumulate=True)
    acc = (want.astype(np.float16).astype(np.float32) + want).astype(np.float16)
    np.testing.assert_array_equal(out[:, :D], acc)
    ml = pytest.importorskip("ml_dtypes")
    bf = table.submit(**TWO).dequant_cpu(dtype=ml.bfloat16)
    assert bf.dtype == ml.bfloat16
    np.testing.assert_array_equal(bf.view(np.uint16), want.astype(ml.bfloat16).view(np.uint16))


def test_per_token_form_gives_rows_in_callers_order(table_dir):
    rng = np.random.default_rng(5)
    steps = [
        [(7, 0, [11, 12, 13, 14]), (9, 0, [21, 22, 23]), (4, 0, [1])],
        [(7, 4, [15]), (9, 3, [24]), (4, 1, [2, 3, 4])],
        [(9, 4, [25, 26])],
    ]
    with ple.Table(table_dir) as a, ple.Table(table_dir) as b:
        for spans in steps:
            off = ple.batch_from_requests(spans)
            n = off["tokens"].size
            perm = rng.permutation(n)
            owner = np.repeat(off["request_ids"], np.diff(off["query_start"]))
            tok, pos, tid = off["tokens"][perm], off["positions"][perm], owner[perm]
            np.testing.assert_array_equal(b.ngram_ids(tok, pos, token_request_ids=tid), a.ngram_ids(**off)[perm])
            want = a.submit(**off).dequant_cpu()
            got = b.submit(tok, pos, token_request_ids=tid)
            np.testing.assert_array_equal(got.dequant_cpu(), want[perm])
        for s in (a.stats(), b.stats()):
            assert s["prefill_tokens"] + s["decode_tokens"] == 15


def test_per_token_ids_equal_offsets_ids(table):
    off = ple.batch_from_requests([(1, 5, [10, 11, 12]), (2, 0, [20, 21])])
    ctx = np.array([3, 4, 248044, 248044], np.int32)
    want = table.ngram_ids(**off, context=ctx)
    perm = np.array([4, 2, 0, 3, 1])
    owner = np.array([1, 1, 1, 2, 2], np.uint64)
    # stateless context in order of first appearance: request 2 (token 4) comes first
    ctx_tok = np.array([248044, 248044, 3, 4], np.int32)
    got = table.ngram_ids(off["tokens"][perm], off["positions"][perm], token_request_ids=owner[perm], context=ctx_tok)
    np.testing.assert_array_equal(got, want[perm])


def test_errors_carry_status_name_and_message(table, table_dir):
    with pytest.raises(ple.PleError) as e:
        table.submit([248320], [0])
    assert e.value.name == "PLE_E_INVALID_ARGUMENT" and e.value.status == -1
    assert "outside [0, 248320)" in e.value.message and str(e.value).startswith("PLE_E_INVALID_ARGUMENT: ")
    with pytest.raises(ple.PleError) as e:
        table.submit([1, 2], [0, 0], token_request_ids=[5, 5])
    assert "both at position 0" in e.value.message
    with pytest.raises(ple.PleError) as e:
        table.wait(999)
    assert e.value.name == "PLE_E_STATE"
    with pytest.raises(ple.PleError) as e:
        ple.Table(table_dir + "-missing")
    assert e.value.name in ("PLE_E_IO", "PLE_E_FORMAT") and "missing" in e.value.message
    with pytest.raises(TypeError, match="unknown option"):
        ple.Table(table_dir, max_tokens=3)
    with pytest.raises(ValueError, match="prefetch_policy"):
        ple.Table(table_dir, prefetch_policy="sometimes")
    t = ple.Table(table_dir)
    t.close()
    with pytest.raises(ple.PleError, match="closed"):
        t.submit([1], [0])


def test_inputs_are_read_in_place_when_the_layout_allows():
    a = np.arange(10, dtype=np.int32)
    assert _arrays.host_input(a, np.int32, "x") is a
    b = _arrays.host_input(a[::2], np.int32, "x")  # strided: a copy
    assert not np.shares_memory(a, b) and b.tolist() == [0, 2, 4, 6, 8]
    c = _arrays.host_input(np.arange(3, dtype=np.int64), np.int32, "x")
    assert c.dtype == np.int32
    assert _arrays.host_input([1, 2], np.uint64, "x").tolist() == [1, 2]


def test_packed_rows_view_keeps_the_handle_open(table_dir):
    t = ple.Table(table_dir)
    ids = t.ngram_ids(**TWO)
    rows = t.submit(**TWO).packed_rows()
    t.close()
    np.testing.assert_array_equal(rows, file_rows(table_dir, ids))


def test_stats_count_steps(table):
    table.submit(**TWO).dequant_cpu()
    table.submit([16, 24], [5, 3], request_ids=[7, 9], query_start=[0, 1, 2]).release()
    s = table.stats()
    assert set(s) == set(_lib.COUNTER_FIELDS)
    assert (s["prefill_steps"], s["decode_steps"]) == (0, 2)  # spans of at most 8 tokens
    assert (s["decode_tokens"], s["decode_rows"]) == (10, 160)
    assert s["table_pages"] > 0 and s["failed_steps"] == 0
    # residency is measured only when asked for (a mincore pass: not every step)
    assert (s["resident_pages"], s["mem_available_bytes"]) == (0, 0)
    r = table.stats(residency=True)
    assert r["resident_pages"] > 0 and r["mem_available_bytes"] > 0
    assert (r["table_pages"], r["decode_rows"]) == (s["table_pages"], s["decode_rows"])


def test_dequant_fuse_argument_plumbing(table):
    class FakeCuda:
        __cuda_array_interface__ = {"data": (0x1000, False), "shape": (8, D), "typestr": "<f2", "version": 3}

    d = _arrays.device_output(FakeCuda(), D)
    assert (d.ptr, d.rows, d.stride, d.dtype) == (0x1000, 8, D, _lib.DTYPE_F16)
    assert _arrays.device_output(FakeCuda(), D, dtype="bfloat16").dtype == _lib.DTYPE_BF16

    class TorchLikeStream:
        cuda_stream = 0xABC

    assert _arrays.stream_handle(TorchLikeStream()) == 0xABC
    assert _arrays.stream_handle(None) == 0 and _arrays.stream_handle(77) == 77
    assert [_arrays.dtype_code(x) for x in (np.float32, np.float16, "bf16", "<f4")] == [0, 1, 2, 0]
    with pytest.raises(TypeError, match="not float32"):
        _arrays.dtype_code(np.int8)
    # a CPU handle has no GPU side: libple refuses, nothing is written at the fake address
    step = table.submit(**TWO)
    with pytest.raises(ple.PleError) as e:
        step.dequant_fuse(FakeCuda(), TorchLikeStream())
    assert e.value.name.startswith("PLE_E_") and e.value.message
    step.release()


def test_pack_with_progress_gives_the_synth_table(tmp_path, table_dir):
    ck = str(tmp_path / "ck")
    subprocess.run([_ple_bin(), "synth-checkpoint", ck, "--base", str(BASE), "--shards", str(SHARDS),
                    "--seed", str(SEED)], check=True, capture_output=True)  # fmt: skip
    seen = []
    ple.pack(ck, str(tmp_path / "out"), progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] > 0
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    with open(os.path.join(table_dir, "table.rows"), "rb") as f1, open(tmp_path / "out" / "table.rows", "rb") as f2:
        assert f1.read() == f2.read()

    def stop(d, t):
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        ple.pack(ck, str(tmp_path / "cancelled"), progress=stop)
    assert not os.path.exists(tmp_path / "cancelled" / "table.json")


def test_head_shards_sum_to_the_whole_and_pack_a_shard_table(tmp_path, table, table_dir):
    ml = pytest.importorskip("ml_dtypes")
    ids = table.ngram_ids(**TWO)
    for dtype, bits in [(np.float32, np.uint32), (np.float16, np.uint16), (ml.bfloat16, np.uint16)]:
        want = table.submit(**TWO).dequant_cpu(dtype=dtype)
        total = None
        served = []
        for k in range(3):
            with ple.Table(table_dir, max_tokens_per_step=256, num_threads=2, shard_count=3, shard_index=k) as t:
                i = t.info
                # round-robin: heads k, k + 3, ...
                heads = list(range(k, H, 3))
                assert (i["shard_index"], i["shard_count"], i["shard_first_head"]) == (k, 3, k)
                assert (i["shard_head_stride"], i["shard_heads"]) == (3, len(heads))
                step = t.submit(**TWO)
                rows = step.packed_rows()
                assert rows.shape == (8, i["shard_heads"], 90)
                np.testing.assert_array_equal(rows, file_rows(table_dir, ids[:, heads]))
                part = step.dequant_cpu(dtype=dtype)
                # the other heads' columns are -0.0
                other = np.ones(D, bool)
                for h in heads:
                    other[h * 160 : (h + 1) * 160] = False
                assert (part[:, other].view(bits) == np.array(-0.0, dtype).view(bits)).all()
                total = part if total is None else (total.astype(np.float32) + part.astype(np.float32)).astype(dtype)
                served += heads
        assert sorted(served) == list(range(H))
        np.testing.assert_array_equal(total.view(bits), want.view(bits))
    with pytest.raises(ple.PleError) as e:
        ple.Table(table_dir, shard_count=17)
    assert e.value.name == "PLE_E_INVALID_ARGUMENT" and "shard_count" in e.value.message
    # a shard table: only its heads' rows, opened as its own shard only
    ck = str(tmp_path / "ck")
    subprocess.run([_ple_bin(), "synth-checkpoint", ck, "--base", str(BASE), "--shards", str(SHARDS),
                    "--seed", str(SEED)], check=True, capture_output=True)  # fmt: skip
    out = str(tmp_path / "s1of2")
    ple.pack(ck, out, shard=(1, 2))
    meta = json.load(open(os.path.join(out, "table.json")))
    odd = list(range(1, H, 2))
    assert (meta["shard"]["index"], meta["shard"]["count"], meta["shard"]["head_ids"]) == (1, 2, odd)
    offsets = meta["hash"]["offsets"]
    whole_rows = os.path.getsize(os.path.join(table_dir, "table.rows")) // 90
    ends = offsets[1:] + [whole_rows]
    assert os.path.getsize(os.path.join(out, "table.rows")) == sum(ends[h] - offsets[h] for h in odd) * 90
    with ple.Table(out, shard_count=2, shard_index=1) as t:
        np.testing.assert_array_equal(t.submit(**TWO).packed_rows(), file_rows(table_dir, ids[:, odd]))
    with pytest.raises(ple.PleError) as e:
        ple.Table(out)
    assert e.value.name == "PLE_E_FORMAT" and "shard 1/2" in e.value.message and "the whole table" in e.value.message
    # `python -m ple inspect` and `ple inspect` describe it alike
    shard_rows = os.path.getsize(os.path.join(out, "table.rows")) // 90
    line = f"head shard:   1/2 (round_robin): heads 1, 3, 5, 7, 9, 11, 13, 15, {shard_rows} of the whole table's {whole_rows} rows"
    for cmd in ([sys.executable, "-m", "ple"], [_ple_bin()]):
        txt = subprocess.run([*cmd, "inspect", out], check=True, capture_output=True, text=True).stdout
        assert line in txt, txt


def test_python_m_ple_mirrors_the_cli(table_dir):
    toks = "9707,11,248044,5,5"
    py = subprocess.run([sys.executable, "-m", "ple", "lookup", table_dir, "--tokens", toks, "--json"],
                        check=True, capture_output=True, text=True)  # fmt: skip
    cli = subprocess.run([_ple_bin(), "lookup", table_dir, "--tokens", toks, "--json"],
                         check=True, capture_output=True, text=True)  # fmt: skip
    assert json.loads(py.stdout) == json.loads(cli.stdout)
    txt = subprocess.run([sys.executable, "-m", "ple", "lookup", table_dir, "--tokens", toks],
                         check=True, capture_output=True, text=True).stdout.splitlines()  # fmt: skip
    assert txt[2].split("\t")[:2] == ["2", "248044"] and len(txt[2].split("\t")[2].split()) == 16
    info = subprocess.run([sys.executable, "-m", "ple", "inspect", table_dir, "--json"],
                          check=True, capture_output=True, text=True)  # fmt: skip
    assert json.loads(info.stdout)["valid"] is True
    bad = subprocess.run([sys.executable, "-m", "ple", "inspect", table_dir + "-x", "--json"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and json.loads(bad.stdout)["valid"] is False


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch", reason="torch is not installed (large); the numpy paths cover the bindings")
    t = torch.arange(6, dtype=torch.int32)
    a = _arrays.host_input(t, np.int32, "tokens")
    assert a.ctypes.data == t.data_ptr()  # read in place
    out = torch.zeros(4, D, dtype=torch.bfloat16)
    d = _arrays.host_output(out, D)
    assert (d.ptr, d.rows, d.stride, d.dtype) == (out.data_ptr(), 4, D, _lib.DTYPE_BF16)


def test_the_bundled_library_is_loaded():
    if os.environ.get("PLE_LIBRARY"):
        pytest.skip("PLE_LIBRARY overrides the bundled libple.so")
    here = os.path.dirname(os.path.abspath(ple.__file__))
    assert _lib._find_library() == os.path.join(here, "libple.so")
    assert ple.version().startswith("0.3.")
    if os.environ.get("PLE_EXPECT_INSTALLED"):  # scripts/test.sh: the wheel in a fresh venv
        assert here.startswith(sys.prefix) and "site-packages" in here, here
        assert shutil.which("cargo") is None and shutil.which("rustc") is None


def test_without_the_sigbus_handler_a_handle_runs_direct_and_mmap_is_refused(table_dir):
    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=2, sigbus_handler=0) as t:
        assert t.info["io_mode"] == "direct"
        ids = t.ngram_ids(**TWO)
        rows = t.submit(**TWO).packed_rows().copy()
        assert np.array_equal(rows.reshape(-1, rows.shape[-1]), file_rows(table_dir, ids.reshape(-1)))
    with pytest.raises(ple.PleUnsupportedError, match="sigbus_handler"):
        ple.Table(table_dir, io_mode="mmap", sigbus_handler=0)
    with pytest.raises(ple.PleInvalidArgumentError, match="sigbus_handler"):
        ple.Table(table_dir, sigbus_handler=2)
