#!/usr/bin/env bash
# Rewrites integrations/llama.cpp/patches/ from the commits upstream..HEAD of a llama.cpp checkout:
# build.sh leaves one in OUT/src (the pinned sources committed and tagged `upstream`, then one commit
# per patch), so rebasing is: edit or `git rebase` there, then run this.
#   integrations/llama.cpp/refresh-patches.sh [SRC]       (default target/llama.cpp-ple/src)
# Each patch is the commit's message followed by its plain unified diff (`git diff-tree -p`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$here/../../target/llama.cpp-ple/src}
git -C "$src" rev-parse -q --verify upstream >/dev/null || { echo "refresh-patches: $src has no 'upstream' tag" >&2; exit 1; }
rm -f "$here"/patches/*.patch
n=0
for c in $(git -C "$src" rev-list --reverse upstream..HEAD); do
  n=$((n + 1))
  subject=$(git -C "$src" log -1 --format=%s "$c")
  slug=$(printf '%s' "$subject" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//' | cut -c1-60 | sed 's/-$//')
  f=$(printf '%s/patches/%04d-%s.patch' "$here" "$n" "$slug")
  { git -C "$src" log -1 --format=%B "$c" | sed -e '/^$/N;/^\n$/D'; git -C "$src" diff-tree -p --no-color --no-commit-id "$c"; } > "$f"
  echo "$f"
done
