#!/usr/bin/env bash
# FIR's recovery claim (issue 14, FIR §4.4 and §5.3): recovery after a real kill mid-run (the
# paper's "unplanned crash") grows with the data written since the last index leaf checkpoint,
# not with the pool size. Release build, pools in /dev/shm (PMTX_POOL_DIR), removed afterwards.
#
# Experiment 1 (sizes): pools of 1, 2 and 4 GiB (--pool-size), loaded with 250,000 YCSB records
#   per GiB by 2 threads, then 16-op YCSB-A until a SIGKILL a few seconds into the run; FIR
#   checkpoints every second (its default). fir vs zen vs falcon (DRAM indexes; falcon also with
#   PM indexes). `pmtx recover` then recovers each pool ROUNDS times (the first is the recovery of
#   the killed pool) and the line gives the time until transactions can run, its phases and, for
#   FIR, the versions redone (the work since the checkpoint) and the slots of PM the scan read.
# Experiment 2 (work since the checkpoint): one pool size (WORK_POOL, default 2G, 250,000 records);
#   FIR's checkpointer runs every CKPT_MS (default 4000) ms from the pool's creation, and the kill
#   lands WAIT seconds after the first checkpoint, for each WAIT in WAITS (default "0.25 0.5 1 2").
#
#   scripts/fir_recovery.sh [sizes|work|all]   (default all)
#     CONFIGS (env): ENGINE:INDEX list for experiment 1 (default "fir:dram zen:dram falcon:dram falcon:pm")
#     SIZES (env): pool sizes in GiB for experiment 1 (default "1 2 4")
#     ROUNDS (env): recoveries per pool (default 2)
#
# The machine the numbers come from matters: on a shared 2-core machine other processes'
# builds stretch every phase; compare engines within one run of this script.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in sizes | work | all) ;; *) echo "usage: $0 [sizes|work|all]" >&2; exit 2 ;; esac
configs=${CONFIGS:-"fir:dram zen:dram falcon:dram falcon:pm"}
sizes=${SIZES:-"1 2 4"}
rounds=${ROUNDS:-2}
dir=${PMTX_POOL_DIR:-/dev/shm}
cargo build --release --quiet --bin pmtx
pmtx=target/release/pmtx

# Runs the bench on a new pool until it is killed after $1 seconds (or ends on its own: then
# says so). Remaining arguments go to the bench.
run_and_kill() {
    local after=$1 pool=$2
    shift 2
    rm -f "$pool"
    "$pmtx" bench ycsb --threads 2 --duration 600 --warmup 0 --ops-per-txn 16 --pool "$pool" "$@" \
        >/dev/null 2>"$pool.err" &
    local bench=$!
    sleep "$after"
    if kill -KILL "$bench" 2>/dev/null; then
        wait "$bench" 2>/dev/null || true
        killed=yes
    else
        wait "$bench" 2>/dev/null || true
        killed="no, the bench ended first: $(grep -m1 error "$pool.err" | cut -c1-120 || true)"
    fi
    rm -f "$pool.err"
}

# Recovers $2 (engine $1) ROUNDS times; prints one line per round after the prefix $3.
recover_rounds() {
    local e=$1 pool=$2 prefix=$3
    for run in $(seq 1 "$rounds"); do
        out=$("$pmtx" recover "$pool" --engine "$e" 2>/dev/null)
        ready=$(echo "$out" | grep -E "^ *total" | tr -s " " | cut -d" " -f6 || true)
        phases=$(echo "$out" \
            | grep -E "^  (catalog|index recovery|replay|heap scan|scan regions|page table|checkpoint load|checkpoint read|checkpoint install|undo/redo scan|redo|update_map|secondary indexes)" \
            | tr -s " " | sed 's/^ //' | paste -sd ";" - || true)
        fact() { echo "$out" | grep -E "^  $1 " | tr -s " " | rev | cut -d" " -f1 | rev || true; }
        extra=""
        if [ "$e" = fir ]; then
            extra="; redone $(fact 'versions redone'); slots read $(fact 'region slots read'); from checkpoint $(fact 'entries from the checkpoint')"
        fi
        echo "$prefix run $run: ready ${ready} ms$extra; $phases"
    done
}

if [ "$what" != work ]; then
    echo "== experiment 1: recovery after a kill, by pool size"
    for gib in $sizes; do
        records=$((gib * 250000))
        kill_after=$((records / 400000 + 3))
        for config in $configs; do
            e=${config%%:*}
            index=${config##*:}
            cc=occ
            [ "$e" = fir ] && cc=mvto # FIR runs MVTO only (§4.2.1)
            pool="$dir/pmtx-firrec-$e-$index-$gib.pool"
            run_and_kill "$kill_after" "$pool" --engine "$e" --cc "$cc" --index "$index" \
                --records "$records" --pool-size "${gib}G"
            recover_rounds "$e" "$pool" "$e index=$index pool=${gib}GiB records=$records killed=$killed"
            rm -f "$pool"
        done
    done
fi

if [ "$what" != sizes ]; then
    pool_size=${WORK_POOL:-2G}
    ckpt_ms=${CKPT_MS:-4000}
    echo "== experiment 2: FIR recovery after a kill, by the work since the checkpoint (pool $pool_size)"
    for wait_s in ${WAITS:-"0.25 0.5 1 2"}; do
        pool="$dir/pmtx-firrec-work.pool"
        after=$(echo "$ckpt_ms / 1000 + $wait_s" | bc -l)
        run_and_kill "$after" "$pool" --engine fir --cc mvto --records 250000 \
            --pool-size "$pool_size" --fir-checkpoint-ms "$ckpt_ms"
        recover_rounds fir "$pool" "fir ${wait_s}s after the checkpoint killed=$killed"
        rm -f "$pool"
    done
fi
