#!/usr/bin/env bash
# Seeds the load_index fuzzer's corpus with real index files of several key types and
# parameters (small TPC-H tables), so that mutations start from valid structures.
# Usage: fuzz/seed-corpus.sh [MPHF_BINARY]   (default: target/release/mphf)
set -euo pipefail
cd "$(dirname "$0")/.."
mphf=${1:-target/release/mphf}
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
corpus=fuzz/corpus/load_index
mkdir -p "$corpus"
"$mphf" tpch --scale 0.002 --output "$data" --tables region,nation,supplier,customer,orders >/dev/null
build() { # table column leaf bucket [--rotation]
  "$mphf" build --input "$data/$1.parquet" --column "$2" --leaf "$3" --bucket "$4" ${5:-} \
    --device cpu --output "$corpus/$1-$2-l$3-b$4${5:+-rot}.mphf" >/dev/null
}
build region r_regionkey 8 100
build nation n_name 8 100
build nation n_nationkey 2 5
build supplier s_suppkey 5 20 --rotation
build supplier s_name 16 2000
build customer c_custkey 8 100
build customer c_phone 3 10
build orders o_orderdate 8 100
build orders o_orderkey 12 400 --rotation
ls "$corpus" | wc -l
