#!/usr/bin/env python3
"""The Julia binding (bindings/julia/MoEEP.jl) against include/moeep.h,
without Julia: every struct of the header declared in LibMoEEP.jl with the
same fields in the same order, each of the C field's size, laid out (by the C rules Julia follows for
isbits structs: each field at a multiple of its alignment, the size rounded
up to the largest) at the offsets and size the C compiler gives; and every
ccall naming a function of the header with as many arguments, pointers
where the header has pointers.

    tests/ffi/julia_layout_check.py
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import header_layout  # noqa: E402

JL = os.path.join(header_layout.ROOT, "bindings", "julia", "MoEEP.jl", "src")
# (size, alignment) of Julia's types on LP64 (x86-64, aarch64)
SCALARS = {"Csize_t": (8, 8), "Cuint": (4, 4), "Cint": (4, 4), "Int32": (4, 4), "UInt32": (4, 4),
           "Int64": (8, 8), "UInt64": (8, 8), "Float32": (4, 4), "Float64": (8, 8), "UInt8": (1, 1),
           "Int8": (1, 1), "UInt16": (2, 2), "Cstring": (8, 8)}


def julia_sources():
    return "\n".join(open(os.path.join(JL, f)).read() for f in sorted(os.listdir(JL)) if f.endswith(".jl"))


def julia_type(name, aliases):
    name = name.strip()
    name = aliases.get(name, name)
    if name.startswith("Ptr{") or name.startswith("Ref{"):
        return 8, 8
    m = re.fullmatch(r"NTuple\{(\d+),\s*(\w+)\}", name)
    if m:
        size, align = julia_type(m.group(2), aliases)
        return int(m.group(1)) * size, align
    if name not in SCALARS:
        raise ValueError("unknown Julia field type %s" % name)
    return SCALARS[name]


def julia_structs(text):
    aliases = dict(re.findall(r"^const (\w+) = (\w+(?:\{[^}]*\})?)\s*$", text, flags=re.M))
    out = {}
    for name, body in re.findall(r"^struct (\w+)\n(.*?)^end", text, flags=re.M | re.S):
        fields, offset, biggest = [], 0, 1
        for fname, ftype in re.findall(r"^\s+(\w+)::(\S+)\s*$", body, flags=re.M):
            size, align = julia_type(ftype, aliases)
            offset = (offset + align - 1) // align * align
            fields.append((fname, offset, size))
            offset += size
            biggest = max(biggest, align)
        out[name] = ((offset + biggest - 1) // biggest * biggest, fields)
    return out


def split_types(tuple_text):
    parts, depth, cur = [], 0, ""
    for ch in tuple_text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def main():
    fails = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            fails.append(what)

    text = julia_sources()
    c_layout = header_layout.measure()
    jl = julia_structs(open(os.path.join(JL, "LibMoEEP.jl")).read())  # the raw structs live there
    for name, (size, fields) in c_layout.items():
        if name not in jl:
            check(False, "%s: in moeep.h, not declared in LibMoEEP.jl" % name)
            continue
        jsize, jfields = jl[name]
        check(jfields == fields and jsize == size, "%s: %d fields, %d bytes, offsets and field sizes as in C%s" % (
            name, len(fields), size, "" if jfields == fields and jsize == size else
            " (Julia: %d bytes, %s; C: %s)" % (jsize, jfields, fields)))
    for name in jl:
        if name.startswith("ep") and name not in c_layout:
            check(False, "%s: declared in LibMoEEP.jl, not a struct of moeep.h" % name)

    protos = header_layout.prototypes()
    calls = re.findall(r"ccall\(\(:(\w+),\s*L\.libmoeep\),\s*[\w{}.]+,\s*\(([^()]*)\)", text)
    check(len(calls) >= 15, "ccalls found: %d" % len(calls))
    for fn, types in sorted(set(calls)):
        jtypes = split_types(types)
        if fn not in protos:
            check(False, "ccall of %s, which moeep.h does not declare" % fn)
            continue
        cargs = protos[fn]
        same_ptrs = [header_layout.c_is_pointer(a) for a in cargs] == [
            t.startswith(("Ptr{", "Ref{")) or t == "Cstring" for t in jtypes]
        check(len(jtypes) == len(cargs) and same_ptrs, "ccall %s: %d arguments as in moeep.h%s" % (
            fn, len(cargs), "" if len(jtypes) == len(cargs) and same_ptrs else " (Julia %s, C %s)" % (jtypes, cargs)))
    print("julia_layout_check: %s" % ("all checks passed" if not fails else "%d FAILED" % len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
