#!/usr/bin/env bash
# A venv with torch and transformers from PyPI, for the tests and examples that run a real model or
# torch.distributed. Usage: scripts/torch-venv.sh [DIR]  -> prints DIR/bin/python.
# The venv lives under target/ (default target/torch-venv) so reruns reuse it: PyPI's Linux torch
# wheel is large. PLE_TORCH_VENV names an existing venv to use instead (developers' shared copy).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${PLE_TORCH_VENV:-}" ] && [ -x "$PLE_TORCH_VENV/bin/python" ]; then
  echo "$PLE_TORCH_VENV/bin/python"; exit 0
fi
dir=${1:-${CARGO_TARGET_DIR:-$root/target}/torch-venv}
stamp="$dir/.ple-torch-ok"
want="torch==2.15.0 transformers==5.23.0 accelerate numpy ml_dtypes safetensors pytest tqdm"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  python3 -m venv "$dir" >&2
  "$dir/bin/python" -m pip install -q --disable-pip-version-check $want >&2
  "$dir/bin/python" -c 'import torch, transformers' >&2
  echo "$want" > "$stamp"
fi
echo "$dir/bin/python"
