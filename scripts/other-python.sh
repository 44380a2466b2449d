#!/usr/bin/env bash
# Prints the path of a CPython 3 interpreter other than `python3`'s version that can make a venv
# (python3.X on PATH, then pyenv's versions), or exits 1 when there is none. scripts/test.sh
# installs the py3-none wheel there too.
set -uo pipefail
this=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cands=()
for v in 3.14 3.13 3.12 3.11 3.10 3.9; do
  p=$(command -v "python$v" 2>/dev/null) && cands+=("$p")
done
cands+=("${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3)
for p in "${cands[@]}"; do
  [ -x "$p" ] || continue
  v=$("$p" -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 9); print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
  [ "$v" != "$this" ] && { echo "$p"; exit 0; }
done
exit 1
