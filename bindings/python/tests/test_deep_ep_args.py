#!/usr/bin/env python3
"""moeep.deep_ep without torch: its surface against DeepEP 2.1.0's V1 Buffer
(every parameter, in DeepEP's order with DeepEP's defaults; additions only
after them), every argument in the policy table, the table in the README,
and the refusals, each raised with its reason before any tensor is read and
without importing torch.

    test_deep_ep_args.py bindings/python/README.md
"""
import inspect
import sys

import moeep.deep_ep as dep
from moeep.deep_ep import Buffer, Config, EventOverlap, Unsupported, policy

# DeepEP 2.1.0 (deepseek-ai/DeepEP dd758ca), deep_ep/buffers/legacy.py and the
# pybind Config: (method, [(parameter, default or REQUIRED)]).
REQUIRED = object()
DEEPEP = [
    ("__init__", [("group", REQUIRED), ("num_nvl_bytes", 0), ("num_rdma_bytes", 0), ("low_latency_mode", False),
                  ("num_qps_per_rank", 24), ("allow_nvlink_for_low_latency_mode", True), ("allow_mnnvl", False),
                  ("explicitly_destroy", False), ("enable_shrink", False), ("comm", None)]),
    ("destroy", []),
    ("is_sm90_compiled", []),
    ("set_num_sms", [("new_num_sms", REQUIRED)]),
    ("capture", []),
    ("get_low_latency_rdma_size_hint", [("num_max_dispatch_tokens_per_rank", REQUIRED), ("hidden", REQUIRED),
                                        ("num_ranks", REQUIRED), ("num_experts", REQUIRED)]),
    ("get_comm_stream", []),
    ("get_local_buffer_tensor", [("dtype", REQUIRED), ("size", None), ("offset", 0), ("use_rdma_buffer", False)]),
    ("get_dispatch_config", [("num_ranks", REQUIRED)]),
    ("get_combine_config", [("num_ranks", REQUIRED)]),
    ("get_dispatch_layout", [("topk_idx", REQUIRED), ("num_experts", REQUIRED), ("previous_event", None),
                             ("async_finish", False), ("allocate_on_comm_stream", False)]),
    ("dispatch", [("x", REQUIRED), ("handle", None), ("num_tokens_per_rank", None), ("num_tokens_per_rdma_rank", None),
                  ("is_token_in_rank", None), ("num_tokens_per_expert", None), ("topk_idx", None),
                  ("topk_weights", None), ("expert_alignment", 1), ("num_worst_tokens", 0), ("config", None),
                  ("previous_event", None), ("async_finish", False), ("allocate_on_comm_stream", False)]),
    ("combine", [("x", REQUIRED), ("handle", REQUIRED), ("topk_weights", None), ("bias", None), ("config", None),
                 ("previous_event", None), ("async_finish", False), ("allocate_on_comm_stream", False)]),
    ("clean_low_latency_buffer", [("num_max_dispatch_tokens_per_rank", REQUIRED), ("hidden", REQUIRED),
                                  ("num_experts", REQUIRED)]),
    ("low_latency_dispatch", [("x", REQUIRED), ("topk_idx", REQUIRED), ("num_max_dispatch_tokens_per_rank", REQUIRED),
                              ("num_experts", REQUIRED), ("cumulative_local_expert_recv_stats", None),
                              ("dispatch_wait_recv_cost_stats", None), ("use_fp8", True), ("round_scale", False),
                              ("use_ue8m0", False), ("async_finish", False), ("return_recv_hook", False)]),
    ("low_latency_combine", [("x", REQUIRED), ("topk_idx", REQUIRED), ("topk_weights", REQUIRED),
                             ("handle", REQUIRED), ("use_logfmt", False), ("zero_copy", False),
                             ("async_finish", False), ("return_recv_hook", False), ("out", None),
                             ("combine_wait_recv_cost_stats", None)]),
    ("low_latency_update_mask_buffer", [("rank_to_mask", REQUIRED), ("mask", False)]),
    ("low_latency_query_mask_buffer", [("mask_status", REQUIRED)]),
    ("low_latency_clean_mask_buffer", []),
    ("get_next_low_latency_combine_buffer", [("handle", REQUIRED)]),
]
CONFIG = [("num_sms", 20), ("num_max_nvl_chunked_send_tokens", 6), ("num_max_nvl_chunked_recv_tokens", 256),
          ("num_max_rdma_chunked_send_tokens", 6), ("num_max_rdma_chunked_recv_tokens", 256)]

fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        fails.append(what)


def params(fn):
    ps = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return [(p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default) for p in ps]


def table_covers(method, name):
    call_name = "Buffer()" if method == "__init__" else method
    for call, arg, _, _ in policy.TABLE:
        calls = [c.strip() for c in call.replace("Buffer.", "").split(",")]
        if (call_name in calls or call == "all calls") and (arg == "all" or name in [a.strip() for a in arg.split(",")]
                                                             or ("*" in arg and name.startswith(arg.split("*")[0]))):
            return True
    return False


def raises(exc, text, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        return text in str(e)
    except Exception as e:  # noqa: BLE001 - any other type is a failure, reported by name
        print("     raised %s: %s" % (type(e).__name__, e))
        return False
    return False


class FakeMpiComm:
    """What Buffer reads of an mpi4py communicator (one rank)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def allgather(self, obj):
        return [obj]


class FakeScales:
    dtype = "torch.int32"


def main():
    # The surface: DeepEP's parameters first, in order, with its defaults.
    for method, want in DEEPEP:
        have = params(getattr(Buffer, method))
        check(have[:len(want)] == want, "Buffer.%s takes DeepEP's parameters %s" % (method, [n for n, _ in want]))
        for name, _ in have[len(want):]:
            check(any(arg == name and status == policy.EXTENSION for _, arg, status, _ in policy.TABLE),
                  "Buffer.%s: %s, beyond DeepEP's, is in the table as added" % (method, name))
        for name, _ in want:
            if method not in ("destroy", "is_sm90_compiled", "capture", "get_comm_stream"):
                check(table_covers(method, name), "the table says what Buffer.%s does with %s" % (method, name))
    check(params(Config.__init__) == CONFIG, "Config takes DeepEP's parameters and defaults")
    check(params(EventOverlap.__init__) == [("event", None), ("extra_tensors", None)], "EventOverlap(event, extra_tensors)")
    for name in ("current_stream_wait", "register_hook_after_wait", "__call__", "__enter__", "__exit__"):
        check(hasattr(EventOverlap, name), "EventOverlap.%s" % name)

    # The README's table is the policy's.
    readme = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
    check(policy.markdown() in readme, "README.md holds the table of moeep.deep_ep.policy.markdown()")

    # Refusals and argument errors, before any tensor is read.
    check(raises(ValueError, "Either 'group' or 'comm'", Buffer, None, enable_shrink=True),
          "enable_shrink=True accepted (the missing group is what is refused)")
    check(raises(ValueError, "Either 'group' or 'comm'", Buffer, None), "no group and no comm refused")
    buf = Buffer(None, comm=FakeMpiComm())
    check(buf.rank == 0 and buf.group_size == 1, "Buffer over an mpi4py-like comm: rank and size")
    check(raises(Unsupported, "use_ue8m0", buf.low_latency_dispatch, None, None, 128, 8, use_ue8m0=True),
          "low_latency_dispatch use_ue8m0=True refused")
    check(raises(Unsupported, "dispatch_wait_recv_cost_stats", buf.low_latency_dispatch, None, None, 128, 8,
                 dispatch_wait_recv_cost_stats=object()), "low_latency_dispatch wait statistics refused")
    check(raises(ValueError, "cannot both", buf.low_latency_dispatch, None, None, 128, 8, async_finish=True,
                 return_recv_hook=True), "low_latency_dispatch async_finish with return_recv_hook refused")
    check(raises(Unsupported, "combine_wait_recv_cost_stats", buf.low_latency_combine, None, None, None, None,
                 combine_wait_recv_cost_stats=object()), "low_latency_combine wait statistics refused")
    check(raises(Unsupported, "topk_idx is None", buf.dispatch, None), "dispatch without topk_idx or handle refused")
    check(raises(Unsupported, "UE8M0", buf.dispatch, (None, FakeScales()), topk_idx=object()),
          "dispatch with int32 scales refused")
    check(raises(Unsupported, "not expose", buf.get_local_buffer_tensor, None), "get_local_buffer_tensor refused")
    for name, args in (("low_latency_update_mask_buffer", (0, True)), ("low_latency_query_mask_buffer", (None,)),
                       ("low_latency_clean_mask_buffer", ()), ("shrink", ())):
        check(raises(Unsupported, "enable_shrink=True", getattr(buf, name), *args),
              "%s refused without enable_shrink" % name)
    sbuf = Buffer(None, comm=FakeMpiComm(), enable_shrink=True)
    check(raises(ValueError, "not a rank of 0..0", sbuf.low_latency_update_mask_buffer, 1, True),
          "low_latency_update_mask_buffer of a rank out of range refused")
    check(raises(ValueError, "cannot mask itself", sbuf.low_latency_update_mask_buffer, 0, True),
          "low_latency_update_mask_buffer of the rank itself refused")
    check(sbuf.low_latency_update_mask_buffer(0, False) is None and sbuf.low_latency_clean_mask_buffer() is None,
          "unmasking with no rank masked: nothing to do")
    sbuf._masked = [0]  # as after a shrink: unmasking is refused (a removed rank cannot rejoin)
    check(raises(Unsupported, "cannot rejoin", sbuf.low_latency_clean_mask_buffer), "clean after a mask refused")
    check(raises(Unsupported, "cannot be unmasked", sbuf.low_latency_update_mask_buffer, 0, False),
          "unmasking a masked rank refused")
    check(raises(Unsupported, "after a rank was masked", sbuf.dispatch, None, topk_idx=object()),
          "high-throughput calls after a mask refused")
    check(raises(Unsupported, "after a rank was masked", sbuf.get_dispatch_layout, None, 8),
          "get_dispatch_layout after a mask refused")
    check(raises(RuntimeError, "explicitly_destroy", buf.destroy), "destroy() without explicitly_destroy refused")
    check(raises(AssertionError, "even", Buffer.set_num_sms, 3), "set_num_sms(odd) refused")
    check(Config().num_sms == 20 and Config().get_nvl_buffer_size_hint(14336, 8) == 0, "Config defaults and hints")
    check(buf.clean_low_latency_buffer(128, 7168, 256) is None, "clean_low_latency_buffer accepted (nothing to do)")
    check(isinstance(policy.Unsupported("x"), NotImplementedError), "refusals are NotImplementedError")
    check("torch" not in sys.modules, "nothing above imported torch")
    check(hasattr(dep, "Buffer") and "topk_idx_t" in dep.__all__, "moeep.deep_ep exports Buffer and topk_idx_t")
    print("test_deep_ep_args: %s" % ("all checks passed" if not fails else "%d FAILED" % len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
