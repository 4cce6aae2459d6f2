#!/usr/bin/env python3
"""Built binaries side by side on one bench command, interleaved (issue 13's way of comparing).

    scripts/ab_binaries.py OUTDIR ROUNDS NAME=BINARY [NAME=BINARY ...] -- BENCH ARGS...

Runs `BINARY BENCH ARGS... --json OUTDIR/NAME-ROUND.json` for every binary in every round,
reversing the order each round so that a drift of the machine hits all alike. Prints per engine,
thread count and binary the median throughput with its range, the median CPU time per committed
transaction (binaries from stop 42 on report it), and the per-round ("paired") ratio of each
binary's throughput to the first one's: on a noisy machine the paired ratios of back-to-back
runs say more than the medians. With `--compare-volatile` it also prints, per binary and round,
the engine's throughput over volatile's in the same run and volatile's CPU per transaction over
the engine's. Example:

    scripts/ab_binaries.py /tmp/ab 3 old=/tmp/pmtx-old new=target/release/pmtx -- \\
        bench ycsb --engine mmdb --records 1000000 --threads 1,2 --duration 5
"""
import json
import os
import statistics
import subprocess
import sys

from compare_builds import fmt_range


def main():
    if "--" not in sys.argv or sys.argv.index("--") < 4:
        sys.exit(__doc__)
    split = sys.argv.index("--")
    out, rounds = sys.argv[1], int(sys.argv[2])
    binaries = [arg.split("=", 1) for arg in sys.argv[3:split]]
    if rounds < 1 or any(len(b) != 2 for b in binaries):
        sys.exit(__doc__)
    bench_args = sys.argv[split + 1:]
    os.makedirs(out, exist_ok=True)
    results = {}  # (name, engine, threads) -> {round: (tx/s, cpu µs/tx or None)}
    to_volatile = {}  # (name, engine, threads) -> {round: ratio to volatile}
    for rnd in range(rounds):
        for name, binary in binaries if rnd % 2 == 0 else binaries[::-1]:
            path = os.path.join(out, f"{name}-{rnd}.json")
            run = subprocess.run([binary] + bench_args + ["--json", path], capture_output=True,
                                 text=True)
            if run.returncode != 0:
                sys.exit(f"{name}: {binary} failed:\n{run.stderr[-4000:]}")
            for row in json.load(open(path)):
                results.setdefault((name, row["engine"], row["threads"]), {})[rnd] = (
                    row["throughput_tps"], row.get("cpu_us_per_txn"))
                if row["engine"] != "volatile" and row.get("ratio_to_volatile") is not None:
                    to_volatile.setdefault((name, row["engine"], row["threads"]), {})[rnd] = (
                        row["ratio_to_volatile"])
        print(f"round {rnd + 1} of {rounds} done", file=sys.stderr, flush=True)
    first = binaries[0][0]
    print(f"{'engine':<10} {'thr':>3} {'binary':<10} {'tx/s [range]':>30} {'cpu µs/tx':>9}  "
          f"per-round tx/s ÷ {first}")
    for (name, engine, threads), per in sorted(results.items(),
                                               key=lambda k: (k[0][1], k[0][2], k[0][0])):
        tput = [t for t, _ in per.values()]
        cpu = [c for _, c in per.values() if c is not None]
        base = results.get((first, engine, threads), {})
        paired = [per[r][0] / base[r][0] for r in sorted(per) if r in base and base[r][0]]
        cpu_text = f"{statistics.median(cpu):.1f}" if cpu else "-"
        print(f"{engine:<10} {threads:>3} {name:<10} {fmt_range(tput):>30} {cpu_text:>9}  "
              + " ".join(f"{p:.2f}" for p in paired))
    if to_volatile:
        print("\nper round, engine ÷ volatile in the same run: throughput | CPU (volatile's µs/tx "
              "over the engine's)")
    for (name, engine, threads), per in sorted(to_volatile.items(),
                                               key=lambda k: (k[0][1], k[0][2], k[0][0])):
        volatile = results.get((name, "volatile", threads), {})
        own = results[(name, engine, threads)]
        cpu = [volatile[r][1] / own[r][1] for r in sorted(own)
               if r in volatile and volatile[r][1] and own[r][1]]
        print(f"{engine:<10} {threads:>3} {name:<10} "
              + " ".join(f"{per[r]:.2f}" for r in sorted(per))
              + f" (median {statistics.median(per.values()):.2f}) | "
              + (" ".join(f"{c:.2f}" for c in cpu) or "-"))


if __name__ == "__main__":
    main()
