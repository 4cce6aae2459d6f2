#!/usr/bin/env bash
# ArchTM vs PMDK (libpmemobj) on the persistent-object API (issue 15, ArchTM §6): the hash table
# and the B+-tree at 5/50/80 % updates and 1/2 threads, and New-Order and TATP on the key-value
# store, in one run: ROUNDS interleaved rounds (every engine once per round, so drift on a shared
# machine hits both), then the median throughput of each configuration.
#
#   scripts/ptm_compare.sh                 # install libpmemobj-dev if missing, build, run
#   DURATION=2 ROUNDS=3 ENGINES=archtm,dudetx,pmdk scripts/ptm_compare.sh
#   STRUCTURES=hash,tree scripts/ptm_compare.sh   # micro-benchmarks only
#   PMTX=/path/to/pmtx scripts/ptm_compare.sh      # a binary already built with --features pmdk
#
# Installing libpmemobj-dev is scripts/peers.sh's step (apt-get, root or sudo); this script runs
# it with --build-only when the library is missing. Results: a median table on stdout, every
# round's JSON in $OUT (default target/ptm-compare/).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-2}
WARMUP=${WARMUP:-0.5}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1,2}
ENGINES=${ENGINES:-archtm,pmdk}
STRUCTURES=${STRUCTURES:-hash,tree,neworder,tatp}
OUT=${OUT:-target/ptm-compare}

if [ -z "${PMTX:-}" ]; then
    if ! dpkg -s libpmemobj-dev >/dev/null 2>&1; then
        scripts/peers.sh --build-only
    fi
    cargo build --release --features pmdk
    PMTX=target/release/pmtx
fi
mkdir -p "$OUT"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -m), pools in /dev/shm (DRAM, no real PM), ADR"
echo "# $PMTX bench ptm --engine $ENGINES --threads $THREADS --duration $DURATION --repeat $ROUNDS"
for s in ${STRUCTURES//,/ }; do
    case "$s" in
        hash | tree) extra=(--update-pct 5,50,80) ;;
        *) extra=() ;;
    esac
    "$PMTX" bench ptm --engine "$ENGINES" --structure "$s" "${extra[@]}" --threads "$THREADS" \
        --duration "$DURATION" --warmup "$WARMUP" --repeat "$ROUNDS" --domain adr \
        --json "$OUT/$s.json" >"$OUT/$s.txt"
done
python3 - "$OUT" ${STRUCTURES//,/ } <<'EOF'
import json, statistics, sys
out, structures = sys.argv[1], sys.argv[2:]
print(f"\n| workload | threads | engine | median tx/s | p50 µs | rounds | PM B/tx | write ampl. | vs pmdk |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for s in structures:
    runs = json.load(open(f"{out}/{s}.json"))
    groups = {}
    for r in runs:
        key = (r["workload"], r["threads"], r["engine"])
        groups.setdefault(key, []).append(r)
    med = {k: statistics.median(x["throughput_tps"] for x in v) for k, v in groups.items()}
    for (w, t, e), v in sorted(groups.items()):
        pm = statistics.median(x["pm"]["bytes_per_txn"] for x in v)
        p50 = statistics.median(x["latency_us"]["p50"] for x in v)
        was = [x["params"].get("write_amplification") for x in v]
        was = [a for a in was if a is not None]
        wa = f"{statistics.median(was):.2f}" if was else "-"
        base = med.get((w, t, "pmdk"))
        ratio = f"{med[(w, t, e)] / base:.1f}x" if base and e != "pmdk" else ""
        print(f"| {w} | {t} | {e} | {med[(w, t, e)]:,.0f} | {p50:,.0f} | {len(v)} | {pm:.0f} | {wa} | {ratio} |")
EOF
