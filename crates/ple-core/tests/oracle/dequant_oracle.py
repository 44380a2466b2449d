#!/usr/bin/env python3
"""Independent oracle for libple's CPU dequantisation (docs/FORMAT.md#row-formats-and-dequantisation), bit for bit.

Usage: dequant_oracle.py CASES_DIR

Each subdirectory of CASES_DIR is one case written by tests/dequant_oracle.rs:
  meta.json  {"format": "nvfp4"|"fp8"|"bf16"|"f32", "global_scale": float, "dtype": "f32"|"f16"|"bf16",
              "accumulate": bool, "tokens": int, "stride": int, "num_heads": int, "head_dim": int}
              (num_heads, head_dim: the table's geometry; 16 and 160 when absent)
  rows.bin   the packed rows, [tokens][num_heads][row_bytes] uint8
  init.bin   the output buffer before the call ((tokens-1)*stride + num_heads*head_dim elements of dtype)
  out.bin    the output buffer after the library's call

The values are recomputed with ml_dtypes (float4_e2m1fn, float8_e4m3fn, bfloat16) and numpy:
value = e2m1 x e4m3 block scale (fp32, exact), x global scale (one fp32 multiply), then one
round-to-nearest-even to the output dtype (bf16 and f32 rows: the value as stored, no multiply); with accumulate: dtype(fp32(init) + value). Elements
between rows (stride > num_heads*head_dim) must be untouched. Every element must match bit for bit; where the
oracle gives NaN, the library must write the canonical positive quiet NaN (f32 0x7FC00000, f16
0x7E00, bf16 0x7FC0), as the GPU kernel does.

Exit status: 0 all cases match, 1 mismatch, 2 usage or import error.
"""
import json
import os
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:  # the Rust test checks this first and decides skip vs fail
    print(f"dequant_oracle: missing package: {e}", file=sys.stderr)
    sys.exit(2)

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
UINT = {"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}


def row_bytes(fmt, head_dim):
    """Bytes of one row (docs/FORMAT.md#row-formats-and-dequantisation)."""
    return {"nvfp4": head_dim // 2 + head_dim // 16, "fp8": head_dim, "bf16": 2 * head_dim, "f32": 4 * head_dim}[fmt]


def values(fmt, rows, scale, head_dim):
    """rows: (n_rows, row_bytes) uint8 -> (n_rows, head_dim) float32, per docs/FORMAT.md#row-formats-and-dequantisation."""
    n = rows.shape[0]
    g = np.float32(scale)
    if fmt == "nvfp4":
        half = head_dim // 2
        codes = rows[:, :half]
        c = np.empty((n, head_dim), np.uint8)
        c[:, 0::2] = codes & 0x0F  # even element: low nibble
        c[:, 1::2] = codes >> 4  # odd element: high nibble
        fp4 = c.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
        sc = np.ascontiguousarray(rows[:, half : half + head_dim // 16]).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        v = fp4 * np.repeat(sc, 16, axis=1)  # exact in fp32
        return v * g  # one fp32 multiply
    if fmt == "fp8":
        return np.ascontiguousarray(rows).view(ml_dtypes.float8_e4m3fn).astype(np.float32) * g
    if fmt == "bf16":
        return np.ascontiguousarray(rows).view("<u2").view(ml_dtypes.bfloat16).astype(np.float32)
    if fmt == "f32":
        return np.ascontiguousarray(rows).view("<f4").astype(np.float32)
    raise ValueError(fmt)


def check(case):
    meta = json.load(open(os.path.join(case, "meta.json")))
    fmt, dt, acc = meta["format"], meta["dtype"], meta["accumulate"]
    t, stride = meta["tokens"], meta["stride"]
    heads, hd = meta.get("num_heads", 16), meta.get("head_dim", 160)
    dim = heads * hd
    rb = row_bytes(fmt, hd)
    rows = np.fromfile(os.path.join(case, "rows.bin"), np.uint8).reshape(t * heads, rb)
    init = np.fromfile(os.path.join(case, "init.bin"), DTYPES[dt])
    got = np.fromfile(os.path.join(case, "out.bin"), DTYPES[dt])
    need = (t - 1) * stride + dim
    assert init.size == need and got.size == need, (init.size, got.size, need)
    with np.errstate(all="ignore"):
        v = values(fmt, rows, meta["global_scale"], hd).reshape(t, dim)
        want = init.copy()
        for i in range(t):
            o = want[i * stride : i * stride + dim]
            if acc:
                want[i * stride : i * stride + dim] = (o.astype(np.float32) + v[i]).astype(DTYPES[dt])
            else:
                want[i * stride : i * stride + dim] = v[i].astype(DTYPES[dt])
    wb, gb = want.view(UINT[dt]), got.view(UINT[dt])
    wnan = np.isnan(want.astype(np.float32))
    gnan = np.isnan(got.astype(np.float32))
    # NaN: the library writes the canonical positive quiet NaN, as the GPU kernel does
    canonical = {"f32": 0x7FC00000, "f16": 0x7E00, "bf16": 0x7FC0}[dt]
    bad = ~((wb == gb) | (wnan & gnan & (gb == canonical)))
    name = os.path.basename(case)
    if bad.any():
        idx = np.nonzero(bad)[0]
        print(f"{name}: {idx.size} of {need} elements differ", file=sys.stderr)
        for k in idx[:10]:
            tok, e = divmod(int(k), stride)
            print(
                f"  element {k} (token {tok}, index {e}): want {want[k]!r} ({int(wb[k]):#x}) "
                f"got {got[k]!r} ({int(gb[k]):#x})",
                file=sys.stderr,
            )
        return False
    nan = int(wnan.sum())
    print(f"{name}: {need} elements match ({nan} NaN; {heads} heads of {hd})")
    return True


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    root = sys.argv[1]
    cases = sorted(os.path.join(root, d) for d in os.listdir(root))
    if not cases:
        print("no cases", file=sys.stderr)
        sys.exit(2)
    ok = all([check(c) for c in cases])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
