#!/usr/bin/env bash
# Nsight Compute on BERT-base's products (batch 32) in kiln's INT8 warpgroup kernel beside
# cuBLASLt's FP16 and FP8 kernels at the same shapes, and on BERT-base's attention: where the
# kernels' time goes (tensor pipe, L2 and DRAM throughput, stall reasons), on a GPU machine.
#
#   KILN_BUNDLE=$PWD/.bundle1.tgz OUT=$OUT bench/cuda/ncu_products.sh
#
# Bundle: cuda_kernels_bench (scripts/bundle_gpu.sh). Environment: OUT (results folder),
# PRODUCTS (default "qkv fc1 attn_out fc2"), TILES (KILN_CUDA_WGMMA_TILES, default the binary's
# order; t0 is the first), SASS (1: also the per-instruction stall samples of the INT8 QKV
# kernel). Clocks are left alone (--clock-control none), as the machine's notes ask.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/scripts/gpu_env.sh"
B=$root/.bundle/bin
OUT=${OUT:?set OUT to the folder for results}
PRODUCTS=${PRODUCTS:-qkv fc1 attn_out fc2}
SASS=${SASS:-1}
[ -n "${TILES:-}" ] && export KILN_CUDA_WGMMA_TILES=$TILES
export KILN_CUDA_QUANT_TACTICS=1 KILN_CUDA_INT8_KERNEL=all KILN_CUDA_FP8_KERNEL=all
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
NCU=(ncu --clock-control none --launch-skip 3 --launch-count 1)
prof() {  # name kernel-regex bench-filter [set]
  timeout 120 "${NCU[@]}" --set "${4:-full}" -k "regex:$2" "$B/cuda_kernels_bench" \
    --benchmark_min_time=0.001 --benchmark_filter="$3" >"$OUT/ncu_$1.txt" 2>&1
  echo "$1 rc $? $(grep -m1 -E 'Duration' "$OUT/ncu_$1.txt")"
}
for p in $PRODUCTS; do
  prof "${p}_i8io" 'Int8Wgmma' "^bert_${p}_i8io_wgmma_t0/"
  prof "${p}_f16" 'nvjet|sm90|gemm' "^bert_${p}_f16/"
  prof "${p}_f8lt" 'nvjet|sm90|gemm' "^bert_${p}_f8_cublaslt_fast_t0/"
done
prof attn 'ttention|flash' '^attention_bert_b32_t0/'
if [ "$SASS" = 1 ]; then
  timeout 120 "${NCU[@]}" -k regex:Int8Wgmma --section SourceCounters --page source \
    --print-source sass --csv "$B/cuda_kernels_bench" --benchmark_min_time=0.001 \
    --benchmark_filter='^bert_qkv_i8io_wgmma_t0/' >"$OUT/sass_qkv_i8io.csv" 2>&1
  echo "sass rc $?"
  gzip -f "$OUT/sass_qkv_i8io.csv"
fi
# The headline rows of each report, for the log.
for f in "$OUT"/ncu_*.txt; do
  echo "== $(basename "$f")"
  grep -E "^  [a-zA-Z_0-9<>:, ]+\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size|Dynamic Shared" "$f" | head -14
done
# PyTorch's attention at the bench's attention shapes (bench/cuda/sdpa_ref.py), for the
# attention_* rows of cuda_kernels_bench.
timeout 60 python3 "$root/bench/cuda/sdpa_ref.py" >"$OUT/sdpa_ref.txt" 2>&1
echo "sdpa rc $?"; cat "$OUT/sdpa_ref.txt"
