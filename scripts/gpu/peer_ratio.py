#!/usr/bin/env python3
"""peer_ratio.py - deepinfer against llama.cpp measured in the same device call.

Reads remote.sh's bench.log, where the `e2e` step left bench_cuda_e2e's lines ("decode batch B
... N tok/s", "prefill L ... N tok/s") and the `peer` step llama-batched-bench's table (its S_TG
column: decode tok/s over B concurrent sequences, prompt 128, 128 new tokens) and llama-bench's
pp512 row (prefill of one 512-token prompt) and tg128 row (one sequence's decode: batch 1 again),
and prints one row per workload both measured: deepinfer tok/s, llama.cpp tok/s, and the ratio.
With several runs of a workload (rounds), each side's best is used and the range is shown.

usage: python3 peer_ratio.py BENCH_LOG
"""
import re
import sys


def parse(lines):
    ours = {}   # ("decode", B) / ("prefill", L) -> [tok/s, ...]
    peer = {}
    for line in lines:
        m = re.match(r"\s*(decode batch (\d+)|prefill (\d+) tokens)\s+(\d+)\s+tok/s", line)
        if m:
            key = ("decode", int(m.group(2))) if m.group(2) else ("prefill", int(m.group(3)))
            ours.setdefault(key, []).append(float(m.group(4)))
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        # llama-batched-bench: PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
        if len(cells) == 10 and all(re.fullmatch(r"[0-9.]+", c) for c in cells):
            pp, tg, b = int(cells[0]), int(cells[1]), int(cells[2])
            if pp == 128 and tg == 128:
                peer.setdefault(("decode", b), []).append(float(cells[7]))
            continue
        # llama-bench: ... | test | t/s ("18080.12 ± 30.10"): ppL = prefill of L tokens, tgN = one
        # sequence's decode (a batch-1 number beside batched-bench's)
        if len(cells) >= 3:
            t = re.fullmatch(r"(pp|tg)(\d+)", cells[-2])
            v = re.match(r"([0-9.]+)", cells[-1])
            if t and v:
                key = ("prefill", int(t.group(2))) if t.group(1) == "pp" else ("decode", 1)
                peer.setdefault(key, []).append(float(v.group(1)))
    return ours, peer


def fmt(vals):
    best = max(vals)
    if len(vals) == 1:
        return f"{best:,.0f}"
    return f"{best:,.0f} ({min(vals):,.0f}-{best:,.0f})"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        ours, peer = parse(f)
    keys = sorted(set(ours) & set(peer), key=lambda k: (k[0] != "decode", k[1]))
    if not keys:
        print("peer_ratio: no workload measured by both (run the e2e and peer steps in one call)")
        return 1
    print("| workload | deepinfer tok/s | llama.cpp tok/s | ratio |")
    print("|---|---|---|---|")
    for k in keys:
        what = f"decode, batch {k[1]}" if k[0] == "decode" else f"prefill, {k[1]} tokens"
        print(f"| {what} | {fmt(ours[k])} | {fmt(peer[k])} | {max(ours[k]) / max(peer[k]):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
