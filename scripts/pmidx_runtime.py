#!/usr/bin/env python3
"""Runtime cost of persistent indexes (issue 17): falcon with PM indexes against falcon with DRAM
indexes and the volatile engine, interleaved rounds, medians and ratios.

Cases (release build, eADR, OCC):
  YCSB-A, 1 op/txn, 1 M records, theta 0 and 0.99, 1 and 2 threads;
  TPC-C, 2 warehouses, full mix, 1 and 2 threads (with PM indexes its secondary indexes,
  customer by last name and order by customer, are in PM too).
Each round runs every case with `--index dram`, then `--index pm` (the order alternates from
round to round, so that a drift of the machine hits both alike); `--compare-volatile` adds the
volatile engine to each run. Prints per case and thread count the median throughput of each
configuration with its range, the ratio PM/DRAM (the issue's goal: >= 0.8) and each one's ratio
to volatile, then the DRAM bytes per record after the YCSB load (from the bench JSON).

    scripts/pmidx_runtime.py [--rounds 3] [--duration 3] [--records 1000000] [--smoke] [--no-build]

--smoke: one round of 1 s at 100 k records (checks the script and the binary, measures nothing).
Needs python3 and cargo; nothing else should run on the machine meanwhile.
"""

import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_builds import fmt_range, run  # noqa: E402  (one runner and format for both scripts)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def cases(records, duration):
    timing = ["--duration", str(duration), "--warmup", "1", "--domain", "eadr", "--cc", "occ",
              "--engine", "falcon", "--threads", "1,2", "--compare-volatile"]
    out = []
    for theta in ["0", "0.99"]:
        out.append((f"ycsb-a theta {theta}",
                    ["bench", "ycsb", "--records", str(records), "--theta", theta] + timing))
    out.append(("tpcc 2wh", ["bench", "tpcc", "--warehouses", "2"] + timing))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-build", action="store_true",
                        help="use the release binary already built (CARGO_TARGET_DIR or target)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.duration, args.records = 1, 1, 100_000
    if args.rounds < 1 or args.duration <= 0 or args.records < 1:
        sys.exit("--rounds and --records must be at least 1 and --duration positive")
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binary = os.path.join(target, "release", "pmtx")
    print(f"{args.rounds} rounds of {args.duration} s, {args.records} YCSB records, interleaved; "
          f"machine: {os.cpu_count()} CPUs", flush=True)
    tput = {}  # (case, config, threads) -> [tx/s]; config: dram, pm, volatile
    dram = {}  # (case, config) -> [DRAM bytes per record after the load]
    order = ["dram", "pm"]
    for rnd in range(args.rounds):
        for name, case_args in cases(args.records, args.duration):
            for index in order:
                rows = run(binary, case_args + ["--index", index])
                for (engine, threads), row in rows.items():
                    config = "volatile" if engine == "volatile" else index
                    tput.setdefault((name, config, threads), []).append(row["throughput_tps"])
                    per_record = row.get("params", {}).get("dram_bytes_per_record_after_load")
                    if per_record is not None:
                        dram.setdefault((name, config), []).append(per_record)
            order.reverse()
        print(f"round {rnd + 1} done", file=sys.stderr, flush=True)
    print(f"{'case':<18} {'thr':>3}  {'DRAM index tx/s [range]':>26}  "
          f"{'PM index tx/s [range]':>26}  {'volatile tx/s [range]':>26}  {'pm/dram':>7}  "
          f"{'dram×vol':>8}  {'pm×vol':>7}")
    names = [n for n, _ in cases(args.records, 1)]
    for name in names:
        for threads in (1, 2):
            d, p, v = (tput.get((name, c, threads)) for c in ("dram", "pm", "volatile"))
            if not d or not p:
                continue
            med = statistics.median
            vol = fmt_range(v) if v else ""
            dv = f"{med(d) / med(v):.2f}" if v else ""
            pv = f"{med(p) / med(v):.2f}" if v else ""
            print(f"{name:<18} {threads:>3}  {fmt_range(d):>26}  {fmt_range(p):>26}  {vol:>26}  "
                  f"{med(p) / med(d):>7.2f}  {dv:>8}  {pv:>7}")
    for (name, config), values in sorted(dram.items()):
        print(f"DRAM per record after load, {name}, {config} index: "
              f"{statistics.median(values):.1f} B")


if __name__ == "__main__":
    main()
