#!/usr/bin/env python3
"""moeep.deep_ep.Buffer beside torch.distributed's NCCL backend in one
PyTorch program (tests/gpu/bindings_gpu.sh runs it).

Two ranks as processes (sharing the GPU when there is one: each then sets
its own NCCL_HOSTID, since NCCL refuses two ranks on one GPU of one host).
On the current stream, one MoE layer: dist.all_reduce, get_dispatch_layout,
dispatch (num_worst_tokens: no host wait), the experts (torch operations),
combine, dist.all_reduce, low_latency_dispatch / low_latency_combine; first
eagerly (and an exact-size dispatch too), then captured in one
torch.cuda.graph and replayed on new inputs. Every output is checked: the
values are small multiples of 1/4, so the all-reduces, the combine and the
low-latency combine are exact and must equal the layer computed on one rank.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
      PYTHONPATH=bindings/python MOEEP_LIBRARY=build/lib python3 tests/gpu/torch_beside.py [--cpu]

--cpu runs the eager part on CPU tensors (gloo, libmoeep's host backend):
the same layer and checks where there is no GPU.
"""
import os
import random
import subprocess
import sys
import time

R, T, H, E_PER_RANK, K, LL_MAX_TOKENS, N_REDUCE, REPLAYS = 2, 64, 512, 4, 2, 64, 1 << 16, 3
E = E_PER_RANK * R


def inputs(rank, rnd, device):
    import torch
    t = torch.arange(T)
    x = ((rank * T + t[:, None] + torch.arange(H)[None, :] + 3 * rnd) % 9 - 4).to(torch.bfloat16)
    topk = torch.stack([(t + rank + rnd) % E, (3 * t + 1 + rank + rnd) % E], dim=1).to(torch.int64)
    w = torch.tensor([0.5, 0.25]).repeat(T, 1)
    a = rank + 0.5 * (torch.arange(N_REDUCE) % 64).float() + rnd
    return {k: v.to(device) for k, v in dict(x=x, topk=topk, w=w, a=a, b=a.clone()).items()}


def expected(rnd):
    """The layer computed on one rank: outputs of each rank, and the all-reduce sum."""
    import torch
    outs = []
    for rank in range(R):
        i = inputs(rank, rnd, "cpu")
        scale = (i["w"] * (i["topk"] + 1).float()).sum(1)
        outs.append((i["x"].float() * scale[:, None]).to(torch.bfloat16))
    total = sum(inputs(r, rnd, "cpu")["a"] for r in range(R))
    return outs, total


def moe_layer(buf, rank, inp, keep):
    import torch
    import torch.distributed as dist
    dist.all_reduce(inp["a"])
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(inp["topk"], E)
    recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(
        inp["x"], topk_idx=inp["topk"], topk_weights=inp["w"], num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, num_worst_tokens=R * T)
    # The experts: expert e scales a row by (e + 1) and its gate weight; a rank adds its experts' rows.
    first = rank * E_PER_RANK
    scale = torch.where(recv_idx >= 0, recv_w * (first + recv_idx + 1).float(), torch.zeros_like(recv_w)).sum(1)
    y = (recv_x.float() * scale[:, None]).to(torch.bfloat16)
    combined, _, _ = buf.combine(y, handle)
    dist.all_reduce(inp["b"])
    rx, _, ll_handle, _, _ = buf.low_latency_dispatch(inp["x"], inp["topk"], LL_MAX_TOKENS, E, topk_weights=inp["w"],
                                                      use_fp8=False)
    factor = (first + torch.arange(E_PER_RANK, device=rx.device) + 1).float()[:, None, None]
    ll_out, _, _ = buf.low_latency_combine((rx.float() * factor).to(torch.bfloat16), inp["topk"], inp["w"], ll_handle)
    keep.extend([handle, ll_handle])  # a graph reads its handles' state at every replay
    return combined, ll_out


def check(rank, rnd, inp, combined, ll_out, what):
    import torch
    want, total = expected(rnd)
    fails = []
    for name, got in (("combine", combined), ("low-latency combine", ll_out)):
        if not torch.equal(got.cpu(), want[rank]):
            fails.append("%s: %s differs" % (what, name))
    for name in ("a", "b"):
        if not torch.equal(inp[name].cpu(), total):
            fails.append("%s: all-reduce %s differs" % (what, name))
    for f in fails:
        print("FAIL rank %d %s" % (rank, f), flush=True)
    if not fails:
        print("rank %d: %s correct" % (rank, what), flush=True)
    return not fails


def rank_main(rank, port, device):
    import torch
    import torch.distributed as dist
    from moeep.deep_ep import Buffer
    if device == "cuda":
        ndev = torch.cuda.device_count()
        if ndev < R:
            os.environ["NCCL_HOSTID"] = "moeep-torch-beside-%d" % rank  # two "hosts" for NCCL: one GPU
        torch.cuda.set_device(rank % ndev)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=R)
    buf = Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True, explicitly_destroy=True)
    ok, keep = True, []

    # Eager: the layer, and an exact-size dispatch (a host wait) with its combine.
    inp = inputs(rank, 0, device)
    combined, ll_out = moe_layer(buf, rank, inp, keep)
    if device == "cuda":
        torch.cuda.synchronize()
    ok &= check(rank, 0, inp, combined, ll_out, "eager layer")
    recv_x, _, _, counts, handle, _ = buf.dispatch(inp["x"], topk_idx=inp["topk"], topk_weights=inp["w"])
    exact_out, _, _ = buf.combine(recv_x, handle)
    reached = (inp["topk"] // E_PER_RANK)
    ranks = torch.where(reached[:, 0] == reached[:, 1], 1.0, 2.0).to(inp["x"].device)
    want = (inp["x"].float() * ranks[:, None]).to(torch.bfloat16)
    exact_ok = torch.equal(exact_out, want) and len(counts) == E_PER_RANK
    print("rank %d: eager exact-size dispatch (%d rows) and combine %s" % (
        rank, recv_x.size(0), "correct" if exact_ok else "WRONG"), flush=True)
    ok &= exact_ok
    handle.release()
    if device == "cuda":
        ok &= run_graph(buf, rank, keep)
    keep.clear()
    buf.destroy()
    dist.destroy_process_group()
    return 0 if ok else 1


def run_graph(buf, rank, keep):
    import torch
    ok = True
    # Captured: warm up on a side stream (PyTorch's rule), capture, replay on new inputs.
    static = inputs(rank, 0, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            moe_layer(buf, rank, static, keep)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        combined, ll_out = moe_layer(buf, rank, static, keep)
    for rnd in range(1, REPLAYS + 1):
        fresh = inputs(rank, rnd, "cuda")
        for k in static:
            static[k].copy_(fresh[k])
        graph.replay()
        torch.cuda.synchronize()
        ok &= check(rank, rnd, static, combined, ll_out, "graph replay %d" % rnd)
    torch.cuda.synchronize()
    del graph
    return ok


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIPPED: torch is not installed")
        return 77
    device = "cpu" if "--cpu" in sys.argv else "cuda"
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    if len(args) == 2:
        return rank_main(int(args[0]), int(args[1]), device)
    port = random.randint(20000, 40000)
    env = dict(os.environ, TORCH_NCCL_ASYNC_ERROR_HANDLING="0")  # no watchdog aborts around graph capture
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(r), str(port)] + sys.argv[1:], env=env)
             for r in range(R)]
    deadline, codes = time.time() + 900, []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    ok = all(c == 0 for c in codes)
    print("torch_beside%s: %s (exit codes %s)" % (" --cpu" if device == "cpu" else "", "PASSED" if ok else "FAILED",
                                                   codes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
