"""include/moeep.h as a C compiler sees it, for the checks of the bindings
that cannot ask a compiler themselves (Julia, Python's ctypes): every
`typedef struct { ... } NAME;` with its size and field offsets, measured by a
C program generated from the header, compiled with $CC (else cc) and run;
and every EP_API prototype with its arguments."""
import os
import re
import subprocess
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
HEADER = os.path.join(ROOT, "include", "moeep.h")


def _text():
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def structs():
    """{name: [field, ...]} in declaration order."""
    out = {}
    for body, name in re.findall(r"typedef struct \{(.*?)\}\s*(\w+)\s*;", _text(), flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = decl.strip()
            if decl:
                fields.append(re.findall(r"\w+", decl.split("[")[0])[-1])
        out[name] = fields
    return out


def prototypes():
    """{function: [argument declaration, ...]} of every EP_API function."""
    out = {}
    for name, args in re.findall(r"EP_API\s+[\w\s\*]+?\b(ep\w+)\s*\(([^)]*)\)\s*;", _text(), flags=re.S):
        args = " ".join(args.split())
        out[name] = [] if args in ("", "void") else [a.strip() for a in args.split(",")]
    return out


def c_is_pointer(decl):
    return "*" in decl or re.search(r"\b(epComm_t|epHandle_t|epStream_t)\b", decl) is not None


def measure():
    """{name: (size, [(field, offset, size), ...])} as the C compiler lays them out."""
    st = structs()
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "moeep.h"', "int main(void) {"]
    for name, fields in st.items():
        lines.append('  printf("S %s %%zu\\n", sizeof(%s));' % (name, name))
        for f in fields:
            lines.append('  printf("F %s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));' % (
                f, name, f, name, f))
    lines += ["  return 0;", "}"]
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-std=c11", "-I", os.path.dirname(HEADER), src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    layout, current = {}, None
    for line in out.splitlines():
        kind, name, *values = line.split()
        if kind == "S":
            current = name
            layout[name] = (int(values[0]), [])
        else:
            layout[current][1].append((name, int(values[0]), int(values[1])))
    return layout
