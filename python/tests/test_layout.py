"""The ctypes structs of `ple._lib` against `include/ple.h`, byte for byte: a small C program built
against the header prints `sizeof` and every field's `offsetof` and `sizeof`, and each struct that
`_lib` retypes must have the header's fields, in its order, at the same offsets, with the same
sizes and the same integer signedness. Needs a C compiler (`cc`, or `CC`)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

import pytest

from ple import _lib

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "ple.h")


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc, gcc, clang or $CC) to compile against include/ple.h")
    return cc


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _header_structs(text: str) -> dict[str, list[tuple[str, str]]]:
    """`typedef struct NAME { TYPE FIELD; ... } NAME;` of the header: NAME -> [(TYPE, FIELD)],
    with `[N]` kept on the type of an array field."""
    out = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} (\w+);", text, flags=re.S):
        assert m.group(1) == m.group(3), m.group(0)[:80]
        fields = []
        for decl in filter(None, (d.strip() for d in m.group(2).split(";"))):
            f = re.fullmatch(r"(.+?)\s*\b(\w+)\s*(\[\d+\])?", decl, flags=re.S)
            assert f, decl
            fields.append((" ".join(f.group(1).split()) + (f.group(3) or ""), f.group(2)))
        out[m.group(1)] = fields
    return out


def _typedefs(text: str) -> dict[str, str]:
    """Scalar typedefs of the header (`typedef int32_t ple_format;` -> {"ple_format": "int32_t"})."""
    return dict((b, a) for a, b in re.findall(r"typedef (\w+) (\w+);", text))


def _lib_structs() -> dict[str, type[ctypes.Structure]]:
    return {
        name: obj
        for name, obj in vars(_lib).items()
        if isinstance(obj, type) and issubclass(obj, ctypes.Structure)
        and obj is not ctypes.Structure
    }


def _measure(
    structs: dict[str, list[tuple[str, str]]], tmp_path
) -> dict[tuple[str, str], tuple[int, int]]:
    """(struct, field or "") -> (offset, size) as the C compiler lays the header out."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "ple.h"', "int main(void) {"]
    for s, fields in structs.items():
        lines.append(f'  printf("{s} - 0 %zu\\n", sizeof({s}));')
        for _, f in fields:
            off, size = f"offsetof({s}, {f})", f"sizeof((({s} *)0)->{f})"
            lines.append(f'  printf("{s} {f} %zu %zu\\n", {off}, {size});')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    inc = os.path.dirname(os.path.abspath(HEADER))
    subprocess.run([_cc(), "-std=c11", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(exe)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        s, f, off, size = line.split()
        out[(s, "" if f == "-" else f)] = (int(off), int(size))
    return out


# ctypes types accepted for each C scalar type (after the header's typedefs are resolved)
_SCALARS = {
    "size_t": (ctypes.c_size_t,),
    "uint64_t": (ctypes.c_uint64,),
    "int64_t": (ctypes.c_int64,),
    "uint32_t": (ctypes.c_uint32,),
    "int32_t": (ctypes.c_int32,),
    "uint8_t": (ctypes.c_uint8,),
    "float": (ctypes.c_float,),
    "double": (ctypes.c_double,),
}


def _type_matches(c_type: str, py_type, typedefs: dict[str, str]) -> bool:
    if c_type.endswith("*"):  # any pointer: c_void_p, c_char_p or POINTER(...)
        return py_type in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(py_type, ctypes._Pointer)
    arr = re.fullmatch(r"(.+)\[(\d+)\]", c_type)
    if arr:
        if not issubclass(py_type, ctypes.Array) or py_type._length_ != int(arr.group(2)):
            return False
        elem = arr.group(1)
        if elem == "char":
            return py_type._type_ is ctypes.c_char
        return _type_matches(elem, py_type._type_, typedefs)
    while c_type in typedefs:
        c_type = typedefs[c_type]
    return py_type in _SCALARS.get(c_type, ())


def test_lib_structs_match_the_header_byte_for_byte(tmp_path):
    text = _strip_comments(open(HEADER).read())
    header = _header_structs(text)
    typedefs = _typedefs(text)
    ours = _lib_structs()
    # the structs `_lib` must retype: every one the declared functions take
    needed_structs = ("ple_options", "ple_pack_options", "ple_batch", "ple_token_batch", "ple_info")
    for needed in (*needed_structs, "ple_counters"):
        assert needed in ours, f"_lib has no ctypes struct {needed}"
    missing = sorted(set(ours) - set(header))
    assert not missing, f"_lib structs not in include/ple.h: {missing}"
    c = _measure({s: header[s] for s in ours}, tmp_path)
    for s, py in ours.items():
        py_fields = [(f[0], f[1]) for f in py._fields_]
        assert [f for _, f in header[s]] == [f for f, _ in py_fields], f"{s}: fields differ from ple.h"
        assert ctypes.sizeof(py) == c[(s, "")][1], f"sizeof({s})"
        for (c_type, name), (_, py_type) in zip(header[s], py_fields):
            d = getattr(py, name)
            assert (d.offset, d.size) == c[(s, name)], f"{s}.{name}: (offset, size) differ from ple.h"
            assert _type_matches(c_type, py_type, typedefs), f"{s}.{name}: {py_type} for C {c_type}"


def test_header_parser_sees_known_layouts():
    """The parser the layout test rests on reads fields and types that the header spells out."""
    text = _strip_comments(open(HEADER).read())
    h = _header_structs(text)
    assert h["ple_batch"][0] == ("const int32_t *", "tokens")
    assert ("char[256]", "source_name") in h["ple_info"]
    assert h["ple_counters"][0] == ("size_t", "struct_size")
    assert all(t == "uint64_t" for t, _ in h["ple_counters"][1:])
    assert _typedefs(text)["ple_format"] == "int32_t"


def _header_values(names: list[str], tmp_path) -> dict[str, int]:
    """The values of these header constants (macros or enumerators) as the C compiler sees them."""
    lines = ["#include <stdio.h>", '#include "ple.h"', "int main(void) {"]
    lines += [f'  printf("{n} %llu\\n", (unsigned long long)({n}));' for n in names]
    lines += ["  return 0;", "}"]
    src = tmp_path / "values.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "values"
    inc = os.path.dirname(os.path.abspath(HEADER))
    subprocess.run([_cc(), "-std=c11", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    return {n: int(v) for n, v in zip(out[::2], out[1::2])}


def test_lib_constants_match_the_header(tmp_path):
    """The values `_lib` spells by hand (model constants, PLE_CACHE_AUTO, the enum tables)."""
    expect = {
        "PLE_MAX_HEADS": _lib.PLE_MAX_HEADS,
        "PLE_MAX_HEAD_DIM": _lib.PLE_MAX_HEAD_DIM,
        "PLE_MAX_EMBED_DIM": _lib.PLE_MAX_EMBED_DIM,
        "PLE_CACHE_AUTO": _lib.PLE_CACHE_AUTO,
        "PLE_DTYPE_F32": _lib.DTYPE_F32,
        "PLE_DTYPE_F16": _lib.DTYPE_F16,
        "PLE_DTYPE_BF16": _lib.DTYPE_BF16,
        "PLE_FUSE_ACCUMULATE": _lib.FUSE_ACCUMULATE,
    }
    tables = {
        "PLE_FORMAT_": {name: code for code, name in _lib.FORMATS.items()},
        "PLE_PREFETCH_": _lib.PREFETCH,
        "PLE_RING_": _lib.RING_FULL,
        "PLE_WAIT_": _lib.WAIT_MODE,
        "PLE_IO_": _lib.IO_MODE,
        "PLE_IO_BACKEND_": {name: code for code, name in _lib.IO_BACKENDS.items()},
    }
    for prefix, table in tables.items():
        for name, code in table.items():
            expect[prefix + name.upper()] = code
    got = _header_values(sorted(expect), tmp_path)
    assert got == expect
