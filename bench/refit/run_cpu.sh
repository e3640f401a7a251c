#!/usr/bin/env bash
# Issue 20's CPU refit figures: the CLI (refit_bench.py: kiln refit vs kiln build, cold and warm,
# whole processes) and in one process (kiln_bench_refit: a loaded engine refit with weights in host
# memory), for the zoo and ResNet-50 (zoo/generated/resnet50, made by scripts; ignored by git).
#   bench/refit/run_cpu.sh [PYTHON] [RESNET50_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py=${1:-.venv/bin/python}
r50=${2:-zoo/generated/resnet50}
zoo=(zoo/bert_tiny zoo/efficientnet_tiny zoo/gpt_tiny zoo/mobilenetv3_tiny zoo/resnet_tiny
     zoo/squeezenet_tiny zoo/unet_tiny zoo/vit_tiny)
"$py" bench/refit/refit_bench.py --python "$py" --out bench/results/refit_cpu_cli_zoo.json "${zoo[@]}"
"$py" bench/refit/refit_bench.py --python "$py" --cold-runs 1 --warm-runs 3 --refit-runs 5 \
  --out bench/results/refit_cpu_cli_resnet50.json "$r50"
out=bench/results/refit_cpu_inproc.json
{
  echo '{"command": "bench/refit/run_cpu.sh '"$*"'", "method": "kiln_bench_refit MODEL_DIR [--fp16] --iterations 5: median seconds in one process; refit = ComputeRefit + Engine::RefitWeights with weights B in host memory; warm build = BuildFromOnnxFile with the cold build timing cache", "results": ['
  first=1
  for m in "${zoo[@]}" "$r50"; do
    for p in "" --fp16; do
      line=$(build/bench/refit/kiln_bench_refit "$m" $p --iterations 5)
      [ $first = 1 ] || echo ','
      first=0
      echo "$line"
    done
  done
  echo ']}'
} > "$out.tmp"
"$py" -c "import json,sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2],'w'), indent=2)" "$out.tmp" "$out"
rm -f "$out.tmp"
