#!/usr/bin/env python3
"""The moeep package on the host backend, ranks as processes, NumPy arrays.

    test_host_ranks.py [--ranks N] [--cases C] [--seed S] [--comm-id]

The parent makes the unique ids (or, with --comm-id, sets EP_COMM_ID and
every rank derives them) and starts N ranks of this script. Every rank draws
the inputs of all ranks from the seed, so it knows what it must receive and
checks every output element against a reference written from SPEC.md:
high-throughput dispatch (exact sizing, capacity sizing, a prepared handle,
a cached re-dispatch, FP8 rows with column-major scales), combine (bias,
weights summed back), layout, low-latency dispatch / combine (BF16 and FP8
wires, split halves), errors with the library's message. Exit 0 when every
rank passed.
"""
import argparse
import os
import random
import subprocess
import sys
import time

import numpy as np

import moeep
from moeep.numeric import from_bfloat16, from_float8_e4m3, to_bfloat16

E_PER_RANK, H, H_FP8, M, K = 3, 208, 80, 12, 3  # H: 2 FP8 blocks, the last partial


class Checks:
    def __init__(self, rank):
        self.rank, self.failed, self.passed = rank, 0, 0

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL rank %d: %s" % (self.rank, what), flush=True)


def inputs(seed, case, src, R):
    """Rank src's tokens of a case: BF16 rows of small integers (sums stay
    exact), ids (some -1, some repeated), weights that are powers of two."""
    rng = np.random.default_rng([seed, case, src])
    E = E_PER_RANK * R
    T = int(rng.integers(0, M + 1)) if src != 1 else 0 if case == 0 else M  # an empty rank, a full one
    idx = rng.integers(0, E, size=(T, K)).astype(np.int64)
    idx[rng.random((T, K)) < 0.2] = -1
    w = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), size=(T, K)).astype(np.float32)
    x = rng.integers(-8, 9, size=(T, H)).astype(np.float32)
    x2 = rng.integers(-8, 9, size=(T, H)).astype(np.float32)
    fp8 = rng.integers(0, 0x7E, size=(T, H_FP8)).astype(np.uint8) | (rng.integers(0, 2, (T, H_FP8)) << 7).astype(
        np.uint8)
    scales = rng.random((T, (H_FP8 + 127) // 128)).astype(np.float32)
    bias = rng.integers(-4, 5, size=(T, H)).astype(np.float32)
    return dict(T=T, idx=idx, w=w, x=x, x2=x2, fp8=fp8, scales=scales, bias=bias)


def received(all_in, rank, R):
    """(src, t) of the rows rank receives, by source rank then token."""
    lo, hi = rank * E_PER_RANK, (rank + 1) * E_PER_RANK
    return [(s, t) for s in range(R) for t in range(all_in[s]["T"])
            if any(lo <= e < hi for e in all_in[s]["idx"][t])]


def check_ht(comm, fp8_comm, all_in, rank, R, case, check):
    mine = all_in[rank]
    rows = received(all_in, rank, R)
    n = len(rows)
    first = rank * E_PER_RANK
    align = 4 if case % 2 else 0
    ref_x = np.array([all_in[s]["x"][t] for s, t in rows]).reshape(n, H)
    ref_idx = np.array([[e - first if first <= e < first + E_PER_RANK else -1 for e in all_in[s]["idx"][t]]
                        for s, t in rows], np.int64).reshape(n, K)
    ref_w = np.array([[all_in[s]["w"][t][k] if ref_idx[i][k] >= 0 else 0 for k in range(K)]
                      for i, (s, t) in enumerate(rows)], np.float32).reshape(n, K)
    per_expert = [int((ref_idx == e).sum()) for e in range(E_PER_RANK)]
    if align:
        per_expert = [(c + align - 1) // align * align for c in per_expert]

    # Exact sizing: the package allocates n rows.
    d = comm.dispatch(to_bfloat16(mine["x"]), mine["idx"], topk_weights=mine["w"], expert_alignment=align)
    check(d.num_recv == n, "case %d: num_recv %s, expected %d" % (case, d.num_recv, n))
    check(d.recv_x.shape == (n, H) and np.array_equal(from_bfloat16(d.recv_x), ref_x),
          "case %d: recv_x rows by source rank then token" % case)
    check(np.array_equal(d.recv_topk_idx, ref_idx), "case %d: recv_topk_idx local ids" % case)
    check(np.array_equal(d.recv_topk_weights, ref_w), "case %d: recv_topk_weights" % case)
    check(list(d.recv_tokens_per_expert) == per_expert, "case %d: recv_tokens_per_expert %s, expected %s" % (
        case, list(d.recv_tokens_per_expert), per_expert))

    # Combine: each rank returns its rows times (rank + 1); the home rank sums.
    y = to_bfloat16(ref_x * (rank + 1))
    c = comm.combine(y, d.handle, bias=to_bfloat16(mine["bias"]), recv_topk_weights=d.recv_topk_weights)
    lo = [set(e // E_PER_RANK for e in mine["idx"][t] if e >= 0) for t in range(mine["T"])]
    ref_out = np.array([mine["x"][t] * sum(r + 1 for r in lo[t]) + mine["bias"][t] for t in range(mine["T"])],
                       np.float32).reshape(mine["T"], H)
    check(np.array_equal(from_bfloat16(c.out), from_bfloat16(to_bfloat16(ref_out))), "case %d: combine out" % case)
    ref_back = np.where(mine["idx"] >= 0, mine["w"], 0).astype(np.float32)
    check(np.array_equal(c.out_topk_weights, ref_back), "case %d: combine out_topk_weights" % case)

    # A cached re-dispatch of new rows with the same routing.
    d2 = comm.dispatch(to_bfloat16(mine["x2"]), handle=d.handle)
    ref_x2 = np.array([all_in[s]["x2"][t] for s, t in rows]).reshape(n, H)
    check(d2.handle is d.handle and np.array_equal(from_bfloat16(d2.recv_x), ref_x2),
          "case %d: cached re-dispatch rows" % case)
    d.handle.close()
    try:
        comm.combine(y, d.handle)
        check(False, "case %d: a closed handle must be refused" % case)
    except ValueError:
        check(True, "")

    # Capacity sizing: no host count; unused rows get -1 ids.
    cap = R * M
    d = comm.dispatch(to_bfloat16(mine["x"]), mine["idx"], no_host_sync=True)
    check(d.recv_x.shape == (cap, H) and int(d.num_recv[0]) == n, "case %d: capacity num_recv %s" % (
        case, d.num_recv))
    check(np.array_equal(from_bfloat16(d.recv_x[:n]), ref_x) and np.array_equal(d.recv_topk_idx[:n], ref_idx)
          and bool((d.recv_topk_idx[n:] == -1).all()), "case %d: capacity rows and unused -1 ids" % case)
    check(d.handle.num_recv == n, "case %d: handle.num_recv on the host backend" % case)
    d.handle.close()

    # A prepared handle knows the count before any row moves.
    with comm.prepare(mine["idx"]) as h:
        check(h.num_recv == n, "case %d: prepare num_recv %s" % (case, h.num_recv))
        out = np.zeros((n, H), np.uint16)
        d = comm.dispatch(to_bfloat16(mine["x"]), mine["idx"], handle=h, recv_x=out)
        check(d.recv_x is out and np.array_equal(from_bfloat16(out), ref_x), "case %d: prepared dispatch" % case)

    # FP8 rows with column-major scales, carried unchanged.
    nb = (H_FP8 + 127) // 128
    scales = np.asfortranarray(mine["scales"])
    d = fp8_comm.dispatch(mine["fp8"], mine["idx"], x_scales=scales)
    ref_fp8 = np.array([all_in[s]["fp8"][t] for s, t in rows], np.uint8).reshape(n, H_FP8)
    ref_sc = np.array([all_in[s]["scales"][t] for s, t in rows], np.float32).reshape(n, nb)
    check(np.array_equal(d.recv_x, ref_fp8) and np.array_equal(d.recv_scales, ref_sc),
          "case %d: FP8 rows and scales" % case)
    d.handle.close()

    # Layout of this rank's ids.
    lay = comm.layout(mine["idx"])
    in_rank = np.array([[any(e // E_PER_RANK == r for e in mine["idx"][t] if e >= 0) for r in range(R)]
                        for t in range(mine["T"])], np.uint8).reshape(mine["T"], R)
    check(np.array_equal(lay.is_token_in_rank, in_rank) and
          np.array_equal(lay.tokens_per_rank, in_rank.sum(0).astype(np.int32)), "case %d: layout per rank" % case)
    ids = mine["idx"][mine["idx"] >= 0]
    check(np.array_equal(lay.tokens_per_expert, np.bincount(ids, minlength=E_PER_RANK * R).astype(np.int32)),
          "case %d: layout per expert" % case)


def check_ll(comm, all_in, rank, R, case, wire, split, check):
    mine = all_in[rank]
    first = rank * E_PER_RANK
    slots = R * M
    d = comm.ll_dispatch(to_bfloat16(mine["x"]), mine["idx"], topk_weights=mine["w"], wire=wire,
                         send_only=split)
    if split:
        comm.ll_complete(d.handle)
    what = "case %d %s%s" % (case, wire, " split" if split else "")
    y = np.zeros((E_PER_RANK, slots, H), np.float32)
    for e in range(E_PER_RANK):
        arrivals = [(s, t) for s in range(R) for t in range(all_in[s]["T"]) if first + e in all_in[s]["idx"][t]]
        count = int(d.recv_count[e])
        check(count == len(arrivals), "%s: recv_count[%d] %d, expected %d" % (what, e, count, len(arrivals)))
        if count != len(arrivals):
            continue
        check(list(d.recv_src[e][:count]) == [s * M + t for s, t in arrivals], "%s: recv_src[%d]" % (what, e))
        want = np.array([all_in[s]["x"][t] for s, t in arrivals], np.float32).reshape(count, H)
        if wire == "bfloat16":
            got = from_bfloat16(d.recv_x[e][:count])
            check(np.array_equal(got, want), "%s: rows of expert %d" % (what, e))
        elif count > 0:
            scales = d.recv_scales[e][:, :count].T  # [slots, blocks]: token index fastest in the library
            amax = np.array([np.abs(want[:, b * 128:(b + 1) * 128]).max(axis=1) for b in range((H + 127) // 128)],
                            np.float32).T
            ref_scales = np.maximum(amax, np.float32(1e-4)) / np.float32(448)
            check(np.array_equal(scales, ref_scales), "%s: FP8 scales of expert %d" % (what, e))
            deq = from_float8_e4m3(d.recv_x[e][:count]) * np.repeat(scales, 128, axis=1)[:, :H]
            tol = np.abs(want) * 2.0 ** -4 + np.repeat(scales, 128, axis=1)[:, :H] * 2.0 ** -9
            check(bool((np.abs(deq - want) <= tol).all()), "%s: FP8 rows of expert %d within rounding" % (what, e))
        y[e][:count] = want * (first + e + 1)
    out = comm.ll_combine(to_bfloat16(y), d.handle, send_only=split)
    if split:
        comm.ll_complete(d.handle)
    ref = np.zeros((mine["T"], H), np.float64)
    for t in range(mine["T"]):
        for k in range(K):
            e = mine["idx"][t][k]
            if e >= 0:
                ref[t] += float(mine["w"][t][k]) * mine["x"][t] * (e + 1)
    check(np.array_equal(from_bfloat16(out), from_bfloat16(to_bfloat16(ref.astype(np.float32)))),
          "%s: combine out" % what)
    d.handle.close()


def check_errors(comm, rank, check):
    # The same bad call on every rank: refused before any communication, the
    # communicator stays usable.
    bad = np.full((2, K), 10 ** 6, np.int64)
    try:
        comm.dispatch(np.zeros((2, H), np.uint16), bad)
        check(False, "an expert id out of range must raise")
    except moeep.MoeepError as e:
        check(e.name == "epInvalidArgument" and "topk_idx" in e.message, "bad id message: %s" % e)
    try:
        comm.dispatch(np.zeros((2, H + 8), np.uint16), bad)
        check(False, "a row of the wrong width must raise")
    except ValueError as e:
        check("columns" in str(e), "x width message: %s" % e)


def rank_main(args):
    R, rank = args.ranks, args.rank
    check = Checks(rank)
    ids = os.environ.get("MOEEP_TEST_UIDS")
    uids = [moeep.UniqueId.fromhex(h) for h in ids.split(",")] if ids else [None, None]
    common = dict(num_experts=E_PER_RANK * R, max_tokens_per_rank=M, max_topk=K, backend="host", timeout_ms=60000)
    comm = moeep.Communicator(R, rank, uids[0], hidden=H, low_latency=True, **common)
    fp8_comm = moeep.Communicator(R, rank, uids[1], hidden=H_FP8, dispatch_type="float8_e4m3", **common)
    check(comm.rank == rank and comm.size == R and comm.first_local_expert == rank * E_PER_RANK
          and comm.num_local_experts == E_PER_RANK, "rank, size and local experts")
    me = comm.peer_info(rank)
    other = comm.peer_info((rank + 1) % R)
    check(me["transport"] == "self" and me["path"] == "self" and me["via_rank"] == -1 and
          (R == 1 or other["transport"] in ("shm", "socket", "ibverbs")), "peer_info: %s / %s" % (me, other))
    try:
        comm.peer_info(R)
        check(False, "peer_info of a rank outside the communicator must fail")
    except moeep.MoeepError as e:
        check("outside" in str(e), "peer_info message: %s" % e)
    for case in range(args.cases):
        all_in = [inputs(args.seed, case, s, R) for s in range(R)]
        check_ht(comm, fp8_comm, all_in, rank, R, case, check)
        check_ll(comm, all_in, rank, R, case, "bfloat16", case % 2 == 1, check)
        check_ll(comm, all_in, rank, R, case, "float8_e4m3", case % 2 == 0, check)
    check_errors(comm, rank, check)
    fp8_comm.close()
    comm.close()
    print("rank %d: %d checks passed, %d failed" % (rank, check.passed, check.failed), flush=True)
    return 1 if check.failed else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--cases", type=int, default=3)
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--comm-id", action="store_true", help="EP_COMM_ID instead of ids made by the parent")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank >= 0:
        return rank_main(args)
    env = dict(os.environ)
    if args.comm_id:
        env["EP_COMM_ID"] = "127.0.0.1:%d" % random.randint(20000, 40000)
        env.pop("MOEEP_TEST_UIDS", None)
    else:
        # This process serves both bootstraps, so it waits for the ranks.
        env["MOEEP_TEST_UIDS"] = ",".join(moeep.UniqueId.create().hex() for _ in range(2))
    cmd = [sys.executable, os.path.abspath(__file__), "--ranks", str(args.ranks), "--cases", str(args.cases),
           "--seed", str(args.seed)]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(args.ranks)]
    deadline, codes = time.time() + 300, []
    for p_ in procs:
        try:
            codes.append(p_.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p_.kill()
            codes.append("timeout")
    ok = all(c == 0 for c in codes)
    print("test_host_ranks %d ranks%s: %s (exit codes %s)" % (
        args.ranks, " EP_COMM_ID" if args.comm_id else "", "PASSED" if ok else "FAILED", codes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
