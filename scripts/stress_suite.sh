#!/usr/bin/env bash
# The suite under load: `make test` (three xdist workers) three times in a row on each database (the machine's
# PostgreSQL and Redis as CI uses them, then the embedded default), with two CPU-bound processes
# running beside it the whole time, as a shared CI machine would have. Prints each run's time and
# closing line and exits non-zero if any run failed. Logs go to var/stress/.
#
#   scripts/stress_suite.sh                 # 3 runs on each database
#   RUNS=1 DATABASES=postgres scripts/stress_suite.sh
#   PYTEST_ARGS='-m unit' scripts/stress_suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
DATABASES="${DATABASES:-postgres embedded}"
PG_URL="${STRESS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
REDIS="${STRESS_REDIS_URL:-redis://127.0.0.1:6379/0}"
mkdir -p var/stress

burners=()
cleanup() { for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
trap 'exit 130' INT TERM  # stop here (the EXIT trap then stops the burners), not at the next run
for _ in 1 2; do
  python3 -c 'while True: pass' &
  burners+=($!)
done

failed=0
for db in $DATABASES; do
  for run in $(seq "$RUNS"); do
    log="var/stress/$db-$run.log"
    start=$(date +%s)
    if [ "$db" = postgres ]; then
      DATABASE_URL="$PG_URL" REDIS_URL="$REDIS" make test PYTEST_ARGS="${PYTEST_ARGS:-}" >"$log" 2>&1
    else
      env -u DATABASE_URL -u REDIS_URL make test PYTEST_ARGS="${PYTEST_ARGS:-}" >"$log" 2>&1
    fi
    rc=$?
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -n 1)
    printf '%-9s run %d: exit %d in %4d s  %s\n' "$db" "$run" "$rc" "$(( $(date +%s) - start ))" "$summary"
    [ "$rc" -eq 0 ] || { failed=1; grep -E '^(FAILED|ERROR) ' "$log" | head -n 20; }
  done
done
exit "$failed"
