"""Fixtures shared by the package's tests: generated tables, made once per session and shape by
the `ple` CLI (`PLE_BIN`, or `ple` on PATH: no Rust toolchain is needed). Tests read them and
never change them; a test that needs a table of its own makes it in its `tmp_path`."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable, Dict, Tuple

import pytest

# The default table's generator arguments (`ple synth-table`).
SEED, BASE, SHARDS = 3, 2000, 4


def ple_bin() -> str:
    """The `ple` CLI the tests make their tables and checkpoints with."""
    b = os.environ.get("PLE_BIN") or shutil.which("ple")
    if not b or not os.access(b, os.X_OK):
        pytest.fail("the tests make their tables with the ple CLI: set PLE_BIN=<path to ple>")
    return b


@pytest.fixture(scope="session")
def synth_table(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """`synth_table(fmt="nvfp4", seed=SEED, base=BASE, shards=SHARDS)`: the directory of a table
    `ple synth-table` generated with those arguments, made on first use and shared after."""
    made: Dict[Tuple[str, int, int, int], str] = {}

    def make(fmt: str = "nvfp4", seed: int = SEED, base: int = BASE, shards: int = SHARDS) -> str:
        key = (fmt, seed, base, shards)
        if key not in made:
            d = str(tmp_path_factory.mktemp(f"table-{fmt}") / "table")
            args = ["synth-table", d, "--format", fmt, "--base", str(base), "--shards", str(shards), "--seed", str(seed)]
            subprocess.run([ple_bin(), *args], check=True, capture_output=True)
            made[key] = d
        return made[key]

    return make


@pytest.fixture(scope="session")
def table_dir(synth_table: Callable[..., str]) -> str:
    """The default NVFP4 table (`SEED`, `BASE`, `SHARDS`)."""
    return synth_table()
