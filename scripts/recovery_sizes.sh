#!/usr/bin/env bash
# Recovery time after a real kill mid-run (issue 17; docs/ARCHITECTURE.md "Recovery"), for pools
# of about 0.5, 1, 2 and 4 GiB: falcon with PM indexes, falcon with DRAM indexes, zen, fir (its
# background checkpointer on, every second by default: recovery loads the last index leaf
# checkpoint and redoes what was written after it). Each pool
# is written by 2 threads (YCSB load, then 16-op YCSB-A) and the bench is SIGKILLed a few seconds
# into the run (after the load for these sizes on the reference machine; a kill that lands in the
# load is still a kill mid-write). `pmtx recover` then recovers it ROUNDS times (the first is the
# recovery of the killed pool) and prints the phases: "total (transactions can run)" is the time
# until the first transaction can run; "background work pending, done" is when the lazy heap
# sweep of PM-index tables finished. Pools go to /dev/shm and are removed afterwards.
#
#   scripts/recovery_sizes.sh [CONFIGS] [RECORDS...]
#     CONFIGS: space-separated ENGINE:INDEX (default "falcon:pm falcon:dram zen:dram fir:dram")
#     RECORDS: default 250000 500000 1000000 2000000 (pools of about 0.5, 1, 2 and 4 GiB)
#     ROUNDS (env): recoveries per pool, default 3
#     CARGO_TARGET_DIR (env): where cargo builds (default target); NO_BUILD=1: use the binary there
#     RATE (env): records loaded per second, default 400000 (the kill comes 3 s after the load)
#     MODE (env): kill (default: SIGKILL mid-run, the paper's unplanned crash) or clean (the bench
#       runs for the same time and shuts down cleanly)
set -euo pipefail
cd "$(dirname "$0")/.."
configs=${1:-"falcon:pm falcon:dram zen:dram fir:dram"}
shift || true
sizes=${*:-"250000 500000 1000000 2000000"}
rounds=${ROUNDS:-3}
mode=${MODE:-kill}
case "$mode" in kill | clean) ;; *) echo "MODE must be kill or clean, not $mode" >&2; exit 2 ;; esac
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet
pmtx=${CARGO_TARGET_DIR:-target}/release/pmtx
dir=${PMTX_POOL_DIR:-/dev/shm}
for records in $sizes; do
    # Load time grows with the records (about 400k per second with 2 threads, release build, on
    # an idle machine; set RATE lower on a loaded one, or the kill lands in the load).
    kill_after=$(( records / ${RATE:-400000} + 3 ))
    for config in $configs; do
        e=${config%%:*}
        index=${config##*:}
        pool="$dir/pmtx-recovery-$e-$index-$records.pool"
        rm -f "$pool"
        cc=occ
        [ "$e" = fir ] && cc=mvto # FIR runs MVTO only (§4.2.1)
        if [ "$mode" = clean ]; then
            # The load, then YCSB-A until about the time a kill would land; a clean shutdown.
            "$pmtx" bench ycsb --engine "$e" --cc "$cc" --index "$index" --records "$records" \
                --threads 2 --duration 2 --warmup 0 --ops-per-txn 16 --pool "$pool" >/dev/null 2>&1
        else
            "$pmtx" bench ycsb --engine "$e" --cc "$cc" --index "$index" --records "$records" \
                --threads 2 --duration 600 --warmup 0 --ops-per-txn 16 --pool "$pool" >/dev/null 2>&1 &
            bench=$!
            sleep "$kill_after"
            kill -KILL "$bench" 2>/dev/null || true
            wait "$bench" 2>/dev/null || true
        fi
        size=$(du -m --apparent-size "$pool" | cut -f1)
        for run in $(seq 1 "$rounds"); do
            out=$("$pmtx" recover "$pool" --engine "$e" 2>/dev/null)
            ready=$(echo "$out" | grep -E "^ *total" | tr -s " " | cut -d" " -f6 || true)
            phases=$(echo "$out" \
                | grep -E "^  (catalog|index recovery|replay|heap scan|page table|checkpoint load|checkpoint read|index build|checkpoint headers|undo/redo scan|redo|update_map|secondary indexes)" \
                | tr -s " " | sed 's/^ //' | paste -sd ";" - || true)
            background=$(echo "$out" | grep -E "background work pending" | tr -s " " | cut -d" " -f6 || true)
            echo "$e index=$index records=$records pool=${size}MiB $mode run $run: ready ${ready} ms; background done ${background:-none} ms; $phases"
        done
        rm -f "$pool"
    done
done
