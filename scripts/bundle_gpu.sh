#!/usr/bin/env bash
# Builds the CUDA preset here and packs what must travel to the GPU machine into .bundle/:
# bin/ (kiln and the test binaries), lib/ (the Debian shared libraries they need, which the GPU
# machine lacks), and the run script. The binaries carry an rpath of $ORIGIN/../lib.
# CUDA, cuDNN, NCCL, NVML and OpenMPI stay out: the GPU machine has its own (see GPU.md).
# Usage: scripts/bundle_gpu.sh   then carry ".bundle.tgz" in the device call (the carry limit is
# 64 MiB; the uncompressed bundle with OpenBLAS and oneDNN is larger) and, there, run
# `source scripts/gpu_env.sh` first: it unpacks the bundle and sets the library path.
# KILN_BUNDLE_BINS="kiln|cuda_runtime_tests" limits the binaries (a regex alternation of names);
# scripts/gpu_run.sh needs kiln and runs every cuda_*_tests binary it finds. KILN_BUNDLE_NO_BUILD=1
# bundles what the build folder holds without building first. The zoo and
# bench/cuda/*.py travel with the working tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh
# KILN_BUNDLE_BUILD=build bundles the default (CPU) build instead, whose NCCL and NVML parts are
# still GPU-capable (dist, doctor, monitor); the CUDA backend needs the cuda preset.
build_dir=${KILN_BUNDLE_BUILD:-build-cuda}
if [ "$build_dir" = build-cuda ] && [ ! -f build-cuda/build.ninja ]; then
  cmake --preset cuda >/dev/null
fi
if [ -n "${KILN_BUNDLE_NO_BUILD:-}" ]; then
  echo "bundle_gpu.sh: KILN_BUNDLE_NO_BUILD set: bundling $build_dir as it is" >&2
elif [ -n "${KILN_BUNDLE_BINS:-}" ]; then
  # Build only the named binaries (their names are their CMake targets).
  cmake --build "$build_dir" -j"${KILN_BUILD_JOBS:-$(nproc)}" --target ${KILN_BUNDLE_BINS//|/ }
  # kiln_c brings the package's kiln._fast along (absent where CMake found no Python headers).
  if [[ "kiln_c" =~ ^(${KILN_BUNDLE_BINS})$ ]]; then
    cmake --build "$build_dir" --target kiln_python_fast ||
      echo "bundle_gpu.sh: no kiln._fast: the package will run on ctypes alone" >&2
  fi
else
  cmake --build "$build_dir" -j"${KILN_BUILD_JOBS:-$(nproc)}"
fi
rm -rf .bundle && mkdir -p .bundle/bin .bundle/lib
mapfile -t bins < <(find "$build_dir" -type f -executable \( -name kiln -o -name '*_tests' -o -name '*_driver' -o -name '*_bench' -o -name 'obs_overhead_bench' -o -name 'kiln_bench_*' \) -not -path '*/CMakeFiles/*' | grep -E "/(${KILN_BUNDLE_BINS:-[^/]+})\$")
for b in "${bins[@]}"; do
  cp "$b" .bundle/bin/
  strip --strip-unneeded ".bundle/bin/$(basename "$b")" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN/../lib' ".bundle/bin/$(basename "$b")" 2>/dev/null || true
done
# The C API library the Python package loads (python/kiln; KILN_LIBRARY=.bundle/lib/libkiln_c.so),
# beside the libraries it needs, and the package's kiln._fast module.
# With KILN_BUNDLE_BINS, only when it names kiln_c (the library is as large as kiln itself).
if [ -f "$build_dir/src/kiln/api/libkiln_c.so" ] &&
   { [ -z "${KILN_BUNDLE_BINS:-}" ] || [[ "kiln_c" =~ ^(${KILN_BUNDLE_BINS})$ ]]; }; then
  cp "$build_dir/src/kiln/api/libkiln_c.so" .bundle/lib/
  strip --strip-unneeded .bundle/lib/libkiln_c.so 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN' .bundle/lib/libkiln_c.so 2>/dev/null || true
  # kiln._fast (the C hot path of runs; stable ABI, so the GPU machine's Python 3.12 loads it): the
  # package finds it beside KILN_LIBRARY. It needs no library of its own.
  for module in "$build_dir"/src/kiln/api/_fast*.so; do
    [ -f "$module" ] || continue
    cp "$module" .bundle/lib/
    strip --strip-unneeded ".bundle/lib/$(basename "$module")" 2>/dev/null || true
  done
fi
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvidia|libmpi|libopen-|libcupti|libnvrtc|libnvJitLink)'
for b in .bundle/bin/* .bundle/lib/libkiln_c.so; do
  [ -f "$b" ] || continue
  ldd "$b" 2>/dev/null | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    if ! [[ "$name" =~ $skip ]]; then cp -Ln "$path" .bundle/lib/ 2>/dev/null || true; fi
  done
done
du -sh .bundle
# Libraries kiln loads with dlopen (so ldd does not list them) and what they need.
for lazy in libopenblas.so.0; do
  path=$(ldconfig -p | awk -v n="$lazy" '$1 == n && /x86-64/ && !seen {print $NF; seen = 1}')  # no early exit: SIGPIPE under pipefail
  [ -n "$path" ] || continue
  cp -Ln "$path" .bundle/lib/ 2>/dev/null || true
  ldd "$path" | awk '/=> \//{print $1" "$3}' | while read -r name p; do
    if ! [[ "$name" =~ $skip ]]; then cp -Ln "$p" .bundle/lib/ 2>/dev/null || true; fi
  done
done
# xz -9: about 40% smaller than gzip. The device tool carries at most 64 MiB with the working tree
# (tracked files included), so a bundle of three CUDA binaries must stay near 40 MiB.
XZ_OPT="-9 -T0" tar -C . -cJf .bundle.tgz .bundle
size_mib=$(( $(stat -c %s .bundle.tgz) / 1048576 ))
tree_mib=$(( $(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}') / 1048576 ))
echo ".bundle.tgz: ${size_mib} MiB (tracked files: ${tree_mib} MiB)"
if (( size_mib + tree_mib > 62 )); then
  echo "warning: bundle plus tracked files exceed what one device call carries (64 MiB);" \
       "name fewer binaries with KILN_BUNDLE_BINS" >&2
fi
ls -la .bundle.tgz
# The device call carries at most 64 MiB with the working tree; leave room for the tree.
size=$(stat -c %s .bundle.tgz)
if [ "$size" -gt $((56 << 20)) ]; then
  echo "bundle_gpu.sh: .bundle.tgz is $((size >> 20)) MiB; the carry limit is 64 MiB with the" \
    "working tree: narrow KILN_BUNDLE_BINS" >&2
  exit 1
fi
