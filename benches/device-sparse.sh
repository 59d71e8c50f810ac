#!/usr/bin/env bash
# One device run (the H200 host, 16 cores, no Rust there) of the sparse-key suite (issue 19):
# `mphf bench sparse` in several processes over in-memory tables and Parquet files, DuckDB on
# the same Parquet files, and an index build with slot maps over a large Parquet table.
#
# Usage on the device: benches/device-sparse.sh BIN OUT_DIR [PART] [ROWS] [PROCESSES]
#   BIN: a `mphf` release binary built here, stripped and xz-compressed, carried over;
#   PART: suite (default) | build | explain | cpu | tpch | ab | purge | all; ROWS: rows of the suite (default 30 M, ids = rows / 10);
#   PROCESSES: processes of the suite (default 3; the medians of each are kept apart).
#   PART ab takes two more arguments, BASE (a second binary) and ONLY (`bench sparse --only`):
#   both builds alternate over the same Parquet files, PROCESSES processes each (all in ab.md).
#   PART purge takes ONLY as its sixth argument: BIN with mimalloc's purge delay at 10 ms and at
#   1 s, alternating the same way (all in purge.md).
# DuckDB: wheels carried in .whl/ (see the device README) are installed into /tmp/site first;
# without them the DuckDB step prints its skip notice.
set -u
BIN=${1:?mphf binary}
OUT=${2:?output dir}
PART=${3:-suite}
ROWS=${4:-30000000}
PROCS=${5:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
log() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
nproc > "$OUT/nproc.txt"

if ls "$HERE"/../.whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$HERE"/../.whl/*.whl && export PYTHONPATH=/tmp/site
fi

if [ "$PART" = suite ] || [ "$PART" = all ]; then
  DIR=/tmp/sparse-suite
  for p in $(seq 1 "$PROCS"); do
    log "bench sparse, $ROWS rows, process $p"
    timeout 280 "$BIN" bench sparse --rows "$ROWS" --runs 5 --parquet "$DIR" --json "$OUT/sparse_p$p.json" \
      --markdown > "$OUT/sparse_p$p.md" 2>&1
    echo "exit $?" >> "$OUT/sparse_p$p.md"
  done
  log "DuckDB on the same Parquet files"
  timeout 200 python3 "$HERE/duckdb_sparse.py" "$DIR" --json "$OUT/sparse_p1.json" --runs 5 > "$OUT/duckdb.md" 2>&1
  echo "exit $?" >> "$OUT/duckdb.md"
fi

if [ "$PART" = build ] || [ "$PART" = all ]; then
  # The index build with slot maps (CREATE INDEX times in the output) and the bytes on disk.
  DIR=/tmp/sparse-build
  log "index build with slot maps, 10^8 rows, Parquet"
  timeout 400 "$BIN" bench sparse --rows 100000000 --mode parquet --runs 1 --only "GROUP BY id" --parquet "$DIR" \
    --markdown > "$OUT/build_1e8.md" 2>&1
  echo "exit $?" >> "$OUT/build_1e8.md"
  du -b "$DIR"/events/*.parquet "$DIR"/events/_mphf/* "$DIR"/dims/_mphf/* >> "$OUT/build_1e8.md" 2>&1
fi
if [ "$PART" = explain ] || [ "$PART" = all ]; then
  # Where the range form's time goes on this host (EXPLAIN ANALYZE: scatter_time, merge_time, ...).
  DIR=/tmp/sparse-suite
  [ -d "$DIR/events" ] || timeout 200 "$BIN" bench sparse --rows "$ROWS" --mode parquet --runs 1 --only "GROUP BY id" \
    --parquet "$DIR" > "$OUT/explain_setup.md" 2>&1
  for q in "SELECT id, count(*), sum(amount) FROM events GROUP BY id" "SELECT session, count(*) FROM events GROUP BY session" \
    "SELECT category, count(*), sum(amount) FROM events JOIN dims ON events.id = dims.id GROUP BY category"; do
    log "EXPLAIN ANALYZE $q"
    timeout 120 "$BIN" sql --table events="$DIR/events" --table dims="$DIR/dims" --format csv -c "$q" \
      -c "EXPLAIN ANALYZE $q" 2>&1 | grep -o 'Mphf[A-Za-z]*Exec.*\|HashJoinExec.*\|AggregateExec.*\|DataSourceExec.*' \
      >> "$OUT/explain.txt"
  done
  # The same GROUP BY id without the extension: DataFusion's own operators and their metrics.
  q="SELECT id, count(*), sum(amount) FROM events GROUP BY id"
  log "EXPLAIN ANALYZE $q, vanilla"
  timeout 120 "$BIN" sql --no-mphf --table events="$DIR/events" --format csv -c "$q" -c "EXPLAIN ANALYZE $q" 2>&1 \
    | grep -o 'RepartitionExec.*\|AggregateExec.*\|DataSourceExec.*' >> "$OUT/explain_vanilla.txt"
fi

if [ "$PART" = cpu ] || [ "$PART" = all ]; then
  # User and system CPU of 20 runs of GROUP BY id over the Parquet files, with and without the
  # extension and with mimalloc's purge delay at its default (10 ms) and at 1 s: the process
  # with 21 runs less the one with 1 run, so the index load cancels. System time is mostly the
  # kernel zeroing fresh pages.
  DIR=/tmp/sparse-suite
  [ -d "$DIR/events" ] || timeout 200 "$BIN" bench sparse --rows "$ROWS" --mode parquet --runs 1 --only "GROUP BY id" \
    --parquet "$DIR" > "$OUT/explain_setup.md" 2>&1
  # The groups are summed in the query, so that no time goes to printing 3 M rows.
  Q="SELECT count(*), sum(n), sum(s) FROM (SELECT id, count(*) AS n, sum(amount) AS s FROM events GROUP BY id)"
  for mode in mphf vanilla; do
    flag=""; [ $mode = vanilla ] && flag=--no-mphf
    for delay in 10 1000; do
      for n in 1 21; do
        args=(); for _ in $(seq 1 $n); do args+=(-c "$Q"); done
        TIMEFORMAT="$mode purge_delay=$delay runs=$n: real %R user %U sys %S"
        { time MIMALLOC_PURGE_DELAY=$delay timeout 120 "$BIN" sql $flag --table events="$DIR/events" --format csv \
            "${args[@]}" > /dev/null 2> "$OUT/cpu_last.txt"; } 2>> "$OUT/cpu.txt"
        [ $n = 21 ] && echo "$mode purge_delay=$delay per-query s: $(grep -o 'in [0-9.]* s' "$OUT/cpu_last.txt" \
          | tail -20 | awk '{print $2}' | sort -n | tr '\n' ' ')" >> "$OUT/cpu.txt"
      done
    done
  done
  rm -f "$OUT/cpu_last.txt"
fi

if [ "$PART" = ab ]; then
  # An A/B of two builds on the queries ONLY selects, in memory and over the same files.
  BASE=${6:?base binary}
  ONLY=${7:?bench sparse --only filter}
  DIR=/tmp/sparse-suite
  for p in $(seq 1 "$PROCS"); do
    for build in base new; do
      bin=$BIN; [ $build = base ] && bin=$BASE
      log "bench sparse --only '$ONLY', $ROWS rows, $build, process $p"
      echo "### $build, process $p" >> "$OUT/ab.md"
      timeout 200 "$bin" bench sparse --rows "$ROWS" --runs 5 --parquet "$DIR" --only "$ONLY" --markdown \
        >> "$OUT/ab.md" 2>&1
      echo "exit $?" >> "$OUT/ab.md"
    done
  done
fi

if [ "$PART" = purge ]; then
  # One build with mimalloc's purge delay at its default (10 ms) and at 1 s, alternating over
  # the same Parquet files, PROCESSES processes each, on the queries ONLY selects.
  ONLY=${6:?bench sparse --only filter}
  DIR=/tmp/sparse-suite
  for p in $(seq 1 "$PROCS"); do
    for delay in 10 1000; do
      log "bench sparse --only '$ONLY', $ROWS rows, purge delay $delay ms, process $p"
      echo "### purge delay $delay ms, process $p" >> "$OUT/purge.md"
      MIMALLOC_PURGE_DELAY=$delay timeout 200 "$BIN" bench sparse --rows "$ROWS" --runs 5 --parquet "$DIR" \
        --only "$ONLY" --markdown >> "$OUT/purge.md" 2>&1
      echo "exit $?" >> "$OUT/purge.md"
    done
  done
fi

if [ "$PART" = tpch ] || [ "$PART" = all ]; then
  # The TPC-H GROUP BY and JOIN suites at SF 1 on all cores (no row may fall below 0.95x).
  log "bench groupby SF 1"
  timeout 200 "$BIN" bench groupby --scale 1 --runs 5 --markdown > "$OUT/groupby_sf1.md" 2>&1
  log "bench join SF 1"
  timeout 150 "$BIN" bench join --scale 1 --runs 5 --markdown > "$OUT/join_sf1.md" 2>&1
fi
log "done"
