#!/usr/bin/env python3
"""moeep.deep_ep.Buffer on PyTorch tensors, ranks as processes joined by a
torch.distributed group (gloo: it only carries the unique ids and the
reference's inputs).

    test_deep_ep_torch.py [--ranks N] [--device cpu|cuda] [--seed S]

Each rank runs DeepEP's calls as DeepEP's own tests do (layout, dispatch with
exact sizing and with num_worst_tokens, a cached re-dispatch, combine with
two biases and weights, FP8 rows, a cached BF16 re-dispatch of an FP8
handle, low-latency dispatch / combine with BF16 and FP8 wires, the receive
hook, the combine buffer) on random data and checks every output against a
reference from all ranks' inputs. With --device cuda every call also runs on
CPU copies of the inputs (libmoeep's host backend) and the two must agree bit
for bit. Without torch: SKIPPED (exit 77).
"""
import argparse
import os
import random
import subprocess
import sys
import time

E_PER_RANK, H, T_MAX, K = 4, 256, 24, 4


def setup(seed, rank, R, device):
    import torch
    g = torch.Generator().manual_seed(seed * 100 + rank)
    T = int(torch.randint(1, T_MAX + 1, (1,), generator=g)) if rank != 1 else 0
    E = E_PER_RANK * R
    scores = torch.rand((T, E), generator=g)
    idx = scores.topk(K, dim=1).indices.to(torch.int64)
    idx[torch.rand((T, K), generator=g) < 0.15] = -1
    w = (2.0 ** torch.randint(-1, 2, (T, K), generator=g)).float()
    x = torch.randint(-8, 9, (T, H), generator=g).to(torch.bfloat16)
    x2 = torch.randint(-8, 9, (T, H), generator=g).to(torch.bfloat16)
    fp8 = torch.randint(0, 0x7E, (T, H), generator=g).to(torch.uint8)
    scales = torch.rand((H // 128, T), generator=g).t()  # column-major, as DeepEP's tests pass them
    b0 = torch.randint(-3, 4, (T, H), generator=g).to(torch.bfloat16)
    b1 = torch.randint(-3, 4, (T, H), generator=g).to(torch.bfloat16)
    return dict(T=T, idx=idx, w=w, x=x, x2=x2, fp8=fp8, scales=scales, b0=b0, b1=b1)


def fp8_view(t):
    import torch
    return t.view(torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else t


def run_calls(buf, d, device, R, rank):
    """Every call of the scenario on one device; the outputs by name, on the CPU."""
    import torch
    to = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in d.items()}
    E = E_PER_RANK * R
    out = {}
    lay = buf.get_dispatch_layout(to["idx"], E)
    out.update(per_rank=lay[0], per_expert=lay[2], in_rank=lay[3])
    recv_x, recv_idx, recv_w, counts, handle, event = buf.dispatch(
        to["x"], topk_idx=to["idx"], topk_weights=to["w"], num_tokens_per_rank=lay[0], is_token_in_rank=lay[3],
        num_tokens_per_expert=lay[2], expert_alignment=2, async_finish=True)
    event.current_stream_wait()
    out.update(recv_x=recv_x, recv_idx=recv_idx, recv_w=recv_w, counts=torch.tensor(counts))
    y = (recv_x.float() * (rank + 1)).to(torch.bfloat16)
    combined, combined_w, _ = buf.combine(y, handle, topk_weights=recv_w, bias=(to["b0"], to["b1"]))
    out.update(combined=combined, combined_w=combined_w)
    out["cached"] = buf.dispatch(to["x2"], handle=handle)[0]
    worst = R * T_MAX
    wx, widx, _, wcounts, whandle, _ = buf.dispatch(to["x"], topk_idx=to["idx"], num_tokens_per_expert=lay[2],
                                                    num_worst_tokens=worst)
    n = recv_x.size(0)
    out.update(worst_rows=wx[:n], worst_idx=widx, worst_counts=torch.tensor(len(wcounts)))
    out["worst_combined"] = buf.combine(torch.cat([y, torch.zeros_like(wx[n:])]), whandle)[0]
    (fx, fs), _, _, _, fhandle, _ = buf.dispatch((fp8_view(to["fp8"]), to["scales"]), topk_idx=to["idx"],
                                                num_tokens_per_expert=lay[2])
    out.update(fp8_rows=fx.view(torch.uint8), fp8_scales=fs)
    out["fp8_then_bf16"] = buf.dispatch(to["x2"], handle=fhandle)[0]
    for h in (handle, whandle, fhandle):
        h.release()
    out.update(run_ll_calls(buf, d, device, R, rank))
    return {k: v.cpu() for k, v in out.items()}


def run_ll_calls(buf, d, device, R, rank):
    """The low-latency calls of the scenario (run_calls), alone: BF16 wire
    with the stats, then FP8 with the receive hook. The outputs by name."""
    import torch
    to = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in d.items()}
    E = E_PER_RANK * R
    out = {}
    stats = torch.zeros((E_PER_RANK,), dtype=torch.int32, device=device)
    rx, count, lh, _, hook = buf.low_latency_dispatch(to["x"], to["idx"], T_MAX, E, topk_weights=to["w"],
                                                      cumulative_local_expert_recv_stats=stats, use_fp8=False)
    out.update(ll_count=count.clone(), ll_stats=stats.clone())
    valid = torch.arange(rx.size(1), device=device)[None, :] < count[:, None]
    out["ll_rows"] = torch.where(valid[:, :, None], rx, torch.zeros_like(rx))
    factor = (torch.arange(E_PER_RANK, device=device) + rank * E_PER_RANK + 1).float()[:, None, None]
    ly = (rx.float() * factor).to(torch.bfloat16)
    if d["T"] > 0:  # weights other than the dispatch's are refused (an empty batch has none to apply)
        try:
            buf.low_latency_combine(ly, to["idx"], to["w"].clone(), lh)
            out["ll_other_weights_refused"] = torch.tensor(0)
        except ValueError:
            out["ll_other_weights_refused"] = torch.tensor(1)
    else:
        out["ll_other_weights_refused"] = torch.tensor(1)
    combine_buf = buf.get_next_low_latency_combine_buffer(lh)
    combine_buf.copy_(ly)
    out["ll_combined"], _, _ = buf.low_latency_combine(combine_buf, to["idx"], to["w"], lh, zero_copy=True)
    (qx, qs), count, lh2, _, hook = buf.low_latency_dispatch(to["x"], to["idx"], T_MAX, E, topk_weights=to["w"],
                                                             round_scale=True, return_recv_hook=True)
    hook()
    valid = torch.arange(qx.size(1), device=device)[None, :] < count[:, None]
    out["ll_fp8_bytes"] = torch.where(valid[:, :, None], qx.view(torch.uint8), torch.zeros_like(qx.view(torch.uint8)))
    out["ll_fp8_scales"] = torch.where(valid[:, :, None], qs, torch.zeros_like(qs))
    qy = (torch.where(valid[:, :, None], rx.float(), torch.zeros_like(rx.float())) * factor).to(torch.bfloat16)
    res, _, hook = buf.low_latency_combine(qy, to["idx"], to["w"], lh2, return_recv_hook=True)
    hook()
    out["ll_hook_combined"] = res
    lh.release()
    lh2.release()
    if device != "cpu":
        torch.cuda.synchronize()
    return out


def reference(all_in, rank, R):
    """The outputs run_calls must give on `rank`, from SPEC.md and DeepEP's docs."""
    import torch
    lo, hi = rank * E_PER_RANK, (rank + 1) * E_PER_RANK
    rows = [(s, t) for s in range(R) for t in range(all_in[s]["T"])
            if any(lo <= int(e) < hi for e in all_in[s]["idx"][t])]
    mine = all_in[rank]
    ref = {}
    in_rank = [[any(int(e) // E_PER_RANK == r for e in mine["idx"][t] if e >= 0) for r in range(R)]
               for t in range(mine["T"])]
    ref["in_rank"] = torch.tensor(in_rank, dtype=torch.bool).reshape(mine["T"], R)
    ref["per_rank"] = ref["in_rank"].sum(0).to(torch.int32)
    ids_here = mine["idx"][mine["idx"] >= 0]
    ref["per_expert"] = torch.bincount(ids_here, minlength=E_PER_RANK * R).to(torch.int32)
    ref["recv_x"] = torch.stack([all_in[s]["x"][t] for s, t in rows]) if rows else torch.zeros((0, H), dtype=torch.bfloat16)
    ids = [[int(e) - lo if lo <= int(e) < hi else -1 for e in all_in[s]["idx"][t]] for s, t in rows]
    ref["recv_idx"] = torch.tensor(ids, dtype=torch.int64).reshape(len(rows), K)
    ref["recv_w"] = torch.tensor([[float(all_in[s]["w"][t][k]) if ids[i][k] >= 0 else 0.0 for k in range(K)]
                                  for i, (s, t) in enumerate(rows)], dtype=torch.float32).reshape(len(rows), K)
    ref["counts"] = torch.tensor([((ref["recv_idx"] == e).sum().item() + 1) // 2 * 2 for e in range(E_PER_RANK)])
    reached = [sorted({int(e) // E_PER_RANK for e in mine["idx"][t] if e >= 0}) for t in range(mine["T"])]
    bias = (mine["b0"].float() + mine["b1"].float()).to(torch.bfloat16).float()
    acc = torch.stack([sum((mine["x"][t].float() * (r + 1) for r in reached[t]), torch.zeros(H)) for t in
                       range(mine["T"])]) if mine["T"] else torch.zeros((0, H))
    ref["combined"] = (acc + bias).to(torch.bfloat16)
    ref["combined_w"] = torch.where(mine["idx"] >= 0, mine["w"], torch.zeros_like(mine["w"]))
    ref["cached"] = torch.stack([all_in[s]["x2"][t] for s, t in rows]) if rows else ref["recv_x"]
    ref["worst_rows"], ref["worst_counts"] = ref["recv_x"], torch.tensor(0)
    ref["worst_idx"] = torch.cat([ref["recv_idx"], torch.full((R * T_MAX - len(rows), K), -1, dtype=torch.int64)])
    ref["worst_combined"] = acc.to(torch.bfloat16)
    ref["fp8_rows"] = torch.stack([all_in[s]["fp8"][t] for s, t in rows]) if rows else torch.zeros((0, H), dtype=torch.uint8)
    ref["fp8_scales"] = (torch.stack([all_in[s]["scales"][t] for s, t in rows]) if rows
                         else torch.zeros((0, H // 128)))
    ref["fp8_then_bf16"] = ref["cached"]
    ll_count = []
    ll_rows = torch.zeros((E_PER_RANK, R * T_MAX, H), dtype=torch.bfloat16)
    for e in range(E_PER_RANK):
        arr = [(s, t) for s in range(R) for t in range(all_in[s]["T"]) if lo + e in [int(v) for v in all_in[s]["idx"][t]]]
        ll_count.append(len(arr))
        for slot, (s, t) in enumerate(arr):
            ll_rows[e][slot] = all_in[s]["x"][t]
    ref["ll_count"] = ref["ll_stats"] = torch.tensor(ll_count, dtype=torch.int32)
    ref["ll_rows"] = ll_rows
    ll_out = torch.zeros((mine["T"], H))
    for t in range(mine["T"]):
        for k in range(K):
            e = int(mine["idx"][t][k])
            if e >= 0:
                ll_out[t] += float(mine["w"][t][k]) * mine["x"][t].float() * (e + 1)
    ref["ll_combined"] = ref["ll_hook_combined"] = ll_out.to(torch.bfloat16)
    ref["ll_other_weights_refused"] = torch.tensor(1)
    return ref


def check_fp8_ll(got, ref, fails, rank):
    """FP8 low-latency rows: power-of-two scales covering each block, values within E4M3 rounding."""
    import torch
    from moeep.numeric import from_float8_e4m3
    q = torch.from_numpy(from_float8_e4m3(got["ll_fp8_bytes"].numpy()))
    scales = got["ll_fp8_scales"]
    deq = q * scales.repeat_interleave(128, dim=2)
    want = ref["ll_rows"].float()
    tol = want.abs() * 2.0 ** -4 + scales.repeat_interleave(128, dim=2) * 2.0 ** -9
    pow2 = scales[scales > 0]
    if not bool(((deq - want).abs() <= tol).all()) or not bool((torch.frexp(pow2).mantissa == 0.5).all()):
        fails.append("rank %d: ll FP8 rows or power-of-two scales" % rank)


def rank_main(args):
    import torch
    import torch.distributed as dist
    from moeep.deep_ep import Buffer
    R, rank = args.ranks, args.rank
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=rank, world_size=R)
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    d = setup(args.seed, rank, R, args.device)
    all_in = [None] * R
    dist.all_gather_object(all_in, d)
    buf = Buffer(dist.group.WORLD, int(1e9), 0, low_latency_mode=True, explicitly_destroy=True)
    fails = []
    got = run_calls(buf, d, args.device if args.device == "cpu" else "cuda:%d" % torch.cuda.current_device(), R, rank)
    ref = reference(all_in, rank, R)
    for name, want in ref.items():
        have = got.get(name)
        if have is None or have.shape != want.shape or not torch.equal(have, want.to(have.dtype)):
            fails.append("rank %d: %s" % (rank, name))
    check_fp8_ll(got, ref, fails, rank)
    unchecked = set(got) - set(ref) - {"ll_fp8_bytes", "ll_fp8_scales"}
    if unchecked:
        fails.append("rank %d: outputs without a reference: %s" % (rank, sorted(unchecked)))
    if args.device == "cuda":
        # The same calls on the host backend (CPU tensors): bit for bit.
        host = run_calls(buf, d, "cpu", R, rank)
        for name in got:
            if not torch.equal(got[name], host[name]):
                fails.append("rank %d: %s differs between the CUDA and the host backend" % (rank, name))
    buf.destroy()
    dist.destroy_process_group()
    for f in fails:
        print("FAIL " + f, flush=True)
    print("rank %d: %d outputs checked, %d failed" % (rank, len(got), len(fails)), flush=True)
    return 1 if fails else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIPPED: torch is not installed (moeep.deep_ep's calls work on torch tensors)")
        return 77
    if args.rank >= 0:
        return rank_main(args)
    return spawn_ranks(__file__, "test_deep_ep_torch", args, 600)


def spawn_ranks(script, name, args, timeout_s):
    """Runs `script` once per rank (--rank r), the ranks joined through a
    random port; 0 when every rank exited 0."""
    port = random.randint(20000, 40000)
    cmd = [sys.executable, os.path.abspath(script), "--ranks", str(args.ranks), "--device", args.device,
           "--seed", str(args.seed), "--port", str(port)]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)]) for r in range(args.ranks)]
    deadline, codes = time.time() + timeout_s, []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append("timeout")
    ok = all(c == 0 for c in codes)
    print("%s %d ranks on %s: %s (exit codes %s)" % (name, args.ranks, args.device, "PASSED" if ok else "FAILED",
                                                     codes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
