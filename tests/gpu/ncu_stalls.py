#!/usr/bin/env python3
"""Sums an ncu source page (--page source --print-source sass --csv) by warp
stall reason, lists the instructions with the most samples, and shows how the
executed instructions spread over the kernel's code in 4 KB stretches.

    tests/gpu/ncu_stalls.py REPORT.sass.csv [TOP]
"""
import collections
import csv
import sys


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    header = rows[1]
    data = [r for r in rows[2:] if len(r) >= len(header)]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, h):
        return int(r[col[h]] or 0)

    total = collections.Counter()
    for r in data:
        for h in reasons:
            total[h] += num(r, h)
    n = sum(total.values()) or 1
    executed = [num(r, "Instructions Executed") for r in data]
    print(f"{len(data)} instructions ({16 * len(data)} bytes), "
          f"{sum(1 for e in executed if e)} executed; {n} warp-stall samples")
    for h, v in total.most_common():
        if v:
            print(f"  {h:24s} {v:6d} {100.0 * v / n:5.1f}%")
    print("instructions with the most samples:")
    ranked = sorted(data, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))
    for r in ranked[:top]:
        why = {h[6:]: num(r, h) for h in reasons if num(r, h)}
        print(f"  {num(r, 'Warp Stall Sampling (All Samples)'):5d} {r[0][-6:]} {r[1].strip()[:56]:56s} {why}")
    print("code in 4 KB stretches: instructions executed / 256, no-instruction samples")
    for k in range(0, len(data), 256):
        part = range(k, min(len(data), k + 256))
        ran = sum(1 for i in part if executed[i])
        if ran:
            misses = sum(num(data[i], "stall_no_inst") for i in part)
            print(f"  {16 * k:#08x} {ran:4d} {misses:5d}")


if __name__ == "__main__":
    main()
