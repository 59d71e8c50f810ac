#!/usr/bin/env bash
# One device run (H200 machine, no Rust there): the `mphf` binary's GPU paths and the SQL
# benchmarks at larger scale. Usage on the device: benches/device-sql.sh BIN OUT_DIR
# (BIN: a `mphf` built here, stripped and xz-compressed into device-bin/ and carried over).
set -u
BIN=${1:?mphf binary}
OUT=${2:?output dir}
PART=${3:-all}   # all | planning (BASE binary or none 4th, PROCESSES 5th) | planab (BASE binary 4th) | clustered (BASE binary 4th) | p16ab (BASE binary 4th) | p16tpch | q12why | suites4w (SUITE 4th: groupby or join) | w4ab (BASE binary 4th, SUITE 5th) | membab (BASE binary 4th) | overhead | joinsab (BASE binary 4th) | distab (BASE binary 4th) | build | sf10 | joins | joinmodel | semi | parity | coldstart | sf1 | forms | gpu | gpu10 | gpubuild | auto | auto10 | tpch10 | tpch10why | q17 | suites
mkdir -p "$OUT"
log() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nproc > "$OUT/nproc.txt"

# TPC-H SF 1 over Parquet with BIN (benches/distributed_tpch.py, MPHF on and off in the same
# processes, two processes per cell) on an in-memory cluster of $1 workers (0: one process),
# into $OUT/$2, once for each planner threshold NAME=VALUE given after them (`--tune`).
tpch_by_tune() {
  local workers=$1 file=$2 data=/tmp/tpch1
  shift 2
  [ -f "$data/lineitem.parquet" ] || "$BIN" tpch --scale 1 --output "$data" > "$OUT/tpch_gen.txt" 2>&1
  for tune in "$@"; do
    log "BIN: TPC-H SF 1, $workers workers, $tune"
    echo "### $workers workers, $tune" >> "$OUT/$file"
    timeout 280 python3 "$(dirname "$0")/distributed_tpch.py" "$BIN" "$data" --workers "$workers" --processes 2 \
      --runs 3 --tune "$tune" >> "$OUT/$file" 2>&1
    echo "exit $?" >> "$OUT/$file"
  done
}

if [ "$PART" = clustered ]; then
  # Issue 19: the merge form of a clustered key (l_orderkey), BIN against BASE (a second binary),
  # alternating: the TPC-H GROUP BYs over l_orderkey at SF 1 in two processes each, then at SF 10.
  BASE=${4:?base binary}
  for p in 1 2; do
    for b in BASE BIN; do
      log "$b: bench groupby SF 1, process $p"
      timeout 100 "${!b}" bench groupby --scale 1 --runs 5 --markdown --only l_orderkey --only Q18 --only DISTINCT \
        >> "$OUT/clustered_$b.md" 2>&1
    done
  done
  for b in BASE BIN; do
    log "$b: bench groupby SF 10"
    timeout 150 "${!b}" bench groupby --scale 10 --runs 3 --markdown --only "GROUP BY l_orderkey" \
      >> "$OUT/clustered_$b.md" 2>&1
  done
  log "done"
  exit 0
fi

if [ "$PART" = membab ]; then
  # Membership probes (session 42): the TPC-H join suite at SF 1 on all cores, in memory and
  # over Parquet, BASE and BIN alternating in two processes each (one file per form); then the
  # MPHF session's cost where no MPHF operator runs: BIN over Parquet on the rows both sessions
  # run with DataFusion's joins, as it is and with both MPHF rules off.
  BASE=${4:?base binary}
  for p in 1 2; do
    for form in memory parquet; do
      case $form in memory) flags=();; parquet) flags=(--parquet);; esac
      for b in BASE BIN; do
        log "$b: bench join SF 1, $form, process $p"
        echo "### $b, process $p" >> "$OUT/membab_$form.md"
        timeout 100 "${!b}" bench join --scale 1 --runs 5 --markdown "${flags[@]}" >> "$OUT/membab_$form.md" 2>> "$OUT/membab.err"
      done
    done
  done
  for p in 1 2; do
    for rules in on off; do
      case $rules in on) flags=();; off) flags=(--set mphf.enable_join=false --set mphf.enable_aggregate=false);; esac
      log "BIN: bench join SF 1, parquet, MPHF rules $rules, process $p"
      echo "### rules $rules, process $p" >> "$OUT/overhead.md"
      timeout 100 "$BIN" bench join --scale 1 --runs 7 --markdown --parquet --only custkey --only Q18 "${flags[@]}" \
        >> "$OUT/overhead.md" 2>> "$OUT/membab.err"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = overhead ]; then
  # Where the MPHF session's time goes when no MPHF operator runs (session 42): `mphf sql`
  # running three joins 12 times each over TPC-H SF 1 Parquet, as plain DataFusion
  # (`--no-mphf`), as the MPHF session over files without indexes, and over a copy of the same
  # files with saved indexes on the join keys; two processes of each, alternating. Each
  # statement's "N row(s) in S s" line is kept (overhead_sql.txt).
  D=/tmp/overhead
  rm -rf "$D" && mkdir -p "$D/plain" "$D/indexed"
  "$BIN" tpch --scale 1 --output "$D/plain" --tables lineitem,orders,customer > /dev/null 2>&1
  cp "$D"/plain/*.parquet "$D/indexed/"
  tables() { for t in lineitem orders customer; do printf -- '--table %s=%s/%s.parquet ' "$t" "$1" "$t"; done; }
  # shellcheck disable=SC2046
  "$BIN" sql $(tables "$D/indexed") -c "CREATE INDEX li_ok ON lineitem USING mphf (l_orderkey)" \
    -c "CREATE INDEX o_ok ON orders USING mphf (o_orderkey)" -c "CREATE INDEX c_ck ON customer USING mphf (c_custkey)" \
    > "$OUT/overhead_index.txt" 2>&1
  QUERIES=(
    "SELECT count(*), sum(l_quantity), sum(o_totalprice) FROM lineitem JOIN orders ON l_orderkey = o_orderkey"
    "SELECT count(*), sum(o_totalprice), max(c_acctbal) FROM orders JOIN customer ON o_custkey = c_custkey"
    "SELECT count(*) FROM lineitem WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_orderpriority = '1-URGENT')"
  )
  args=()
  for q in "${QUERIES[@]}"; do for _ in $(seq 12); do args+=(-c "$q"); done; done
  for p in 1 2; do
    for variant in vanilla plain indexed; do
      case $variant in
        vanilla) flags=(--no-mphf $(tables "$D/plain"));;
        plain) flags=($(tables "$D/plain"));;
        indexed) flags=($(tables "$D/indexed"));;
      esac
      log "mphf sql, $variant, process $p"
      echo "### $variant, process $p" >> "$OUT/overhead_sql.txt"
      timeout 120 "$BIN" sql --format csv "${flags[@]}" "${args[@]}" 2>&1 | grep "row(s) in" >> "$OUT/overhead_sql.txt"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = joinsab ]; then
  # Slot tables by position among few occupied slots (session 38): the TPC-H join suite at SF 1
  # on all cores, BASE, BIN, and BIN with one-for-one Partitioned joins on any partition count
  # (join_partitioned_max_partitions = 0), alternating in three processes each; then TPC-H
  # Q1-Q22 at SF 1, BASE and BIN alternating in two processes each.
  BASE=${4:?base binary}
  for p in 1 2 3; do
    for b in BASE BIN TUNED; do
      log "$b: bench join SF 1, process $p"
      echo "### $b, process $p" >> "$OUT/joins_ab.md"
      case $b in
        TUNED) timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown --tune join_partitioned_max_partitions=0 \
                 >> "$OUT/joins_ab.md" 2>&1 ;;
        *) timeout 100 "${!b}" bench join --scale 1 --runs 5 --markdown >> "$OUT/joins_ab.md" 2>&1 ;;
      esac
    done
  done
  for p in 1 2; do
    for b in BASE BIN; do
      log "$b: bench tpch SF 1, process $p"
      echo "### $b, process $p" >> "$OUT/tpch_ab.md"
      timeout 150 "${!b}" bench tpch --scale 1 --runs 5 --markdown >> "$OUT/tpch_ab.md" 2>&1
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = p16ab ]; then
  # One-for-one Partitioned joins on slots on 16 partitions (session 39): BASE and BIN with
  # every partition building its own slot table (join_partitioned_max_partitions=0), and BIN
  # with the default limit, alternating in three processes; an EXPLAIN ANALYZE of each build
  # with the limit off; then TPC-H on an in-memory cluster of 4 workers, BIN with the limit off
  # and at 4.
  BASE=${4:?base binary}
  LIMIT0="--tune join_partitioned_max_partitions=0"
  for p in 1 2 3; do
    for run in BASE BIN BIN_DEFAULT; do
      log "$run: bench join SF 1, process $p"
      echo "### $run, process $p" >> "$OUT/p16_join.md"
      case $run in
        BIN_DEFAULT) timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown >> "$OUT/p16_join.md" 2>&1 ;;
        *) timeout 100 "${!run}" bench join --scale 1 --runs 5 --markdown $LIMIT0 >> "$OUT/p16_join.md" 2>&1 ;;
      esac
    done
  done
  for b in BASE BIN; do
    log "$b: bench join SF 1 EXPLAIN ANALYZE, limit off"
    timeout 60 "${!b}" bench join --scale 1 --runs 3 --explain --only "lineitem ⋈ orders" --only "customer (custkey)" \
      $LIMIT0 > "$OUT/p16_explain_$b.txt" 2>&1
  done
  tpch_by_tune 4 p16_dist.md join_partitioned_max_partitions=0 join_partitioned_max_partitions=4
  log "done"
  exit 0
fi

if [ "$PART" = p16tpch ]; then
  # TPC-H SF 1 over Parquet on all cores with BIN's one-for-one Partitioned joins on any
  # partition count (join_partitioned_max_partitions=0) and with the limit of 4, alternating
  # (benches/distributed_tpch.py): in one process (--workers 0), then on 4 in-memory workers.
  for workers in 0 4; do
    tpch_by_tune $workers "p16_tpch_$workers.md" join_partitioned_max_partitions=0 join_partitioned_max_partitions=4
  done
  log "done"
  exit 0
fi

if [ "$PART" = q12why ]; then
  # TPC-H Q12 over Parquet in one process on all cores, BIN with the one-for-one partition limit
  # off and at 4: EXPLAIN ANALYZE of each, then Q12 timed (MPHF on and off) in three processes
  # each, alternating (benches/distributed_tpch.py --workers 0 runs all 22; this runs Q12 only).
  DATA=/tmp/tpch1
  [ -f "$DATA/lineitem.parquet" ] || "$BIN" tpch --scale 1 --output "$DATA" > "$OUT/tpch_gen.txt" 2>&1
  SLT="$(dirname "$0")/../sql-tests/tpch_queries.slt"
  mapfile -t IDX < <(grep '^CREATE INDEX' "$SLT" | sed 's/CREATE INDEX/CREATE INDEX IF NOT EXISTS/')
  Q12=$(awk '/^# Q12/{getline; getline; print; exit}' "$SLT")
  TABLES=()
  for t in lineitem orders customer part partsupp supplier nation region; do TABLES+=("--table=$t=$DATA/$t.parquet"); done
  IDXARGS=()
  for s in "${IDX[@]}"; do IDXARGS+=(-c "$s"); done
  for limit in 0 4; do
    log "Q12 EXPLAIN ANALYZE, join_partitioned_max_partitions=$limit"
    timeout 120 "$BIN" sql "${TABLES[@]}" --tune join_partitioned_max_partitions=$limit "${IDXARGS[@]}" \
      -c "EXPLAIN ANALYZE $Q12" > "$OUT/q12_explain_limit$limit.txt" 2>&1
  done
  for p in 1 2 3; do
    for limit in 0 4; do
      log "Q12 timed, join_partitioned_max_partitions=$limit, process $p"
      RUNS=()
      for r in 1 2 3 4 5 6; do
        RUNS+=(-c "SET mphf.enable_join = true" -c "SET mphf.enable_aggregate = true" -c "$Q12")
        RUNS+=(-c "SET mphf.enable_join = false" -c "SET mphf.enable_aggregate = false" -c "$Q12")
      done
      echo "### limit $limit, process $p" >> "$OUT/q12_times.txt"
      timeout 120 "$BIN" sql --format csv "${TABLES[@]}" --tune join_partitioned_max_partitions=$limit "${IDXARGS[@]}" \
        "${RUNS[@]}" 2>&1 >/dev/null | grep -E "row\(s\) in" >> "$OUT/q12_times.txt"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = distab ]; then
  # Issue 20 on all cores: TPC-H Q1-Q22 at SF 1 over Parquet on an in-memory cluster of 4
  # workers (benches/distributed_tpch.py, MPHF on and off in the same processes), BASE and BIN
  # alternating, two rounds of two processes each.
  BASE=${4:?base binary}
  DATA=/tmp/tpch1
  [ -f "$DATA/lineitem.parquet" ] || "$BIN" tpch --scale 1 --output "$DATA" > "$OUT/tpch_gen.txt" 2>&1
  for round in 1 2; do
    for b in BASE BIN; do
      log "$b: distributed TPC-H SF 1, 4 workers, round $round"
      echo "### $b, round $round" >> "$OUT/dist_ab.md"
      timeout 280 python3 "$(dirname "$0")/distributed_tpch.py" "${!b}" "$DATA" --workers 4 --processes 2 --runs 3 \
        >> "$OUT/dist_ab.md" 2>&1
      echo "exit $?" >> "$OUT/dist_ab.md"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = sf1 ]; then
  log "bench join SF 1, 16 partitions"
  timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown > "$OUT/join_sf1_p16.md" 2>&1
  log "bench join SF 1, lineitem ⋈ orders, EXPLAIN ANALYZE"
  timeout 60 "$BIN" bench join --scale 1 --runs 3 --explain --only "lineitem ⋈ orders" > "$OUT/join_sf1_p16_explain.txt" 2>&1
  log "bench groupby SF 1, 16 partitions"
  timeout 150 "$BIN" bench groupby --scale 1 --runs 5 --markdown > "$OUT/groupby_sf1_p16.md" 2>&1
  log "bench groupby SF 10, 16 partitions (dependent columns)"
  timeout 150 "$BIN" bench groupby --scale 10 --runs 3 --markdown --only "order columns" > "$OUT/groupby_sf10_p16_dep.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" = tpch10 ]; then
  # Issue 23: TPC-H Q1–Q22 at SF 10 in memory, 16 partitions, `auto` placement, in PROCS
  # processes (default 1; three fit in one device call), then Q17's plan with its metrics
  # (eight files at most come back from a device call: the processes share one log).
  for p in $(seq 1 "${PROCS:-1}"); do
    log "bench tpch SF 10, 16 partitions, process $p"
    timeout 300 "$BIN" bench tpch --scale 10 --runs 3 --markdown > "$OUT/tpch_sf10_p16_$p.md" 2>> "$OUT/tpch_sf10_p16.err"
  done
  log "bench tpch SF 10, Q17, EXPLAIN ANALYZE"
  timeout 120 "$BIN" bench tpch --scale 10 --runs 1 --explain --only 17 > /dev/null 2> "$OUT/tpch_sf10_q17_explain.txt"
  log "done"
  exit 0
fi

if [ "$PART" = tpch10why ]; then
  # Issue 23: the SF 10 queries below 0.95× (Q17's GPU placement; Q10, Q13, Q14, Q16), with
  # EXPLAIN ANALYZE under `auto`, and Q17 with the aggregate kept on the CPU.
  log "bench tpch SF 10, EXPLAIN ANALYZE of the slow queries, auto"
  timeout 300 "$BIN" bench tpch --scale 10 --runs 3 --markdown --explain --only 17 --only 10 --only 13 \
    --only 14 --only 16 > "$OUT/tpch_sf10_why.md" 2> "$OUT/tpch_sf10_why.err"
  log "bench tpch SF 10, Q17, aggregate_device=cpu"
  timeout 200 "$BIN" bench tpch --scale 10 --runs 3 --markdown --only 17 --set mphf.aggregate_device=cpu \
    > "$OUT/tpch_sf10_q17_cpu.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" = q17 ]; then
  # Issue 23: Q17 at SF 10 with its GROUP BY l_partkey on the CPU (per partition: a partitioned
  # join above needs the hash partitioning) and with the aggregate rule off, EXPLAIN ANALYZE.
  for set in mphf.aggregate_device=cpu mphf.enable_aggregate=false; do
    log "bench tpch SF 10, Q17, $set"
    timeout 200 "$BIN" bench tpch --scale 10 --runs 5 --markdown --explain --only 17 --set $set \
      > "$OUT/q17_${set//[.=]/_}.md" 2> "$OUT/q17_${set//[.=]/_}.err"
  done
  log "done"
  exit 0
fi

if [ "$PART" = suites ]; then
  # Issue 23: every row of `bench join` and `bench groupby` (SF 1, three processes each) and of
  # the sparse-key suite (30 M rows, in memory and over Parquet, one process) on 16 cores. The
  # processes append to one file per bench (eight files at most come back from a device call).
  for p in 1 2 3; do
    log "bench join SF 1, 16 partitions, process $p"
    timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown >> "$OUT/join_sf1_p16.md" 2>> "$OUT/suites.err"
    log "bench groupby SF 1, 16 partitions, process $p"
    timeout 120 "$BIN" bench groupby --scale 1 --runs 5 --markdown >> "$OUT/groupby_sf1_p16.md" 2>> "$OUT/suites.err"
  done
  log "bench sparse, 30 M rows, 16 partitions"
  timeout 240 "$BIN" bench sparse --rows 30000000 --runs 5 --parquet /tmp/sparse30m --markdown \
    > "$OUT/sparse_30m_p16.md" 2>> "$OUT/suites.err"
  log "done"
  exit 0
fi

if [ "$PART" = planning ]; then
  # Issue 23: only the planning the MPHF rules add over Parquet on 16 partitions (`mphf bench
  # planning --parquet`), BASE and BIN alternating, PROCESSES processes each (default 3), one
  # file per binary.
  # BASE may be `none`: BIN alone.
  BASE=${4:?base binary or none}
  PROCS=${5:-3}
  builds=(BASE BIN); [ "$BASE" = none ] && builds=(BIN)
  for p in $(seq 1 "$PROCS"); do
    for b in "${builds[@]}"; do
      log "$b: bench planning --parquet, 16 partitions, process $p"
      echo "### process $p" >> "$OUT/planning_$b.md"
      timeout 120 "${!b}" bench planning --parquet --partitions 16 --runs 31 --markdown \
        >> "$OUT/planning_$b.md" 2>> "$OUT/planning.err"
      echo "exit $?" >> "$OUT/planning_$b.md"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = planab ]; then
  # Issue 23 (session 43): the MPHF rules' planning time over Parquet on 16 partitions (`mphf
  # bench planning --parquet`), then the group-by and join suites over Parquet in one process
  # and on in-memory clusters of 4 workers; BASE and BIN alternating, two processes each, one
  # file per binary and form.
  BASE=${4:?base binary}
  for p in 1 2; do
    for b in BASE BIN; do
      log "$b: bench planning --parquet, 16 partitions, process $p"
      timeout 120 "${!b}" bench planning --parquet --partitions 16 --runs 31 --markdown \
        >> "$OUT/planning_$b.md" 2>> "$OUT/planab.err"
    done
  done
  for suite in groupby join; do
    for p in 1 2; do
      for form in parquet w4; do
        case $form in parquet) flags=(--parquet);; w4) flags=(--workers 4);; esac
        for b in BASE BIN; do
          log "$b: bench $suite SF 1, $form, process $p"
          echo "### process $p" >> "$OUT/${suite}_${form}_$b.md"
          timeout 150 "${!b}" bench "$suite" --scale 1 --runs 3 --markdown "${flags[@]}" \
            >> "$OUT/${suite}_${form}_$b.md" 2>> "$OUT/planab.err"
        done
      done
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = w4ab ]; then
  # Issue 20: `mphf bench SUITE` (groupby or join, SF 1) on in-memory clusters of 4 workers, BIN
  # against BASE (a second binary), alternating, two processes of each; one file per binary.
  BASE=${4:?base binary}
  SUITE=${5:?suite: groupby or join}
  for p in 1 2; do
    for b in BASE BIN; do
      log "$b: bench $SUITE SF 1, 4 workers, process $p"
      timeout 300 "${!b}" bench "$SUITE" --scale 1 --runs 3 --markdown --workers 4 \
        >> "$OUT/${SUITE}_w4_$b.md" 2>> "$OUT/w4ab.err"
      echo "exit $?" >> "$OUT/${SUITE}_w4_$b.md"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = suites4w ]; then
  # Issue 20: `mphf bench SUITE` (groupby or join, SF 1) on 16 cores in one process in memory,
  # in one process over Parquet, and on in-memory clusters of 4 workers over the same Parquet
  # files, two processes of each, alternating; one file per form.
  SUITE=${4:?suite: groupby or join}
  for p in 1 2; do
    for form in memory parquet w4; do
      case $form in memory) flags=();; parquet) flags=(--parquet);; w4) flags=(--workers 4);; esac
      log "bench $SUITE SF 1, $form, process $p"
      timeout 150 "$BIN" bench "$SUITE" --scale 1 --runs 3 --markdown "${flags[@]}" \
        >> "$OUT/${SUITE}_$form.md" 2>> "$OUT/suites4w.err"
      echo "exit $?" >> "$OUT/${SUITE}_$form.md"
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = parity ]; then
  # Parquet parity (benches/parquet_parity.sh): TPC-H SF 1 and SF 10 Parquet files with saved
  # indexes, `mphf sql` against `mphf sql --no-mphf`, 3 processes each.
  for sf in 1 10; do
    log "parquet parity, SF $sf"
    timeout 400 "$(dirname "$0")/parquet_parity.sh" "$BIN" "/tmp/tpch_parity_sf$sf" $sf 3 "$OUT/parity_sf$sf" \
      > "$OUT/parity_sf$sf.txt" 2>&1
  done
  log "done"
  exit 0
fi

if [ "$PART" = coldstart ]; then
  # Issue 23: the first query of a process under `auto`, whose indexed GROUP BY the model keeps
  # on the CPU, must not pay the CUDA context's start while planning. SF 1 Parquet (the parity
  # folder, made by one parity round), 3 processes per binary and session, each running the
  # query twice (first and second time in order). OLD_BIN (optional) is the build before.
  D=/tmp/tpch_parity_sf1
  log "parquet parity, SF 1, one round (makes the data and the indexes)"
  timeout 200 "$(dirname "$0")/parquet_parity.sh" "$BIN" "$D" 1 1 "$OUT/parity_sf1" > "$OUT/parity_sf1.txt" 2>&1
  Q="SELECT count(*), sum(n), max(q) FROM (SELECT l_orderkey, count(*) AS n, sum(l_quantity) AS q FROM lineitem GROUP BY l_orderkey)"
  for b in "$BIN" ${OLD_BIN:-}; do
    for p in 1 2 3; do
      for mode in mphf vanilla; do
        flag=(); [ "$mode" = vanilla ] && flag=(--no-mphf)
        times=$(timeout 60 "$b" sql "${flag[@]}" --table "lineitem=$D/lineitem.parquet" -c "$Q" -c "$Q" 2>&1 >/dev/null \
          | grep -o 'in [0-9.]* s' | tr '\n' ' ')
        echo "$(basename "$b") $mode process $p: $times" | tee -a "$OUT/coldstart.txt"
      done
    done
  done
  log "done"
  exit 0
fi

if [ "$PART" = auto ]; then
  # Issue 23: the cost model's constants measured on this host (one core), and `mphf demo`
  # (SF 1, 16 partitions, `auto` placement) in 3 processes.
  log "calibrate"
  timeout 150 "$BIN" calibrate --out "$OUT/costs.txt" > "$OUT/calibrate.txt" 2>&1
  for p in 1 2 3; do
    log "demo, process $p"
    timeout 150 "$BIN" demo --runs 5 > "$OUT/demo_p$p.txt" 2>&1
  done
  log "done"
  exit 0
fi

if [ "$PART" = auto10 ]; then
  # Issue 23: SF 10 GROUP BYs with the default `auto` placement (the cost model's device choice).
  log "bench groupby SF 10, auto"
  timeout 500 "$BIN" bench groupby --scale 10 --runs 3 --markdown --explain --only "GROUP BY l_orderkey" \
    --only "GROUP BY l_partkey" --only "o_cname" > "$OUT/gb_sf10_auto.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" = gpubuild ]; then
  # Issue 5: the CLI's GPU build times at the latency targets, kernels compiled before timing.
  timeout 240 "$BIN" bench build --device gpu --keys 5000000 --grid 16:2000,18:50 --runs 3 \
    --only recsplit --queries 100000 --max-build-secs 5 > "$OUT/bench_build_gpu5.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" = gpuprobe ]; then
  # Where the GPU placement's time goes (EXPLAIN ANALYZE metrics gpu_*_time), SF 1.
  T=/tmp/gpuprobe; mkdir -p $T
  timeout 120 "$BIN" bench slots --scale 1 --runs 7 > $T/slots_sf1.md 2>&1
  for dev in cpu gpu; do
    timeout 120 "$BIN" bench groupby --scale 1 --runs 3 --markdown --explain --only "GROUP BY l_orderkey" --only "l_suppkey" \
      --set mphf.aggregate_device=$dev > $T/gb_sf1_$dev.md 2>&1
  done
  for dev in cpu gpu; do
    timeout 100 "$BIN" bench groupby --scale 1 --runs 5 --markdown --only "mphf_index" \
      --set mphf.lookup_device=$dev > $T/udf_sf1_$dev.md 2>&1
  done
  for f in $T/*; do echo "=== $f"; cat $f; done > "$OUT/gpuprobe.md"
  log "done"
  exit 0
fi

if [ "$PART" = gpu ]; then
  # Issue 7: the GROUP BY operator on the GPU vs our CPU operator vs vanilla DataFusion (16
  # cores), SF 0.1 to 1 (the crossover of Tuning::aggregate_gpu_min_rows). Every bench compares
  # its rows with vanilla's.
  T=/tmp/gpuparts; mkdir -p $T
  for sf in 0.1 0.3 1; do
    for dev in cpu gpu; do
      log "bench groupby SF $sf, aggregate_device=$dev"
      timeout 150 "$BIN" bench groupby --scale $sf --runs 5 --markdown --only "GROUP BY l" --only "GROUP BY o" \
        --set mphf.aggregate_device=$dev > $T/gb_sf${sf}_$dev.md 2>&1
    done
  done
  log "bench groupby SF 1, aggregate_device=auto"
  timeout 150 "$BIN" bench groupby --scale 1 --runs 5 --markdown --only "GROUP BY l" --only "GROUP BY o" \
    > $T/gb_sf1_auto.md 2>&1
  for f in $T/*; do echo "=== $f"; cat $f; done > "$OUT/gpu.md"
  log "done"
  exit 0
fi

if [ "$PART" = gpu10 ]; then
  for dev in cpu gpu; do
    log "bench groupby SF 10, aggregate_device=$dev"
    timeout 280 "$BIN" bench groupby --scale 10 --runs 3 --markdown --explain --only "GROUP BY l" --only "GROUP BY o" \
      --set mphf.aggregate_device=$dev > "$OUT/gb_sf10_$dev.md" 2>&1
  done
  log "done"
  exit 0
fi

if [ "$PART" = joinmodel ]; then
  # The join's cost figures by partitions: the same SF 1 joins on 2, 4, 8 and 16 partitions of
  # the 16-core host, and per-operator metrics (EXPLAIN ANALYZE) of the MPHF plan and of the
  # same session with the join operator off (DataFusion's plan) on 16.
  for p in 2 4 8 16; do
    log "bench join SF 1, $p partitions"
    timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown --partitions $p > "$OUT/join_sf1_p$p.md" 2>&1
    timeout 100 "$BIN" bench groupby --scale 1 --runs 5 --markdown --partitions $p --only "c_name" --only "order columns" \
      > "$OUT/gbjoin_sf1_p$p.md" 2>&1
    timeout 60 "$BIN" bench join --scale 1 --runs 3 --explain --partitions $p --only "orders (orderkey)" \
      --only "customer (custkey)" > "$OUT/join_sf1_p${p}_explain_mphf.txt" 2>&1
  done
  log "EXPLAIN ANALYZE, 16 partitions, MPHF and DataFusion plans"
  timeout 100 "$BIN" bench join --scale 1 --runs 3 --explain > "$OUT/join_sf1_p16_explain_mphf.txt" 2>&1
  timeout 100 "$BIN" bench join --scale 1 --runs 3 --explain --set mphf.enable_join=false \
    > "$OUT/join_sf1_p16_explain_vanilla.txt" 2>&1
  log "bench join SF 10, 16 partitions"
  timeout 200 "$BIN" bench join --scale 10 --runs 3 --markdown > "$OUT/join_sf10_p16.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" = semi ]; then
  # The semi join priced by its join type: SF 1 on 2, 4, 8 and 16 partitions, two processes
  # each, and SF 10 on 16.
  for p in 2 4 8 16; do
    for r in 1 2; do
      log "bench join SF 1 semi, $p partitions, process $r"
      timeout 60 "$BIN" bench join --scale 1 --runs 5 --markdown --partitions $p --only "semi" \
        > "$OUT/semi_sf1_p${p}_$r.md" 2>&1
    done
  done
  log "bench join SF 10 semi, 16 partitions"
  timeout 200 "$BIN" bench join --scale 10 --runs 3 --markdown --only "semi" > "$OUT/semi_sf10_p16.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" = forms ]; then
  # The join's collect form vs its partitioned (one build per partition) form on 16 partitions.
  for form in collect partitioned; do
    set_arg=""; [ "$form" = partitioned ] && set_arg="--tune join_collect_max_partitions=8"
    log "bench join SF 1, 16 partitions, $form form"
    timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown $set_arg > "$OUT/join_sf1_p16_$form.md" 2>&1
    log "bench join SF 1 lineitem ⋈ orders EXPLAIN ANALYZE, $form form"
    timeout 60 "$BIN" bench join --scale 1 --runs 3 --explain --only "lineitem ⋈ orders" $set_arg > "$OUT/join_sf1_p16_${form}_explain.txt" 2>&1
    log "bench groupby SF 1, 16 partitions, joins feeding GROUP BYs, $form form"
    timeout 60 "$BIN" bench groupby --scale 1 --runs 5 --markdown --only "c_name" $set_arg > "$OUT/groupby_sf1_p16_cname_$form.md" 2>&1
    timeout 60 "$BIN" bench groupby --scale 1 --runs 5 --markdown --only "order columns" $set_arg > "$OUT/groupby_sf1_p16_dep_$form.md" 2>&1
    log "bench join SF 10, 16 partitions, $form form"
    timeout 150 "$BIN" bench join --scale 10 --runs 3 --markdown --only "orders (orderkey)" $set_arg > "$OUT/join_sf10_p16_$form.md" 2>&1
  done
  log "done"
  exit 0
fi

if [ "$PART" = joins ]; then
  log "bench join SF 1, 16 partitions"
  timeout 100 "$BIN" bench join --scale 1 --runs 5 --markdown > "$OUT/join_sf1_p16.md" 2>&1
  log "bench join SF 10, 16 partitions (joins only)"
  timeout 200 "$BIN" bench join --scale 10 --runs 3 --markdown --only "⋈" > "$OUT/join_sf10_p16.md" 2>&1
  log "bench groupby SF 10, 16 partitions (GROUP BY only)"
  timeout 200 "$BIN" bench groupby --scale 10 --runs 3 --markdown --only "GROUP BY" > "$OUT/groupby_sf10_p16.md" 2>&1
  log "done"
  exit 0
fi

if [ "$PART" != sf10 ]; then
log "TPC-H SF 1 parquet"
"$BIN" tpch --scale 1 --output /tmp/tpch1 --tables lineitem,orders 2>&1 | tail -3 | tee -a "$OUT/summary.txt"

log "mphf build --device cpu|gpu, then lookups through both indexes must be identical"
for dev in cpu gpu; do
  for p in "--leaf 8 --bucket 100" "--leaf 12 --bucket 2000 --rotation"; do
    tag=$(echo "$p" | tr -d ' -')
    /usr/bin/time -f "%e s" "$BIN" build --input /tmp/tpch1/lineitem.parquet --column l_orderkey $p --device $dev \
      --output "/tmp/li_${dev}_$tag.mphf" 2>&1 | tee -a "$OUT/summary.txt"
  done
done
for p in "--leaf 8 --bucket 100" "--leaf 12 --bucket 2000 --rotation"; do
  tag=$(echo "$p" | tr -d ' -')
  for dev in cpu gpu; do
    "$BIN" inspect /tmp/li_${dev}_$tag.mphf > "$OUT/inspect_${dev}_$tag.json" 2>&1
    "$BIN" lookup --index /tmp/li_${dev}_$tag.mphf --input /tmp/tpch1/orders.parquet --column o_orderkey \
      --output /tmp/slots_${dev}_$tag.parquet 2>&1 | tail -1
  done
  if cmp -s /tmp/slots_cpu_$tag.parquet /tmp/slots_gpu_$tag.parquet; then
    echo "$tag: CPU and GPU lookups identical" | tee -a "$OUT/summary.txt"
  else
    echo "$tag: CPU and GPU lookups DIFFER" | tee -a "$OUT/summary.txt"
  fi
done

log "SQL: CREATE INDEX ... WITH (device = 'gpu') vs 'cpu'"
"$BIN" sql --format csv --table lineitem=/tmp/tpch1/lineitem.parquet \
  -c "SET mphf.persist = false" \
  -c "CREATE INDEX g ON lineitem USING mphf (l_orderkey) WITH (device = 'gpu', leaf = 12, bucket = 2000, rotation = true)" \
  -c "SELECT name, keys, bits_per_key, device FROM mphf_indexes()" \
  -c "SELECT count(DISTINCT mphf_index(l_orderkey)), max(mphf_index(l_orderkey)) FROM lineitem" 2>&1 | tee -a "$OUT/summary.txt"

log "bench build --device gpu vs cpu, 5e6 keys"
timeout 240 "$BIN" bench build --device gpu --keys 5000000 --grid 8:100,12:2000,16:2000,18:50 --runs 1 \
  --only recsplit --queries 200000 --max-build-secs 60 2>&1 | tee "$OUT/bench_build_gpu.md" | tail -12
timeout 120 "$BIN" bench build --device cpu --keys 5000000 --grid 8:100,12:2000 --runs 1 \
  --only recsplit --queries 200000 --max-build-secs 60 2>&1 | tee "$OUT/bench_build_cpu.md" | tail -8

log "bench groupby SF 1, 16 partitions"
timeout 150 "$BIN" bench groupby --scale 1 --runs 5 --markdown 2>&1 | tee "$OUT/groupby_sf1.md" | tail -12
fi
if [ "$PART" != build ]; then
log "bench groupby SF 10, 16 partitions"
timeout 480 "$BIN" bench groupby --scale 10 --runs 3 --markdown 2>&1 | tee "$OUT/groupby_sf10.md" | tail -12
fi
log "done"
