#!/usr/bin/env bash
# Runs ON the GPU machine: examples/train.py (DDP + AMP, a kiln FP16 validation engine built once
# per epoch through the job's process group) on one GPU, world size 1, 10 epochs, with the bundle's
# libkiln_c.so; its validation table and the seed's verification table (build time, max kernel
# time, NCCL init latency, peak GPU memory, GPU utilisation, flatness across epochs) go to
# $OUT/train.txt and $OUT/train.json. Then the Python call overhead (bench/python/call_overhead.py,
# ResNet-50 FP16 batch 1, CUDA-graph path) to $OUT/call_overhead.{json,txt}.
#
#   scripts/bundle_gpu.sh            # here: builds build-cuda, writes .bundle.tgz
#   run(carry=[".bundle.tgz"]): scripts/gpu_train.sh [options]
#
# Options: --epochs N (10); --nproc N (1; more GPUs through torchrun, NCCL); --int8; --no-overhead;
#          --device cpu (a check of the script's path on a machine without a GPU, with the
#          build/ tree's library); anything after -- goes to train.py.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
epochs=10 nproc=1 device=cuda overhead=1 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=$2; shift ;;
    --nproc) nproc=$2; shift ;;
    --device) device=$2; shift ;;
    --int8) extra+=(--int8) ;;
    --no-overhead) overhead=0 ;;
    --) shift; extra+=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu_train.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$device" = cuda ] && [ -z "${KILN_LIBRARY:-}" ]; then
  # shellcheck source=/dev/null
  source scripts/gpu_env.sh
fi
if [ -z "${KILN_LIBRARY:-}" ]; then
  for lib in .bundle/lib/libkiln_c.so build/src/kiln/api/libkiln_c.so; do
    if [ -f "$lib" ]; then KILN_LIBRARY=$PWD/$lib; break; fi
  done
fi
export KILN_LIBRARY
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
args=(examples/train.py --device "$device" --epochs "$epochs" --json "$OUT/train.json" "${extra[@]}")
if [ "$nproc" -gt 1 ]; then
  launch=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$nproc")
  # Debian's torch 1.13 under Python 3.11 cannot parse torchrun's own --redirects default.
  if "$PY" -c 'import sys, torch; sys.exit(not torch.__version__.startswith("1."))'; then
    launch+=(--redirects 9:1 --tee 9:1)
  fi
else
  launch=("$PY")
fi
{
  echo "# $(date -u +%FT%TZ) KILN_LIBRARY=$KILN_LIBRARY"
  echo "# ${launch[*]} ${args[*]}"
} > "$OUT/train.txt"
timeout 480 "${launch[@]}" "${args[@]}" 2>&1 | tee -a "$OUT/train.txt"
rc=${PIPESTATUS[0]}
echo "train.py exit status $rc" | tee -a "$OUT/train.txt"
if [ "$overhead" = 1 ]; then
  over=(bench/python/call_overhead.py --out "$OUT")
  [ "$device" = cpu ] && over+=(--tiny)
  echo "# ${PY} ${over[*]}" > "$OUT/call_overhead.txt"
  timeout 300 "$PY" "${over[@]}" 2>&1 | tee -a "$OUT/call_overhead.txt"
  orc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && rc=$orc
fi
exit "$rc"
