"""The C ABI of libmoeep as ctypes declarations (include/moeep.h: epConfig_t at
version 3, every other struct at version 1; epCommPeerInfo_t, epPeerClassInfo_t). Field names and order follow the header exactly; the layout is
checked against the C compiler's by tests/ffi/python_layout_check.py.
"""
import ctypes as C

from ._find import load_library

# epResult_t: values fixed forever by the header.
RESULT_NAMES = {
    0: "epSuccess", 1: "epUnhandledCudaError", 2: "epSystemError", 3: "epInternalError",
    4: "epInvalidArgument", 5: "epInvalidUsage", 6: "epRemoteError", 7: "epInProgress",
    8: "epTimeout", 9: "epNotSupported", 10: "epAborted", 11: "epOutOfMemory",
}
SUCCESS, INVALID_ARGUMENT, INVALID_USAGE = 0, 4, 5

# epDataType_t
BFLOAT16, FLOAT16, FLOAT32, FLOAT8_E4M3, INT32, INT64 = 0, 1, 2, 3, 4, 5
# epBackend_t
BACKEND_AUTO, BACKEND_HOST, BACKEND_CUDA = 0, 1, 2

CONFIG_MAGIC = 0x65704366
LAYOUT_ARGS_MAGIC = 0x65704C61
DISPATCH_ARGS_MAGIC = 0x65704469
COMBINE_ARGS_MAGIC = 0x6570436F
LL_DISPATCH_ARGS_MAGIC = 0x65704C64
LL_COMBINE_ARGS_MAGIC = 0x65704C63
COMM_PEER_INFO_MAGIC = 0x65705069
PEER_TRAFFIC_CLASSES = 3

DISPATCH_NO_HOST_SYNC = 0x1
COMBINE_DETERMINISTIC = 0x1
LL_SEND_ONLY = 0x1
LL_ROUND_SCALE_POW2 = 0x2

UNIQUE_ID_BYTES = 128

CONFIG_VERSION = 3  # EP_CONFIG_VERSION; every other struct is at version 1

_IB_FIELDS = ("ib_sl_throughput", "ib_sl_low_latency", "ib_sl_control", "ib_traffic_class",
              "ib_gid_index", "ib_qps_per_peer", "ib_ar_throughput", "ib_ar_low_latency",
              "ib_ar_control", "ib_tc_throughput", "ib_tc_low_latency", "ib_tc_control", "ib_timeout",
              "ib_retry_cnt", "ib_qp_budget")


class UniqueIdStruct(C.Structure):
    _fields_ = [("internal", C.c_char * UNIQUE_ID_BYTES)]


class Config(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("num_experts", C.c_int), ("hidden", C.c_int), ("max_tokens_per_rank", C.c_int),
                ("max_topk", C.c_int), ("dispatch_type", C.c_int), ("combine_type", C.c_int),
                ("backend", C.c_int), ("device", C.c_int), ("buffer_bytes_cap", C.c_size_t),
                ("timeout_ms", C.c_int), ("num_sms", C.c_int), ("max_nodes_per_token", C.c_int),
                ("low_latency", C.c_int)] + [(name, C.c_int) for name in _IB_FIELDS] + \
               [("enable_shrink", C.c_int)]


class LayoutArgs(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("topk_idx", C.c_void_p), ("topk_idx_type", C.c_int), ("num_tokens", C.c_int),
                ("num_topk", C.c_int), ("tokens_per_rank", C.c_void_p), ("tokens_per_node", C.c_void_p),
                ("tokens_per_expert", C.c_void_p), ("is_token_in_rank", C.c_void_p)]


class DispatchArgs(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("flags", C.c_uint),
                ("x", C.c_void_p), ("x_type", C.c_int), ("x_stride", C.c_size_t),
                ("x_scales", C.c_void_p), ("scales_token_stride", C.c_size_t),
                ("scales_block_stride", C.c_size_t), ("topk_idx", C.c_void_p), ("topk_idx_type", C.c_int),
                ("topk_weights", C.c_void_p), ("num_tokens", C.c_int), ("num_topk", C.c_int),
                ("expert_alignment", C.c_int), ("recv_x", C.c_void_p), ("recv_scales", C.c_void_p),
                ("recv_topk_idx", C.c_void_p), ("recv_topk_weights", C.c_void_p),
                ("recv_capacity", C.c_int64), ("recv_tokens_per_expert", C.c_void_p),
                ("num_recv", C.c_void_p)]


class CombineArgs(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("flags", C.c_uint),
                ("y", C.c_void_p), ("y_type", C.c_int), ("y_stride", C.c_size_t),
                ("recv_topk_weights", C.c_void_p), ("num_topk", C.c_int), ("bias", C.c_void_p),
                ("out", C.c_void_p), ("out_topk_weights", C.c_void_p)]


class LowLatencyDispatchArgs(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("flags", C.c_uint),
                ("x", C.c_void_p), ("topk_idx", C.c_void_p), ("topk_idx_type", C.c_int),
                ("topk_weights", C.c_void_p), ("num_tokens", C.c_int), ("num_topk", C.c_int),
                ("wire_type", C.c_int), ("recv_x", C.c_void_p), ("recv_scales", C.c_void_p),
                ("recv_count", C.c_void_p), ("recv_src", C.c_void_p)]


class LowLatencyCombineArgs(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("flags", C.c_uint),
                ("y", C.c_void_p), ("out", C.c_void_p)]


class PeerClassInfo(C.Structure):
    _fields_ = [("service_level", C.c_int), ("traffic_class", C.c_int), ("adaptive_routing", C.c_int)]


class CommPeerInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("peer", C.c_int),
                ("node", C.c_int), ("path", C.c_int), ("via_rank", C.c_int), ("transport", C.c_char * 32),
                ("device", C.c_char * 64), ("port", C.c_int), ("qps", C.c_int), ("link", C.c_char * 32),
                ("classes", PeerClassInfo * PEER_TRAFFIC_CLASSES), ("detail", C.c_char * 128)]


# The header's struct names, for the layout check.
STRUCTS = {
    "epUniqueId": UniqueIdStruct, "epConfig_t": Config, "epLayoutArgs_t": LayoutArgs,
    "epDispatchArgs_t": DispatchArgs, "epCombineArgs_t": CombineArgs,
    "epLowLatencyDispatchArgs_t": LowLatencyDispatchArgs, "epLowLatencyCombineArgs_t": LowLatencyCombineArgs,
    "epPeerClassInfo_t": PeerClassInfo, "epCommPeerInfo_t": CommPeerInfo,
}
_MAGIC = {Config: CONFIG_MAGIC, LayoutArgs: LAYOUT_ARGS_MAGIC, DispatchArgs: DISPATCH_ARGS_MAGIC,
          CombineArgs: COMBINE_ARGS_MAGIC, LowLatencyDispatchArgs: LL_DISPATCH_ARGS_MAGIC,
          LowLatencyCombineArgs: LL_COMBINE_ARGS_MAGIC, CommPeerInfo: COMM_PEER_INFO_MAGIC}


def initialized(cls):
    """The struct as its *_INITIALIZER macro makes it: size, magic, version,
    the non-zero defaults of the header (-1 device and InfiniBand settings,
    FP8 wire for the low-latency dispatch, int64 ids)."""
    s = cls()
    s.size, s.magic, s.version = C.sizeof(cls), _MAGIC[cls], 1
    if cls is Config:
        s.version = CONFIG_VERSION
        s.device = -1
        for name in _IB_FIELDS:
            setattr(s, name, -1)
    elif cls in (LayoutArgs, DispatchArgs, LowLatencyDispatchArgs):
        s.topk_idx_type = INT64
        if cls is LowLatencyDispatchArgs:
            s.wire_type = FLOAT8_E4M3
    elif cls is CommPeerInfo:
        s.via_rank = -1
    return s


_handle = C.c_void_p
_PROTOTYPES = {
    "epGetVersion": [C.POINTER(C.c_int)],
    "epGetErrorString": [C.c_int],
    "epGetLastError": [_handle],
    "epGetParam": [C.c_int, C.POINTER(C.c_char_p), C.POINTER(C.c_char_p), C.POINTER(C.c_char_p),
                   C.POINTER(C.c_char_p)],
    "epGetTransport": [C.c_int, C.POINTER(C.c_char_p), C.POINTER(C.c_int), C.POINTER(C.c_char_p)],
    "epGetUniqueId": [C.POINTER(UniqueIdStruct)],
    "epCommInitRank": [C.POINTER(_handle), C.c_int, UniqueIdStruct, C.c_int, C.POINTER(Config)],
    "epCommInitAll": [C.POINTER(_handle), C.c_int, C.POINTER(C.c_int), C.POINTER(Config)],
    "epCommDestroy": [_handle],
    "epCommAbort": [_handle],
    "epCommShrink": [_handle, C.POINTER(C.c_int), C.c_int, C.POINTER(C.c_int), C.POINTER(C.c_int)],
    "epCommDeadRanks": [_handle, C.POINTER(C.c_int), C.c_int, C.POINTER(C.c_int), C.POINTER(C.c_uint)],
    "epCommRank": [_handle, C.POINTER(C.c_int)],
    "epCommSize": [_handle, C.POINTER(C.c_int)],
    "epCommLocalExperts": [_handle, C.POINTER(C.c_int), C.POINTER(C.c_int)],
    "epCommBufferBytes": [_handle, C.POINTER(C.c_size_t)],
    "epCommNodes": [_handle, C.POINTER(C.c_int), C.POINTER(C.c_int)],
    "epCommPlanReport": [_handle, C.c_char_p, C.POINTER(C.c_size_t)],
    "epCommPeerInfo": [_handle, C.c_int, C.POINTER(CommPeerInfo)],
    "epLayout": [_handle, C.POINTER(LayoutArgs), C.c_void_p],
    "epDispatchPrepare": [_handle, C.POINTER(DispatchArgs), C.POINTER(_handle), C.c_void_p],
    "epDispatch": [_handle, C.POINTER(DispatchArgs), C.POINTER(_handle), C.c_void_p],
    "epHandleRecvCount": [_handle, C.POINTER(C.c_int64)],
    "epHandleDestroy": [_handle],
    "epCombine": [_handle, C.POINTER(CombineArgs), _handle, C.c_void_p],
    "epLowLatencyBufferBytes": [C.POINTER(Config), C.c_int, C.POINTER(C.c_size_t)],
    "epLowLatencyDispatch": [_handle, C.POINTER(LowLatencyDispatchArgs), C.POINTER(_handle), C.c_void_p],
    "epLowLatencyCombine": [_handle, C.POINTER(LowLatencyCombineArgs), _handle, C.c_void_p],
    "epLowLatencyComplete": [_handle, _handle, C.c_void_p],
}

_lib = None


def lib():
    """The loaded library with every prototype declared (loaded on first use,
    so that importing moeep never fails for want of it)."""
    global _lib
    if _lib is None:
        handle = load_library()
        for name, argtypes in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.argtypes = argtypes
            fn.restype = C.c_char_p if name in ("epGetErrorString", "epGetLastError") else C.c_int
        _lib = handle
    return _lib
