#!/usr/bin/env python3
"""The Python package's ctypes declarations (bindings/python/moeep/_capi.py)
against include/moeep.h as the C compiler lays it out: every struct with the
same fields in order, offsets, field sizes and size; every prototype with as
many arguments as the header, pointers where it has pointers.

    tests/ffi/python_layout_check.py
"""
import ctypes as C
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import header_layout  # noqa: E402
from moeep import _capi  # noqa: E402  (declarations only: the library is not loaded)


def is_pointer(t):
    return t in (C.c_void_p, C.c_char_p) or (isinstance(t, type) and issubclass(t, C._Pointer))


def main():
    fails = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            fails.append(what)

    c_layout = header_layout.measure()
    for name, (size, fields) in c_layout.items():
        cls = _capi.STRUCTS.get(name)
        if cls is None:
            check(False, "%s: in moeep.h, not declared in _capi.py" % name)
            continue
        py = [(f, getattr(cls, f).offset, getattr(cls, f).size) for f, _ in cls._fields_]
        check(py == fields and C.sizeof(cls) == size, "%s: fields, offsets, sizes as in C%s" % (
            name, "" if py == fields and C.sizeof(cls) == size else " (Python %s, C %s)" % (py, fields)))
    protos = header_layout.prototypes()
    for fn, argtypes in sorted(_capi._PROTOTYPES.items()):
        cargs = protos.get(fn)
        if cargs is None:
            check(False, "%s declared in _capi.py, not in moeep.h" % fn)
            continue
        same = len(cargs) == len(argtypes) and all(
            header_layout.c_is_pointer(c) == is_pointer(p) for c, p in zip(cargs, argtypes))
        check(same, "%s: %d arguments as in moeep.h" % (fn, len(cargs)))
    print("python_layout_check: %s" % ("all checks passed" if not fails else "%d FAILED" % len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
