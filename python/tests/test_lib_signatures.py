"""Every ctypes declaration of `ple._lib` against the prototype in include/ple.h, parsed from the
header itself: the same functions, and for each its return type and every parameter's type.

Mapping (C -> ctypes): fixed-width integers and their typedefs (`ple_status` is `int32_t`, ...)
-> the ctypes integer of that width and signedness; `const char *` -> c_char_p; `void *` ->
c_void_p; `struct ple_handle *` -> c_void_p (an opaque handle) and `struct ple_handle **` ->
POINTER(c_void_p); `struct ple_X *` -> POINTER(ple_X) of `_lib`; a pointer to integers ->
POINTER of that integer, or c_void_p (an array's address, numpy's ``ctypes.data``); the callback
typedefs -> `_lib.LOG_FN` / `_lib.PROGRESS_FN`, whose own prototypes are checked the same way.
`const` is no part of the ABI and is ignored. On Linux x86-64 ctypes makes c_size_t and c_uint64
the same type (both unsigned long): the header's size_t and uint64_t are told apart by width only.
"""

from __future__ import annotations

import ctypes
import os
import re
from typing import Dict, List, Tuple

import pytest

from ple import _lib

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "ple.h")

BASE = {
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "uint8_t": ctypes.c_uint8,
    "size_t": ctypes.c_size_t,
}
CALLBACKS = {"ple_log_fn": "LOG_FN", "ple_progress_fn": "PROGRESS_FN"}


def _header() -> str:
    if not os.path.exists(HEADER):
        pytest.fail(f"{HEADER} is missing: the tests run from the repository's python/tests")
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _split_decl(decl: str) -> Tuple[str, str]:
    """`const struct ple_options *options` -> ("struct ple_options *", "options")."""
    m = re.fullmatch(r"(.*?)(\w+)", decl.strip(), flags=re.S)
    assert m, decl
    t = re.sub(r"\bconst\b", " ", m.group(1))
    t = re.sub(r"\s*\*\s*", "*", " ".join(t.split()))
    return t.replace("*", " *").replace("* *", "**").strip(), m.group(2)


def _typedefs(text: str) -> Dict[str, str]:
    """Scalar typedefs: `typedef int32_t ple_status;` -> {"ple_status": "int32_t"}."""
    return dict((n, t) for t, n in re.findall(r"typedef\s+(u?int\d+_t)\s+(\w+)\s*;", text))


def _prototypes(text: str, pattern: str) -> Dict[str, Tuple[str, List[str]]]:
    out = {}
    for ret, name, params in re.findall(pattern, text, flags=re.M | re.S):
        args = [] if params.strip() in ("", "void") else [_split_decl(p)[0] for p in params.split(",")]
        out[name] = (_split_decl(ret + " x")[0], args)
    return out


def _functions(text: str) -> Dict[str, Tuple[str, List[str]]]:
    return _prototypes(text, r"^(?!typedef)([A-Za-z_][\w \t*]*?[\s*])(ple_\w+)\s*\(([^)]*)\)\s*;")


def _callbacks(text: str) -> Dict[str, Tuple[str, List[str]]]:
    return _prototypes(text, r"^typedef\s+([\w \t*]+?)\s*\(\s*\*\s*(ple_\w+)\s*\)\s*\(([^)]*)\)\s*;")


def _allowed(c: str, typedefs: Dict[str, str]) -> List[object]:
    """The ctypes types that declare C type `c` faithfully."""
    if c == "void":
        return [None]
    if c in CALLBACKS:
        return [getattr(_lib, CALLBACKS[c])]
    if c in typedefs:
        c = typedefs[c]
    if c in BASE:
        return [BASE[c]]
    if c == "char *":
        return [ctypes.c_char_p]
    if c == "void *":
        return [ctypes.c_void_p]
    if c == "struct ple_handle *":
        return [ctypes.c_void_p]
    if c == "struct ple_handle **":
        return [ctypes.POINTER(ctypes.c_void_p)]
    m = re.fullmatch(r"struct (ple_\w+) \*", c)
    if m:
        return [ctypes.POINTER(getattr(_lib, m.group(1)))]
    m = re.fullmatch(r"(\w+) \*", c)
    if m and m.group(1) in BASE:
        return [ctypes.POINTER(BASE[m.group(1)]), ctypes.c_void_p]
    m = re.fullmatch(r"(\w+) \*\*", c)
    if m and m.group(1) in BASE:
        return [ctypes.POINTER(ctypes.POINTER(BASE[m.group(1)]))]
    raise AssertionError(f"the test has no ctypes mapping for C type {c!r}: extend _allowed")


def _check(what: str, c: Tuple[str, List[str]], res: object, args: List[object], typedefs: Dict[str, str]) -> None:
    ret, params = c
    assert res in _allowed(ret, typedefs), f"{what}: returns {ret}, declared {res}"
    assert len(args) == len(params), f"{what}: {len(params)} parameters in ple.h, {len(args)} declared"
    for i, (p, a) in enumerate(zip(params, args)):
        assert a in _allowed(p, typedefs), f"{what}: parameter {i} is {p} in ple.h, declared {a}"


def test_the_parser_reads_the_header():
    text = _header()
    fns = _functions(text)
    # spot checks from the header, written out by hand
    assert fns["ple_open"] == ("ple_status", ["char *", "struct ple_options *", "struct ple_handle **"])
    assert fns["ple_close"] == ("void", ["struct ple_handle *"])
    assert fns["ple_version_string"] == ("char *", [])
    assert fns["ple_packed_rows"][1] == ["struct ple_handle *", "uint64_t", "uint8_t **", "uint32_t *"]
    assert _callbacks(text)["ple_progress_fn"] == ("int32_t", ["uint64_t", "uint64_t", "void *"])
    assert _typedefs(text)["ple_status"] == "int32_t" and _typedefs(text)["ple_fuse_flags"] == "uint32_t"


def test_every_function_is_declared_as_the_header_says():
    text = _header()
    fns, typedefs = _functions(text), _typedefs(text)
    assert len(fns) >= 27  # the 27 of ple.h 0.1
    assert set(_lib.SIGNATURES) == set(fns), (
        f"in ple.h only: {sorted(set(fns) - set(_lib.SIGNATURES))}; "
        f"in _lib only: {sorted(set(_lib.SIGNATURES) - set(fns))}"
    )
    for name, (res, args) in _lib.SIGNATURES.items():
        _check(name, fns[name], res, args, typedefs)
        f = getattr(_lib.lib, name)  # and the loaded library's functions carry them
        assert f.restype == res and list(f.argtypes) == list(args), name


def test_the_callback_types_match_their_typedefs():
    text = _header()
    cbs, typedefs = _callbacks(text), _typedefs(text)
    assert set(cbs) == set(CALLBACKS)
    for c_name, py_name in CALLBACKS.items():
        t = getattr(_lib, py_name)
        _check(c_name, cbs[c_name], t._restype_, list(t._argtypes_), typedefs)


def test_a_wrong_declaration_is_caught():
    # the checker itself: a parameter of the wrong width or a missing one fails
    text = _header()
    fns, typedefs = _functions(text), _typedefs(text)
    res, args = _lib.SIGNATURES["ple_dequant_fuse_graph"]
    wrong = list(args)
    wrong[2] = ctypes.c_uint64  # capacity_tokens is uint32_t
    with pytest.raises(AssertionError, match="parameter 2 is uint32_t"):
        _check("ple_dequant_fuse_graph", fns["ple_dequant_fuse_graph"], res, wrong, typedefs)
    with pytest.raises(AssertionError, match="7 parameters in ple.h, 6 declared"):
        _check("ple_dequant_fuse_graph", fns["ple_dequant_fuse_graph"], res, args[:-1], typedefs)
    with pytest.raises(AssertionError, match="returns ple_status"):
        _check("ple_wait", fns["ple_wait"], None, _lib.SIGNATURES["ple_wait"][1], typedefs)
