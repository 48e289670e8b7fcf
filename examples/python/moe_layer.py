#!/usr/bin/env python3
"""One mixture-of-experts layer from Python on the host backend, ranks as
processes: the launcher makes the unique id and passes it to each rank on
its command line (any channel will do). Rank r's token t picks experts
(t + r) % E and (3t + 1 + r) % E with gate weights 0.5 and 0.25; each
expert scales its rows by (expert id + 1); combine sums the experts' rows
back. The values are small multiples of 1/4, exact in BF16, so the output
must equal the layer computed locally.

    PYTHONPATH=bindings/python MOEEP_LIBRARY=build/lib python3 examples/python/moe_layer.py [--ranks 3]
"""
import argparse
import subprocess
import sys

import numpy as np

import moeep
from moeep.numeric import from_bfloat16, to_bfloat16

T, H, K, E_PER_RANK = 32, 128, 2, 4


def rank_main(rank, nranks, uid_hex):
    E = E_PER_RANK * nranks
    comm = moeep.Communicator(nranks, rank, moeep.UniqueId.fromhex(uid_hex), num_experts=E, hidden=H,
                              max_tokens_per_rank=T, max_topk=K, backend="host")
    t = np.arange(T)
    x = ((rank * T + t[:, None] + np.arange(H)[None, :]) % 7 - 3).astype(np.float32)
    topk = np.stack([(t + rank) % E, (3 * t + 1 + rank) % E], axis=1).astype(np.int64)
    gate = np.tile(np.array([0.5, 0.25], np.float32), (T, 1))

    d = comm.dispatch(to_bfloat16(x), topk, topk_weights=gate)   # rows sized exactly
    local = d.recv_topk_idx                                      # local expert ids, -1 elsewhere
    scale = np.where(local >= 0, d.recv_topk_weights * (comm.first_local_expert + local + 1), 0).sum(axis=1)
    y = to_bfloat16(from_bfloat16(d.recv_x) * scale[:, None])    # the experts' work
    out = from_bfloat16(comm.combine(y, d.handle).out)
    d.handle.close()
    comm.close()

    want = x * (gate * (topk + 1)).sum(axis=1)[:, None]
    ok = np.array_equal(out, want)
    print("rank %d of %d: received %d rows, combined %d tokens: %s" % (rank, nranks, d.num_recv, T,
                                                                        "correct" if ok else "WRONG"))
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--id", default="")
    args = p.parse_args()
    if args.rank >= 0:
        return rank_main(args.rank, args.ranks, args.id)
    uid = moeep.UniqueId.create()  # this process serves the bootstrap; it waits for the ranks
    ranks = [subprocess.Popen([sys.executable, __file__, "--ranks", str(args.ranks), "--rank", str(r),
                               "--id", uid.hex()]) for r in range(args.ranks)]
    codes = [r.wait(timeout=120) for r in ranks]
    print("moe_layer.py: %s" % ("every rank correct" if not any(codes) else "FAILED %s" % codes))
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
