"""Communicators and routing handles over the C ABI: the collective calls."""
import ctypes as C
import os
from collections import namedtuple

from . import _capi
from .arrays import DTYPES, current_stream, stream_handle, view
from .errors import MoeepError, check
from .library import BACKENDS, WIRE_TYPES, UniqueId, ll_buffer_bytes, make_config, transports, version, wire_type

Layout = namedtuple("Layout", "tokens_per_rank tokens_per_node tokens_per_expert is_token_in_rank")
Dispatched = namedtuple("Dispatched", "handle recv_x recv_scales recv_topk_idx recv_topk_weights "
                                      "recv_tokens_per_expert num_recv")
Combined = namedtuple("Combined", "out out_topk_weights")
LowLatencyDispatched = namedtuple("LowLatencyDispatched", "handle recv_x recv_scales recv_count recv_src")


def _ptr(v):
    return None if v is None else (v.ptr or None)


class _Released:
    """An object of the C ABI that close() releases; also a `with` block's
    end, and garbage collection as a last resort (best effort: at
    interpreter exit the module may be gone). _DESTROY names the C call that
    frees it."""

    _DESTROY = None
    _ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._ptr is not None and _capi._lib is not None:
                getattr(_capi._lib, self._DESTROY)(self._ptr)
                self._ptr = None
        except Exception:  # noqa: BLE001 - nothing can be reported from a finalizer
            pass


class Handle(_Released):
    """A routing handle (epHandle_t). Released by close(), by leaving a `with`
    block, or when garbage collected; close() is the deterministic way. A
    handle may be closed after its communicator."""

    _DESTROY = "epHandleDestroy"

    def __init__(self, ptr, comm, low_latency, num_tokens, num_topk):
        self._ptr = ptr
        self._comm = comm
        self.low_latency = low_latency
        self.num_tokens, self.num_topk = num_tokens, num_topk
        self._pending = None  # arrays a call still writes (split halves), kept alive

    @property
    def ptr(self):
        if self._ptr is None:
            raise ValueError("the handle is closed")
        return self._ptr

    @property
    def num_recv(self):
        """Rows this rank receives (epHandleRecvCount); None while the count is
        on the device only (a dispatch with no_host_sync)."""
        n = C.c_int64(-1)
        res = _capi.lib().epHandleRecvCount(self.ptr, C.byref(n))
        if res == _capi.INVALID_USAGE:
            return None
        check(res, None, "epHandleRecvCount")
        return n.value

    def close(self):
        if self._ptr is not None:
            ptr, self._ptr, self._pending = self._ptr, None, None
            check(_capi.lib().epHandleDestroy(ptr), None, "epHandleDestroy")


class Communicator(_Released):
    """One rank of an expert-parallel communicator (epComm_t).

        Communicator(nranks, rank, unique_id, num_experts=..., hidden=...,
                     max_tokens_per_rank=..., max_topk=..., [backend="host"], ...)

    unique_id: a UniqueId (or its 128 bytes) made by one rank with
    UniqueId.create() and shared; None takes EP_COMM_ID from the environment
    (every rank derives the id from it). The configuration is epConfig_t's
    fields as keyword arguments (see make_config). Released by close() (or
    abort()), a `with` block, or garbage collection."""

    _DESTROY = "epCommDestroy"

    def __init__(self, nranks, rank, unique_id=None, **config):
        cfg = make_config(**config)
        if unique_id is None:
            if nranks > 1 and not os.environ.get("EP_COMM_ID", "").strip():
                raise ValueError("unique_id is None and EP_COMM_ID is not set: rank 0 makes one with "
                                 "UniqueId.create() and every rank is given it")
            unique_id = UniqueId.create()
        elif not isinstance(unique_id, UniqueId):
            unique_id = UniqueId(unique_id)
        ptr = C.c_void_p()
        check(_capi.lib().epCommInitRank(C.byref(ptr), nranks, unique_id._struct(), rank, C.byref(cfg)),
              None, "epCommInitRank")
        self._adopt(ptr.value, cfg)

    @classmethod
    def init_all(cls, nranks, devices=None, **config):
        """epCommInitAll: every rank in this process, a list by rank. On the
        host backend call each rank's collectives from its own thread."""
        cfg = make_config(**config)
        ptrs = (C.c_void_p * nranks)()
        devs = None if devices is None else (C.c_int * nranks)(*devices)
        check(_capi.lib().epCommInitAll(ptrs, nranks, devs, C.byref(cfg)), None, "epCommInitAll")
        comms = []
        for p in ptrs:
            c = cls.__new__(cls)
            c._adopt(p, cfg)
            comms.append(c)
        return comms

    def _adopt(self, ptr, cfg):
        self._ptr = ptr
        self.config = cfg
        self.hidden, self.num_experts = cfg.hidden, cfg.num_experts
        self.max_tokens_per_rank, self.max_topk = cfg.max_tokens_per_rank, cfg.max_topk
        names = {DTYPES[n][0]: n for n in WIRE_TYPES}
        self.dispatch_type, self.combine_type = names[cfg.dispatch_type], names[cfg.combine_type]
        self.backend = {v: k for k, v in BACKENDS.items()}[cfg.backend]
        self.rank, self.size = self._query_int("epCommRank"), self._query_int("epCommSize")
        first, count = C.c_int(), C.c_int()
        self._check(_capi.lib().epCommLocalExperts(ptr, C.byref(first), C.byref(count)), "epCommLocalExperts")
        self.first_local_expert, self.num_local_experts = first.value, count.value

    # ---- life cycle ---------------------------------------------------------
    @property
    def ptr(self):
        if self._ptr is None:
            raise ValueError("the communicator is closed")
        return self._ptr

    def _check(self, res, what):
        check(res, self._ptr, what)

    def close(self):
        """epCommDestroy. Refused (MoeepError) while a call runs in another thread."""
        if self._ptr is not None:
            res = _capi.lib().epCommDestroy(self._ptr)
            if res != _capi.SUCCESS:
                check(res, self._ptr, "epCommDestroy")
            self._ptr = None

    def abort(self):
        """epCommAbort: calls blocked in other threads return epAborted; then freed."""
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            check(_capi.lib().epCommAbort(ptr), None, "epCommAbort")

    def shrink(self, suspects=()):
        """epCommShrink: after a call failed because ranks died, the survivors
        agree on the dead ranks and go on without them (config enable_shrink).
        suspects: ranks known to be gone. Returns the dead ranks, ascending."""
        suspects = list(suspects)
        arr = (C.c_int * max(1, len(suspects)))(*suspects)
        dead = (C.c_int * self.size)()
        n = C.c_int()
        self._check(_capi.lib().epCommShrink(self._ptr, arr, len(suspects), dead, C.byref(n)), "epCommShrink")
        return [dead[i] for i in range(n.value)]

    @property
    def dead_ranks(self):
        """epCommDeadRanks: (the ranks the shrinks so far removed, ascending,
        the epoch of the last completed shrink); ([], 0) before any."""
        dead = (C.c_int * self.size)()
        n = C.c_int()
        epoch = C.c_uint()
        self._check(_capi.lib().epCommDeadRanks(self._ptr, dead, self.size, C.byref(n), C.byref(epoch)),
                    "epCommDeadRanks")
        return [dead[i] for i in range(n.value)], epoch.value

    # ---- queries --------------------------------------------------------------
    def _query_int(self, fn):
        v = C.c_int()
        self._check(getattr(_capi.lib(), fn)(self._ptr, C.byref(v)), fn)
        return v.value

    @property
    def buffer_bytes(self):
        v = C.c_size_t()
        self._check(_capi.lib().epCommBufferBytes(self.ptr, C.byref(v)), "epCommBufferBytes")
        return v.value

    @property
    def nodes(self):
        """The node of each rank, a list by rank."""
        n = C.c_int()
        nodes = (C.c_int * self.size)()
        self._check(_capi.lib().epCommNodes(self.ptr, C.byref(n), nodes), "epCommNodes")
        return list(nodes)

    def plan_report(self):
        size = C.c_size_t(0)
        self._check(_capi.lib().epCommPlanReport(self.ptr, None, C.byref(size)), "epCommPlanReport")
        buf = C.create_string_buffer(size.value)
        self._check(_capi.lib().epCommPlanReport(self.ptr, buf, C.byref(size)), "epCommPlanReport")
        return buf.value.decode()

    _PATHS = {0: "self", 1: "nvlink", 2: "host-staged", 3: "rail", 4: "rail+fwd"}
    _CLASSES = ("throughput", "low_latency", "control")

    def peer_info(self, peer):
        """How this rank reaches peer (epCommPeerInfo), as a dict: node, path,
        via_rank, transport, and for a network peer device, port, qps, link,
        detail and per traffic class what was asked of the fabric."""
        info = _capi.initialized(_capi.CommPeerInfo)
        self._check(_capi.lib().epCommPeerInfo(self.ptr, int(peer), C.byref(info)), "epCommPeerInfo")
        out = {"peer": info.peer, "node": info.node, "path": self._PATHS.get(info.path, str(info.path)),
               "via_rank": info.via_rank, "transport": info.transport.decode(), "device": info.device.decode(),
               "port": info.port, "qps": info.qps, "link": info.link.decode(), "detail": info.detail.decode()}
        out["classes"] = {name: {"service_level": c.service_level, "traffic_class": c.traffic_class,
                                 "adaptive_routing": c.adaptive_routing}
                          for name, c in zip(self._CLASSES, info.classes)}
        return out

    # ---- argument helpers -------------------------------------------------------
    def _rows(self, name, obj, dtype, width=None, optional=False, stream=None, rows=None):
        """The view of a [rows, width] argument whose rows must be packed."""
        if obj is None:
            if optional:
                return None
            raise ValueError("%s is required" % name)
        v = view(obj, dtype, stream)
        if v.ndim != 2:
            raise ValueError("%s must be 2-D, not of shape %s" % (name, v.shape))
        if width is not None and v.shape[1] != width:
            raise ValueError("%s has %d columns, %d expected" % (name, v.shape[1], width))
        if rows is not None and v.shape[0] < rows:
            raise ValueError("%s has %d rows, at least %d expected" % (name, v.shape[0], rows))
        if not v.row_contiguous():
            raise ValueError("%s: the elements of a row must be adjacent" % name)
        return v

    def _packed(self, name, obj, dtype, numel=None, optional=True, stream=None):
        if obj is None:
            if optional:
                return None
            raise ValueError("%s is required" % name)
        if isinstance(dtype, tuple):  # any of these types
            v = view(obj, None, stream)
            if v.dtype not in dtype:
                raise TypeError("%s must be of %s, not %s" % (name, " or ".join(dtype), v.dtype))
        else:
            v = view(obj, dtype, stream)
        if not v.contiguous():
            raise ValueError("%s must be contiguous" % name)
        if numel is not None and v.numel() < numel:
            raise ValueError("%s holds %d elements, at least %d expected" % (name, v.numel(), numel))
        return v

    def _stream(self, stream, views):
        if stream is not None:
            return stream_handle(stream)
        return current_stream(views)

    def _same_device(self, views):
        devices = {v.device for v in views if v is not None}
        if len(devices) > 1:
            raise ValueError("the arrays of one call must all be host or all be CUDA arrays")
        want = {"host": "cpu", "cuda": "cuda"}.get(self.backend)
        if want and devices and devices != {want}:
            raise ValueError("a communicator on the %s backend takes %s arrays" % (
                self.backend, "host" if want == "cpu" else "CUDA"))

    @staticmethod
    def _alloc(like, shape, dtype):
        """An output array of the framework of `like` (NumPy, PyTorch, CuPy)."""
        if like.framework == "numpy":
            import numpy as np
            np_type = {"bfloat16": np.uint16, "float8_e4m3": np.uint8}.get(dtype, dtype)
            return np.empty(shape, dtype=np_type)
        if like.framework == "torch":
            import torch
            t_type = {"float8_e4m3": torch.float8_e4m3fn}.get(dtype) or getattr(torch, dtype)
            return torch.empty(shape, dtype=t_type, device=like.owner.device)
        if like.framework == "cupy":
            import cupy
            cp_type = {"bfloat16": cupy.uint16, "float8_e4m3": cupy.uint8}.get(dtype, dtype)
            return cupy.empty(shape, dtype=cp_type)
        raise ValueError("pass the output arrays: this call cannot allocate arrays like %s's" % like.framework)

    # ---- layout -----------------------------------------------------------------
    def layout(self, topk_idx, tokens_per_rank=None, tokens_per_node=None, tokens_per_expert=None,
               is_token_in_rank=None, stream=None, allocate=True):
        """epLayout of this rank's topk_idx [T, K]. Outputs not given are
        allocated like topk_idx (unless allocate is False: then not written)."""
        idx = self._rows("topk_idx", topk_idx, None)
        if idx.dtype not in ("int64", "int32"):
            raise TypeError("topk_idx must be int64 or int32, not %s" % idx.dtype)
        T, K = idx.shape
        num_nodes = max(self.nodes) + 1
        outs = {}
        for name, obj, shape, dtype in (("tokens_per_rank", tokens_per_rank, (self.size,), "int32"),
                                        ("tokens_per_node", tokens_per_node, (num_nodes,), "int32"),
                                        ("tokens_per_expert", tokens_per_expert, (self.num_experts,), "int32"),
                                        ("is_token_in_rank", is_token_in_rank, (T, self.size), "uint8")):
            if obj is None and allocate:
                obj = self._alloc(idx, shape, dtype)
            # is_token_in_rank: bytes of 0 / 1, so bool arrays serve as well as uint8 ones.
            want = ("uint8", "bool") if name == "is_token_in_rank" else dtype
            outs[name] = (obj, self._packed(name, obj, want, _prod(shape)))
        a = _capi.initialized(_capi.LayoutArgs)
        a.topk_idx, a.topk_idx_type = _ptr(idx), DTYPES[idx.dtype][0]
        a.num_tokens, a.num_topk = T, K
        a.tokens_per_rank = _ptr(outs["tokens_per_rank"][1])
        a.tokens_per_node = _ptr(outs["tokens_per_node"][1])
        a.tokens_per_expert = _ptr(outs["tokens_per_expert"][1])
        a.is_token_in_rank = _ptr(outs["is_token_in_rank"][1])
        views = [idx] + [v for _, v in outs.values()]
        self._same_device(views)
        self._check(_capi.lib().epLayout(self.ptr, C.byref(a), self._stream(stream, views)), "epLayout")
        return Layout(*(outs[n][0] for n in Layout._fields))

    # ---- dispatch / combine -----------------------------------------------------------
    def _dispatch_args(self, x, topk_idx, topk_weights, x_scales, expert_alignment, stream_hint):
        fp8 = self.dispatch_type == "float8_e4m3"
        xv = self._rows("x", x, self.dispatch_type, self.hidden, stream=stream_hint)
        T = xv.shape[0]
        idx = w = sv = None
        if topk_idx is not None:
            idx = self._packed("topk_idx", topk_idx, None, stream=stream_hint)
            if idx.dtype not in ("int64", "int32") or idx.ndim != 2 or idx.shape[0] != T:
                raise ValueError("topk_idx must be int64 or int32 of shape [%d, K], not %s of %s" % (
                    T, idx.dtype, idx.shape))
        K = idx.shape[1] if idx is not None else 0
        if topk_weights is not None:
            w = self._packed("topk_weights", topk_weights, "float32", stream=stream_hint)
            if w.shape != (T, K):
                raise ValueError("topk_weights must be of shape [%d, %d], not %s" % (T, K, w.shape))
        if fp8:
            # Any strides: scales may be column-major (as grouped GEMMs leave them).
            sv = view(x_scales, "float32", stream_hint) if x_scales is not None else None
            if sv is None and T > 0:
                raise ValueError("x_scales is required for an FP8 dispatch")
            if sv is not None and (sv.shape != (T, (self.hidden + 127) // 128) or any(s % 4 for s in sv.strides)):
                raise ValueError("x_scales must be of shape [%d, %d], not %s" % (
                    T, (self.hidden + 127) // 128, sv.shape))
        elif x_scales is not None:
            raise ValueError("x_scales is for an FP8 dispatch; this communicator dispatches %s" % self.dispatch_type)
        a = _capi.initialized(_capi.DispatchArgs)
        a.x, a.x_type, a.x_stride = _ptr(xv), DTYPES[self.dispatch_type][0], xv.strides[0] if T > 1 else 0
        if sv is not None:
            a.x_scales, a.scales_token_stride, a.scales_block_stride = _ptr(sv), sv.strides[0] // 4, sv.strides[1] // 4
        if idx is not None:
            a.topk_idx, a.topk_idx_type = _ptr(idx), DTYPES[idx.dtype][0]
        a.topk_weights, a.num_tokens, a.num_topk = _ptr(w), T, K
        a.expert_alignment = expert_alignment
        return a, [xv, idx, w, sv]

    def prepare(self, topk_idx, num_tokens=None, stream=None):
        """epDispatchPrepare: the routing of topk_idx [T, K] and the exact
        number of rows this rank will receive (handle.num_recv); then
        dispatch(..., handle=h) moves the rows."""
        idx = self._rows("topk_idx", topk_idx, None)
        a = _capi.initialized(_capi.DispatchArgs)
        a.topk_idx, a.topk_idx_type = _ptr(idx), DTYPES[idx.dtype][0]
        a.num_tokens, a.num_topk = idx.shape[0], idx.shape[1]
        a.x_type = DTYPES[self.dispatch_type][0]
        h = C.c_void_p()
        self._same_device([idx])
        self._check(_capi.lib().epDispatchPrepare(self.ptr, C.byref(a), C.byref(h),
                                                  self._stream(stream, [idx])), "epDispatchPrepare")
        return Handle(h.value, self, False, idx.shape[0], idx.shape[1])

    def dispatch(self, x, topk_idx=None, topk_weights=None, x_scales=None, handle=None, recv_x=None,
                 recv_scales=None, recv_topk_idx=None, recv_topk_weights=None, recv_tokens_per_expert=None,
                 num_recv=None, recv_capacity=None, expert_alignment=0, no_host_sync=False, stream=None):
        """epDispatch of x [T, hidden] (the config's dispatch type; FP8 with
        x_scales [T, ceil(hidden/128)] float32 of any strides).

        handle None: a new routing from topk_idx; a handle from prepare(): its
        routing; a handle from an earlier dispatch: a cached re-dispatch.
        Outputs not given are allocated like x: with no_host_sync,
        recv_capacity rows (default size * max_tokens_per_rank) and num_recv
        an array of one int64 written by the call; otherwise exactly the rows
        received (a prepare() first, when needed). Returns a Dispatched tuple
        (handle, the outputs, num_recv: an int when the count is on the host)."""
        a, ins = self._dispatch_args(x, topk_idx, topk_weights, x_scales, expert_alignment, None)
        self._same_device(ins)
        stream_ptr = self._stream(stream, ins)
        K = a.num_topk if topk_idx is not None else (handle.num_topk if handle is not None else 0)
        xv = ins[0]
        allocating = recv_x is None
        if allocating and recv_capacity is None:
            if no_host_sync:
                recv_capacity = self.size * self.max_tokens_per_rank
            else:
                if handle is None:
                    handle = self.prepare(topk_idx, stream=stream_ptr)
                recv_capacity = handle.num_recv
                if recv_capacity is None:
                    raise ValueError("the handle's row count is on the device: pass recv_capacity")
        nb = (self.hidden + 127) // 128
        fp8 = self.dispatch_type == "float8_e4m3"
        if allocating:
            recv_x = self._alloc(xv, (recv_capacity, self.hidden), self.dispatch_type)
            if fp8:
                recv_scales = self._alloc(xv, (recv_capacity, nb), "float32")
            if K > 0 and topk_idx is not None:
                recv_topk_idx = self._alloc(xv, (recv_capacity, K), "int64")
                if topk_weights is not None:
                    recv_topk_weights = self._alloc(xv, (recv_capacity, K), "float32")
            if recv_tokens_per_expert is None:
                recv_tokens_per_expert = self._alloc(xv, (self.num_local_experts,), "int32")
            if no_host_sync and num_recv is None:
                num_recv = self._alloc(xv, (1,), "int64")
        rx = self._rows("recv_x", recv_x, self.dispatch_type, self.hidden)
        if not rx.contiguous():
            raise ValueError("recv_x must be contiguous")
        if recv_capacity is None:
            recv_capacity = rx.shape[0]
        elif recv_capacity > rx.shape[0]:
            raise ValueError("recv_capacity = %d but recv_x has %d rows" % (recv_capacity, rx.shape[0]))
        rs = self._packed("recv_scales", recv_scales, "float32", recv_capacity * nb) if fp8 else None
        ri = self._packed("recv_topk_idx", recv_topk_idx, "int64", recv_capacity * K)
        rw = self._packed("recv_topk_weights", recv_topk_weights, "float32", recv_capacity * K)
        rt = self._packed("recv_tokens_per_expert", recv_tokens_per_expert, "int32", self.num_local_experts)
        host_count = None
        if no_host_sync:
            nr = self._packed("num_recv", num_recv, "int64", 1)
        else:
            host_count = C.c_int64(-1)
            nr = None
        a.flags = _capi.DISPATCH_NO_HOST_SYNC if no_host_sync else 0
        a.recv_x, a.recv_scales, a.recv_topk_idx, a.recv_topk_weights = _ptr(rx), _ptr(rs), _ptr(ri), _ptr(rw)
        a.recv_capacity, a.recv_tokens_per_expert = recv_capacity, _ptr(rt)
        a.num_recv = C.addressof(host_count) if host_count is not None else _ptr(nr)
        views = ins + [rx, rs, ri, rw, rt, nr]
        self._same_device(views)
        h = C.c_void_p(handle.ptr if handle is not None else None)
        self._check(_capi.lib().epDispatch(self.ptr, C.byref(a), C.byref(h), stream_ptr), "epDispatch")
        if handle is None:
            handle = Handle(h.value, self, False, a.num_tokens, a.num_topk)
        count = host_count.value if host_count is not None else num_recv
        return Dispatched(handle, recv_x, recv_scales, recv_topk_idx, recv_topk_weights, recv_tokens_per_expert,
                          count)

    def combine(self, y, handle, out=None, bias=None, recv_topk_weights=None, out_topk_weights=None,
                deterministic=False, stream=None):
        """epCombine: y [rows received, hidden] (the config's combine type, one
        row per received token) summed back onto the tokens' home ranks into
        out [T, hidden] (allocated like y when not given). With
        recv_topk_weights [rows, K] the weights are summed back too, into
        out_topk_weights [T, K]. Returns a Combined tuple."""
        yv = self._rows("y", y, self.combine_type, self.hidden)
        self._same_device([yv])
        T = handle.num_tokens
        if out is None:
            out = self._alloc(yv, (T, self.hidden), self.combine_type)
        ov = self._packed("out", out, self.combine_type, T * self.hidden, optional=False)
        bv = self._packed("bias", bias, self.combine_type, T * self.hidden)
        rw = self._rows("recv_topk_weights", recv_topk_weights, "float32", optional=True)
        K = rw.shape[1] if rw is not None else 0
        if rw is not None and not rw.contiguous():
            raise ValueError("recv_topk_weights must be contiguous")
        if rw is not None and out_topk_weights is None:
            out_topk_weights = self._alloc(yv, (T, K), "float32")
        owv = self._packed("out_topk_weights", out_topk_weights, "float32", T * K)
        a = _capi.initialized(_capi.CombineArgs)
        a.flags = _capi.COMBINE_DETERMINISTIC if deterministic else 0
        a.y, a.y_type = _ptr(yv), DTYPES[self.combine_type][0]
        a.y_stride = yv.strides[0] if yv.shape[0] > 1 else 0
        a.recv_topk_weights, a.num_topk, a.bias, a.out = _ptr(rw), K, _ptr(bv), _ptr(ov)
        a.out_topk_weights = _ptr(owv)
        views = [yv, ov, bv, rw, owv]
        self._same_device(views)
        self._check(_capi.lib().epCombine(self.ptr, C.byref(a), handle.ptr, self._stream(stream, views)),
                    "epCombine")
        return Combined(out, out_topk_weights)

    # ---- low latency ----------------------------------------------------------------
    def ll_dispatch(self, x, topk_idx, topk_weights=None, wire="float8_e4m3", round_scale=False, recv_x=None,
                    recv_scales=None, recv_count=None, recv_src=None, send_only=False, stream=None):
        """epLowLatencyDispatch of x [T, hidden] BF16 (needs low_latency=True).
        Outputs (allocated like x when not given), with M = max_tokens_per_rank
        and R ranks: recv_x [local experts, R*M, hidden] (uint8 FP8 bytes or
        BF16), recv_scales [local experts, ceil(hidden/128), R*M] float32 (FP8),
        recv_count [local experts] int32, recv_src [local experts, R*M] int32.
        topk_weights are the weights ll_combine applies. send_only: finish
        with ll_complete(handle)."""
        wire = wire_type(wire)
        if wire not in ("float8_e4m3", "bfloat16"):
            raise ValueError("the low-latency wire is float8_e4m3 or bfloat16, not %s" % wire)
        xv = self._rows("x", x, "bfloat16", self.hidden)
        T = xv.shape[0]
        if not xv.contiguous():
            raise ValueError("x must be contiguous")
        idx = self._packed("topk_idx", topk_idx, None, optional=False)
        if idx.dtype not in ("int64", "int32") or idx.ndim != 2 or idx.shape[0] != T:
            raise ValueError("topk_idx must be int64 or int32 of shape [%d, K]" % T)
        K = idx.shape[1]
        w = self._packed("topk_weights", topk_weights, "float32", T * K)
        self._same_device([xv, idx, w])
        L, slots, nb = self.num_local_experts, self.size * self.max_tokens_per_rank, (self.hidden + 127) // 128
        fp8 = wire == "float8_e4m3"
        if recv_x is None:
            recv_x = self._alloc(xv, (L, slots, self.hidden), wire)
            recv_scales = self._alloc(xv, (L, nb, slots), "float32") if fp8 else None
            recv_src = self._alloc(xv, (L, slots), "int32") if recv_src is None else recv_src
        if recv_count is None:
            recv_count = self._alloc(xv, (L,), "int32")
        rx = self._packed("recv_x", recv_x, wire, L * slots * self.hidden, False)
        rs = self._packed("recv_scales", recv_scales, "float32", L * slots * nb, not fp8)
        rc = self._packed("recv_count", recv_count, "int32", L, False)
        rsrc = self._packed("recv_src", recv_src, "int32", L * slots)
        a = _capi.initialized(_capi.LowLatencyDispatchArgs)
        a.flags = (_capi.LL_SEND_ONLY if send_only else 0) | (_capi.LL_ROUND_SCALE_POW2 if round_scale else 0)
        a.x, a.topk_idx, a.topk_idx_type = _ptr(xv), _ptr(idx), DTYPES[idx.dtype][0]
        a.topk_weights, a.num_tokens, a.num_topk = _ptr(w), T, K
        a.wire_type = DTYPES[wire][0]
        a.recv_x, a.recv_scales, a.recv_count, a.recv_src = _ptr(rx), _ptr(rs), _ptr(rc), _ptr(rsrc)
        views = [xv, idx, w, rx, rs, rc, rsrc]
        self._same_device(views)
        h = C.c_void_p()
        self._check(_capi.lib().epLowLatencyDispatch(self.ptr, C.byref(a), C.byref(h),
                                                     self._stream(stream, views)), "epLowLatencyDispatch")
        handle = Handle(h.value, self, True, T, K)
        handle._pending = views if send_only else None
        return LowLatencyDispatched(handle, recv_x, recv_scales, recv_count, recv_src)

    def ll_combine(self, y, handle, out=None, send_only=False, stream=None):
        """epLowLatencyCombine: y [local experts, R*M, hidden] BF16 (the expert
        outputs in the dispatch layout, read in place) into out [T, hidden]
        BF16, weighted by the dispatch's topk_weights. Returns out."""
        L, slots = self.num_local_experts, self.size * self.max_tokens_per_rank
        yv = self._packed("y", y, "bfloat16", L * slots * self.hidden, False)
        self._same_device([yv])
        if out is None:
            out = self._alloc(yv, (handle.num_tokens, self.hidden), "bfloat16")
        ov = self._packed("out", out, "bfloat16", handle.num_tokens * self.hidden, False)
        a = _capi.initialized(_capi.LowLatencyCombineArgs)
        a.flags = _capi.LL_SEND_ONLY if send_only else 0
        a.y, a.out = _ptr(yv), _ptr(ov)
        self._same_device([yv, ov])
        self._check(_capi.lib().epLowLatencyCombine(self.ptr, C.byref(a), handle.ptr,
                                                    self._stream(stream, [yv, ov])), "epLowLatencyCombine")
        handle._pending = [yv, ov] if send_only else None
        return out

    def ll_complete(self, handle, stream=None):
        """epLowLatencyComplete: the receive half of a send_only call."""
        views = handle._pending or []
        self._check(_capi.lib().epLowLatencyComplete(self.ptr, handle.ptr, self._stream(stream, views)),
                    "epLowLatencyComplete")
        handle._pending = None


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


__all__ = ["UniqueId", "Communicator", "Handle", "MoeepError", "make_config", "ll_buffer_bytes", "version",
           "transports", "Layout", "Dispatched", "Combined", "LowLatencyDispatched"]
