#!/usr/bin/env python3
"""Compares the C reference of common.h (the dump of `selftest`) with independent oracles:
ml_dtypes (float8_e4m3fn, float4_e2m1fn, bfloat16) and numpy (float16, float32 arithmetic).
Usage: check-reference.py DUMP"""
import sys

import ml_dtypes
import numpy as np

F32 = np.float32


def f32(bits):
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def bits32(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def canon32(x):
    return 0x7FC00000 if np.isnan(x) else bits32(x)


def to16(x, dt):
    if np.isnan(x):
        return 0x7E00 if dt == 1 else 0x7FC0
    t = np.float16 if dt == 1 else ml_dtypes.bfloat16
    with np.errstate(over="ignore"):  # overflow to inf is the expected RNE result
        return int(np.array([x], dtype=np.float32).astype(t).view(np.uint16)[0])


def from16(h, dt):
    t = np.float16 if dt == 1 else ml_dtypes.bfloat16
    return np.array([h], dtype=np.uint16).view(t).astype(np.float32)[0]


def e4m3(b):
    return np.array([b], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0]


def e2m1(c):
    return np.array([c], dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)[0]


def same(a_bits, b):  # a: bits from C, b: numpy float32 (NaN: any NaN)
    if np.isnan(b):
        return np.isnan(f32(a_bits))
    return a_bits == bits32(b)


def main():
    bad = 0
    n = {"e4m3": 0, "e2m1": 0, "f16to32": 0, "cvt": 0, "token": 0, "table": 0}
    e4 = [e4m3(b) for b in range(256)]
    e2 = [e2m1(c) for c in range(16)]
    for line in open(sys.argv[1]):
        f = line.split()
        kind = f[0]
        n[kind] += 1
        if kind == "e4m3":
            ok = same(int(f[2], 16), e4[int(f[1])])
        elif kind == "e2m1":
            ok = same(int(f[2], 16), e2[int(f[1])])
        elif kind == "f16to32":
            ok = same(int(f[2], 16), from16(int(f[1]), 1))
        elif kind == "cvt":
            x = f32(int(f[1], 16))
            ok = int(f[2], 16) == to16(x, 1) and int(f[3], 16) == to16(x, 2)
        elif kind == "table":
            ok = True
        elif kind == "token":
            fmt, dt, acc, gs = int(f[1]), int(f[2]), int(f[3]), f32(int(f[4], 16))
            rows = bytes.fromhex(f[5])
            init = bytes.fromhex(f[6])
            got = bytes.fromhex(f[7])
            rb = {1: 90, 2: 160, 3: 320, 4: 640}[fmt]
            es = 4 if dt == 0 else 2
            if dt == 0:
                old = np.frombuffer(init, dtype=np.float32)
            else:
                old = np.frombuffer(init, dtype=np.uint16).view(
                    np.float16 if dt == 1 else ml_dtypes.bfloat16).astype(np.float32)
            with np.errstate(all="ignore"):
                vals = []
                for e in range(2560):
                    row = rows[(e // 160) * rb:(e // 160 + 1) * rb]
                    j = e % 160
                    if fmt == 1:
                        code = (row[j // 2] >> 4) if j & 1 else (row[j // 2] & 15)
                        v = F32(F32(e2[code] * e4[row[80 + j // 16]]) * gs)
                    elif fmt == 2:
                        v = F32(e4[row[j]] * gs)
                    elif fmt == 4:
                        v = np.frombuffer(row[4 * j:4 * j + 4], dtype="<f4").astype(np.float32)[0]
                    else:
                        v = np.frombuffer(row[2 * j:2 * j + 2], dtype=ml_dtypes.bfloat16).astype(np.float32)[0]
                    if acc:
                        v = F32(old[e] + v)
                    vals.append(v)
            exp = bytearray()
            for v in vals:
                if dt == 0:
                    exp += canon32(v).to_bytes(4, "little")
                else:
                    exp += to16(v, dt).to_bytes(2, "little")
            ok = bytes(exp) == got
            if not ok:
                diff = [i for i in range(0, len(got), es) if got[i:i + es] != exp[i:i + es]]
                print(f"token fmt {fmt} dtype {dt} acc {acc}: {len(diff)} elements differ, first at {diff[0] // es}")
        else:
            ok = False
        if not ok:
            bad += 1
            if bad < 20:
                print("MISMATCH:", line[:200].strip())
    print(f"check-reference: {n}, {bad} mismatches")
    # selftest.c dumps every token case: 4 row formats (nvfp4, fp8, bf16, f32) x 3 output dtypes x
    # accumulate or not
    sys.exit(1 if bad or n["token"] != 24 or n["e4m3"] != 256 else 0)


if __name__ == "__main__":
    main()
