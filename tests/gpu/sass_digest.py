#!/usr/bin/env python3
"""Each kernel's machine code in a cubin: size and digest.

Two builds whose kernels have equal digests run identical SASS, so a refactor
of device code can be checked without a GPU (and without a disassembler):

    nvcc -std=c++17 -O3 -arch=sm_90 -cubin -Isrc -Iinclude src/cuda/ll_dispatch.cu -o a.cubin
    (change, rebuild as b.cubin)
    tests/gpu/sass_digest.py a.cubin b.cubin

Kernels are matched by name with the anonymous-namespace part (which holds a
hash of the file name) taken out, so the same kernel moved to another file
still matches. Exit status 1 when a kernel present in both differs.
"""
import hashlib
import re
import struct
import sys


def kernel_texts(path):
    """{kernel name: bytes of its .text section} of an ELF64 cubin."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{path}: not an ELF64 file (build with nvcc -cubin)")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    texts = {}
    for name_off, _type, _flags, _addr, off, size in headers:
        end = data.index(b"\0", names_at + name_off)
        name = data[names_at + name_off:end].decode()
        if name.startswith(".text."):
            symbol = name[len(".text."):]
            # _ZN2ep4cuda<len>_GLOBAL__N__<hash>_<len>_<file>_<hash><len><kernel>...: drop the namespace.
            symbol = re.sub(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}", "", symbol)
            texts[symbol] = data[off:off + size]
    return texts


def main(paths):
    builds = [kernel_texts(p) for p in paths]
    names = sorted(set().union(*builds))
    differ = False
    for name in names:
        row = []
        for texts in builds:
            code = texts.get(name)
            row.append("-" if code is None else f"{len(code):7d} {hashlib.sha256(code).hexdigest()[:12]}")
        present = [t[name] for t in builds if name in t]
        same = all(code == present[0] for code in present)
        differ |= not same
        print(f"{'  ' if same else '!='} {name[:70]:70s} " + " | ".join(row))
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1:]))
