#!/usr/bin/env bash
# Recovery time of zen vs falcon for pools of about 1, 2 and 4 GiB (docs/ZEN.md): each pool is
# written by 2 threads (YCSB load, then 1 s of 16-op YCSB-A), then recovered three times with
# `pmtx recover`, which prints the phases. Pools go to /dev/shm and are removed afterwards.
#
#   scripts/recovery_sizes.sh [ENGINES]      (default: "zen falcon")
set -euo pipefail
cd "$(dirname "$0")/.."
engines=${1:-"zen falcon"}
cargo build --release --quiet
pmtx=target/release/pmtx
dir=${PMTX_POOL_DIR:-/dev/shm}
for records in 650000 1300000 2600000; do
    for e in $engines; do
        pool="$dir/pmtx-recovery-$e-$records.pool"
        rm -f "$pool"
        "$pmtx" bench ycsb --engine "$e" --records "$records" --threads 2 --duration 1 --warmup 0 \
            --ops-per-txn 16 --pool "$pool" >/dev/null
        size=$(du -m --apparent-size "$pool" | cut -f1)
        for run in 1 2 3; do
            ms=$("$pmtx" recover "$pool" --engine "$e" | grep -E "^ *total" | tr -s " ")
            echo "$e records=$records pool=${size}MiB run $run: $ms"
        done
        rm -f "$pool"
    done
done
