#!/usr/bin/env bash
# Runs ON the GPU machine: proves the code an A100 runs. A bundle whose kernels were compiled as
# compute_80 PTX only (no machine code) must JIT-compile on this GPU, pass every CUDA test binary
# and the zoo conformance (FP32 and FP16), and `kiln doctor` must say that it found only PTX.
#
#   here:  cmake --preset default -B build-ptx -DKILN_CUDA_ARCHS=80-virtual
#          KILN_BUNDLE_BUILD=build-ptx KILN_BUNDLE_BINS="kiln|cuda_blas_tests|cuda_dnn_tests|\
#          cuda_kernels_tests|cuda_ops_more_tests|cuda_runtime_tests|op_conformance_tests" \
#          scripts/bundle_gpu.sh
#          mv .bundle.tgz .bundle-ptx.tgz
#   there: run(carry=[".bundle-ptx.tgz"]): scripts/gpu_ptx_check.sh
# Writes $OUT/ptx_check.tgz (every log) and prints a summary last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export KILN_BUNDLE=${KILN_BUNDLE:-$PWD/.bundle-ptx.tgz}
# A JIT cache of its own, empty at the start: what it holds afterwards was compiled in this run.
export CUDA_CACHE_PATH=${TMPDIR:-/tmp}/kiln_ptx_jit_cache
rm -rf "$CUDA_CACHE_PATH" && mkdir -p "$CUDA_CACHE_PATH"
# shellcheck source=/dev/null
source scripts/gpu_env.sh
final_out=${OUT:-$PWD/gpu_out}
logs=${TMPDIR:-/tmp}/kiln_ptx_logs
rm -rf "$logs" && mkdir -p "$logs"
summary=()
note() { summary+=("$1"); echo "== $1"; }

if command -v cuobjdump >/dev/null; then
  elf=$(cuobjdump --list-elf .bundle/bin/kiln 2>&1 | grep -c '\.cubin' || true)
  ptx=$(cuobjdump --list-ptx .bundle/bin/kiln 2>&1 | grep -c 'sm_80\.ptx' || true)
  note "kiln binary: $elf kiln machine-code objects, $ptx compute_80 PTX objects (cuobjdump)"
else
  note "cuobjdump absent on this machine: the bundle's content was checked where it was built"
fi
.bundle/bin/kiln doctor >"$logs/doctor.txt" 2>&1
note "kiln doctor: $(grep -E 'gpu[0-9]+\.arch|compute_80|JIT' "$logs/doctor.txt" | head -2 | tr -s ' ' | tr '\n' ' ')"

start=$(date +%s)
OUT=$logs KILN=$PWD/.bundle/bin/kiln scripts/gpu_run.sh --conformance-only >"$logs/gpu_run.txt" 2>&1
note "conformance with the PTX-only bundle ($(( $(date +%s) - start )) s, JIT included):"
sed -n '/=== gpu_run.sh summary/,$p' "$logs/gpu_run.txt" | tail -n +2 | sed 's/^/    /'
summary+=("$(sed -n '/=== gpu_run.sh summary/,$p' "$logs/gpu_run.txt" | tail -n +2)")
note "JIT cache after the run: $(du -sh "$CUDA_CACHE_PATH" | cut -f1), $(find "$CUDA_CACHE_PATH" -type f | wc -l) files"
mkdir -p "$final_out"
tar -C "$logs" -czf "$final_out/ptx_check.tgz" .
echo
echo "=== gpu_ptx_check.sh summary ==="
for s in "${summary[@]}"; do echo "- $s"; done
