#!/usr/bin/env bash
# pmtx beside LMDB and PMDK (issue 18): installs what the peers need, builds pmtx with them, and
# runs the comparison the README's table shows.
#
#   scripts/peers.sh              # install, build, run (about 25 minutes of runs)
#   scripts/peers.sh --build-only # install and build
#   ROUNDS=1 RECORDS=100000 THETAS=0 ENGINES=falcon scripts/peers.sh   # a quick look
#
# Issue 18's matrix: YCSB-A (50 % reads, 50 % one-field updates), 1 and 16 operations per
# transaction, 1 KB records, 1 M records, uniform and zipfian (theta 0.99), 1 and 2 threads,
# ADR, ROUNDS interleaved rounds (every engine and peer once per round, so drift hits all
# alike); each ratio is measured within a round and the summary gives medians and ranges.
#
# LMDB needs nothing installed: heed's -sys crate vendors it and builds it with the C compiler.
# PMDK needs Debian's libpmemobj-dev, installed with apt-get: that needs root (the script uses
# sudo when it is not root and sudo exists). Results: table on stdout, JSON in $OUT (default
# target/peers/), plottable with `pmtx plot`.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-2}
WARMUP=${WARMUP:-0.5}
ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-1000000}
THETAS=${THETAS:-0 0.99}
THREADS=${THREADS:-1,2}
ENGINES=${ENGINES:-falcon,zen}
PEERS=${PEERS:-lmdb,lmdb-writemap,pmdk}
OUT=${OUT:-target/peers}

if ! dpkg -s libpmemobj-dev >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        SUDO=""
    elif command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "peers.sh: libpmemobj-dev is missing and installing it needs root: run as root," \
            "or install it (apt-get install libpmemobj-dev) and rerun" >&2
        exit 1
    fi
    echo "peers.sh: installing libpmemobj-dev (PMDK) with apt-get" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libpmemobj-dev >/dev/null
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "peers.sh: no C compiler (cc): LMDB is built from source; install gcc" >&2
    exit 1
fi

cargo build --release --features lmdb,pmdk
[ "${1:-}" = "--build-only" ] && exit 0

mkdir -p "$OUT"
PMTX=target/release/pmtx
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -m), pools in /dev/shm (DRAM, no real PM)"
for theta in $THETAS; do
    for ops in 1 16; do
        echo
        echo "## YCSB-A, $ops op(s) per transaction, 1 KB records, $RECORDS records, theta $theta, ADR"
        "$PMTX" compare ycsb --engine "$ENGINES" --peers "$PEERS" --domain adr \
            --records "$RECORDS" --theta "$theta" --ops-per-txn "$ops" --threads "$THREADS" \
            --duration "$DURATION" --warmup "$WARMUP" --repeat "$ROUNDS" \
            --json "$OUT/ycsb-a-$ops-$theta.json"
    done
done
echo
echo "## Bank transfers, $RECORDS accounts, ADR"
"$PMTX" compare bank --engine "$ENGINES" --peers "$PEERS" --domain adr \
    --accounts "$RECORDS" --threads "$THREADS" --repeat "$ROUNDS" \
    --duration "$DURATION" --warmup "$WARMUP" --json "$OUT/bank.json"
