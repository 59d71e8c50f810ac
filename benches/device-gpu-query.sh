#!/usr/bin/env bash
# One device run of examples/gpu_query_bench (issue 7) on the H200 (no Rust there).
# Usage on the device: benches/device-gpu-query.sh BIN_DIR OUT_DIR, where BIN_DIR holds
# gpu_query_bench.xz (built here with
# `cargo build --release --no-default-features --features cuda --example gpu_query_bench`,
# stripped and xz-compressed). Each part has its own timeout so that one slow part cannot
# take the others' results with it.
# PARTS=staging: `--slotmap-files` (slot maps of 64 files at once on the GPU, 40 rounds) in
# STAGING_PROCS processes (default 4), each under a 60 s timeout (rc=124: it hung); with
# gpu_query_bench_base.xz in BIN_DIR too, that build alternates with it (named base_*).
set -u
DIR=${1:?binary dir}
OUT=${2:?output dir}
mkdir -p "$OUT"
xz -dkf "$DIR/gpu_query_bench.xz" && chmod +x "$DIR/gpu_query_bench"
B="$DIR/gpu_query_bench"
if ! ldconfig -p | grep -q libnvrtc; then
  NV=$(python3 -c 'import nvidia,os;print(os.path.join(nvidia.__path__[0],"cu13","lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${NV}:${LD_LIBRARY_PATH:-}
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc; date -u; } > "$OUT/gpu.txt" 2>&1
# At most 8 files come back from $OUT: one .md per part, stderr of all parts in err.txt.
run() { # name timeout args...
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  echo "== $name" >> "$OUT/err.txt"
  timeout "$t" "${BIN:-$B}" "$@" > "$OUT/$name.md" 2>> "$OUT/err.txt"
  echo "$name: rc=$? $(( $(date +%s) - s )) s" | tee -a "$OUT/summary.txt"
}
staging() { # alternating processes of the base build (when carried) and this one
  local base="" i
  if [ -f "$DIR/gpu_query_bench_base.xz" ]; then
    xz -dkf "$DIR/gpu_query_bench_base.xz" && chmod +x "$DIR/gpu_query_bench_base" && base="$DIR/gpu_query_bench_base"
  fi
  for i in $(seq 1 "${STAGING_PROCS:-4}"); do
    [ -n "$base" ] && BIN=$base run "base_staging_$i" 60 --slotmap-files 64,200000,40
    run "staging_$i" 60 --slotmap-files 64,200000,40
  done
  for i in "$OUT"/*staging_*.md; do echo "== $(basename "$i")"; cat "$i"; done > "$OUT/staging.txt"
  rm -f "$OUT"/*staging_*.md
}
PARTS=${PARTS:-check lookup groupby check_big}
for p in $PARTS; do
  case $p in
    check) run check 150 --check --gb-rows 1,1000,1e6,1e7 ;;
    check_gb) run check 120 --check --no-lookup-check --gb-rows 1,1000,1e6,1e7 ;;
    lookup) run lookup 150 --lookup --max-rows 5e7 ;;
    groupby) run groupby 150 --groupby --zipf ;;
    check_big) run check_big 100 --check --no-lookup-check --gb-rows 1e8 ;;
    staging) staging ;;
  esac
done
cat "$OUT/gpu.txt" "$OUT/summary.txt"
grep -h -E "differ|NO\*\*|check:|panicked|error" "$OUT"/*.md "$OUT"/err.txt | head -20
