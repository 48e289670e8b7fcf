#!/usr/bin/env python3
"""moeep.deep_ep.Buffer(enable_shrink=True): DeepEP's mask calls after a rank
died, ranks as processes joined by a torch.distributed group (gloo: it only
carries the unique ids and the inputs, and is not used after the death).

    test_deep_ep_shrink.py [--ranks N] [--device cpu|cuda] [--seed S]

Every rank runs the low-latency calls of test_deep_ep_torch.py (BF16 with the
stats and the combine buffer, FP8 with the receive hook) and a
high-throughput dispatch, checked against the reference; then the last rank
exits. On each survivor: a low-latency layer raises naming it (on a GPU a
kernel's failed wait may be reported by the next call: up to three layers);
low_latency_update_mask_buffer(dead, True) masks it (epCommShrink, a
collective of the survivors); low_latency_query_mask_buffer says so; unmasking
and high-throughput calls are refused; the low-latency calls, twice, match
the reference computed with the dead rank's tokens absent and its experts'
entries -1. Without torch: SKIPPED (exit 77).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_deep_ep_torch as base  # noqa: E402  (the scenario, its inputs and its reference)

LL_KEYS = ("ll_count", "ll_stats", "ll_rows", "ll_combined", "ll_hook_combined", "ll_other_weights_refused")


def masked_inputs(all_in, dead, R):
    """The inputs as the survivors see them after the shrink: the dead rank
    sends nothing; its experts' entries count as -1."""
    import torch
    out = []
    for s, d in enumerate(all_in):
        d = dict(d)
        if s == dead:
            d["T"] = 0
            for k in ("idx", "w", "x", "x2", "fp8", "scales", "b0", "b1"):
                d[k] = d[k][:0]
        else:
            idx = d["idx"].clone()
            idx[(idx >= 0) & (idx // base.E_PER_RANK == dead)] = -1
            d["idx"] = idx
        out.append(d)
    return out


def check_ll(got, all_in, rank, R, what, fails):
    import torch
    ref = base.reference(all_in, rank, R)
    for name in LL_KEYS:
        have, want = got.get(name), ref[name]
        have = have.cpu() if have is not None else None
        if have is None or have.shape != want.shape or not torch.equal(have, want.to(have.dtype)):
            fails.append("rank %d: %s: %s" % (rank, what, name))
    ll = {k: v.cpu() for k, v in got.items()}
    base.check_fp8_ll(ll, ref, fails, rank)
    return ref


def rank_main(args):
    import torch
    import torch.distributed as dist
    import moeep
    from moeep.deep_ep import Buffer, Unsupported
    R, rank, dead = args.ranks, args.rank, args.ranks - 1
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=rank, world_size=R)
    device = "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = "cuda:%d" % torch.cuda.current_device()
    d = base.setup(args.seed, rank, R, args.device)
    all_in = [None] * R
    dist.all_gather_object(all_in, d)
    buf = Buffer(dist.group.WORLD, int(1e9), 0, low_latency_mode=True, explicitly_destroy=True, enable_shrink=True)
    fails = []
    check_ll(base.run_ll_calls(buf, d, device, R, rank), all_in, rank, R, "before the death", fails)
    to = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in d.items()}
    lay = buf.get_dispatch_layout(to["idx"], base.E_PER_RANK * R)
    _, _, _, _, ht_handle, _ = buf.dispatch(to["x"], topk_idx=to["idx"], topk_weights=to["w"],
                                            num_tokens_per_expert=lay[2])
    ht_handle.release()
    if args.device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    if rank == dead:
        print("rank %d exits" % rank, flush=True)
        os._exit(0)

    t0 = time.time()
    raised = None
    for _ in range(3):
        try:
            base.run_ll_calls(buf, d, device, R, rank)
            if args.device == "cuda":
                torch.cuda.synchronize()
        except moeep.MoeepError as e:
            raised = e
            break
    if raised is None or ("rank %d" % dead) not in str(raised):
        fails.append("rank %d: the low-latency layers after the death: %s" % (rank, raised or "no error"))
    else:
        print("rank %d: after %.2f s: %s" % (rank, time.time() - t0, raised), flush=True)
    mask = torch.full((R,), 7, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(mask)
    if mask.tolist() != [0] * R:
        fails.append("rank %d: the mask before the shrink: %s" % (rank, mask.tolist()))
    t1 = time.time()
    buf.low_latency_update_mask_buffer(dead, True)
    print("rank %d: low_latency_update_mask_buffer(%d, True): %.1f ms" % (rank, dead, (time.time() - t1) * 1e3),
          flush=True)
    buf.low_latency_update_mask_buffer(dead, True)  # already masked: nothing to do, no collective
    buf.low_latency_query_mask_buffer(mask)
    if mask.tolist() != [int(r == dead) for r in range(R)]:
        fails.append("rank %d: the mask after the shrink: %s" % (rank, mask.tolist()))
    again = buf.shrink()  # every survivor calls it: a collective, nothing new to agree on
    if again != [dead]:
        fails.append("rank %d: Buffer.shrink() after the mask: %s" % (rank, again))
    for what, call in (("unmask", lambda: buf.low_latency_update_mask_buffer(dead, False)),
                       ("clean", buf.low_latency_clean_mask_buffer),
                       ("high-throughput dispatch", lambda: buf.dispatch(to["x"], topk_idx=to["idx"])),
                       ("get_dispatch_layout", lambda: buf.get_dispatch_layout(to["idx"], base.E_PER_RANK * R))):
        try:
            call()
            fails.append("rank %d: %s after the mask was not refused" % (rank, what))
        except Unsupported:
            pass
    masked = masked_inputs(all_in, dead, R)
    for n in range(2):
        try:
            got = base.run_ll_calls(buf, d, device, R, rank)
        except moeep.MoeepError as e:
            fails.append("rank %d: low-latency calls after the shrink (%d): %s" % (rank, n, e))
            break
        ref = check_ll(got, masked, rank, R, "after the shrink (%d)" % n, fails)
        if n == 0:
            print("rank %d: after the shrink: %d rows received, %d tokens combined" % (
                rank, int(ref["ll_count"].sum()), all_in[rank]["T"]), flush=True)
    buf.destroy()
    for f in fails:
        print("FAIL " + f, flush=True)
    print("rank %d: %s" % (rank, "passed" if not fails else "%d failed" % len(fails)), flush=True)
    sys.stdout.flush()
    os._exit(1 if fails else 0)  # the gloo group lost a rank: no orderly teardown


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=int, default=47)
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIPPED: torch is not installed (moeep.deep_ep's calls work on torch tensors)")
        return 77
    if args.ranks < 3:
        p.error("--ranks must be at least 3 (a majority must survive the death)")
    if args.rank >= 0:
        return rank_main(args)
    return base.spawn_ranks(__file__, "test_deep_ep_shrink", args, 300)

if __name__ == "__main__":
    sys.exit(main())
