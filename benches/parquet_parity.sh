#!/usr/bin/env bash
# Parquet parity: queries over TPC-H Parquet files with saved MPHF indexes on the order keys,
# in the MPHF session (`mphf sql`) and in plain DataFusion (`mphf sql --no-mphf`), one process
# per session and round, alternating which goes first. Most of these queries have no MPHF
# operator in their plan: they check that an indexed table's scan keeps every optimization
# DataFusion makes without indexes (sort pushdown into the scan, TopK and join dynamic
# filters, projection and filter pushdown).
# Usage: benches/parquet_parity.sh BIN DIR SCALE ROUNDS OUT
#   BIN: a release `mphf`; DIR: the TPC-H folder (generated when missing); OUT: results folder.
# Prints one line per query: median ms of each session over ROUNDS processes × RUNS runs, and
# the speed-up (vanilla / MPHF); the same lines go to OUT/parity.md.
set -eu
BIN=${1:?mphf binary}
DIR=${2:?tpch folder}
SCALE=${3:-1}
ROUNDS=${4:-3}
OUT=${5:?output folder}
RUNS=5
mkdir -p "$OUT"
if [ ! -f "$DIR/lineitem.parquet" ]; then
  "$BIN" tpch --scale "$SCALE" -o "$DIR" --tables lineitem,orders > "$OUT/tpch.txt" 2>&1
fi
TABLES=(--table "lineitem=$DIR/lineitem.parquet" --table "orders=$DIR/orders.parquet")
# Saved indexes (reused when present): the MPHF session's tables carry them.
"$BIN" sql -q "${TABLES[@]}" -c "CREATE INDEX IF NOT EXISTS li_ok ON lineitem USING mphf (l_orderkey)" \
  -c "CREATE INDEX IF NOT EXISTS o_ok ON orders USING mphf (o_orderkey)" > "$OUT/index.txt" 2>&1

QUERIES=(
  "top 10 by key, descending|SELECT l_orderkey, l_extendedprice FROM lineitem ORDER BY l_orderkey DESC LIMIT 10"
  "top 10 by key|SELECT l_orderkey, l_partkey, l_quantity FROM lineitem ORDER BY l_orderkey LIMIT 10"
  "top 10 by price|SELECT l_orderkey, l_extendedprice FROM lineitem ORDER BY l_extendedprice DESC, l_orderkey LIMIT 10"
  "join, filter on orders|SELECT count(*), sum(l_quantity) FROM lineitem JOIN orders ON l_orderkey = o_orderkey WHERE o_totalprice > 500000"
  "join, key range|SELECT count(*), sum(l_quantity) FROM lineitem JOIN orders ON l_orderkey = o_orderkey WHERE o_orderkey < 60000"
  "semi join, filter|SELECT count(*) FROM lineitem WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_orderpriority = '1-URGENT')"
  "GROUP BY l_orderkey|SELECT count(*), sum(n), max(q) FROM (SELECT l_orderkey, count(*) AS n, sum(l_quantity) AS q FROM lineitem GROUP BY l_orderkey)"
)
SQL="$OUT/queries.sql"
: > "$SQL"
for q in "${QUERIES[@]}"; do
  for _ in $(seq $RUNS); do echo "${q#*|};" >> "$SQL"; done
done
for r in $(seq "$ROUNDS"); do
  for mode in mphf vanilla; do
    [ $((r % 2)) = 0 ] && mode=$([ $mode = mphf ] && echo vanilla || echo mphf)
    flag=$([ $mode = vanilla ] && echo --no-mphf || true)
    # Result rows to stdout (compared below), "N row(s) in S s" timings to stderr.
    "$BIN" sql $flag --format csv "${TABLES[@]}" -f "$SQL" > "$OUT/rows_${mode}_$r.csv" 2> "$OUT/times_${mode}_$r.txt"
  done
done
python3 - "$OUT" "$ROUNDS" "$RUNS" "${QUERIES[@]}" <<'PY'
import re, statistics, sys
out, rounds, runs, queries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def times(mode, r):
    text = open(f"{out}/times_{mode}_{r}.txt").read()
    return [float(s) * 1e3 for s in re.findall(r"row\(s\) in ([0-9.]+) s", text)]
rows = lambda mode, r: sorted(open(f"{out}/rows_{mode}_{r}.csv").read().splitlines())
same = all(rows("mphf", r) == rows("vanilla", r) for r in range(1, rounds + 1))
lines = ["| query | vanilla ms | mphf ms | speed-up (per process) | median |", "|---|---|---|---|---|"]
for i, q in enumerate(queries):
    label = q.split("|")[0]
    per = {m: [times(m, r)[i * runs:(i + 1) * runs] for r in range(1, rounds + 1)] for m in ("vanilla", "mphf")}
    v = statistics.median([t for ts in per["vanilla"] for t in ts])
    m = statistics.median([t for ts in per["mphf"] for t in ts])
    ratios = [statistics.median(a) / statistics.median(b) for a, b in zip(per["vanilla"], per["mphf"])]
    lines.append(f"| {label} | {v:.1f} | {m:.1f} | {', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f}× |")
lines.append(f"same rows: {'yes' if same else 'NO'}")
open(f"{out}/parity.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
