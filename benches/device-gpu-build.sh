#!/usr/bin/env bash
# One device run of examples/gpu_bench (issue 5) on the H200 (no Rust there).
# Usage on the device: benches/device-gpu-build.sh BIN_DIR OUT_DIR, where BIN_DIR holds
# gpu_bench.xz (built here with
# `cargo build --release --no-default-features --features cuda --example gpu_bench`,
# stripped and xz-compressed). PARTS picks the parts (default: all of them):
#   stages   per-stage times (MPHF_GPU_PROFILE=1) at the latency targets, both key sets, and
#            A/B runs of the defaults (MPHF_GPU_AGG_TABLE=0, MPHF_GPU_LEAF_BUDGET=FIRST,LATER)
#   grid     the byte-equality grid (ℓ 2..=24 × b × rotation, n up to 10^7) and chunked solving
#   bench    the timing table, GPU vs CPU on all cores, n = 5·10^6 and 5·10^7
# Each part has its own timeout so that one slow part cannot take the others' results with it.
# At most 8 files come back from OUT: one .md per part, stderr of all parts in err.txt.
set -u
DIR=${1:?binary dir}
OUT=${2:?output dir}
mkdir -p "$OUT"
xz -dkf "$DIR/gpu_bench.xz" && chmod +x "$DIR/gpu_bench"
B="$DIR/gpu_bench"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc; date -u; } > "$OUT/gpu.txt" 2>&1
run() { # name timeout args...
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  echo "== $name $*" >> "$OUT/err.txt"
  timeout "$t" "$B" "$@" >> "$OUT/$name.md" 2>> "$OUT/err.txt"
  echo "$name: rc=$? $(( $(date +%s) - s )) s" | tee -a "$OUT/summary.txt"
}
PARTS=${PARTS:-stages grid bench}
for p in $PARTS; do
  case $p in
    stages)
      export MPHF_GPU_PROFILE=1
      for cfg in 18,50,1,5000000 16,2000,1,5000000; do
        run stages 60 --one "$cfg"
        MPHF_BENCH_CLI_KEYS=1 run stages 60 --one "$cfg"
      done
      run stages 60 --one 18,50,1,50000000
      # A/B of the defaults: split_agg without its increment table, leaf pass budgets.
      MPHF_GPU_AGG_TABLE=0 run stages 60 --one 16,2000,1,5000000
      for b in 4,4 2,1; do MPHF_GPU_LEAF_BUDGET=$b run stages 60 --one 18,50,1,5000000; done
      unset MPHF_GPU_PROFILE ;;
    grid) run grid 300 --grid 1e7 10000000 ;;
    bench) run bench 330 --bench --ns 5000000,50000000 --reps 3 --cap 3 --gpu-cap 20 ;;
  esac
done
