"""Arrays as the library sees them: an address, a shape, byte strides, an
element type and where the memory lives. Never a copy.

Accepted: PyTorch tensors (data_ptr, so BF16 and FP8 too), objects with
__cuda_array_interface__ (CuPy, Numba, ...), objects with __dlpack__ (CPU or
CUDA), and NumPy arrays or anything with __array_interface__. NumPy has no
BF16 or FP8: pass uint16 / uint8 arrays and say dtype="bfloat16" /
"float8_e4m3" (or use ml_dtypes' types, whose names are recognised).
"""
import ctypes as C

from . import _capi

# Canonical names -> (library type or None, bytes per element)
DTYPES = {
    "bfloat16": (_capi.BFLOAT16, 2), "float16": (_capi.FLOAT16, 2), "float32": (_capi.FLOAT32, 4),
    "float8_e4m3": (_capi.FLOAT8_E4M3, 1), "int32": (_capi.INT32, 4), "int64": (_capi.INT64, 8),
    "uint8": (None, 1), "uint16": (None, 2), "bool": (None, 1), "float64": (None, 8),
}
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "f16": "float16", "fp32": "float32",
           "float": "float32", "f32": "float32", "fp8": "float8_e4m3", "float8_e4m3fn": "float8_e4m3",
           "e4m3": "float8_e4m3", "int": "int32", "long": "int64"}
# Reinterpretations allowed by an explicit dtype: same width, bits taken as they are.
_REINTERPRET = {"uint16": ("bfloat16", "float16"), "uint8": ("float8_e4m3",), "int16": ("bfloat16", "float16")}

_TYPESTR = {"<f4": "float32", "<f2": "float16", "<f8": "float64", "<i8": "int64", "<i4": "int32",
            "|u1": "uint8", "<u1": "uint8", "|i1": "uint8", "<u2": "uint16", "<i2": "int16", "|b1": "bool"}
# DLPack (type code, bits) -> name: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6,
# kDLFloat8_e4m3fn 10.
_DLPACK = {(2, 32): "float32", (2, 16): "float16", (2, 64): "float64", (4, 16): "bfloat16",
           (0, 64): "int64", (0, 32): "int32", (0, 16): "int16", (1, 8): "uint8", (1, 16): "uint16",
           (6, 8): "bool", (10, 8): "float8_e4m3"}
_KDLCPU, _KDLCUDA, _KDLCUDAHOST = 1, 2, 3


def canonical(name):
    name = str(name)
    for prefix in ("torch.", "numpy."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    name = ALIASES.get(name, name)
    if name not in DTYPES and name != "int16":
        raise TypeError("unknown element type %r" % name)
    return name


class ArrayView:
    """What the library needs of an array; `owner` keeps the memory alive."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "itemsize", "device", "device_index", "framework", "owner")

    def __init__(self, ptr, shape, strides, dtype, device, device_index, framework, owner):
        self.ptr, self.shape, self.strides, self.dtype = int(ptr), tuple(shape), tuple(strides), dtype
        self.itemsize = DTYPES[dtype][1] if dtype in DTYPES else 2
        self.device, self.device_index, self.framework, self.owner = device, device_index, framework, owner

    @property
    def ndim(self):
        return len(self.shape)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def row_contiguous(self):
        """True when every dimension but the first is packed (rows may be apart)."""
        if self.numel() == 0:  # empty arrays may come with any strides
            return True
        expect = self.itemsize
        for size, stride in zip(reversed(self.shape[1:]), reversed(self.strides[1:])):
            if size > 1 and stride != expect:
                return False
            expect *= size
        return True

    def contiguous(self):
        if self.numel() == 0:
            return True
        expect = self.itemsize
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size > 1 and stride != expect:
                return False
            expect *= size
        return True


def _packed_strides(shape, itemsize):
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _from_torch(t):
    dtype = canonical(str(t.dtype).replace("float8_e4m3fn", "float8_e4m3"))
    item = t.element_size()
    dev = t.device
    return ArrayView(t.data_ptr(), t.shape, [s * item for s in t.stride()], dtype,
                     "cuda" if dev.type == "cuda" else dev.type, dev.index, "torch", t)


def _from_interface(obj, iface, device):
    typestr = iface["typestr"]
    descr = iface.get("descr")
    dtype = _TYPESTR.get(typestr)
    # ml_dtypes' bfloat16 / float8 show as void types with their name in descr.
    if dtype is None and descr and descr[0][0] in ("bfloat16", "float8_e4m3fn"):
        dtype = canonical(descr[0][0])
    if dtype is None:
        raise TypeError("element type %r is not one the library takes" % typestr)
    shape = tuple(iface["shape"])
    item = DTYPES[dtype][1] if dtype in DTYPES else 2
    strides = iface.get("strides") or _packed_strides(shape, item)
    ptr = iface["data"][0] or 0
    return ArrayView(ptr, shape, strides, dtype, device, None, type(obj).__module__.split(".")[0], obj)


def _from_numpy(a):
    name = a.dtype.name
    if name in ("bfloat16", "float8_e4m3fn"):
        dtype = canonical(name)
    else:
        dtype = _TYPESTR.get(a.dtype.str)
        if dtype is None:
            raise TypeError("NumPy element type %s is not one the library takes" % a.dtype)
    return ArrayView(a.ctypes.data, a.shape, a.strides, dtype, "cpu", None, "numpy", a)


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice), ("ndim", C.c_int32), ("dtype", _DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)),
                ("byte_offset", C.c_uint64)]


def _from_dlpack(obj, stream):
    dev_type, dev_id = obj.__dlpack_device__()
    if dev_type == _KDLCUDA:
        # The producer orders its work before `stream` (DLPack's contract), so the
        # library may read the data on it.
        capsule = obj.__dlpack__(stream=stream if stream else 1)
    else:
        capsule = obj.__dlpack__()
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    # The capsule stays unconsumed (its name unchanged), so its destructor frees
    # the tensor when `owner` goes: the memory lives as long as this view.
    tensor = _DLTensor.from_address(get(capsule, b"dltensor"))
    key = (tensor.dtype.code, tensor.dtype.bits)
    if key not in _DLPACK or tensor.dtype.lanes != 1:
        raise TypeError("DLPack element type (code %d, %d bits) is not one the library takes" % key)
    dtype = _DLPACK[key]
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    item = tensor.dtype.bits // 8
    strides = (tuple(tensor.strides[i] * item for i in range(tensor.ndim)) if tensor.strides
               else _packed_strides(shape, item))
    device = {_KDLCPU: "cpu", _KDLCUDAHOST: "cpu", _KDLCUDA: "cuda"}.get(dev_type)
    if device is None:
        raise TypeError("DLPack device type %d is neither CPU nor CUDA" % dev_type)
    return ArrayView((tensor.data or 0) + tensor.byte_offset, shape, strides, dtype, device,
                     dev_id if device == "cuda" else None, "dlpack", (obj, capsule))


def view(obj, dtype=None, stream=None):
    """The ArrayView of obj; dtype reinterprets a same-width integer array
    (uint16 as "bfloat16", uint8 as "float8_e4m3") or must match."""
    if isinstance(obj, ArrayView):
        v = obj
    elif type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        v = _from_torch(obj)
    elif hasattr(obj, "__cuda_array_interface__"):
        v = _from_interface(obj, obj.__cuda_array_interface__, "cuda")
    elif type(obj).__module__ == "numpy" or hasattr(obj, "__array_interface__"):
        if type(obj).__name__ == "ndarray":
            v = _from_numpy(obj)
        else:
            v = _from_interface(obj, obj.__array_interface__, "cpu")
    elif hasattr(obj, "__dlpack__"):
        v = _from_dlpack(obj, stream)
    else:
        raise TypeError("%s is not an array the library can read (NumPy, PyTorch, CuPy, "
                        "__cuda_array_interface__ or DLPack)" % type(obj).__name__)
    if dtype is not None:
        want = canonical(dtype)
        if want != v.dtype:
            if want not in _REINTERPRET.get(v.dtype, ()):
                raise TypeError("array of %s given where %s is wanted" % (v.dtype, want))
            v = ArrayView(v.ptr, v.shape, v.strides, want, v.device, v.device_index, v.framework, v.owner)
    return v


def current_stream(views):
    """The caller's current CUDA stream for these arrays: PyTorch's or CuPy's
    current stream of the arrays' framework; None for host arrays."""
    for v in views:
        if v is None or v.device != "cuda":
            continue
        if v.framework == "torch":
            import torch
            return torch.cuda.current_stream(v.device_index).cuda_stream
        if v.framework == "cupy":
            import cupy
            return cupy.cuda.get_current_stream().ptr
        return 0  # other producers: the legacy default stream, which orders after all of them
    return None


def stream_handle(stream):
    """A stream argument as the address of its CUstream (0 / None: none)."""
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError("stream must be an int, a torch.cuda.Stream or a cupy Stream, not %s" % type(stream).__name__)
