#!/usr/bin/env bash
# Builds the CUDA preset here and packs what must travel to the GPU machine into .bundle/:
# bin/ (kiln and the test binaries), lib/ (the Debian shared libraries they need, which the GPU
# machine lacks), and the run script. The binaries carry an rpath of $ORIGIN/../lib.
# CUDA, cuDNN, NCCL, NVML and OpenMPI stay out: the GPU machine has its own (see GPU.md).
# Usage: scripts/bundle_gpu.sh   then carry ".bundle" in the device call.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh
if [ ! -f build-cuda/build.ninja ]; then
  cmake --preset cuda -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' >/dev/null
fi
cmake --build build-cuda -j"${KILN_BUILD_JOBS:-$(nproc)}"
rm -rf .bundle && mkdir -p .bundle/bin .bundle/lib
mapfile -t bins < <(find build-cuda -type f -executable \( -name kiln -o -name '*_tests' -o -name '*_driver' -o -name '*_bench' \) -not -path '*/CMakeFiles/*')
for b in "${bins[@]}"; do
  cp "$b" .bundle/bin/
  patchelf --set-rpath '$ORIGIN/../lib' ".bundle/bin/$(basename "$b")" 2>/dev/null || true
done
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvidia|libmpi|libopen-|libcupti|libnvrtc|libnvJitLink)'
for b in .bundle/bin/*; do
  ldd "$b" 2>/dev/null | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    if ! [[ "$name" =~ $skip ]]; then cp -Ln "$path" .bundle/lib/ 2>/dev/null || true; fi
  done
done
cp scripts/gpu_run.sh .bundle/
du -sh .bundle
