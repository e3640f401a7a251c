#!/usr/bin/env bash
# Checks and times tiles of kiln's INT8/FP8 warpgroup kernel (int8_wgmma_gemm.cu) on a Hopper GPU,
# in two device calls (one call carries about 44 MiB of bundle: two binaries):
#
#   bench/cuda/wgmma_tiles.sh tests   # bundle: cuda_blas_tests, cuda_kernels_bench
#   bench/cuda/wgmma_tiles.sh e2e     # bundle: kiln
#
# `tests` runs every INT8/FP8 CUDA test (the every-tile tests name every tile, those not yet
# GPU-tested included: Int8WgmmaTileGpuTested), then the kernel bench of BERT-base's four products
# on the tiles in $TILES (KILN_CUDA_WGMMA_TILES: tN is the Nth of them) beside FP16 and cuBLASLt's
# FP8. `e2e` runs bench/cuda/suite.py on $MODELS with --quant $QUANT twice in the same call: with
# the binary's default tile order ("new") and with only $OLD_TILES offered ("old"), each engine
# checked against PyTorch FP32 before its time counts, per-layer times kept. The default order
# leaves out the tiles not yet GPU-tested: once `tests` passes, mark them tested
# (int8_wgmma_gemm.cu's kTiles), rebuild and bundle kiln, then run `e2e`; or, in the same device
# session, name the tiles for "new" in $NEW_TILES (the build times those, in that order).
#
# Environment: KILN_BUNDLE (scripts/gpu_env.sh), OUT (where results go; the device call's $OUT),
# TILES (default tma-128x192,tma-256x96,tma-128x256,tma-256x128), OLD_TILES (default
# tma-128x256,tma-256x128; set empty: the binary's order), NEW_TILES (default: the binary's
# order), MODELS (default bert_base), QUANT (default int8-all,fp8-all), BENCH (the kernel bench's
# cases, a regular expression; default BERT-base's products). ResNet-50's 64-channel convolutions on the narrow tile, for example:
# TILES=128x64x2,128x128x2 BENCH='^resnet_(stem7x7|l1_.*)_(f16|i8_wgmma_t[0-9]+)/'
# MODELS=resnet50 QUANT=int8-all OLD_TILES=tma-128x256,128x128x2 (the pointwise convolutions'
# first two). OLD_ENV: variable assignments for the "old" run alone, e.g.
# OLD_ENV=KILN_STEM_SPACE_TO_DEPTH=0 (ResNet-50's stem as the model has it; OLD_TILES= empty
# keeps the binary's tiles), to time one change end to end.
set -u
phase=${1:-}
if [ "$phase" != tests ] && [ "$phase" != e2e ]; then
  echo "usage: $0 tests|e2e   (see the comment at the top)" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/scripts/gpu_env.sh"
B=$root/.bundle/bin
OUT=${OUT:?set OUT to the folder for results}
TILES=${TILES:-tma-128x192,tma-256x96,tma-128x256,tma-256x128}
OLD_TILES=${OLD_TILES-tma-128x256,tma-256x128}
NEW_TILES=${NEW_TILES:-}
OLD_ENV=${OLD_ENV:-}
MODELS=${MODELS:-bert_base}
QUANT=${QUANT:-int8-all,fp8-all}
BENCH=${BENCH:-'^bert_.*_(f16|i8io_wgmma_t[0-9]+|f8_wgmma_t[0-9]+|f8_cublaslt_fast_t0)/'}
export KILN_CUDA_QUANT_TACTICS=1 KILN_CUDA_INT8_KERNEL=all KILN_CUDA_FP8_KERNEL=all
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

case "$phase" in
  tests)
    timeout 300 "$B/cuda_blas_tests" --gtest_filter='CudaInt8*:CudaFp8*' >"$OUT/tests.txt" 2>&1
    echo "tests rc $?"
    grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$OUT/tests.txt" | head -20
    # The tN past the tiles named report "no such tactic" and take no time.
    KILN_CUDA_WGMMA_TILES=$TILES timeout 240 "$B/cuda_kernels_bench" --benchmark_min_time=0.02 \
      --benchmark_filter="$BENCH" >"$OUT/bench.txt" 2>&1
    echo "bench rc $?"
    grep -E "^(bert|resnet)_" "$OUT/bench.txt" | awk '{print $1, $2, $NF}'
    ;;
  e2e)
    for v in new old; do
      extra=()
      if [ "$v" = old ]; then
        if [ -n "$OLD_TILES" ]; then export KILN_CUDA_WGMMA_TILES=$OLD_TILES; fi
        read -r -a extra <<<"$OLD_ENV"
      elif [ -n "$NEW_TILES" ]; then
        export KILN_CUDA_WGMMA_TILES=$NEW_TILES
      fi
      timeout 280 env "${extra[@]}" python3 "$root/bench/cuda/suite.py" --kiln "$B/kiln" --models "$MODELS" \
        --exporters ts --batches 32 --modes "" --quant "$QUANT" --calib-sets 1 --budget 265 \
        --work "/tmp/wgmma_w_$v" --layers-dir "/tmp/wgmma_l_$v" --out "$OUT/e2e_$v.json" \
        >"$OUT/e2e_log_$v.txt" 2>&1
      echo "$v rc $?"
    done
    unset KILN_CUDA_WGMMA_TILES
    tar czf "$OUT/e2e_layers.tgz" -C /tmp wgmma_l_new wgmma_l_old 2>/dev/null
    OUT=$OUT python3 - <<'PY'
import glob, json, os
out = os.environ["OUT"]
for v in ("new", "old"):
    for r in json.load(open(f"{out}/e2e_{v}.json"))["rows"]:
        keys = [k for k in r if k.startswith("kiln") and (k.endswith("_ms") or "rel_l2" in k or "error" in k)]
        print(v, r["model"], {k: r[k] for k in sorted(keys) if "build" not in k})
    for f in sorted(glob.glob(f"/tmp/wgmma_l_{v}/*layers.json")):
        layers = json.load(open(f))["layers"]
        print(v, os.path.basename(f), round(sum(l["median_ms"] for l in layers), 3), "ms")
        for l in layers:  # one layer's products (names as the exporters write them)
            if "layer.3/" in l["name"] and "matmul" in l["tactic"]:
                print("   %6.1f us  %s" % (l["median_ms"] * 1000, l["tactic"][:64]))
PY
    ;;
esac
