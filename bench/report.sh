#!/usr/bin/env bash
# Every comparison of BENCHMARKS.md in one go (about an hour on 2 cores; FULL_YEAR=1 adds
# ~25 min), each run's printout and measures kept in OUT (default bench-results/). Needs
# '.[bench]' installed and PostgreSQL at HISTORIAN_TEST_PG_URL
# (default postgresql+psycopg://postgres@127.0.0.1/test).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results}
mkdir -p "$OUT"
PY=.venv/bin/python

compare() {  # NAME ARGS...: one bench/compare.py run, printout and JSON kept
    local name=$1
    shift
    echo "== $name: compare.py $*"
    "$PY" bench/compare.py "$@" --json "$OUT/$name.json" | tee "$OUT/$name.md"
}

# Scaled-down side by side: every contender, medians of 3 after a warm-up.
compare raw-small-parquet --workload raw-small --targets parquet --runs 3 \
    --contenders pipeline,cli,cli-served,dlt,baseline,node
# The hand-written to_sql baseline loads ~9k rows/s: it runs on the 661k-row workload only.
compare raw-small-postgres --workload raw-small --targets postgres --runs 3 \
    --contenders pipeline,cli-served,dlt
compare small-postgres-baseline --workload small --targets postgres --runs 1 \
    --contenders pipeline,baseline
compare agg-small-parquet --workload agg-small --targets parquet --runs 2 \
    --contenders pipeline,cli,dlt,baseline,node
# The node contender's pass renders every answer (aggregated questions are the same for
# every contender), so the others are served from memory without a warm-up round each.
compare agg-small-postgres --workload agg-small --targets postgres --runs 1 --no-warmup \
    --contenders node,pipeline,dlt
compare incr-10k-hour --workload incr-10k-hour --targets parquet,postgres --runs 3 \
    --contenders pipeline,cli,cli-served,dlt,baseline
# Full size: this pipeline (the peers would take hours: dlt ~30k rows/s).
compare raw-1k-day --workload raw-1k-day --targets parquet --runs 1 \
    --contenders pipeline,cli,cli-served
compare raw-1k-day-postgres --workload raw-1k-day --targets postgres --runs 1 \
    --contenders pipeline
compare agg-10k-month --workload agg-10k-month --targets parquet --runs 1 \
    --contenders pipeline,node
# The full-size aggregated year (349 M rows, ~10.5 GB of answers held by the node, ~25 min)
# only with FULL_YEAR=1: the node's pass renders it (~10 min), then the pipeline and the
# same run through a long-lived Prefect server are measured.
if [[ ${FULL_YEAR:-0} == 1 ]]; then
    compare agg-10k-year --workload agg-10k-year --targets parquet --runs 1 --no-warmup \
        --contenders node,pipeline,cli-served
fi
