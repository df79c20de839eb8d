#!/usr/bin/env python3
"""scripts/gpu/breakdown.py - per-kernel breakdown of one decode step from an Nsight Compute CSV.

remote.sh's `breakdown` step runs bench_cuda_e2e eagerly (DEEPINFER_CUDA_GRAPHS=0: the same
kernels a graph replays) under `ncu --metrics gpu__time_duration.sum --csv` (caches flushed
before each kernel, clocks left alone), a few decode steps after a short prefill. The decode
steps repeat the same kernel sequence, so the last step is the last P kernels, P being the
shortest period with which the tail of the sequence repeats. Prints that step's kernels in order
(duration in microseconds) and a summary per kernel name.

usage: breakdown.py NCU_CSV_LOG [LABEL]
"""
import csv
import sys
from collections import OrderedDict


def load(path):
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    head = rows[0]
    try:
        ci, cn, cm, cv, cu = (head.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
    except ValueError:
        return []
    gi = head.index("Grid Size") if "Grid Size" in head else None
    out = []
    for r in rows[1:]:
        if len(r) <= max(ci, cn, cm, cv) or r[cm] != "gpu__time_duration.sum":
            continue
        v = float(r[cv].replace(",", ""))
        unit = r[cu]
        us = v / 1e3 if unit in ("ns", "nsecond") else v * 1e3 if unit in ("ms", "msecond") else v if unit in ("us", "usecond") else v / 1e3
        name = r[cn].split("(")[0]
        if "<" in name:  # keep template args short
            name = name[: name.index("<")] + "<" + name[name.index("<") + 1 :][:40]
        out.append((int(r[ci]), name, us, r[gi] if gi is not None else ""))
    out.sort()
    return out


def period(names, max_p=4000):
    n = len(names)
    for p in range(20, min(max_p, n // 2) + 1):
        if names[n - p :] == names[n - 2 * p : n - p]:
            return p
    return None


def main():
    ks = load(sys.argv[1])
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    if not ks:
        print("breakdown: no kernel timings in", sys.argv[1])
        return 1
    names = [k[1] for k in ks]
    p = period(names)
    if not p:
        print("breakdown: no repeating decode step found among %d kernels" % len(ks))
        return 1
    step = ks[-p:]
    total = sum(k[2] for k in step)
    print("== one step %s: %d kernels, %.1f us summed (kernel durations, caches flushed)" % (label, p, total))
    for i, (_, name, us, grid) in enumerate(step):
        print("  %3d %8.2f  %-60s %s" % (i, us, name[:60], grid))
    agg = OrderedDict()
    for _, name, us, _ in step:
        c, t = agg.get(name, (0, 0.0))
        agg[name] = (c + 1, t + us)
    print("== by kernel %s (count, total us, share)" % label)
    for name, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("  %4d %9.1f %5.1f%%  %s" % (c, t, 100 * t / total, name[:70]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
