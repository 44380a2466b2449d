"""F32 rows (an unquantised table): the `ple` CLI's `synth-table --format f32` and
`synth-checkpoint --format f32` + `ple.pack`, read back through `ple.Table` and checked against the
row file itself (little-endian f32) and numpy / ml_dtypes conversions (docs/FORMAT.md, the
dequantisation rule: f32 out as stored, f16 / bf16 one round to nearest even)."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import ple

from conftest import ple_bin as _ple_bin

SEED, BASE, SHARDS = 5, 2000, 4
D, ROW_BYTES = 2560, 640
TWO = ple.batch_from_requests([(7, 0, [11, 12, 13, 14, 15]), (9, 0, [21, 22, 23])])


@pytest.fixture(scope="module")
def f32_dir(synth_table) -> str:
    return synth_table("f32", seed=SEED, base=BASE, shards=SHARDS)


def file_values(table_dir: str, ids: np.ndarray) -> np.ndarray:
    """[tokens, 2560] float32: rows `ids` of the row file (row r at r * 640), as stored."""
    raw = np.fromfile(os.path.join(table_dir, "table.rows"), np.uint8).reshape(-1, ROW_BYTES)
    rows = np.ascontiguousarray(raw[ids.reshape(-1)])
    return rows.view("<f4").astype(np.float32).reshape(ids.shape[0], D)


def test_info_says_f32(f32_dir):
    with ple.Table(f32_dir, num_threads=2) as t:
        i = t.info
        assert (i["format"], i["row_bytes"], i["global_scale"]) == ("f32", 640, 1.0)
        assert i["source_name"] == f"synthetic-f32-seed{SEED}"


@pytest.mark.parametrize("io", [dict(io_mode="mmap"), dict(io_mode="direct", cache_bytes=0), dict(io_mode="direct")])
def test_packed_rows_and_dequant_cpu_are_the_stored_values(f32_dir, io):
    """Through the memory map and through DIRECT reads (640-byte rows straddle 4 KiB blocks), with
    and without the row cache."""
    ml = pytest.importorskip("ml_dtypes")
    with ple.Table(f32_dir, max_tokens_per_step=64, num_threads=2, **io) as t:
        assert t.info["io_mode"] == io["io_mode"]
        ids = t.ngram_ids(**TWO)
        want = file_values(f32_dir, ids)
        # the generator's values round when narrowed (so the f16 / bf16 checks below mean something)
        assert (want.astype(np.float16).astype(np.float32) != want).mean() > 0.9
        assert (want.astype(ml.bfloat16).astype(np.float32) != want).mean() > 0.9
        step = t.submit(**TWO)
        packed = np.asarray(step.packed_rows())
        assert packed.shape == (8, 16, ROW_BYTES)
        np.testing.assert_array_equal(packed.reshape(8, -1).view("<f4"), want)
        got = step.dequant_cpu()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        for dtype, bits in [(np.float16, np.uint16), (ml.bfloat16, np.uint16)]:
            out = t.submit(**TWO).dequant_cpu(dtype=dtype)
            np.testing.assert_array_equal(out.view(bits), want.astype(dtype).view(bits))
            # accumulate: fp32(old) + value, one rounding
            acc = out.copy()
            t.submit(**TWO).dequant_cpu(acc, accumulate=True)
            expect = (out.astype(np.float32) + want).astype(dtype)
            np.testing.assert_array_equal(acc.view(bits), expect.view(bits))


def test_an_f32_checkpoint_packs_to_the_synth_table(tmp_path, f32_dir):
    ck = str(tmp_path / "ck")
    args = ["synth-checkpoint", ck, "--format", "f32", "--base", str(BASE), "--shards", str(SHARDS),
            "--seed", str(SEED)]  # fmt: skip
    subprocess.run([_ple_bin(), *args], check=True, capture_output=True)
    ple.pack(ck, str(tmp_path / "out"))
    with open(os.path.join(f32_dir, "table.rows"), "rb") as f1, open(tmp_path / "out" / "table.rows", "rb") as f2:
        assert f1.read() == f2.read()
    with ple.Table(str(tmp_path / "out"), num_threads=2) as t:
        assert (t.info["format"], t.info["row_bytes"]) == ("f32", 640)
