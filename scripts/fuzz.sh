#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/, README "Fuzzing") one after another, each for a given time, one
# libFuzzer process at a time (-jobs=1 -workers=1: the machine is shared).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Defaults: 600 s each, targets crash_image pool_open window_decode. Needs nightly and
# cargo-fuzz (`cargo install cargo-fuzz`). Logs go to fuzz/runs/TARGET-DATE.log (libFuzzer's
# final stats: executions, exec/s, coverage); a crashing, hanging (-timeout) or over-allocating
# (-rss_limit_mb / -malloc_limit_mb) input goes to fuzz/artifacts/TARGET/ and the run stops with
# exit status 1. Reproduce one with
#   fuzz/target/x86_64-unknown-linux-gnu/release/TARGET fuzz/artifacts/TARGET/crash-...
# then keep it under fuzz/regressions/TARGET/ (tests/fuzz_props.rs replays every file there).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(crash_image pool_open window_decode)

cargo +nightly fuzz build -O
bin=fuzz/target/x86_64-unknown-linux-gnu/release
if [ ! -d fuzz/corpus/crash_image ] || [ -z "$(ls -A fuzz/corpus/crash_image)" ]; then
    cargo test --release --test fuzz_props -- --ignored write_fuzz_seeds
fi
mkdir -p fuzz/runs
status=0
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    log="fuzz/runs/$t-$(date +%Y%m%d-%H%M%S).log"
    echo "== $t for ${seconds}s -> $log"
    # The regression inputs seed the corpus too.
    extra=()
    [ -d "fuzz/regressions/$t" ] && extra=("fuzz/regressions/$t")
    (cd fuzz && timeout $((seconds + 120)) "../$bin/$t" "corpus/$t" "${extra[@]/#/../}" \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -max_len=8192 -len_control=0 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" >"../$log" 2>&1) || status=1
    grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^Done|cov:" "$log" | tail -3
done
exit $status
