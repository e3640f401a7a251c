#!/usr/bin/env bash
# Runs ON the GPU machine (builds nothing): (a) conformance on the GPU: every cuda_*_tests binary
# in the bundle and the op conformance suite (op_conformance_tests, its CUDA instantiation), then `kiln conformance --backend cuda` over the zoo (FP32, and FP16 where this
# kiln's conformance has --fp16); (b) the benchmark of issue 4: export ResNet-50, BERT-base and
# GPT-2 small with torch, build kiln engines, time kiln against PyTorch eager / torch.compile /
# torch.compile(mode="reduce-overhead") in the same run. Results go to $OUT (JSON and logs); a
# short table is printed last. Bounded: every step has a timeout; the whole run fits in ~9 min.
#
#   scripts/bundle_gpu.sh            # here: builds build-cuda, writes .bundle.tgz
#   run(carry=[".bundle.tgz"]): source scripts/gpu_env.sh && scripts/gpu_run.sh [options]
#
# Options: --conformance-only | --bench-only; --models resnet50,bert_base,gpt2; --batches 1,32;
#          --modes eager,default,reduce-overhead; --iterations N; --no-kiln (PyTorch side only,
#          a dry run of export and timing); --budget SECONDS for the benchmark (default 420).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=/dev/null
source scripts/gpu_env.sh
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
KILN=${KILN:-$PWD/.bundle/bin/kiln}
PY=${PYTHON:-python3}

conformance=1 bench=1 models=resnet50,bert_base,gpt2 batches=1,32
modes=eager,default,reduce-overhead iterations=50 no_kiln="" budget=420
while [ $# -gt 0 ]; do
  case "$1" in
    --conformance-only) bench=0 ;;
    --bench-only) conformance=0 ;;
    --models) models=$2; shift ;;
    --batches) batches=$2; shift ;;
    --modes) modes=$2; shift ;;
    --iterations) iterations=$2; shift ;;
    --no-kiln) no_kiln=--no-kiln ;;
    --budget) budget=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

summary=()
note() { summary+=("$1"); echo "== $1"; }
t_start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'

if [ "$conformance" = 1 ]; then
  # (a1) the CUDA test binaries the bundle carries, and the op conformance suite on CUDA.
  for t in .bundle/bin/cuda_*_tests .bundle/bin/op_conformance_tests; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    filter=()
    [ "$name" = op_conformance_tests ] && filter=(--gtest_filter='*/cuda*')
    timeout 180 "$t" --gtest_brief=1 "${filter[@]}" >"$OUT/$name.log" 2>&1
    rc=$?
    pass=$(grep -c '^\[       OK \]' "$OUT/$name.log")
    fail=$(grep -c '^\[  FAILED  \]' "$OUT/$name.log")
    skip=$(grep -c '^\[  SKIPPED \]' "$OUT/$name.log")
    note "$name: rc $rc ($(grep -E '^\[  PASSED  \]|tests ran' "$OUT/$name.log" | tail -1 | tr -s ' '), failed lines $fail, skipped $skip)"
    [ "$rc" = 0 ] || grep -E '^\[  FAILED  \]|Failure|error' "$OUT/$name.log" | head -20
    : "$pass"
  done
  # (a2) the zoo through the whole engine path on the GPU, FP32 then FP16.
  if [ -x "$KILN" ] && [ -d zoo ]; then
    timeout 240 "$KILN" conformance --backend cuda zoo --rel-l2 1e-4 --json "$OUT/conformance_cuda_fp32.json" \
      >"$OUT/conformance_cuda_fp32.log" 2>&1
    note "zoo conformance cuda fp32: rc $? — $(grep -iE 'passed|cases' "$OUT/conformance_cuda_fp32.log" | tail -1)"
    if "$KILN" conformance --help 2>/dev/null | grep -q -- --fp16; then
      timeout 240 "$KILN" conformance --backend cuda --fp16 zoo --json "$OUT/conformance_cuda_fp16.json" \
        >"$OUT/conformance_cuda_fp16.log" 2>&1
      note "zoo conformance cuda fp16: rc $? — $(grep -iE 'passed|cases' "$OUT/conformance_cuda_fp16.log" | tail -1)"
    else
      note "zoo conformance cuda fp16: skipped (this kiln's conformance has no --fp16 yet)"
    fi
  fi
fi

if [ "$bench" = 1 ]; then
  # (b) export, build, check and time; bounded by --budget seconds.
  work=${TMPDIR:-/tmp}/kiln_gpu_bench
  mkdir -p "$work"
  timeout 120 $PY bench/cuda/export_models.py --out "$work/models" --models "$models" \
    --batches "$batches" 2>&1 | tee "$OUT/export.log" | grep -v Warning
  fp16_note="--fp16"
  "$KILN" build --help 2>/dev/null | grep -q -- --fp16 || fp16_note="fp32 (no --fp16 in this kiln)"
  echo "kiln build precision flag: $fp16_note (FP32 fallback if the build rejects it)"
  timeout "$budget" $PY bench/cuda/bench_vs_torch.py --kiln "$KILN" --models-dir "$work/models" \
    --work "$work/engines" --out "$OUT/bench_cuda.json" --models "$models" --batches "$batches" \
    --modes "$modes" --iterations "$iterations" --layers-dir "$work/layers" $no_kiln 2>&1 |
    tee "$OUT/bench.log" | grep -vE 'Warning|warn\(|^\||^build '
  note "benchmark: rc ${PIPESTATUS[0]}, results in $OUT/bench_cuda.json"
  # Per-layer GPU times of each engine, one archive (the device returns few files).
  [ -d "$work/layers" ] && tar -C "$work" -czf "$OUT/layers.tgz" layers
fi

echo
echo "=== gpu_run.sh summary ($(( $(date +%s) - t_start )) s) ==="
for s in "${summary[@]}"; do echo "- $s"; done
if [ -f "$OUT/bench_cuda.json" ]; then
  # From the JSON (written after every model), so a run cut short still shows what it measured.
  $PY bench/cuda/bench_vs_torch.py --table "$OUT/bench_cuda.json"
fi
