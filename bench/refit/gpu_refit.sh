#!/usr/bin/env bash
# Runs ON the GPU machine (builds nothing): issue 20's refit figures on the GPU. Exports
# ResNet-50 and BERT-base with bench/cuda/export_models.py (torch there), gives each an info.json
# profile (batch 1..32, opt 8), then times a cold build, warm builds and refits of a loaded engine
# in one process with kiln_bench_refit (FP16). JSON per model in $OUT.
#
#   here:  KILN_BUNDLE_BINS="kiln|kiln_bench_refit|..." scripts/bundle_gpu.sh
#   there: run(carry=[".bundle.tgz"]): source scripts/gpu_env.sh && bench/refit/gpu_refit.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-$PWD/gpu_out}
models=${REFIT_MODELS:-resnet50,bert_base}
work=${TMPDIR:-/tmp}/kiln_refit_models
mkdir -p "$work" "$out"
timeout 300 python3 bench/cuda/export_models.py --out "$work" --models "$models" --batches 8 ||
  echo "export failed"
python3 - "$work" "$models" <<'PY'
import json, os, sys
work, models = sys.argv[1], sys.argv[2].split(",")
for m in models:
    info_path = os.path.join(work, m, "info.json")
    if not os.path.exists(info_path):
        continue
    info = json.load(open(info_path))
    prof = {}
    for inp in info["inputs"]:
        rest = [int(d) for d in inp["shape"][1:]]
        prof[inp["name"]] = {"min": [1] + rest, "opt": [8] + rest, "max": [32] + rest}
    info["profile"] = prof
    json.dump(info, open(info_path, "w"), indent=1)
PY
# The card in the file names: h100, h200, ... (figures from different cards are not compared).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
  grep -oiE '[a-z][0-9]{2,3}' | head -1 | tr 'A-Z' 'a-z')
for m in ${models//,/ }; do
  [ -f "$work/$m/model.onnx" ] || continue
  timeout 150 .bundle/bin/kiln_bench_refit "$work/$m" --backend cuda --fp16 \
    --iterations "${REFIT_ITERATIONS:-5}" --json "$out/refit_${gpu:-gpu}_${m}_fp16.json" 2>&1 |
    tail -15
done
