#!/usr/bin/env bash
# FIR's recovery claim (issue 14, FIR §4.4 and §5.3): recovery after a real kill mid-run (the
# paper's "unplanned crash") grows with the data written since the last index leaf checkpoint,
# not with the pool size. Release build, pools in /dev/shm (PMTX_POOL_DIR), removed afterwards.
#
# Every kill lands after the load: the bench says on stderr when its load is done ("loaded N
# records"), and the script waits for that line before it counts the run time. (A fixed sleep
# landed in the load at 2 and 4 GiB on a loaded machine, so FIR redid 160k-300k versions of the
# load instead of a run's.)
#
# The scenario (the paper's "unplanned crash", §5.3): the engine is loaded, runs its workload,
# and is terminated at a time set in advance, with FIR's checkpointer at its configured interval
# (the paper keeps "the time interval of checkpoint flush" of its other experiments; here the
# default, 1 s between the end of one checkpoint and the start of the next). So the kill is not
# synchronised with the checkpointer: it lands RUN_S s into the run, at whatever point of the
# checkpoint cycle that is; with RUN_S = 3 at least one checkpoint that started after the load
# has had time to complete unless checkpoints take over 2 s. Every kill counts (none is retried
# or filtered); FIR's report line says which checkpoint recovery loaded (its CT) and how many
# versions it redid, so a kill that came before the first checkpoint after the load shows as a
# large "redone". zen and falcon run the same load, workload and kill time on their own pools of
# the same size. What each recovery does: zen scans every tuple slot of its heap (Zen §3.3.3:
# newest version per key into a fresh index), falcon replays its log and rebuilds DRAM indexes
# from the heap, fir loads the last index leaf checkpoint and redoes the versions after its CT.
#
# Experiment 1 (sizes): pools of 1, 2 and 4 GiB (--pool-size), loaded with 250,000 YCSB records
#   per GiB by 2 threads, then 16-op YCSB-A (2 threads) killed RUN_S seconds (default 3) after
#   the load; FIR checkpoints every second (its default). fir vs zen vs falcon. Each of REPEAT
#   kills (default 1; the rounds interleave the configurations) is recovered ROUNDS times by
#   `pmtx recover` (the first is the recovery of the killed pool, the others recover its image
#   again); each line gives the time until transactions can run, its phases and, for FIR, the
#   versions redone (the work since the checkpoint) and the slots of PM the scan read.
# Experiment 2 (work since the checkpoint, the issue's "fixed pool, varying the work since the
#   checkpoint"): one pool size (WORK_GIB GiB, default 4, 250,000 records per GiB); FIR's
#   background checkpointer is off and the bench takes one checkpoint right after the load
#   (--checkpoint-after-load), then runs YCSB-A until the kill WAIT seconds later, for each WAIT
#   in WAITS (default "0 1 2 4 8"): the work since the checkpoint grows with WAIT while the pool
#   and the data stay the same. Each line and the summary give the bytes of tuple_content
#   written since the CT of the checkpoint recovery loaded (recovery's "bytes written since CT":
#   the x axis; a GC round may take a checkpoint of its own during the run, and then that one
#   is loaded) next to the time until transactions can run.
#
# Every FIR line also gives the age of the checkpoint recovery loaded (wall clock at the start
#   of recovery minus when the checkpoint was published; the kill comes just before), which
#   says whether the checkpointer kept up with the run.
#
# Experiment 3 (history): the paper's pools hold a history far larger than the data loaded
#   (§5.3: TPC-C grows from 12 GB to 83 GB in its 100 s run), where experiment 1's kill comes 3 s
#   into the run. Here the live set is fixed (HISTORY_RECORDS, default 1,000,000 records of
#   1,000 B, about 1 GiB) in a pool of HISTORY_GIB GiB (default 4), and 16-op YCSB-A (2 threads,
#   θ 0.99; half the operations are updates, which fir and zen write as new versions) is killed
#   after each of HISTORY_RUNS seconds of run (default "3 20 60"), for each engine of
#   HISTORY_CONFIGS (default "fir:dram zen:dram falcon:dram"): the same live keys, a longer and
#   longer history. Each recovery line lists every fact the engine reported, which says how
#   much of the history is still in the pool and was read: fir's "versions before CT skipped"
#   (the binary search passes over them) plus "versions redone" are its regions' committed
#   versions, its "checkpoint CT" counts the transactions begun before its last checkpoint;
#   zen's "heap pages" and "NVM-tuple slots scanned" are what its scan read, "old versions
#   queued as garbage" the versions it found superseded; falcon updates in place. What stays
#   of the history depends on each engine's garbage collection (fir §4.5, zen's reclamation),
#   which runs as it always does: the scenario does not tune it.
#
# Every experiment ends with the median and range of the time until transactions can run, over
# every recovery of each configuration.
#
#   scripts/fir_recovery.sh [sizes|work|history|all]   (default all: the three in turn)
#     CONFIGS (env): ENGINE:INDEX list for experiment 1 (default "fir:dram zen:dram falcon:dram falcon:pm")
#     SIZES (env): pool sizes in GiB for experiment 1 (default "1 2 4")
#     RUN_S (env): seconds of run before experiment 1's kill (default 3)
#     WORK_GIB, WAITS (env): experiment 2's pool size and kill times (see above)
#     HISTORY_GIB, HISTORY_RECORDS, HISTORY_RUNS, HISTORY_CONFIGS (env): experiment 3's (above)
#     ROUNDS (env): recoveries per killed pool (default 2); REPEAT (env): kills per
#       configuration (default 1)
#     NO_BUILD=1 (env): use target/release/pmtx as it is
#     PMTX (env): the binary that runs the bench (default target/release/pmtx; implies NO_BUILD)
#     RECOVER_BINS (env): "LABEL=PATH ..." binaries that each recover every killed image in
#       turn, interleaved round by round (default: the bench's binary alone); the summary keys
#       name the label. All must share the pool layout.
#
# The machine the numbers come from matters: on a shared 2-core machine other processes'
# builds stretch every phase; compare engines within one run of this script.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in sizes | work | history | all) ;; *) echo "usage: $0 [sizes|work|history|all]" >&2; exit 2 ;; esac
configs=${CONFIGS:-"fir:dram zen:dram falcon:dram falcon:pm"}
sizes=${SIZES:-"1 2 4"}
rounds=${ROUNDS:-2}
repeat=${REPEAT:-1}
run_s=${RUN_S:-3}
dir=${PMTX_POOL_DIR:-/dev/shm}
[ -n "${NO_BUILD:-}${PMTX:-}" ] || cargo build --release --quiet --bin pmtx
pmtx=${PMTX:-target/release/pmtx}
recover_bins=${RECOVER_BINS:-"this=$pmtx"}
results=$(mktemp)
trap 'rm -f "$results" "$dir"/pmtx-firrec-*' EXIT

# Runs the bench on a new pool $3 and SIGKILLs it $2 seconds after its stderr shows a line
# matching $1 (or reports that it ended first). Remaining arguments go to the bench. Sets
# `killed` and `marker` (the line waited for).
run_and_kill() {
    local pattern=$1 after=$2 pool=$3
    shift 3
    rm -f "$pool"
    "$pmtx" bench ycsb --threads 2 --duration 600 --warmup 0 --ops-per-txn 16 --pool "$pool" "$@" \
        >/dev/null 2>"$pool.err" &
    local bench=$!
    until grep -q "$pattern" "$pool.err" 2>/dev/null; do
        kill -0 "$bench" 2>/dev/null || break
        sleep 0.05
    done
    marker=$(grep -m1 "$pattern" "$pool.err" | cut -c1-100 || true)
    if [ -n "$marker" ]; then sleep "$after"; fi
    if [ -n "$marker" ] && kill -KILL "$bench" 2>/dev/null; then
        wait "$bench" 2>/dev/null || true
        killed=yes
    else
        wait "$bench" 2>/dev/null || true
        killed="no, the bench ended first: $(grep -m1 -i error "$pool.err" | cut -c1-120 || true)"
    fi
    rm -f "$pool.err"
}

# Several binaries recover each image: then every line and summary key names the binary.
read -ra bins <<<"$recover_bins"
several_bins=$((${#bins[@]} > 1))

# The value of fact $2 (a "  name   value" line) in the recovery output $1.
fact() {
    echo "$1" | grep -E "^  $2 " | tr -s " " | rev | cut -d" " -f1 | rev || true
}

# Recovers $2 (engine $1) ROUNDS times with each binary of RECOVER_BINS (interleaved: one
# recovery per binary per round); prints one line per recovery after the prefix $3 and records
# "key ready_ms" under the key $4 (plus the binary's label if there are several) for the summary.
# With $5 = facts, the line also lists every fact the recovery reported.
recover_rounds() {
    local e=$1 pool=$2 prefix=$3 key=$4 with_facts=${5:-}
    local run bin label line_prefix line_key out ready phases extra bytes
    for run in $(seq 1 "$rounds"); do
        for bin in "${bins[@]}"; do
            label=${bin%%=*}
            line_prefix=$prefix
            line_key=$key
            if [ "$several_bins" = 1 ]; then
                line_prefix="$prefix [$label]"
                line_key="$key [$label]"
            fi
            out=$("${bin#*=}" recover "$pool" --engine "$e" 2>/dev/null)
            ready=$(echo "$out" | grep -E "^ *total" | tr -s " " | cut -d" " -f6 || true)
            phases=$(echo "$out" \
                | grep -E "^  (catalog|index recovery|replay|heap scan|scan regions|page table|checkpoint load|checkpoint read|index build|checkpoint headers|undo/redo scan|redo|update_map|secondary indexes)" \
                | tr -s " " | sed 's/^ //' | paste -sd ";" - || true)
            extra=""
            bytes=""
            if [ "$e" = fir ]; then
                bytes=$(fact "$out" 'bytes written since CT')
                extra="; redone $(fact "$out" 'versions redone'); bytes since CT ${bytes:-?}; checkpoint age $(fact "$out" 'checkpoint age at recovery \(ms\)') ms; slots read $(fact "$out" 'region slots read'); from checkpoint $(fact "$out" 'entries from the checkpoint')"
            fi
            if [ "$with_facts" = facts ]; then
                # Fact lines: two spaces, a name, a number (phases end in "ms", tables in "rows").
                extra="$extra; facts: $(echo "$out" | grep -E "^  [a-zA-Z].* [0-9]+$" \
                    | sed -E 's/^  //; s/ +([0-9]+)$/=\1/' | paste -sd "," - || true)"
            fi
            echo "$line_prefix run $run: ready ${ready} ms$extra; $phases"
            if [ -n "$ready" ]; then echo "$line_key|$ready|$bytes" >>"$results"; fi
        done
    done
}

# Median and range of every recovery recorded under each key, in the order the keys came, and
# for FIR the median of the bytes of tuple_content written since the checkpoint it loaded.
summary() {
    python3 - "$results" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    key, ms, written = line.rstrip("\n").split("|")
    ms_list, bytes_list = runs.setdefault(key, ([], []))
    ms_list.append(float(ms))
    if written:
        bytes_list.append(float(written))
for key, (ms, written) in runs.items():
    since = f"  bytes since CT {statistics.median(written) / 2**20:8.1f} MiB" if written else ""
    print(f"  {key:<40} median {statistics.median(ms):9.1f} ms  range {min(ms):.1f}-{max(ms):.1f}  ({len(ms)} recoveries){since}")
EOF
    : >"$results"
}

if [ "$what" = sizes ] || [ "$what" = all ]; then
    echo "== experiment 1: recovery after a kill ${run_s} s after the load, by pool size"
    for round in $(seq 1 "$repeat"); do
        for gib in $sizes; do
            records=$((gib * 250000))
            for config in $configs; do
                e=${config%%:*}
                index=${config##*:}
                cc=occ
                [ "$e" = fir ] && cc=mvto # FIR runs MVTO only (§4.2.1)
                pool="$dir/pmtx-firrec-$e-$index-$gib.pool"
                run_and_kill "loaded .* records" "$run_s" "$pool" --engine "$e" --cc "$cc" \
                    --index "$index" --records "$records" --pool-size "${gib}G"
                recover_rounds "$e" "$pool" \
                    "round $round: $e index=$index pool=${gib}GiB records=$records ($marker) killed=$killed" \
                    "$e:$index ${gib}GiB"
                rm -f "$pool"
            done
        done
    done
    echo "== experiment 1: time until transactions can run"
    summary
fi

if [ "$what" = work ] || [ "$what" = all ]; then
    gib=${WORK_GIB:-4}
    waits=${WAITS:-"0 1 2 4 8"}
    records=$((gib * 250000))
    echo "== experiment 2: FIR recovery after a kill, by the work since the checkpoint (pool ${gib} GiB, $records records)"
    for round in $(seq 1 "$repeat"); do
        for wait_s in $waits; do
            pool="$dir/pmtx-firrec-work.pool"
            run_and_kill "checkpoint after the load" "$wait_s" "$pool" --engine fir --cc mvto \
                --records "$records" --pool-size "${gib}G" --fir-checkpoint-ms 0 \
                --checkpoint-after-load
            recover_rounds fir "$pool" \
                "round $round: fir ${wait_s}s after the checkpoint ($marker) killed=$killed" \
                "fir ${wait_s}s after the checkpoint"
            rm -f "$pool"
        done
    done
    echo "== experiment 2: time until transactions can run"
    summary
fi

if [ "$what" = history ] || [ "$what" = all ]; then
    gib=${HISTORY_GIB:-4}
    records=${HISTORY_RECORDS:-1000000}
    history_runs=${HISTORY_RUNS:-"3 20 60"}
    history_configs=${HISTORY_CONFIGS:-"fir:dram zen:dram falcon:dram"}
    echo "== experiment 3: recovery after a kill, by the length of the run before it (pool ${gib} GiB, $records records)"
    for round in $(seq 1 "$repeat"); do
        for run_for in $history_runs; do
            for config in $history_configs; do
                e=${config%%:*}
                index=${config##*:}
                cc=occ
                [ "$e" = fir ] && cc=mvto
                pool="$dir/pmtx-firrec-history-$e-$index.pool"
                run_and_kill "loaded .* records" "$run_for" "$pool" --engine "$e" --cc "$cc" \
                    --index "$index" --records "$records" --pool-size "${gib}G"
                recover_rounds "$e" "$pool" \
                    "round $round: $e index=$index ${run_for}s run ($marker) killed=$killed" \
                    "$e:$index ${run_for}s run" facts
                rm -f "$pool"
            done
        done
    done
    echo "== experiment 3: time until transactions can run"
    summary
fi
