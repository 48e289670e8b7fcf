#!/usr/bin/env python3
"""How moeep reads arrays, without a GPU: NumPy views (BF16 and FP8 as
uint16 / uint8 bits), DLPack capsules (NumPy's own __dlpack__), a
__cuda_array_interface__ object (read, and refused by a host communicator
with a message), strides, and the conversions in moeep.numeric."""
import sys

import numpy as np

import moeep
from moeep.arrays import stream_handle, view
from moeep.numeric import from_bfloat16, from_float8_e4m3, to_bfloat16

fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        fails.append(what)


class FakeCudaArray:
    """A device array as CuPy or Numba describe it (never dereferenced here)."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": None, "version": 3}


def main():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = view(a)
    check(v.ptr == a.ctypes.data and v.shape == (4, 6) and v.strides == (24, 4) and v.dtype == "float32"
          and v.device == "cpu", "NumPy float32: address, shape, byte strides")
    b = to_bfloat16(a)
    check(view(b, "bfloat16").dtype == "bfloat16" and view(b).dtype == "uint16", "uint16 read as BF16 on request")
    try:
        view(a, "bfloat16")
        check(False, "float32 cannot be read as BF16")
    except TypeError:
        check(True, "float32 is not reinterpreted as BF16")
    check(view(a[:, ::2]).row_contiguous() is False and view(a[::2]).row_contiguous() is True,
          "rows apart are allowed, elements apart are not")
    if hasattr(a, "__dlpack__"):
        d = view(_DLPackOnly(a[1:]))
        check(d.ptr == a[1:].ctypes.data and d.shape == (3, 6) and d.dtype == "float32" and d.framework == "dlpack",
              "a DLPack capsule (NumPy's): address, shape, type")
    c = view(FakeCudaArray(0x7F0000000000, (8, 16), "<f2"))
    check(c.device == "cuda" and c.dtype == "float16" and c.strides == (32, 2),
          "__cuda_array_interface__: device, type, packed strides")
    check(stream_handle(None) is None and stream_handle(5) == 5 and stream_handle(_Stream()) == 1234,
          "stream arguments: None, int, an object with cuda_stream")
    # 3.14159 rounds down; 65504 up (past the half); 1 + 2^-8 is a tie, kept even (1.0); 1 + 3 * 2^-8 a tie, up.
    x = np.array([1.0, -2.5, 3.14159, 65504.0, 1.00390625, 1.01171875], np.float32)
    check(np.array_equal(from_bfloat16(to_bfloat16(x)), np.array([1.0, -2.5, 3.140625, 65536.0, 1.0, 1.015625],
                                                                 np.float32)), "BF16 rounding to nearest even")
    check(from_bfloat16(to_bfloat16(np.float32(3.14159)))[()] == np.float32(3.140625), "BF16 rounds to nearest")
    check(list(from_float8_e4m3(np.array([0x38, 0xB8, 0x7E, 0x01, 0x00], np.uint8))) == [1.0, -1.0, 448.0, 2.0 ** -9,
                                                                                          0.0], "E4M3 decoding")

    comm = moeep.Communicator(1, 0, None, num_experts=2, hidden=16, max_tokens_per_rank=4, max_topk=1,
                              backend="host")
    try:
        comm.dispatch(FakeCudaArray(0x7F0000000000, (2, 16), "<u2"), np.zeros((2, 1), np.int64))
        check(False, "a CUDA array given to a host communicator must be refused")
    except ValueError as e:
        check("host" in str(e), "a CUDA array given to a host communicator: %s" % e)
    d = comm.dispatch(to_bfloat16(np.ones((2, 16), np.float32)), np.array([[0], [1]], np.int64))
    check(d.num_recv == 2 and d.recv_x.dtype == np.uint16, "one rank: both tokens come back")
    d.handle.close()
    d.handle.close()  # a second close is a no-op
    comm.close()
    try:
        comm.rank_count = comm.buffer_bytes
        check(False, "a closed communicator must refuse calls")
    except ValueError:
        check(True, "a closed communicator refuses calls")
    print("test_arrays: %s" % ("all checks passed" if not fails else "%d FAILED" % len(fails)))
    return 1 if fails else 0


class _DLPackOnly:
    """Hides NumPy's other interfaces, so that the DLPack path is the one taken."""

    def __init__(self, a):
        self._a = np.ascontiguousarray(a)

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class _Stream:
    cuda_stream = 1234


if __name__ == "__main__":
    sys.exit(main())
