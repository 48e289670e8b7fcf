"""moeep.deep_ep.Buffer: DeepEP's V1 Buffer calls mapped onto libmoeep.

Each call finds (or, at its first use, makes) a libmoeep communicator for its
shape: high-throughput ones per (device, hidden, experts, dispatch type,
top-k, SM budget), low-latency ones per (device, max tokens, hidden, experts,
top-k). Making one is collective (its unique id goes round the group), so
every rank makes the same calls with the same shapes, as DeepEP requires; it
cannot happen inside CUDA graph capture (make the first call eagerly).
"""
from .. import comm as _comm
from . import layout as _layout
from . import policy
from .config import Config
from .event import EventHandle, EventOverlap

_HT_MIN_TOKENS = 4096  # default max_tokens_per_rank of high-throughput communicators


class DispatchHandle:
    """The handle of a high-throughput dispatch: what combine and a cached
    re-dispatch need. release() frees it now (else garbage collection does);
    keep it alive as long as a CUDA graph that captured its calls may run."""

    def __init__(self, comm, ep_handle, dispatch_type, key, rows, num_recv, topk_idx, num_tokens, num_topk):
        self.comm, self._ep, self.dispatch_type, self.key = comm, ep_handle, dispatch_type, key
        self.rows = rows            # rows of recv_x: exact, or num_worst_tokens
        self.num_recv = num_recv    # the exact count when known on the host, else None
        self.topk_idx = topk_idx    # a copy: a dispatch of another type is routed again from it
        self.num_tokens, self.num_topk = num_tokens, num_topk
        self._aux = []              # handles of such re-routed dispatches (graphs may replay them)

    @property
    def ep(self):
        if self._ep is None:
            raise ValueError("the dispatch handle was released")
        return self._ep

    def release(self):
        for h in self._aux:
            h.close()
        self._aux = []
        if self._ep is not None:
            self._ep.close()
            self._ep = None


class LowLatencyHandle:
    """The handle of a low-latency dispatch (see DispatchHandle.release)."""

    def __init__(self, comm, ep_handle, key, buffer_set, topk_weights, num_tokens, num_topk):
        self.comm, self._ep, self.key, self.buffer_set = comm, ep_handle, key, buffer_set
        self.topk_weights, self.num_tokens, self.num_topk = topk_weights, num_tokens, num_topk

    @property
    def ep(self):
        if self._ep is None:
            raise ValueError("the low-latency handle was released")
        return self._ep

    def release(self):
        if self._ep is not None:
            self._ep.close()
            self._ep = None


def _wait(previous_event):
    if previous_event is not None and previous_event.event is not None:
        previous_event.current_stream_wait()


def _event(async_finish, device, tensors):
    if not async_finish:
        return EventOverlap()
    return EventOverlap(EventHandle(device), tensors)


def _same_tensor(a, b):
    if a is None or b is None:
        return a is b
    if a.numel() == 0 and b.numel() == 0 and a.shape == b.shape:
        return True  # no weights to apply
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
                      and a.dtype == b.dtype)


def _fp8_dtype(torch):
    # torch < 2.1 has no FP8 type: such tensors are uint8 bytes there.
    return getattr(torch, "float8_e4m3fn", torch.uint8)


class Buffer:
    """DeepEP's V1 Buffer on libmoeep; see moeep.deep_ep.policy for what each
    argument does here."""

    num_sms = 20
    _num_sms_set = False  # set_num_sms called: its value is the SM budget of new communicators

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, explicitly_destroy=False,
                 enable_shrink=False, comm=None, num_max_tokens_per_rank=None):
        if group is not None:
            self.rank, self.group, self.group_size = group.rank(), group, group.size()

            def all_gather_object(obj):
                import torch.distributed as dist
                objects = [None] * self.group_size
                dist.all_gather_object(objects, obj, group)
                return objects
        elif comm is not None:
            self.rank, self.group, self.group_size = comm.Get_rank(), comm, comm.Get_size()

            def all_gather_object(obj):
                return comm.allgather(obj)
        else:
            raise ValueError("Either 'group' or 'comm' must be provided.")
        self._all_gather_object = all_gather_object
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode, self.explicitly_destroy = low_latency_mode, explicitly_destroy
        self.enable_shrink = bool(enable_shrink)
        self._masked = []  # ranks the shrinks removed (shrink), ascending
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.runtime = None  # DeepEP's C++ runtime; libmoeep's communicators are in _comms
        self._comms = {}
        self._ll_dispatches = {}  # low-latency dispatches per communicator: which buffer set is next
        self._ll_buffers = {}

    # ---- life cycle and static helpers ---------------------------------------------
    def destroy(self):
        if not self.explicitly_destroy:
            raise RuntimeError("`explicitly_destroy` flag must be set")
        self._close()

    def _close(self):
        comms, self._comms = getattr(self, "_comms", {}), {}
        self._ll_buffers = {}
        for c in comms.values():
            c.close()

    def __del__(self):
        try:
            if not self.explicitly_destroy:
                self._close()
        except Exception:  # noqa: BLE001 - nothing can be reported from a finalizer
            pass

    @staticmethod
    def is_sm90_compiled():
        """Whether the library was built with its CUDA backend (sm_90 by default)."""
        return any(name == "cuda_ipc" for name, _, _ in _comm.transports())

    @staticmethod
    def set_num_sms(new_num_sms):
        assert new_num_sms % 2 == 0, "The SM count must be even"
        Buffer.num_sms = new_num_sms
        Buffer._num_sms_set = True

    @staticmethod
    def capture():
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        return _comm.ll_buffer_bytes(num_ranks, num_experts=num_experts, hidden=hidden,
                                     max_tokens_per_rank=num_max_dispatch_tokens_per_rank, max_topk=32,
                                     low_latency=True)

    def get_comm_stream(self):
        import torch
        return torch.cuda.current_stream()

    def get_local_buffer_tensor(self, dtype, size=None, offset=0, use_rdma_buffer=False):
        policy.refuse_if(True, "get_local_buffer_tensor is refused: libmoeep does not expose its registered "
                               "buffers")

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    # ---- communicators ------------------------------------------------------------
    def _comm(self, key, tensor, tokens, **config):
        """The communicator of key, made collectively at its first use."""
        c = self._comms.get(key)
        if c is not None:
            return c
        if self._masked:
            raise RuntimeError(policy.SHRUNK_NEW_COMM_MESSAGE % self._masked)
        if self.enable_shrink and config.get("low_latency"):  # DeepEP's shrink mode is low-latency only
            config["enable_shrink"] = True
        import torch
        if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moeep.deep_ep: the first call of a shape makes a communicator, which cannot "
                               "happen during CUDA graph capture: make the same call once before capturing")
        uid = _comm.UniqueId.create().hex() if self.rank == 0 else None
        gathered = self._all_gather_object((uid, tokens))
        most = max(t for _, t in gathered)
        if config.get("max_tokens_per_rank") is None:  # high throughput: from the batches, or the hint
            hint = self.num_max_tokens_per_rank
            if hint is not None and most > hint:
                raise ValueError("a rank passes %d tokens, above num_max_tokens_per_rank = %d" % (most, hint))
            config["max_tokens_per_rank"] = hint if hint is not None else max(most, _HT_MIN_TOKENS)
        backend = "cuda" if tensor.is_cuda else "host"
        device = tensor.device.index if tensor.is_cuda else -1
        c = _comm.Communicator(self.group_size, self.rank, _comm.UniqueId.fromhex(gathered[0][0]),
                               backend=backend, device=device, **config)
        self._comms[key] = c
        return c

    def _ht_comm(self, x, dispatch_type, num_topk, config):
        if config is not None:
            sms = config.num_sms
        else:
            sms = Buffer.num_sms if Buffer._num_sms_set else 0  # 0: the library's default budget
        key = ("ht", x.device.type, x.device.index, x.size(1), self._num_experts, dispatch_type, num_topk, sms)
        return key, self._comm(key, x, x.size(0), num_experts=self._num_experts, hidden=x.size(1),
                               max_tokens_per_rank=None, max_topk=num_topk, dispatch_type=dispatch_type,
                               num_sms=sms)

    # ---- high throughput ------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        policy.refuse_if(bool(self._masked), policy.SHRUNK_HT_MESSAGE % "get_dispatch_layout")
        _wait(previous_event)
        self._num_experts = num_experts  # dispatch is not told it: it takes the layout's
        out = _layout.dispatch_layout(topk_idx, num_experts, self.group_size)
        return out + (_event(async_finish, topk_idx.device, out),)

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment=1, num_worst_tokens=0, config=None, previous_event=None, async_finish=False,
                 allocate_on_comm_stream=False):
        policy.refuse_if(bool(self._masked), policy.SHRUNK_HT_MESSAGE % "dispatch")
        policy.check_dispatch(x, handle, topk_idx)
        import torch
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        dispatch_type = "float8_e4m3" if x_scales is not None else "bfloat16"
        _wait(previous_event)
        if handle is not None:
            return self._cached_dispatch(x, x_scales, dispatch_type, handle, async_finish)
        if num_tokens_per_expert is not None:
            self._num_experts = num_tokens_per_expert.numel()
        elif not hasattr(self, "_num_experts"):
            raise ValueError("dispatch: num_tokens_per_expert (from get_dispatch_layout) tells the number of "
                             "experts; pass it with the first dispatch")
        T, H = x.shape
        K = topk_idx.size(1)
        key, comm = self._ht_comm(x, dispatch_type, K, config)
        if T > comm.max_tokens_per_rank:
            raise ValueError("dispatch: %d tokens, above the communicator's max_tokens_per_rank %d (set "
                             "Buffer(..., num_max_tokens_per_rank=N))" % (T, comm.max_tokens_per_rank))
        dev = x.device
        capacity_mode = num_worst_tokens > 0
        if capacity_mode:
            ep_handle, rows = None, num_worst_tokens
        else:
            if x.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("dispatch during CUDA graph capture needs num_worst_tokens > 0 (the exact "
                                   "row count needs a wait for the GPU), as in DeepEP")
            ep_handle = comm.prepare(topk_idx)
            rows = ep_handle.num_recv
        recv_x = torch.empty((rows, H), dtype=x.dtype, device=dev)
        recv_scales = (torch.empty((rows, (H + 127) // 128), dtype=torch.float32, device=dev)
                       if x_scales is not None else None)
        recv_topk_idx = torch.empty((rows, K), dtype=torch.int64, device=dev)
        recv_topk_weights = (torch.empty((rows, K), dtype=torch.float32, device=dev)
                             if topk_weights is not None else None)
        per_expert = torch.empty((comm.num_local_experts,), dtype=torch.int32, device=dev)
        num_recv = torch.empty((1,), dtype=torch.int64, device=dev) if capacity_mode else None
        d = comm.dispatch(x, topk_idx, topk_weights=topk_weights, x_scales=x_scales, handle=ep_handle,
                          recv_x=recv_x, recv_scales=recv_scales, recv_topk_idx=recv_topk_idx,
                          recv_topk_weights=recv_topk_weights, recv_tokens_per_expert=per_expert,
                          num_recv=num_recv, expert_alignment=expert_alignment, no_host_sync=capacity_mode)
        # The per-expert counts are in device memory: read back in exact mode (one
        # more wait for the GPU than DeepEP, whose counts come with the row count).
        counts = [] if capacity_mode else per_expert.tolist()
        h = DispatchHandle(comm, d.handle, dispatch_type, key, rows, None if capacity_mode else rows,
                           topk_idx.clone(), T, K)
        recv = (recv_x, recv_scales) if x_scales is not None else recv_x
        event = _event(async_finish, dev, (x, topk_idx, recv_x, recv_topk_idx))
        return recv, recv_topk_idx, recv_topk_weights, counts, h, event

    def _cached_dispatch(self, x, x_scales, dispatch_type, handle, async_finish):
        import torch
        H, dev = x.size(1), x.device
        recv_x = torch.empty((handle.rows, H), dtype=x.dtype, device=dev)
        recv_scales = (torch.empty((handle.rows, (H + 127) // 128), dtype=torch.float32, device=dev)
                       if x_scales is not None else None)
        if dispatch_type == handle.dispatch_type:
            handle.comm.dispatch(x, x_scales=x_scales, handle=handle.ep, recv_x=recv_x, recv_scales=recv_scales,
                                 no_host_sync=True)
        else:
            # A handle belongs to the communicator of its dispatch type: route
            # again on the other type's from the same ids (the same rows, in the
            # same order), without a host wait.
            sms = handle.key[-1]
            _, comm = self._ht_comm(x, dispatch_type, handle.num_topk, None if sms == 0 else Config(sms))
            d = comm.dispatch(x, handle.topk_idx, x_scales=x_scales, recv_x=recv_x, recv_scales=recv_scales,
                              recv_capacity=handle.rows, no_host_sync=True)
            handle._aux.append(d.handle)
        recv = (recv_x, recv_scales) if x_scales is not None else recv_x
        return recv, None, None, None, None, _event(async_finish, dev, (x, recv_x))

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        policy.refuse_if(bool(self._masked), policy.SHRUNK_HT_MESSAGE % "combine")
        import torch
        _wait(previous_event)
        if x.size(0) < (handle.num_recv or 0):
            raise ValueError("combine: x has %d rows, the dispatch received %d" % (x.size(0), handle.num_recv))
        bias_0, bias_1 = (bias if isinstance(bias, tuple) else (bias, None))
        if bias_0 is not None and bias_1 is not None:
            bias_0 = (bias_0.float() + bias_1.float()).to(torch.bfloat16)
        elif bias_0 is None:
            bias_0 = bias_1
        out = torch.empty((handle.num_tokens, x.size(1)), dtype=torch.bfloat16, device=x.device)
        out_w = (torch.empty((handle.num_tokens, topk_weights.size(1)), dtype=torch.float32, device=x.device)
                 if topk_weights is not None else None)
        handle.comm.combine(x, handle.ep, out=out, bias=bias_0, recv_topk_weights=topk_weights,
                            out_topk_weights=out_w)
        return out, out_w, _event(async_finish, x.device, (x, out))

    # ---- low latency ------------------------------------------------------------------
    def _ll_comm(self, x, max_tokens, num_experts, num_topk):
        key = ("ll", x.device.type, x.device.index, max_tokens, x.size(1), num_experts, num_topk)
        return key, self._comm(key, x, x.size(0), num_experts=num_experts, hidden=x.size(1),
                               max_tokens_per_rank=max_tokens, max_topk=num_topk, low_latency=True)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """Nothing to clean: libmoeep's low-latency buffers carry no state between modes."""

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,
                             return_recv_hook=False, topk_weights=None):
        policy.check_low_latency_dispatch(dispatch_wait_recv_cost_stats, use_ue8m0, async_finish,
                                          return_recv_hook)
        import torch
        T, H = x.shape
        K = topk_idx.size(1)
        key, comm = self._ll_comm(x, num_max_dispatch_tokens_per_rank, num_experts, K)
        L, slots, dev = comm.num_local_experts, comm.size * comm.max_tokens_per_rank, x.device
        recv_x = torch.empty((L, slots, H), dtype=_fp8_dtype(torch) if use_fp8 else torch.bfloat16, device=dev)
        # [experts, H/128, slots], the library's layout, seen transposed: DeepEP's
        # column-major [experts, slots, H/128].
        scales = torch.empty((L, (H + 127) // 128, slots), dtype=torch.float32, device=dev) if use_fp8 else None
        recv_count = torch.empty((L,), dtype=torch.int32, device=dev)
        d = comm.ll_dispatch(x, topk_idx, topk_weights=topk_weights, wire="float8_e4m3" if use_fp8 else "bfloat16",
                             round_scale=round_scale, recv_x=recv_x, recv_scales=scales, recv_count=recv_count,
                             send_only=return_recv_hook)
        n = self._ll_dispatches.get(key, 0)
        self._ll_dispatches[key] = n + 1
        handle = LowLatencyHandle(comm, d.handle, key, n % 2, topk_weights, T, K)
        stats = cumulative_local_expert_recv_stats

        def finish():
            if stats is not None:
                stats.add_(recv_count)

        hook = None
        if return_recv_hook:
            def hook():
                comm.ll_complete(d.handle)
                finish()
        else:
            finish()
        recv = (recv_x, scales.transpose(1, 2)) if use_fp8 else recv_x
        event = _event(async_finish, dev, (x, topk_idx, recv_x, scales, recv_count))
        return recv, recv_count, handle, event, hook

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False, zero_copy=False,
                            async_finish=False, return_recv_hook=False, out=None,
                            combine_wait_recv_cost_stats=None):
        policy.check_low_latency_combine(combine_wait_recv_cost_stats, async_finish, return_recv_hook)
        if not _same_tensor(topk_weights, handle.topk_weights):
            raise ValueError(policy.LL_WEIGHTS_MESSAGE)
        if tuple(topk_idx.shape) != (handle.num_tokens, handle.num_topk):
            raise ValueError("low_latency_combine: topk_idx of shape %s, the dispatch's was [%d, %d]" % (
                tuple(topk_idx.shape), handle.num_tokens, handle.num_topk))
        import torch
        comm = handle.comm
        if out is None:
            out = torch.empty((handle.num_tokens, x.size(-1)), dtype=torch.bfloat16, device=x.device)
        comm.ll_combine(x, handle.ep, out=out, send_only=return_recv_hook)
        hook = None
        if return_recv_hook:
            def hook():
                comm.ll_complete(handle.ep)
        return out, _event(async_finish, x.device, (x, topk_idx, topk_weights, out)), hook

    def get_next_low_latency_combine_buffer(self, handle):
        """A BF16 [local experts, R * max tokens, hidden] tensor for the expert
        outputs of handle's buffer set (libmoeep reads combine inputs in place,
        so any tensor serves; this one is reused by every handle of the set)."""
        import torch
        key = (handle.key, handle.buffer_set)
        buf = self._ll_buffers.get(key)
        if buf is None:
            comm = handle.comm
            _, _, _, max_tokens, hidden, _, _ = handle.key
            buf = torch.empty((comm.num_local_experts, comm.size * max_tokens, hidden), dtype=torch.bfloat16,
                              device=torch.device(handle.key[1], handle.key[2]) if handle.key[1] == "cuda"
                              else "cpu")
            self._ll_buffers[key] = buf
        return buf

    # ---- shrink mode ----------------------------------------------------------------------
    def shrink(self, suspects=()):
        """libmoeep's addition: after a call raised because ranks died, every
        survivor calls it: epCommShrink on each low-latency communicator of
        the Buffer, in the order they were made (the same on every rank),
        with `suspects` and the ranks found dead so far as suspects. Returns
        the masked ranks, ascending: their experts' entries count as -1 from
        the next low-latency call on (docs/SHRINK.md). High-throughput
        communicators (made without enable_shrink) are left as they are: the
        calls that would use them are refused from then on."""
        policy.require_shrink(self.enable_shrink, "Buffer.shrink")
        comms = [c for key, c in self._comms.items() if key[0] == "ll"]
        if not comms:
            raise RuntimeError("Buffer.shrink: no low-latency communicator to shrink yet (the first low-latency "
                               "call of a shape makes one)")
        dead, wanted = set(self._masked), {int(r) for r in suspects}
        try:
            for c in comms:
                dead.update(c.shrink(sorted((dead | wanted) - set(c.dead_ranks[0]))))
        finally:  # what the communicators say, also when one of them failed
            self._masked = sorted({r for c in comms for r in c.dead_ranks[0]})
        return list(self._masked)

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        """mask=True: rank_to_mask is masked on every low-latency communicator
        through epCommShrink (shrink), a collective that every surviving rank
        must call (in DeepEP each rank writes its own mask)."""
        name = "low_latency_update_mask_buffer"
        policy.require_shrink(self.enable_shrink, name)
        rank_to_mask = int(rank_to_mask)
        if not 0 <= rank_to_mask < self.group_size:
            raise ValueError("%s: rank %d is not a rank of 0..%d" % (name, rank_to_mask, self.group_size - 1))
        if rank_to_mask == self.rank and mask:
            raise ValueError("%s: rank %d cannot mask itself" % (name, rank_to_mask))
        if not mask:
            policy.refuse_if(rank_to_mask in self._masked, policy.UNMASK_MESSAGE % (name, rank_to_mask))
            return
        if rank_to_mask not in self._masked:
            self.shrink([rank_to_mask])

    def low_latency_query_mask_buffer(self, mask_status):
        """mask_status (int32 [num_ranks]) := 1 for each masked rank, else 0."""
        policy.require_shrink(self.enable_shrink, "low_latency_query_mask_buffer")
        if mask_status.numel() != self.group_size:
            raise ValueError("low_latency_query_mask_buffer: mask_status has %d elements, not %d (the ranks)" % (
                mask_status.numel(), self.group_size))
        mask_status.zero_()
        for r in self._masked:
            mask_status[r] = 1

    def low_latency_clean_mask_buffer(self):
        name = "low_latency_clean_mask_buffer"
        policy.require_shrink(self.enable_shrink, name)
        if self._masked:
            raise policy.Unsupported(policy.UNMASK_MESSAGE % (name, self._masked[0]))
