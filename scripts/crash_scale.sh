#!/usr/bin/env bash
# Crash-consistency at scale (issue 19, item 6; not in CI): runs `pmtx crashtest` for every engine
# × persistence domain the harness supports, IMAGES simulated crash images each (default 10^5),
# and prints a table of images, violations, elapsed time and images/s. Exit 1 if any run found a
# violation (each run's report, with the commands that reproduce its violations, is kept in
# OUT_DIR).
#
#   scripts/crash_scale.sh [IMAGES] [OUT_DIR]
#   WORKLOADS="bank tpcc" ENGINES="falcon zen" DOMAINS="adr" scripts/crash_scale.sh 100000
#
# The release binary is built first, unless PMTX names a binary to use (e.g. a copy, so that
# rebuilding the tree during a long run does not change what the later runs test). Runs go one after another (each uses the machine's cores
# for recovery); at ~100-400 images/s on a 2-core machine, 10^5 images take 5-20 minutes per run.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=${1:-100000}
OUT_DIR=${2:-target/crash-scale}
ENGINES=${ENGINES:-"falcon falcon-allflush falcon-noflush inp zen"}
DOMAINS=${DOMAINS:-"adr eadr"}
WORKLOADS=${WORKLOADS:-"bank"}
THREADS=${THREADS:-2}
if [ -z "${PMTX:-}" ]; then
  cargo build --release --quiet
  PMTX=./target/release/pmtx
fi
mkdir -p "$OUT_DIR"
summary="$OUT_DIR/summary.md"
printf '| engine | domain | workload | images | crash points | violations | seconds | images/s |\n|---|---|---|---|---|---|---|---|\n' > "$summary"
failed=0
for engine in $ENGINES; do
  for domain in $DOMAINS; do
    for workload in $WORKLOADS; do
      name="$engine-$domain-$workload"
      json="$OUT_DIR/$name.json"
      set +e
      "$PMTX" crashtest --engine "$engine" --domain "$domain" --workload "$workload" \
        --threads "$THREADS" --images "$IMAGES" --json "$json" > "$OUT_DIR/$name.txt" 2> "$OUT_DIR/$name.err"
      status=$?
      set -e
      if [ ! -s "$json" ]; then
        # Not a combination the harness runs (e.g. falcon-noflush under adr): say why.
        echo "$name: skipped: $(tail -n 1 "$OUT_DIR/$name.err")"
        continue
      fi
      python3 - "$json" "$engine" "$domain" "$workload" >> "$summary" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
images = r["images"] + r.get("restart_images", 0)
violations = sum(r["violations"].values())
secs = r["elapsed_s"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {images} | {r['crash_points']} | "
      f"{violations} | {secs:.0f} | {images / max(secs, 1e-9):.0f} |")
PY
      tail -n 1 "$summary"
      [ "$status" -eq 0 ] || failed=1
    done
  done
done
echo
cat "$summary"
echo "reports: $OUT_DIR"
exit $failed
