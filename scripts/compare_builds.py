#!/usr/bin/env python3
"""Old build against new build, side by side in one session (issue 13's benchmark).

Builds the binary of an older commit (default: 56d4ac6, main before the core-speed work) into its
own target directory and the working tree's into target/release, then runs every case of the
chosen suites with both, interleaved (old, new, new, old, ... so that a drift of the machine hits
both alike), for several rounds. Prints per case and engine the median throughput of each build
with its range, the ratio new/old, the new build's ratio to volatile where the case measures it,
and its 2-thread/1-thread scaling. Where both binaries report it (builds from stop 42 on), also the
CPU time per committed transaction (the whole process: drivers and background threads) and
old/new of it: on a shared or virtualised machine it varies far less than throughput, because
time spent waiting for a core costs no CPU.

    scripts/compare_builds.py [--old REV] [--rounds 3] [--duration 3] [--suite core,protocols]
                              [--only tpcc,16op] [--old-binary PATH] [--new-binary PATH]

Suites:
  core       TPC-C (2 warehouses, full mix, falcon OCC eADR and volatile, 1 and 2 threads);
             YCSB 16 ops/txn, 1 KB records, 50 % whole-record updates, 1 M records, uniform,
             falcon and zen under ADR and eADR; YCSB-A 1 op/txn, 1 M records, theta 0 and 0.99,
             falcon eADR against volatile; DRAM per record after the load.
  protocols  TPC-C, 2 warehouses, 2 threads, falcon and zen under each of the 12 protocols.

Needs only python3, git and cargo. Nothing else should run on the machine meanwhile.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROTOCOLS = ["no-wait", "wait-die", "dl-detect", "to", "occ", "silo", "tictoc", "mvocc",
             "mvto", "mv2pl", "si", "hstore"]
YCSB16 = ["bench", "ycsb", "--records", "1000000", "--field-count", "1", "--field-len", "1024",
          "--ops-per-txn", "16", "--theta", "0", "--threads", "1,2"]


def cases(suites, duration):
    timing = ["--duration", str(duration), "--warmup", "1"]
    out = []
    if "core" in suites:
        out.append(("tpcc 2wh occ eadr", ["bench", "tpcc", "--warehouses", "2", "--threads", "1,2",
                                          "--engine", "falcon", "--cc", "occ", "--domain", "eadr",
                                          "--compare-volatile"] + timing))
        for domain in ["adr", "eadr"]:
            out.append((f"ycsb 16op 1KB {domain}",
                        YCSB16 + ["--engine", "falcon,zen", "--domain", domain] + timing))
        for theta in ["0", "0.99"]:
            out.append((f"ycsb-a 1op theta {theta}",
                        ["bench", "ycsb", "--records", "1000000", "--theta", theta,
                         "--threads", "1,2", "--engine", "falcon", "--domain", "eadr",
                         "--compare-volatile"] + timing))
    if "protocols" in suites:
        for cc in PROTOCOLS:
            out.append((f"tpcc 2thr {cc}",
                        ["bench", "tpcc", "--warehouses", "2", "--threads", "2",
                         "--engine", "falcon,zen", "--cc", cc] + timing))
    return out


def build(rev):
    """Builds `rev` (None: the working tree) and returns its binary's path."""
    if rev is None:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        return os.path.join(ROOT, "target", "release", "pmtx")
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    target = os.path.join(ROOT, "target", f"compare-{sha}")
    binary = os.path.join(target, "release", "pmtx")
    if not os.path.exists(binary):
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tree:
            subprocess.run(["git", "worktree", "add", "--detach", "--quiet", tree, sha],
                           cwd=ROOT, check=True)
            try:
                subprocess.run(["cargo", "build", "--release", "--quiet", "--target-dir", target],
                               cwd=tree, check=True)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT,
                               check=True)
    return binary


def run(binary, args):
    """Runs one case; returns {(engine, threads): row} from its JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        result = subprocess.run([binary] + args + ["--json", f.name], capture_output=True,
                                text=True)
        if result.returncode != 0:
            sys.exit(f"{binary} {' '.join(args)} failed:\n{result.stderr}")
        rows = json.load(open(f.name))
    return {(r["engine"], r["threads"]): r for r in rows}


def fmt_range(values):
    return f"{statistics.median(values):>9,.0f} [{min(values):,.0f}–{max(values):,.0f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", default="56d4ac6")
    parser.add_argument("--old-binary", help="an already built old binary (no build of --old)")
    parser.add_argument("--new-binary",
                        help="an already built new binary (no build of the working tree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3)
    parser.add_argument("--suite", default="core")
    parser.add_argument("--only", default="",
                        help="comma-separated parts of case names: run only the cases whose name "
                             "contains one of them (e.g. tpcc)")
    args = parser.parse_args()
    if args.rounds < 1 or args.duration <= 0:
        sys.exit("--rounds must be at least 1 and --duration positive")
    suites = set(args.suite.split(","))
    unknown = suites - {"core", "protocols"}
    if unknown:
        sys.exit(f"unknown suite(s): {', '.join(sorted(unknown))} (core, protocols)")
    only = [part for part in args.only.split(",") if part]

    def chosen(duration):
        return [(n, a) for n, a in cases(suites, duration)
                if not only or any(part in n for part in only)]

    if not chosen(args.duration):
        sys.exit(f"--only {args.only}: no case of suite(s) {args.suite} matches")
    binaries = {"old": args.old_binary or build(args.old),
                "new": args.new_binary or build(None)}
    print(f"old = {args.old_binary or args.old}, new = {args.new_binary or 'working tree'}; {args.rounds} rounds of {args.duration} s, "
          f"interleaved; machine: {os.cpu_count()} CPUs", flush=True)
    tput = {}  # (case, engine, threads, build) -> [tx/s]
    cpu = {}  # (case, engine, threads, build) -> [CPU µs per committed transaction]
    dram = {}  # (case, engine, build) -> [bytes per record]
    order = ["old", "new"]
    for rnd in range(args.rounds):
        for name, case_args in chosen(args.duration):
            for build_name in order:
                rows = run(binaries[build_name], case_args)
                for (engine, threads), row in rows.items():
                    tput.setdefault((name, engine, threads, build_name), []).append(
                        row["throughput_tps"])
                    if row.get("cpu_us_per_txn") is not None:
                        cpu.setdefault((name, engine, threads, build_name), []).append(
                            row["cpu_us_per_txn"])
                    per_record = row.get("params", {}).get("dram_bytes_per_record_after_load")
                    if per_record is not None:
                        dram.setdefault((name, engine, build_name), []).append(per_record)
            order.reverse()
        print(f"round {rnd + 1} done", file=sys.stderr, flush=True)
    print(f"{'case':<22} {'engine':<9} {'thr':>3}  {'old tx/s [range]':>26}  "
          f"{'new tx/s [range]':>26}  {'new/old':>7}  {'new ×vol':>8}  {'new 2t/1t':>9}  "
          f"{'old cpu µs/tx':>13}  {'new cpu µs/tx':>13}  {'cpu old/new':>11}")
    keys = sorted({(c, e, t) for (c, e, t, _) in tput},
                  key=lambda k: ([n for n, _ in cases(suites, 1)].index(k[0]), k[1], k[2]))
    for case, engine, threads in keys:
        old, new = tput.get((case, engine, threads, "old")), tput.get((case, engine, threads, "new"))
        if not old or not new:
            continue
        ratio = statistics.median(new) / statistics.median(old)
        vol = tput.get((case, "volatile", threads, "new"))
        vs_vol = (f"{statistics.median(new) / statistics.median(vol):.2f}"
                  if vol and engine != "volatile" else "")
        one = tput.get((case, engine, 1, "new"))
        scaling = (f"{statistics.median(new) / statistics.median(one):.2f}"
                   if threads == 2 and one else "")
        old_cpu = cpu.get((case, engine, threads, "old"))
        new_cpu = cpu.get((case, engine, threads, "new"))
        cpu_cols = [f"{statistics.median(v):.1f}" if v else "-" for v in (old_cpu, new_cpu)]
        cpu_ratio = (f"{statistics.median(old_cpu) / statistics.median(new_cpu):.2f}"
                     if old_cpu and new_cpu else "-")
        print(f"{case:<22} {engine:<9} {threads:>3}  {fmt_range(old):>26}  {fmt_range(new):>26}  "
              f"{ratio:>7.2f}  {vs_vol:>8}  {scaling:>9}  {cpu_cols[0]:>13}  {cpu_cols[1]:>13}  "
              f"{cpu_ratio:>11}")
    for (case, engine, build_name), values in sorted(dram.items()):
        print(f"DRAM per record after load, {case}, {engine}, {build_name}: "
              f"{statistics.median(values):.1f} B")


if __name__ == "__main__":
    main()
