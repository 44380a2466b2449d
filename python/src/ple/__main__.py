"""``python -m ple``: the `inspect` and `lookup` subcommands of the `ple` CLI, through the bindings.

    python -m ple inspect TABLE_DIR [--json] [--config CONFIG_JSON] [--checkpoint DIR]
    python -m ple lookup TABLE_DIR --tokens 9707,11,... [--json]
    python -m ple bench-hf WORK_DIR [...]    (Hugging Face transformers; needs torch: see ple._bench_hf)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from . import PleError, Table, TableOptions, version


def _shard_of(table_dir: str) -> Optional[Dict[str, Any]]:
    """The `shard` record of a libple shard table's table.json (index, count, whole_total_rows,
    and its layout when it has one), else None."""
    try:
        with open(os.path.join(table_dir, "table.json"), "rb") as f:
            meta = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None  # no libple metadata (or unreadable): opening reports it
    s = meta.get("shard") if isinstance(meta, dict) else None
    keys = ("index", "count", "whole_total_rows")
    if not isinstance(s, dict) or not all(isinstance(s.get(k), int) for k in keys):
        return None
    return {**{k: s[k] for k in keys}, "layout": s.get("layout")}


def _inspect(a: argparse.Namespace) -> int:
    opts: TableOptions = {"config_json_path": a.config, "checkpoint_dir": a.checkpoint}
    shard = _shard_of(a.table_dir)
    if shard is not None:  # a shard table opens only as its own shard
        opts["shard_index"], opts["shard_count"] = shard["index"], shard["count"]
    try:
        with Table(a.table_dir, **opts) as t:
            i = t.info
    except PleError as e:
        if a.json:
            print(json.dumps({"table_dir": a.table_dir, "valid": False, "error": str(e)}))
        else:
            print(f"table:        {a.table_dir}")
            print("valid:        no")
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps({"table_dir": a.table_dir, "valid": True, **i}, indent=2))
        return 0
    print(f"table:        {a.table_dir}")
    print(f"rows file:    {i['file_size']} bytes")
    print(f"format:       {i['format']} ({i['row_bytes']} B/row)")
    print(f"rows:         {i['total_rows']}, {i['addressed_rows']} addressed by the hash")
    if shard is not None:
        heads = ", ".join(str(i.shard_first_head + j * i.shard_head_stride) for j in range(i.shard_heads))
        print(f"head shard:   {shard['index']}/{shard['count']} ({shard['layout'] or '?'}): heads {heads}, "
              f"{i.total_rows} of the whole table's {shard['whole_total_rows']} rows")
    print(f"heads:        {i['num_heads']} × {i['head_dim']} elements, ngram_size {i['ngram_size']}")
    print(f"tokens:       vocab_size {i['vocab_size']}, eos {i['eos_token_id']}")
    print(f"global scale: {i['global_scale']}")
    print(f"source:       {i['source_name']} ({i['source_fingerprint']})")
    print("valid:        yes")
    return 0


def _lookup(a: argparse.Namespace) -> int:
    toks = [int(x) for x in a.tokens.split(",") if x.strip()]
    try:
        with Table(a.table_dir, max_tokens_per_step=max(1, len(toks))) as t:
            ids = t.ngram_ids(toks, list(range(len(toks))))
    except PleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps({"ids": ids.tolist()}, separators=(",", ":")))
    else:
        for p, (tok, row) in enumerate(zip(toks, ids)):
            print(f"{p}\t{tok}\t" + " ".join(str(int(x)) for x in row))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench-hf"]:
        from ._bench_hf import main as bench_hf

        return bench_hf(argv[1:])
    p = argparse.ArgumentParser(prog="python -m ple", description=f"libple {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("inspect", help="describe a packed table")
    i.add_argument("table_dir")
    i.add_argument("--json", action="store_true")
    i.add_argument("--config", help="config.json for tables made by the Python tool")
    i.add_argument("--checkpoint", help="check the table was packed from this checkpoint")
    lk = sub.add_parser("lookup", help="row ids of one sequence starting at position 0")
    lk.add_argument("table_dir")
    lk.add_argument("--tokens", required=True, help="comma-separated token ids")
    lk.add_argument("--json", action="store_true")
    sub.add_parser("bench-hf", help="a transformers model generating with libple (python -m ple bench-hf -h)")
    a = p.parse_args(argv)
    return _inspect(a) if a.cmd == "inspect" else _lookup(a)


if __name__ == "__main__":
    sys.exit(main())
