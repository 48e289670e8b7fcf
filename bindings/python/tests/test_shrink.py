#!/usr/bin/env python3
"""Communicator.shrink (epCommShrink) from Python, ranks as processes.

    test_shrink.py [--ranks N]

Every rank makes a communicator with enable_shrink=True and dispatches once;
then rank 1 exits. The others' next dispatch must raise, naming it; shrink()
must return [1] on each of them, and a dispatch after it must run, its rows
those of the reference without rank 1 (its experts' entries -1). Exit 0 when
every surviving rank passed.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import moeep
from moeep.numeric import to_bfloat16

E_PER_RANK, H, M, K = 2, 64, 6, 2


def inputs(rank, nranks, seed=11):
    rng = np.random.default_rng(seed * 100 + rank)
    x = rng.uniform(-1, 1, (M, H)).astype(np.float32)
    idx = np.stack([rng.choice(E_PER_RANK * nranks, K, replace=False) for _ in range(M)]).astype(np.int64)
    return x, idx


def rank_main(rank, nranks, uid):
    comm = moeep.Communicator(nranks, rank, moeep.UniqueId.fromhex(uid), num_experts=E_PER_RANK * nranks,
                              hidden=H, max_tokens_per_rank=M, max_topk=K, backend="host",
                              enable_shrink=True, timeout_ms=5000)
    x, idx = inputs(rank, nranks)
    comm.dispatch(to_bfloat16(x), idx)
    if rank == 1:
        time.sleep(1)  # its last chunks reach the others first
        os._exit(0)
    try:
        comm.dispatch(to_bfloat16(x), idx)
        print("FAIL rank %d: the dispatch that meets the death returned" % rank, flush=True)
        return 1
    except moeep.MoeepError as e:
        if "rank 1" not in str(e):
            print("FAIL rank %d: the error does not name rank 1: %s" % (rank, e), flush=True)
            return 1
    if comm.dead_ranks != ([], 0):
        print("FAIL rank %d: dead_ranks before the shrink: %r" % (rank, comm.dead_ranks), flush=True)
        return 1
    dead = comm.shrink()
    if dead != [1]:
        print("FAIL rank %d: shrink returned %r, not [1]" % (rank, dead), flush=True)
        return 1
    if comm.dead_ranks != ([1], 1):
        print("FAIL rank %d: dead_ranks after the shrink: %r, not ([1], 1)" % (rank, comm.dead_ranks), flush=True)
        return 1
    d = comm.dispatch(to_bfloat16(x), idx)
    # Rows this rank receives: every survivor's tokens with an expert here,
    # none from rank 1 (gone), in source order.
    want = 0
    for src in range(nranks):
        if src == 1:
            continue
        _, sidx = inputs(src, nranks)
        for t in range(M):
            want += any(e // E_PER_RANK == rank for e in sidx[t])
    if d.num_recv != want:
        print("FAIL rank %d: %d rows after the shrink, want %d" % (rank, d.num_recv, want), flush=True)
        return 1
    print("ok   rank %d: the dispatch failed naming rank 1, shrink() = [1], %d rows after it\n" % (rank, want),
          end="", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--uid", default="")
    args = ap.parse_args()
    if args.rank >= 0:
        sys.exit(rank_main(args.rank, args.ranks, args.uid))
    uid = moeep.UniqueId.create().hex()
    cmd = [sys.executable, os.path.abspath(__file__), "--ranks", str(args.ranks), "--uid", uid]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)]) for r in range(args.ranks)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(124)
    ok = all(c == 0 for c in codes)
    print("test_shrink: %s (exit codes %s)" % ("all checks passed" if ok else "FAILED", codes))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
