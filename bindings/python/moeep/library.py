"""The library as a whole: its version, transports and buffer sizes, unique
ids, and configurations (epConfig_t from keyword arguments)."""
import ctypes as C

from . import _capi
from .arrays import DTYPES, canonical
from .errors import check

BACKENDS = {"auto": _capi.BACKEND_AUTO, "host": _capi.BACKEND_HOST, "cuda": _capi.BACKEND_CUDA}
WIRE_TYPES = ("bfloat16", "float16", "float32", "float8_e4m3")


class UniqueId:
    """The 128 bytes every rank of a communicator must be given."""

    __slots__ = ("_data",)

    def __init__(self, data):
        data = bytes(data)
        if len(data) != _capi.UNIQUE_ID_BYTES:
            raise ValueError("a unique id is %d bytes, not %d" % (_capi.UNIQUE_ID_BYTES, len(data)))
        self._data = data

    @classmethod
    def create(cls):
        """epGetUniqueId: on the root rank, whose process then serves the
        bootstrap of one communicator; with EP_COMM_ID set, on any rank."""
        s = _capi.UniqueIdStruct()
        check(_capi.lib().epGetUniqueId(C.byref(s)), None, "epGetUniqueId")
        return cls(C.string_at(C.addressof(s), _capi.UNIQUE_ID_BYTES))

    @classmethod
    def fromhex(cls, text):
        return cls(bytes.fromhex(text))

    def hex(self):
        return self._data.hex()

    def __bytes__(self):
        return self._data

    def _struct(self):
        s = _capi.UniqueIdStruct()
        C.memmove(C.addressof(s), self._data, _capi.UNIQUE_ID_BYTES)
        return s


def make_config(num_experts, hidden, max_tokens_per_rank, max_topk, dispatch_type="bfloat16",
                combine_type="bfloat16", backend="auto", device=-1, buffer_bytes_cap=0, timeout_ms=0,
                num_sms=0, max_nodes_per_token=0, low_latency=False, enable_shrink=False, **ib):
    """An epConfig_t from keyword arguments (0 / -1 leave a field to its EP_*
    variable or default, as in C); ib_* are the InfiniBand fields by name;
    enable_shrink lets Communicator.shrink (epCommShrink) run."""
    cfg = _capi.initialized(_capi.Config)
    cfg.num_experts, cfg.hidden = num_experts, hidden
    cfg.max_tokens_per_rank, cfg.max_topk = max_tokens_per_rank, max_topk
    cfg.dispatch_type = DTYPES[wire_type(dispatch_type)][0]
    cfg.combine_type = DTYPES[wire_type(combine_type)][0]
    if backend not in BACKENDS:
        raise ValueError("backend must be one of %s, not %r" % (", ".join(BACKENDS), backend))
    cfg.backend, cfg.device = BACKENDS[backend], device
    cfg.buffer_bytes_cap, cfg.timeout_ms, cfg.num_sms = buffer_bytes_cap, timeout_ms, num_sms
    cfg.max_nodes_per_token, cfg.low_latency = max_nodes_per_token, int(bool(low_latency))
    cfg.enable_shrink = int(bool(enable_shrink))
    for name, value in ib.items():
        if name not in _capi._IB_FIELDS:
            raise TypeError("unknown config field %r" % name)
        setattr(cfg, name, value)
    return cfg


def wire_type(name):
    name = canonical(name)
    if name not in WIRE_TYPES:
        raise ValueError("%s is not a row type of the library (%s)" % (name, ", ".join(WIRE_TYPES)))
    return name


def ll_buffer_bytes(nranks, **config):
    """epLowLatencyBufferBytes: what a GPU communicator of nranks registers."""
    cfg = make_config(**config)
    n = C.c_size_t()
    check(_capi.lib().epLowLatencyBufferBytes(C.byref(cfg), nranks, C.byref(n)), None, "epLowLatencyBufferBytes")
    return n.value


def version():
    """epGetVersion of the loaded library: (major, minor, patch)."""
    v = C.c_int()
    check(_capi.lib().epGetVersion(C.byref(v)), None, "epGetVersion")
    return v.value // 10000, v.value // 100 % 100, v.value % 100


def transports():
    """[(name, available, detail)] of this process (epGetTransport)."""
    out, i = [], 0
    while True:
        name, detail, ok = C.c_char_p(), C.c_char_p(), C.c_int()
        if _capi.lib().epGetTransport(i, C.byref(name), C.byref(ok), C.byref(detail)) != _capi.SUCCESS:
            return out
        out.append((name.value.decode(), bool(ok.value), (detail.value or b"").decode()))
        i += 1
