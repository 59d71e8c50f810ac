#!/usr/bin/env bash
# GPU build at scale (issue 21), one device run on the H200 (no Rust there).
# Usage on the device: benches/device-gpu-scale.sh BIN_DIR OUT_DIR, where BIN_DIR holds
# gpu_bench.xz and gpu_query_bench.xz (built here with
# `cargo build --release --no-default-features --features cuda --example gpu_bench --example gpu_query_bench`,
# stripped and xz-compressed).
#
# Environment:
#   PARTS    the parts to run (default: peer stages huge slotmap)
#   PEER     a GpuRecSplit `gpurecsplit_construction` binary built on the host from its
#            published sources (shared/docs/gpurecsplit-peer.md says how; this repository holds
#            no recipe for it). Without it, `peer` times only our build.
#   KDIR_A   a directory of kernel sources to compare against the built-in ones in `stages`
#            (MPHF_GPU_KERNELS, e.g. the kernels/ of an earlier commit); optional.
#   REPS     processes per configuration in `peer`, `stages` and `host` (default 3).
#   CFGS     the `peer` configurations as ℓ,b,n words (default: the issue's five rows).
#
# Parts:
#   peer     the issue's table: for each (ℓ, b, n), the peer and our `gpu_bench --one`, three
#            processes each, interleaved; rotation on; every key set random 64-bit.
#   stages   per-stage times (MPHF_GPU_PROFILE=1) at (16, 2000) and (18, 50), n = 5·10^6, with
#            the built-in kernels and with KDIR_A, interleaved.
#   ncu      Nsight Compute on the split_agg launches at (16, 2000) and the leaf passes at
#            (18, 50) (clock control off, as the host's METHOD.md asks).
#   host     host stages of whole builds (MPHF_BUILD_PROFILE=1: bucketing, checks, solve, encoding,
#            Elias–Fano; with MPHF_GPU_PROFILE=1 the device stages inside solve) at (8, 100),
#            n = 5·10^7, and (16, 2000), n = 5·10^6.
#   huge     10^9 random keys at (8, 100) with rotation, end to end, bijection checked on the host.
#   slotmap  slot maps of 10^8 and 10^9 rows: resident, end to end, copy floors, CPU equality.
#   grid     the byte-equality grid against the CPU build (ℓ 2..=24 × b × rotation).
# At most 8 files come back: one .md per part (ncu.txt for ncu), stderr of all parts in err.txt.
set -u
DIR=${1:?binary dir}
OUT=${2:?output dir}
mkdir -p "$OUT"
for b in gpu_bench gpu_query_bench; do
  xz -dkf "$DIR/$b.xz" && chmod +x "$DIR/$b"
done
G="$DIR/gpu_bench"
Q="$DIR/gpu_query_bench"
if ! ldconfig -p | grep -q libnvrtc; then
  NV=$(python3 -c 'import nvidia,os;print(os.path.join(nvidia.__path__[0],"cu13","lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${NV}:${LD_LIBRARY_PATH:-}
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc; date -u; } > "$OUT/gpu.txt" 2>&1
run() { # name timeout command...
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  echo "== $name $*" >> "$OUT/err.txt"
  timeout "$t" "$@" >> "$OUT/$name.md" 2>> "$OUT/err.txt"
  echo "$name: rc=$? $(( $(date +%s) - s )) s: $*" >> "$OUT/summary.txt"
}
PARTS=${PARTS:-peer stages huge slotmap}
for p in $PARTS; do
  case $p in
    peer)
      for cfg in ${CFGS:-16,2000,5000000 18,50,5000000 8,100,50000000 12,2000,5000000 16,2000,50000000}; do
        IFS=, read -r l b n <<< "$cfg"
        for rep in $(seq "${REPS:-3}"); do
          if [ -n "${PEER:-}" ]; then
            echo "PEER ($l,$b) n=$n rep=$rep" >> "$OUT/peer.md"
            GRS_WARMUP=1 run peer 120 "$PEER" -n "$n" -q 1000000 -l "$l" -b "$b" -t "$(nproc)" -L rotations
          fi
          run peer 120 "$G" --one "$l,$b,1,$n" --reps 1
        done
      done ;;
    stages)
      for cfg in 16,2000,1,5000000 18,50,1,5000000; do
        for rep in $(seq "${REPS:-3}"); do
          MPHF_GPU_PROFILE=1 run stages 60 "$G" --one "$cfg" --reps 1
          if [ -n "${KDIR_A:-}" ]; then
            echo "(kernels of $KDIR_A)" >> "$OUT/stages.md"
            MPHF_GPU_KERNELS="$KDIR_A" MPHF_GPU_PROFILE=1 run stages 60 "$G" --one "$cfg" --reps 1
          fi
        done
      done ;;
    host)
      for cfg in 8,100,1,50000000 16,2000,1,5000000; do
        for rep in $(seq "${REPS:-3}"); do
          echo "HOST $cfg rep=$rep" >> "$OUT/err.txt"
          MPHF_BUILD_PROFILE=1 MPHF_GPU_PROFILE=1 run host 120 "$G" --one "$cfg" --reps 1
        done
      done ;;
    ncu)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --section Occupancy"
      # shellcheck disable=SC2086
      run ncu 200 "$NCU" --clock-control none -k regex:split_agg -c 4 $S "$G" --one 16,2000,1,5000000 --reps 1
      # shellcheck disable=SC2086
      run ncu 200 "$NCU" --clock-control none -k regex:leaf_pass -c 3 $S "$G" --one 18,50,1,5000000 --reps 1
      mv "$OUT/ncu.md" "$OUT/ncu.txt" ;;
    huge)
      MPHF_GPU_PROFILE=1 run huge 400 "$G" --one 8,100,1,1000000000 --reps 1 --gpu-cap 1000 --verify ;;
    slotmap) run slotmap 400 "$Q" --slotmap 1e8,1e9 --reps 5 ;;
    grid) run grid 330 "$G" --grid 1e7 10000000 ;;
  esac
done
cat "$OUT/gpu.txt" "$OUT/summary.txt"
grep -h -E "FAIL|NO\*\*|differ|panicked|error" "$OUT"/*.md "$OUT"/err.txt | head -20
