#!/usr/bin/env bash
# Runs ON the GPU machine (builds nothing): issue 19's cold/warm build figures for one model.
# Exports the model with bench/cuda/export_models.py, then builds it FP16 at a fixed batch with
# --opt-level 0, the default, 5, the default with serial set-up (KILN_BUILD_SETUP_THREADS=1), and
# twice on one timing cache (cold, then warm); times each engine with `kiln run` (CUDA graph,
# compute_ms). The summary (each report's phase times and time_breakdown) goes to
# $OUT/build_times_<model>.json and stdout, the build logs to $OUT/build_times_<model>.log.
#
#   run(carry=[".bundle.tgz"]): source scripts/gpu_env.sh && scripts/gpu_build_times.sh resnet50 32
set -uo pipefail
model=${1:-resnet50}
batch=${2:-32}
out=${OUT:-/tmp/out}
kiln=${KILN:-.bundle/bin/kiln}
work=$(mktemp -d)
mkdir -p "$out"
timeout 240 python3 bench/cuda/export_models.py --out "$work" --models "$model" --batches "$batch" \
  > "$work/export.log" 2>&1 || { echo "export of $model failed"; tail -5 "$work/export.log"; exit 1; }
onnx="$work/$model/model.onnx"   # export_models.py writes DIR/MODEL/model.onnx
input=$(python3 -c "import onnx,sys; m=onnx.load('$onnx', load_external_data=False); print(m.graph.input[0].name)")
dims=$(python3 -c "
import onnx; m=onnx.load('$onnx', load_external_data=False)
d=[x.dim_value if x.dim_value>0 else $batch for x in m.graph.input[0].type.tensor_type.shape.dim]
print('x'.join(map(str,d)))")
shape="$input:$dims"
profile="$input:$dims,$dims,$dims"

build() {  # name, extra args...
  local name=$1; shift
  local t0 t1
  # Every build compiles its cuDNN runtime-compiled plans afresh except cache_warm, which reuses
  # cache_cold's (as it reuses its timing cache).
  local plans="$work/plans_$name"
  [ "$name" = cache_warm ] && plans="$work/plans_cache_cold"
  t0=$(date +%s%N)
  KILN_CUDNN_PLAN_CACHE="$plans" timeout 300 "$kiln" build "$onnx" --backend cuda --fp16 --profile "$profile" \
    -o "$work/$name.kiln" --report "$work/build_$name.json" "$@" > "$work/build_$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || tail -4 "$work/build_$name.log"
  cat "$work/build_$name.log" >> "$out/build_times_$model.log"
  t1=$(date +%s%N)
  local run_ms=""
  if [ $rc -eq 0 ]; then
    run_ms=$(timeout 120 "$kiln" run "$work/$name.kiln" --shapes "$shape" --json 2>/dev/null \
      | python3 -c "import json,sys; print(json.load(sys.stdin).get('compute_ms',{}).get('median',''))" 2>/dev/null)
  fi
  local wall
  wall=$(python3 -c "print(f'{($t1 - $t0) / 1e9:.2f}')")
  echo "$name $rc $wall $run_ms" >> "$work/summary.txt"
  echo "$name rc=$rc wall=${wall}s run_ms=$run_ms"
}

build level0 --opt-level 0
build default
build level5 --opt-level 5
KILN_BUILD_SETUP_THREADS=1 build serial_setup
build cache_cold --timing-cache "$work/tc.cache"
build cache_warm --timing-cache "$work/tc.cache"

python3 - "$work/summary.txt" "$work" "$model" "$batch" "$out" <<'EOF'
import json, sys
summary, work, model, batch, out = sys.argv[1:]
rows = []
for line in open(summary):
    name, rc, wall, *rest = line.split()
    row = {"variant": name, "rc": int(rc), "wall_s": float(wall),
           "run_ms": float(rest[0]) if rest and rest[0] else None}
    try:
        rep = json.load(open(f"{work}/build_{name}.json"))
        tb = rep.get("time_breakdown", {})
        row.update({k: rep.get(k) for k in ("build_seconds", "phase_seconds")})
        row["time_breakdown"] = {k: v for k, v in tb.items() if not isinstance(v, list)}
    except (OSError, ValueError):
        pass
    rows.append(row)
json.dump({"model": model, "batch": int(batch), "rows": rows},
          open(f"{out}/build_times_{model}.json", "w"), indent=1)
print(f"{'variant':14} {'rc':>3} {'build s':>8} {'precision s':>11} {'tactics s':>9} {'engine ms':>9}")
for r in rows:
    ps = r.get("phase_seconds") or {}
    print(f"{r['variant']:14} {r['rc']:>3} {r.get('build_seconds') or r['wall_s']:>8.2f} "
          f"{ps.get('precision', 0):>11.2f} {ps.get('tactics', 0):>9.2f} {r['run_ms'] or 0:>9.3f}")
EOF
