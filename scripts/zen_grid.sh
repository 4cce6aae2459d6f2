#!/usr/bin/env bash
# The Zen measurement grid of docs/ZEN.md (Zen §4.1): YCSB with 16-request transactions, four
# read/write mixes × three skews × P = 4 and 16, zen and falcon against volatile in the same
# invocation, 1 and 2 threads; then TPC-C-NP. Prints one line per cell: ratios to volatile.
#
#   scripts/zen_grid.sh [RECORDS] [DURATION_S]      (defaults: 200000 records, 2 s)
#
# Writes are whole-tuple (`--write-all-fields`), as in Zen's YCSB ("a write request modifies a
# tuple") and Falcon §6.2.3's configuration. Needs `jq`.
set -euo pipefail
cd "$(dirname "$0")/.."
records=${1:-200000}
duration=${2:-2}
cargo build --release --quiet
pmtx=target/release/pmtx
out=$(mktemp -d)
ratio() { # file engine threads
    jq -r --arg e "$2" --argjson t "$3" \
        '[.[] | select(.engine == $e and .threads == $t) | .ratio_to_volatile] | first | . * 1000 | round / 1000' "$1"
}
echo "P   workload     theta  zen 1t  falcon 1t  zen 2t  falcon 2t   (× volatile, same invocation)"
for p in 4 16; do
    for w in read-only read-heavy balanced write-heavy; do
        for theta in 0 0.6 0.95; do
            f="$out/ycsb-$p-$w-$theta.json"
            "$pmtx" bench ycsb --engine zen,falcon --compare-volatile --threads 1,2 \
                --workload "$w" --theta "$theta" --cache-ratio "$p" --ops-per-txn 16 \
                --write-all-fields --records "$records" --duration "$duration" --warmup 1 \
                --json "$f" >/dev/null
            printf "%-3s %-12s %-5s  %-6s  %-9s  %-6s  %-9s\n" "$p" "$w" "$theta" \
                "$(ratio "$f" zen 1)" "$(ratio "$f" falcon 1)" "$(ratio "$f" zen 2)" "$(ratio "$f" falcon 2)"
        done
    done
done
f="$out/tpcc-np.json"
"$pmtx" bench tpcc-np --engine zen,falcon --compare-volatile --threads 1,2 --warehouses 2 \
    --duration "$duration" --warmup 1 --json "$f" >/dev/null
printf "%-3s %-12s %-5s  %-6s  %-9s  %-6s  %-9s\n" 4 tpcc-np - \
    "$(ratio "$f" zen 1)" "$(ratio "$f" falcon 1)" "$(ratio "$f" zen 2)" "$(ratio "$f" falcon 2)"
echo "JSON: $out"
