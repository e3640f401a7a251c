#!/usr/bin/env bash
# kiln's distributed GPU checks (issue 5): the NCCL transport at world size 1 (under mpirun and
# torchrun-style, without MPI), and a non-blocking NCCL init that times out and aborts when the
# second process never joins.
#   Here (build machine):  scripts/bundle_gpu.sh          -> .bundle/ (bin: dist_nccl_tests,
#                          dist_nccl_driver, dist_driver; lib: Debian libraries)
#   GPU machine:           scripts/gpu_dist_check.sh [BUNDLE_DIR]   (default .bundle)
# MPI comes from the GPU machine's own OpenMPI 4.1 (same ABI, libmpi.so.40). It builds nothing
# on the GPU machine and prints a short table last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

bundle=${1:-$root/.bundle}
V=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH=$bundle/lib:$V/nccl/lib:$V/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$bundle/bin
declare -a rows
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }

echo "== gtest: NCCL world size 1 broadcast, init timeout with a rank that never exists"
if "$bin/dist_nccl_tests"; then row "dist_nccl_tests" "PASS"; else row "dist_nccl_tests" "FAIL"; fi

echo "== NCCL world size 1: init latency and broadcast of 100 MB and 1 GB"
for bytes in 100000000 1000000000; do
  line=$("$bin/dist_nccl_driver" --world 1 --bytes $bytes --timeout-ms 60000)
  echo "$line"
  row "nccl world=1 bytes=$bytes" "$line"
done

echo "== two processes on one GPU, only rank 0 joins: bounded init, abort, KILN-E7013"
port=$((30000 + RANDOM % 20000))
"$bin/dist_nccl_driver" --rank 1 --world 2 --port $port --skip-init --hold-ms 15000 --timeout-ms 20000 > /tmp/kiln_r1.json &
r1=$!
start=$(date +%s.%N)
r0=$("$bin/dist_nccl_driver" --rank 0 --world 2 --port $port --timeout-ms 5000)
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')  # no bc on the GPU machine
echo "$r0 (wall ${took}s)"
kill $r1 2>/dev/null; wait $r1 2>/dev/null
if echo "$r0" | grep -q '"code":"KILN-E7013"' && awk -v t="$took" 'BEGIN{exit !(t < 12)}'; then
  row "init timeout (bound 5 s), rank 1 never joins" "PASS wall ${took}s"
else
  row "init timeout (bound 5 s), rank 1 never joins" "FAIL: $r0 wall ${took}s"
fi

if command -v mpirun >/dev/null; then
  echo "== BuildOnce through NCCL, mpirun -np 1 (100 MB synthetic engine)"
  mkdir -p /tmp/kiln_nccl_rep
  if mpirun --allow-run-as-root -np 1 "$bin/dist_driver" --transport nccl --size 100000000 --build-ms 100 \
      --report-dir /tmp/kiln_nccl_rep; then
    row "BuildOnce --transport nccl np=1" "PASS $(grep -ho '"bulk_setup_s": [0-9.e-]*' /tmp/kiln_nccl_rep/*.json | head -1)"
  else
    row "BuildOnce --transport nccl np=1" "FAIL"
  fi
fi

echo "== BuildOnce through NCCL, torchrun-style world size 1 (env vars, no mpirun: control and"
echo "   the NCCL unique id over TCP to MASTER_ADDR:MASTER_PORT+17), 100 MB synthetic engine"
rm -rf /tmp/kiln_nccl_torchrun && mkdir -p /tmp/kiln_nccl_torchrun
tport=$((30000 + RANDOM % 20000))
if env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMIX_RANK -u PMI_SIZE -u PMI_RANK \
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$tport \
    "$bin/dist_driver" --transport nccl --size 100000000 --build-ms 100 \
    --report-dir /tmp/kiln_nccl_torchrun &&
    grep -q '"transport": "nccl"' /tmp/kiln_nccl_torchrun/*.json; then
  row "BuildOnce --transport nccl torchrun-style world=1" "PASS $(grep -ho '"bulk_setup_s": [0-9.e-]*' /tmp/kiln_nccl_torchrun/*.json | head -1)"
else
  row "BuildOnce --transport nccl torchrun-style world=1" "FAIL"
fi

echo
echo "== summary"
printf '%s\n' "${rows[@]}"
