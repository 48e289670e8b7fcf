#!/usr/bin/env python3
"""The target tables from the logs of tests/gpu/issue_tables.sh.

    issue_tables.py LOGS RANKS MACHINE COMMIT

LOGS/ht.log: ep_bench_gpu's JSON lines ({"what": ..., "us": ...}).
LOGS/ll.log: gpu_ll_test --bench's lines; LOGS/ll_kernels.log: the library's
INFO lines of EP_CUDA_LL_TIMING (each communicator logs its kernel times when
destroyed: one group per benchmark case, in the order the cases ran).
Prints markdown: each figure, its target, met or not. Figures are medians
(ep_bench_gpu: 20 runs after an L2 flush; gpu_ll_test: the slower rank).
"""
import json
import os
import re
import sys

# (case, ep_bench_gpu's name at an SM count S, target us at <= 32 SMs, DeepEP
# V1 at 24 / 32 / 64 SMs on 2 x H200); the targets are the library's EP2
# high-throughput targets, DeepEP V1's figures were measured on the same
# 2 x H200 machine on 2026-11-30 (best-tuned chunk sizes; docs/PERFORMANCE.md).
HT_ROWS = [
    ("dispatch BF16, 8192 tokens", "dispatch bf16 T=8192 sms={S} (cached)", 390, "659 / 507 / 410"),
    ("dispatch FP8, 8192 tokens", "dispatch fp8 T=8192 sms={S} (cached)", 210, "456 / 354 / 230"),
    ("combine BF16, 8192 tokens", "combine bf16 T=8192 sms={S} (after bf16)", 420, "789 / 615 / 413"),
    ("dispatch BF16, 4096 tokens", "dispatch bf16 T=4096 sms={S} (cached)", 205, "344 / - / -"),
    ("dispatch FP8, 4096 tokens", "dispatch fp8 T=4096 sms={S} (cached)", 115, "246 / - / -"),
    ("combine BF16, 4096 tokens", "combine bf16 T=4096 sms={S} (after bf16)", 225, "407 / - / -"),
    ("dispatch BF16, 8192 tokens, new routing", "dispatch bf16 T=8192 sms={S} (new routing)", None, ""),
    ("dispatch BF16, 4096 tokens, new routing", "dispatch bf16 T=4096 sms={S} (new routing)", None, ""),
]
NCCL = {"BF16": "nccl all-to-all bf16 bytes T={T}", "FP8": "nccl all-to-all fp8 bytes T={T}"}


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


EP = "EP2"  # the EP of the run (main), named in each verdict: the targets are EP2's


def verdict(v, target):
    if v is None or target is None:
        return ""
    return (f"met at {EP}" if v <= target else f"missed by {100 * (v - target) / target:.1f}% at {EP}")


def ht_table(path, ranks):
    if not os.path.exists(path):
        return []
    us = {}
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            try:
                j = json.loads(line)
                us[j["what"]] = j["us"]
            except (ValueError, KeyError):
                pass
    out = [f"### High throughput, EP{ranks} (hidden 7168, top-8 of 256), us", "",
           "| case | 24 SMs | 32 SMs | 64 SMs | NCCL all-to-all, same bytes | DeepEP V1, EP2: 24 / 32 / 64 SMs | "
           "target, <= 32 SMs | at 32 SMs |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, key, target, deepep in HT_ROWS:
        at = [us.get(key.format(S=s)) for s in (24, 32, 64)]
        tokens = 8192 if "8192" in name else 4096
        kind = "FP8" if "FP8" in name else "BF16"
        nccl = us.get(NCCL[kind].format(T=tokens)) if name.startswith("dispatch") else None
        out.append(f"| {name} | {fmt(at[0])} | {fmt(at[1])} | {fmt(at[2])} | {fmt(nccl)} | {deepep} | "
                   f"{'-' if target is None else '<= %d' % target} | {verdict(at[1], target)} |")
    lay = [us.get(f"layout T={t}") for t in (4096, 8192)]
    out.append(f"| layout, 4096 / 8192 tokens | {fmt(lay[0])} / {fmt(lay[1])} | | | | - / 61 (24 SMs) | "
               f"<= 25 (8192) | {verdict(lay[1], 25)} |")
    return out


def kernel_groups(path):
    """Per benchmark case: {(rank, kind): median us}, in the order the cases ran."""
    groups, cur = [], {}
    if not os.path.exists(path):
        return groups
    pat = re.compile(r"rank (\d+) low-latency kernel time, (.+?): median ([\d.]+) us")
    for line in open(path, errors="replace"):
        m = pat.search(line)
        if not m:
            continue
        key = (int(m.group(1)), m.group(2))
        if key in cur:  # a (rank, kind) already seen: the next case's communicators
            groups.append(cur)
            cur = {}
        cur[key] = float(m.group(3))
    if cur:
        groups.append(cur)
    return groups


def slowest(group, kind):
    vals = [v for (r, k), v in group.items() if k == kind]
    return max(vals) if vals else None


def ll_table(path, kpath, ranks):
    if not os.path.exists(path):
        return []
    layer = {}
    events = {}
    pat = re.compile(r"LL EP\d+ tokens (\d+)( split)?: slower rank: dispatch median ([\d.]+) us, combine median "
                     r"([\d.]+) us, ([\d.]+) us per layer")
    half = re.compile(r"LL EP\d+ rank (\d+) tokens 128 split:.*send half ([\d.]+) us, receive half ([\d.]+) us")
    halves = []
    for line in open(path, errors="replace"):
        m = pat.search(line)
        if m:
            case = (int(m.group(1)), bool(m.group(2)))
            events[case] = (float(m.group(3)), float(m.group(4)))
            layer[case] = float(m.group(5))
        m = half.search(line)
        if m:
            halves.append((float(m.group(2)), float(m.group(3))))
    groups = kernel_groups(kpath)
    cases = [(128, False), (128, True), (1, False)]  # the order of benchStandard
    kern = dict(zip(cases, groups)) if len(groups) == len(cases) else {}
    fused, send, recv, comb = ("dispatch (fused or send half)", "dispatch (fused or send half)",
                               "dispatch receive half", "combine (fused or send half)")
    k128 = kern.get((128, False), {})
    ks = kern.get((128, True), {})
    k1 = kern.get((1, False), {})
    ev128 = events.get((128, False), (None, None))
    ev_half = (max(h[0] for h in halves), max(h[1] for h in halves)) if halves else (None, None)
    out = [f"### Low latency, EP{ranks} (128 tokens per rank, hidden 7168, top-8 of 288, FP8 wire), us", "",
           "Kernel time: the kernels' own clocks (EP_CUDA_LL_TIMING), median of the calls they timed, slower rank.",
           "Events: CUDA events around each call in a graph of 100 layers, median, slower rank.", "",
           "| case | kernel time | events | DeepEP V1, EP2 | target | kernel time against it |",
           "| --- | --- | --- | --- | --- | --- |"]
    rows = [
        ("dispatch, FP8", slowest(k128, fused), ev128[0], "28-32", 15),
        ("combine, BF16", slowest(k128, comb), ev128[1], "39-40", 20),
        ("dispatch send half", slowest(ks, send), ev_half[0], "20", 8),
        ("dispatch receive half", slowest(ks, recv), ev_half[1], "8", 5),
    ]
    for name, k, e, deepep, target in rows:
        out.append(f"| {name} | {fmt(k)} | {fmt(e)} | {deepep} | <= {target} | {verdict(k, target)} |")
    d1, c1 = slowest(k1, fused), slowest(k1, comb)
    both = d1 + c1 if d1 is not None and c1 is not None else None
    out.append(f"| 1 token per rank: dispatch + combine | {fmt(both)} ({fmt(d1)} + {fmt(c1)}) | | - | | |")
    l1 = layer.get((1, False))
    out.append(f"| 1 token per rank: layer in a graph (replay time / layers) | | {fmt(l1)} | - | <= 12 | "
               f"{verdict(l1, 12)} (replay) |")
    out.append(f"| 128 tokens: layer in a graph, unsplit / split | | {fmt(layer.get((128, False)))} / "
               f"{fmt(layer.get((128, True)))} | | | |")
    if not kern:
        out += ["", f"(kernel times not matched to the cases: {len(groups)} groups of INFO lines, 3 expected)"]
    return out


def main():
    global EP
    logs, ranks, machine, commit = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    EP = f"EP{ranks}"
    print(f"## Target tables: {machine}, EP{ranks}, commit {commit}")
    if ranks == "1":
        print("\nEP1: every row stays on its GPU (no link); the targets are stated for EP2 on two GPUs.")
    for table in (ht_table(os.path.join(logs, "ht.log"), ranks),
                  ll_table(os.path.join(logs, "ll.log"), os.path.join(logs, "ll_kernels.log"), ranks)):
        if table:
            print()
            print("\n".join(table))


if __name__ == "__main__":
    main()
