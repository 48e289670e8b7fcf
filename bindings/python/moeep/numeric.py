"""NumPy helpers for the types NumPy lacks: BF16 and FP8-E4M3 as raw bits
(uint16 / uint8 arrays), which is how host arrays of those types are passed."""
import numpy as np


def to_bfloat16(a):
    """float32 values -> BF16 bits (uint16), rounded to nearest even (NaN kept NaN)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


def from_bfloat16(b):
    """BF16 bits (uint16) -> float32, exactly."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_float8_e4m3(b):
    """FP8-E4M3 (the "fn" variant: no infinities, 0x7f / 0xff NaN) bits -> float32, exactly."""
    b = np.asarray(b, dtype=np.uint8).astype(np.int32)
    sign = np.where(b & 0x80, -1.0, 1.0).astype(np.float32)
    exp, man = (b >> 3) & 0xF, b & 0x7
    normal = np.ldexp(1.0 + man / 8.0, exp - 7)
    subnormal = np.ldexp(man / 8.0, -6)
    value = np.where(exp == 0, subnormal, normal).astype(np.float32) * sign
    return np.where((b & 0x7F) == 0x7F, np.float32(np.nan), value).astype(np.float32)
