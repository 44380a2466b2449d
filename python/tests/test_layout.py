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


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


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
        if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj is not ctypes.Structure
    }


def _measure(structs: dict[str, list[tuple[str, str]]], tmp_path) -> dict[tuple[str, str], tuple[int, int]]:
    """(struct, field or "") -> (offset, size) as the C compiler lays the header out."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc, gcc, clang or $CC) to lay out include/ple.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "ple.h"', "int main(void) {"]
    for s, fields in structs.items():
        lines.append(f'  printf("{s} - 0 %zu\\n", sizeof({s}));')
        for _, f in fields:
            lines.append(f'  printf("{s} {f} %zu %zu\\n", offsetof({s}, {f}), sizeof((({s} *)0)->{f}));')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    inc = os.path.dirname(os.path.abspath(HEADER))
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(exe)], check=True)
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
    for needed in ("ple_options", "ple_pack_options", "ple_batch", "ple_token_batch", "ple_info", "ple_counters"):
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
