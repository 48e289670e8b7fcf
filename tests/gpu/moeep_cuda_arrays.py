#!/usr/bin/env python3
"""The moeep package on CUDA arrays it knows only by their interfaces
(tests/gpu/bindings_gpu.sh runs it): PyTorch tensors hidden behind objects
that show nothing but __cuda_array_interface__ or DLPack, on a one-rank
communicator of the CUDA backend; every output compared bit for bit with a
host-backend communicator given the same data as NumPy arrays.

    PYTHONPATH=bindings/python MOEEP_LIBRARY=build/lib python3 tests/gpu/moeep_cuda_arrays.py
"""
import sys

import numpy as np

T, H, E, K = 48, 256, 4, 2


class OnlyCai:
    """A CUDA array seen through __cuda_array_interface__ alone (as CuPy or Numba show theirs)."""

    def __init__(self, t):
        self.t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class OnlyDlpack:
    """A CUDA array seen through DLPack alone."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def main():
    try:
        import torch
    except ImportError:
        print("SKIPPED: torch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("SKIPPED: no GPU visible")
        return 77
    import moeep
    g = torch.Generator().manual_seed(43)
    x = torch.randn((T, H), generator=g).to(torch.bfloat16)
    topk = torch.rand((T, E), generator=g).topk(K, dim=1).indices.to(torch.int64)
    topk[::7, 1] = -1
    w = torch.rand((T, K), generator=g)
    common = dict(num_experts=E, hidden=H, max_tokens_per_rank=T, max_topk=K, low_latency=True)
    cuda = moeep.Communicator(1, 0, None, backend="cuda", device=torch.cuda.current_device(), **common)
    host = moeep.Communicator(1, 0, None, backend="host", **common)
    fails = []

    def same(name, got, want):
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            fails.append(name)
        print(("ok   " if name not in fails else "FAIL ") + name)

    dev = lambda t: t.cuda()  # noqa: E731
    bits = lambda t: t.view(torch.int16)  # noqa: E731  (torch's CAI has no BF16: its bits, read as BF16)
    # High throughput, capacity sizing (this package allocates only for frameworks it knows).
    rx, ri, rw = dev(torch.zeros((T, H), dtype=torch.bfloat16)), dev(torch.zeros((T, K), dtype=torch.int64)), \
        dev(torch.zeros((T, K)))
    n = dev(torch.zeros(1, dtype=torch.int64))
    d = cuda.dispatch(OnlyDlpack(dev(x)), OnlyCai(dev(topk)), topk_weights=OnlyCai(dev(w)), recv_x=OnlyCai(bits(rx)),
                      recv_topk_idx=OnlyCai(ri), recv_topk_weights=OnlyDlpack(rw), num_recv=OnlyCai(n),
                      no_host_sync=True)
    out = dev(torch.zeros((T, H), dtype=torch.bfloat16))
    cuda.combine(OnlyDlpack(rx), d.handle, out=OnlyCai(bits(out)))
    torch.cuda.synchronize()
    hx = x.view(torch.int16).numpy().view(np.uint16)
    hd = host.dispatch(hx, topk.numpy(), topk_weights=w.numpy())
    hout = host.combine(hd.recv_x, hd.handle).out
    rows = hd.num_recv
    same("num_recv", n.cpu().numpy()[0], rows)
    same("recv_x", rx.cpu().view(torch.int16).numpy().view(np.uint16)[:rows], hd.recv_x)
    same("recv_topk_idx", ri.cpu().numpy()[:rows], hd.recv_topk_idx)
    same("recv_topk_weights", rw.cpu().numpy()[:rows], hd.recv_topk_weights)
    same("combine out", out.cpu().view(torch.int16).numpy().view(np.uint16), hout)
    d.handle.close()
    hd.handle.close()

    # Low latency, FP8 wire.
    L, slots, nb = cuda.num_local_experts, cuda.size * cuda.max_tokens_per_rank, (H + 127) // 128
    q = dev(torch.zeros((L, slots, H), dtype=torch.uint8))
    qs, qc = dev(torch.zeros((L, nb, slots))), dev(torch.zeros(L, dtype=torch.int32))
    ll = cuda.ll_dispatch(OnlyDlpack(dev(x)), OnlyCai(dev(topk)), topk_weights=OnlyCai(dev(w)),
                          recv_x=OnlyCai(q), recv_scales=OnlyCai(qs), recv_count=OnlyDlpack(qc))
    y_cpu = torch.randn((L, slots, H), generator=g).to(torch.bfloat16)  # the experts' outputs, any values
    y = dev(y_cpu)
    lout = dev(torch.zeros((T, H), dtype=torch.bfloat16))
    cuda.ll_combine(OnlyDlpack(y), ll.handle, out=OnlyCai(bits(lout)))
    torch.cuda.synchronize()
    hl = host.ll_dispatch(hx, topk.numpy(), topk_weights=w.numpy())
    counts = hl.recv_count
    same("ll recv_count", qc.cpu().numpy(), counts)
    same("ll FP8 rows", np.concatenate([q.cpu().numpy()[e, :counts[e]] for e in range(L)]),
         np.concatenate([hl.recv_x[e, :counts[e]] for e in range(L)]))
    same("ll scales", np.concatenate([qs.cpu().numpy()[e, :, :counts[e]].ravel() for e in range(L)]),
         np.concatenate([hl.recv_scales[e, :, :counts[e]].ravel() for e in range(L)]))
    hlout = host.ll_combine(y_cpu.view(torch.int16).numpy().view(np.uint16), hl.handle)
    same("ll combine", lout.cpu().view(torch.int16).numpy().view(np.uint16), hlout)
    ll.handle.close()
    hl.handle.close()
    cuda.close()
    host.close()
    print("moeep_cuda_arrays: %s" % ("PASSED" if not fails else "FAILED: %s" % ", ".join(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
