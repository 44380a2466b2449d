"""pytest: the Python hash oracle against docs/FORMAT.md, then the library against the oracle.

Run from the repository root: `python3 -m pytest tests/oracle`. The library comparison builds and
runs the Rust test `tests/hash_oracle.rs` (which writes its ids to a dump) and checks the dump here.
"""

import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import hash_oracle as ho

ROOT = pathlib.Path(__file__).resolve().parents[2]
EOS = ho.SPEC_CONFIG["eos_token_id"]


def test_spec_constants():
    mults, sizes, offsets = ho.derive(ho.SPEC_CONFIG)
    assert mults == ho.SPEC_MULTIPLIERS
    assert sizes == ho.SPEC_SIZES
    assert offsets[0] == 0 and offsets[-1] + sizes[-1] == 320_001_446
    # padded to a multiple of 128
    assert -(-320_001_446 // 128) * 128 == 320_001_536


def test_spec_vector():
    mults, sizes, offsets = ho.derive(ho.SPEC_CONFIG)
    ids = ho.row_ids([9707], ho.SPEC_CONFIG, mults, sizes, offsets)
    assert ids[0].tolist() == ho.SPEC_VECTOR


def test_context_rule():
    a, b, c, d = 11, 22, 33, 44
    ctx = ho.contexts([a, b, EOS, c, d, EOS, EOS, a], 3, EOS).tolist()
    assert ctx == [
        [EOS, EOS], [a, EOS], [b, a], [EOS, EOS], [c, EOS], [d, c], [EOS, EOS], [EOS, EOS]
    ]
    assert ho.contexts([1, 2, 3, EOS, 4, 5, 6], 4, EOS).tolist() == [
        [EOS, EOS, EOS], [1, EOS, EOS], [2, 1, EOS], [3, 2, 1],
        [EOS, EOS, EOS], [4, EOS, EOS], [5, 4, EOS],
    ]


def test_context_rule_matches_walk_back():
    """The vectorised rule equals docs/FORMAT.md's other phrasing: walk back, stop at the first EOS."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        seq = rng.choice([EOS, 1, 2, 3, 248_319], size=int(rng.integers(1, 30))).tolist()
        for n in (2, 3, 5):
            got = ho.contexts(seq, n, EOS).tolist()
            for p in range(len(seq)):
                want, cut = [], False
                for k in range(1, n):
                    t = EOS if cut or p - k < 0 else seq[p - k]
                    want.append(t)
                    cut = t == EOS
                assert got[p] == want, (seq, p, n)


def test_library_matches_oracle(tmp_path):
    if shutil.which("cargo") is None:
        pytest.skip("cargo not found")
    dump = tmp_path / "dump.json"
    env = dict(os.environ, PLE_HASH_ORACLE_DUMP=str(dump))
    r = subprocess.run(
        ["cargo", "test", "--quiet", "--test", "hash_oracle"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert ho.check_dump(str(dump)) == 0
