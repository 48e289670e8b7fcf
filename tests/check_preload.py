#!/usr/bin/env python3
"""Every CUDA kernel of the library is loaded at init (src/cuda/preload.cuh).

A kernel left out is loaded lazily at its first launch, which may wait for
every kernel running on the GPU: ranks sharing a GPU then deadlock until the
timeout (docs/SEMANTICS.md). This reads the sources, no GPU or compiler
needed: each __global__ kernel of src/cuda/*.cu must be named in a
preloadKernels(...) call of its file, and each preload function defined there
must be called from src/cuda/cuda_backend.cc. (Names only: which template
instantiations a file lists is for its review.)"""
import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
cuda = root / "src" / "cuda"
backend = (cuda / "cuda_backend.cc").read_text()
bad = []
for cu in sorted(cuda.glob("*.cu")):
    text = cu.read_text()
    kernels = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text))
    listed = " ".join(re.findall(r"preloadKernels\(([^;]*)\);", text, re.S))
    for k in sorted(kernels):
        if not re.search(r"\b%s\b" % re.escape(k), listed):
            bad.append(f"{cu.name}: kernel {k} is not in a preloadKernels(...) call")
    for fn in re.findall(r"^int\s+(preload\w+)\s*\(\s*\)", text, re.M):
        if not re.search(r"\b%s\s*\(\s*\)" % fn, backend):
            bad.append(f"{cu.name}: {fn}() is never called from cuda_backend.cc")
    if kernels and "preloadKernels(" not in text:
        bad.append(f"{cu.name}: has kernels but no preload function")
for b in bad:
    print("check_preload:", b)
print(f"check_preload: {'FAILED' if bad else 'every kernel is preloaded'}")
sys.exit(1 if bad else 0)
