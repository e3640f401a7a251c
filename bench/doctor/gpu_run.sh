#!/usr/bin/env bash
# Runs on the GPU machine (see GPU.md): `kiln doctor` preflight for real, then the log throughput
# benchmark. Builds nothing; needs the bundle from bench/doctor/make_bundle.sh (carry .bundle).
# Usage: bench/doctor/gpu_run.sh [SIZE_MB]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-$PWD/.bundle/doctor}
V=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH=$B/lib:$V/cudnn/lib:$V/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
K=$B/bin/kiln
out=${OUT:-/tmp}
echo "== kiln doctor"
$K doctor --color never; echo "exit $?"
echo "== kiln doctor --memory-budget 0.6 --ranks-per-gpu 2 (must fail: 120% of free memory)"
$K doctor --color never --memory-budget 0.6 --ranks-per-gpu 2 | head -8; echo "exit ${PIPESTATUS[0]}"
echo "== NCCL_SOCKET_IFNAME=eth0 NCCL_IB_TIMEOUT=30 CUDA_WATCHDOG_TIMEOUT=10 kiln doctor"
NCCL_SOCKET_IFNAME=eth0 NCCL_IB_TIMEOUT=30 CUDA_WATCHDOG_TIMEOUT=10 $K doctor --color never | head -20
$K doctor --json > "$out/preflight.json"; echo "json exit $?"
echo "== kiln doctor logs on the corpus"
for d in tests/doctor/incidents/*/; do
  printf '%-34s ' "$(basename "$d")"; $K doctor logs "$d/logs" --json | python3 -c "import json,sys; d=json.load(sys.stdin); r=d['root_cause']; print(d['verdict'], r and r['id'])"
done
echo "== benchmark"
KILN=$K bench/doctor/run.sh "${1:-1024}"
