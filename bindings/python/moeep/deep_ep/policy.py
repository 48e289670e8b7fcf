"""What moeep.deep_ep.Buffer does with each argument of DeepEP's V1 Buffer
(deepseek-ai/DeepEP 2.1.0, dd758ca): accepted, accepted and ignored, refused,
or added. One table serves the checks below and the README
(`python3 -m moeep.deep_ep.policy` prints it as markdown; a test compares).

Nothing here imports torch: refusals are raised before any tensor is read.
"""

ACCEPTED = "accepted"
IGNORED = "ignored"
REFUSED = "refused"
EXTENSION = "added"

SHRINK_OFF_MESSAGE = ("%s needs Buffer(..., enable_shrink=True): the communicators must be made with "
                      "config enable_shrink")
UNMASK_MESSAGE = ("%s: rank %d is masked and cannot be unmasked: a rank that epCommShrink removed cannot rejoin "
                  "its communicators (make a new Buffer with every rank)")
SHRUNK_HT_MESSAGE = ("%s is refused after a rank was masked: a Buffer masks its low-latency calls only, as "
                     "DeepEP's shrink mode does (its layout is computed from the unmasked ids); for high-throughput "
                     "calls after a death use moeep.Communicator(..., enable_shrink=True) and its shrink()")
SHRUNK_NEW_COMM_MESSAGE = ("moeep.deep_ep: rank(s) %s are masked: the first call of a new shape makes a "
                           "communicator of every rank, which the masked ones cannot join (make each shape's "
                           "first call before any rank is lost)")

LL_WEIGHTS_MESSAGE = (
    "low_latency_combine: topk_weights must be the tensor given to low_latency_dispatch(..., topk_weights=...): "
    "libmoeep applies the combine weights on the ranks that hold the experts, so it sends them with the "
    "dispatch (DeepEP sends them with the combine); pass them to low_latency_dispatch")


class Unsupported(NotImplementedError):
    """An argument value that moeep.deep_ep refuses, with the reason."""


# (call, argument, status, why)
TABLE = [
    ("Buffer()", "group", ACCEPTED, "rank, size, and the exchange of each libmoeep communicator's unique id "
     "(`all_gather_object`)"),
    ("Buffer()", "comm", ACCEPTED, "an mpi4py communicator instead of `group` (`allgather`)"),
    ("Buffer()", "num_nvl_bytes, num_rdma_bytes", IGNORED, "libmoeep sizes its own buffers from the shapes of "
     "the first call (a communicator per shape)"),
    ("Buffer()", "low_latency_mode", IGNORED, "low-latency calls work either way: their communicator is made "
     "with `config.low_latency = 1` at the first call"),
    ("Buffer()", "num_qps_per_rank", IGNORED, "queue pairs are the network transport's (`EP_IB_QPS_PER_PEER`)"),
    ("Buffer()", "allow_nvlink_for_low_latency_mode", IGNORED, "ranks of one node always use peer access "
     "(NVLink or PCIe P2P)"),
    ("Buffer()", "allow_mnnvl", IGNORED, "a node is a host; multi-node NVLink domains are not used"),
    ("Buffer()", "explicitly_destroy", ACCEPTED, "True: `destroy()` frees the communicators (and is required); "
     "False: garbage collection does"),
    ("Buffer()", "enable_shrink", ACCEPTED, "`config.enable_shrink` of every low-latency communicator; a "
     "dead rank makes the calls that need it raise (DeepEP masks it inside the call), after which every "
     "survivor calls `low_latency_update_mask_buffer(rank, True)` or `Buffer.shrink()` and goes on without it "
     "in low-latency calls"),
    ("Buffer()", "num_max_tokens_per_rank", EXTENSION, "`config.max_tokens_per_rank` of the high-throughput "
     "communicators; default: the largest batch of any rank at the first call, at least 4096"),
    ("Buffer.set_num_sms", "new_num_sms", ACCEPTED, "`config.num_sms` of communicators made afterwards; "
     "without it (and without `config`) the library's default SM budget applies"),
    ("Buffer.get_low_latency_rdma_size_hint", "all", ACCEPTED, "`epLowLatencyBufferBytes` for top-k 32 (the "
     "size grows with top-k, which the hint is not given)"),
    ("Buffer.get_comm_stream", "", ACCEPTED, "returns the current stream: libmoeep runs on the caller's stream"),
    ("Buffer.get_local_buffer_tensor", "all", REFUSED, "the library's registered buffers are not exposed"),
    ("Buffer.get_dispatch_config, get_combine_config", "num_ranks", ACCEPTED, "any rank count; a `Config` with "
     "`Buffer.num_sms`"),
    ("Config()", "num_sms", ACCEPTED, "`config.num_sms` (the SM budget of the high-throughput kernels)"),
    ("Config()", "num_max_*_chunked_*_tokens", IGNORED, "chunking is the library's own"),
    ("get_dispatch_layout", "topk_idx, num_experts", ACCEPTED, "computed with torch operations on the current "
     "stream (no communication); `num_tokens_per_rdma_rank` is per group of 8 ranks above 8 ranks, else None"),
    ("get_dispatch_layout", "previous_event, async_finish", ACCEPTED, "as in `dispatch`"),
    ("get_dispatch_layout, dispatch, combine", "allocate_on_comm_stream", IGNORED, "there is no communication "
     "stream: outputs belong to the current stream"),
    ("dispatch", "x", ACCEPTED, "BF16 `[T, H]`, or `(FP8-E4M3 [T, H], float32 scales [T, H/128])` of any "
     "strides; int32 (UE8M0) scales are refused"),
    ("dispatch", "handle", ACCEPTED, "a cached re-dispatch (no layout exchange); x of another type than the "
     "handle's dispatch is routed again from the handle's ids, with the same rows"),
    ("dispatch", "num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank", IGNORED,
     "libmoeep routes from `topk_idx` itself (they follow from it)"),
    ("dispatch", "num_tokens_per_expert", ACCEPTED, "only its length is read: the number of experts (else the "
     "last `get_dispatch_layout`'s)"),
    ("dispatch", "topk_idx", ACCEPTED, "required for a new routing (DeepEP can route by `is_token_in_rank` "
     "alone; None is refused); every rank must pass the same top-k width"),
    ("dispatch", "topk_weights", ACCEPTED, "carried to `recv_topk_weights` (0 where the id is -1)"),
    ("dispatch", "expert_alignment", ACCEPTED, "rounds each `num_recv_tokens_per_expert_list` entry up"),
    ("dispatch", "num_worst_tokens", ACCEPTED, "capacity sizing without a host wait (`EP_DISPATCH_NO_HOST_SYNC`), "
     "capturable in a CUDA graph; unused `recv_topk_idx` rows are -1; the per-expert list is empty"),
    ("dispatch", "config", ACCEPTED, "only `num_sms` is read: the SM budget of the communicator made for the "
     "call's shape"),
    ("combine", "config", IGNORED, "the combine runs on the communicator of its handle's dispatch"),
    ("all calls", "previous_event", ACCEPTED, "the current stream waits for it before the call"),
    ("all calls", "async_finish", ACCEPTED, "an event recorded after the call on the current stream, which the "
     "call ran on: nothing overlaps the caller's later work on that stream"),
    ("combine", "x, handle", ACCEPTED, "BF16 `[received rows, H]`, one row per received token"),
    ("combine", "topk_weights", ACCEPTED, "summed back into `combined_topk_weights`"),
    ("combine", "bias", ACCEPTED, "one tensor: added in float32 as DeepEP does; two: summed in float32 and "
     "rounded to BF16 first (one rounding more than DeepEP)"),
    ("low_latency_dispatch", "x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts", ACCEPTED,
     "a low-latency communicator per (max tokens, hidden, experts, top-k)"),
    ("low_latency_dispatch", "topk_weights", EXTENSION, "the weights `low_latency_combine` will apply: "
     "libmoeep sends them with the dispatch"),
    ("low_latency_dispatch", "cumulative_local_expert_recv_stats", ACCEPTED, "`recv_count` is added to it on "
     "the current stream (after the hook when there is one)"),
    ("low_latency_dispatch", "dispatch_wait_recv_cost_stats", REFUSED, "the library does not time its waits "
     "per rank"),
    ("low_latency_dispatch", "use_fp8, round_scale", ACCEPTED, "FP8-E4M3 wire with float32 scales per 128 "
     "values (power-of-two scales with `round_scale`), or BF16"),
    ("low_latency_dispatch", "use_ue8m0", REFUSED, "scales come as float32, not packed UE8M0"),
    ("low_latency_dispatch, low_latency_combine", "return_recv_hook", ACCEPTED, "`EP_LL_SEND_ONLY`; the hook "
     "calls `epLowLatencyComplete` (no SM is held in between)"),
    ("low_latency_combine", "x, handle, out", ACCEPTED, "BF16 `[local experts, R * max tokens, H]`, read in "
     "place; `out` receives the result"),
    ("low_latency_combine", "topk_idx", ACCEPTED, "checked against the handle's shape; the routing is the "
     "handle's"),
    ("low_latency_combine", "topk_weights", ACCEPTED, "must be the tensor given to `low_latency_dispatch`; "
     "otherwise refused (the weights travel with the dispatch)"),
    ("low_latency_combine", "use_logfmt", IGNORED, "partial sums travel as float32: as exact or more"),
    ("low_latency_combine", "zero_copy", ACCEPTED, "every combine reads `x` in place"),
    ("low_latency_combine", "combine_wait_recv_cost_stats", REFUSED, "the library does not time its waits per "
     "rank"),
    ("get_next_low_latency_combine_buffer", "handle", ACCEPTED, "a BF16 tensor per buffer set, owned by the "
     "Buffer, to write the expert outputs into"),
    ("clean_low_latency_buffer", "all", IGNORED, "the library's low-latency buffers need no cleaning"),
    ("low_latency_update_mask_buffer", "rank_to_mask, mask", ACCEPTED, "`mask=True`: `Buffer.shrink` with "
     "the rank as a suspect, a collective of the survivors (DeepEP's is a local write); `mask=False` of a "
     "masked rank is refused: a removed rank cannot rejoin"),
    ("low_latency_query_mask_buffer", "mask_status", ACCEPTED, "1 for each masked rank, 0 for the others "
     "(`epCommDeadRanks`)"),
    ("low_latency_clean_mask_buffer", "", ACCEPTED, "nothing to do while no rank is masked; refused after: a "
     "removed rank cannot rejoin"),
    ("Buffer.shrink", "suspects", EXTENSION, "after a call raised because ranks died: `epCommShrink` on every "
     "low-latency communicator of the Buffer (a collective of the survivors); returns the masked ranks. "
     "High-throughput calls and communicators of new shapes are refused afterwards"),
]


def markdown():
    lines = ["| call | argument | | why |", "| --- | --- | --- | --- |"]
    for call, arg, status, why in TABLE:
        lines.append("| `%s` | %s | %s | %s |" % (call, "`%s`" % arg if arg else "", status, why))
    return "\n".join(lines) + "\n"


def refuse_if(condition, message):
    if condition:
        raise Unsupported(message)


def check_low_latency_dispatch(dispatch_wait_recv_cost_stats, use_ue8m0, async_finish, return_recv_hook):
    refuse_if(dispatch_wait_recv_cost_stats is not None,
              "low_latency_dispatch: dispatch_wait_recv_cost_stats is refused: libmoeep does not time its "
              "waits per rank")
    refuse_if(use_ue8m0, "low_latency_dispatch: use_ue8m0=True is refused: libmoeep returns float32 scales "
                         "(use round_scale=True for power-of-two scales)")
    if async_finish and return_recv_hook:
        raise ValueError("low_latency_dispatch: async_finish and return_recv_hook cannot both be set")


def check_low_latency_combine(combine_wait_recv_cost_stats, async_finish, return_recv_hook):
    refuse_if(combine_wait_recv_cost_stats is not None,
              "low_latency_combine: combine_wait_recv_cost_stats is refused: libmoeep does not time its "
              "waits per rank")
    if async_finish and return_recv_hook:
        raise ValueError("low_latency_combine: async_finish and return_recv_hook cannot both be set")


def check_dispatch(x, handle, topk_idx):
    if handle is None and topk_idx is None:
        raise Unsupported("dispatch: topk_idx is None without a handle: libmoeep routes by expert ids "
                          "(DeepEP's routing by is_token_in_rank alone is not supported)")
    scales = x[1] if isinstance(x, tuple) else None
    refuse_if(scales is not None and "int32" in str(getattr(scales, "dtype", "")),
              "dispatch: int32 (packed UE8M0) scales are refused: libmoeep carries float32 scales")


def require_shrink(enabled, name):
    refuse_if(not enabled, SHRINK_OFF_MESSAGE % name)


if __name__ == "__main__":
    print(markdown(), end="")
