"""`import ple` needs neither torch nor transformers; `import ple.transformers` without them raises
an ImportError that names the missing package (checked in a subprocess that blocks the import)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def _import_with_blocked(pkg: str) -> subprocess.CompletedProcess:
    code = (
        f"import sys; sys.modules[{pkg!r}] = None\n"  # `import pkg` now raises ImportError
        "import ple; assert ple.Table and sys.modules.get('torch') is None\n"
        "import ple.transformers\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.parametrize("pkg, says", [("torch", "needs PyTorch (the 'torch' package)"),
                                       ("transformers", "the 'transformers' package")])  # fmt: skip
def test_a_missing_package_is_named(pkg, says):
    if pkg == "transformers" and importlib.util.find_spec("torch") is None:
        pytest.skip("without torch, the missing torch is named first (the case above)")
    r = _import_with_blocked(pkg)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and says in last, r.stderr
