#!/usr/bin/env bash
# Copies the kiln executable and the Debian libraries it needs that the GPU machine lacks into
# DIR/{bin,lib} (default .bundle/doctor; rpath-free: run with LD_LIBRARY_PATH=DIR/lib), plus the
# scripts and corpus in DIR/tree. Usage: bench/doctor/make_bundle.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
KILN=${KILN:-build/tools/kiln/kiln}
out=${1:-.bundle/doctor}
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$KILN" "$out/bin/kiln"
# glibc, libstdc++, libgcc and libm are on the GPU machine (newer versions); the rest travels.
ldd "$KILN" | awk '/=> \// {print $3}' | grep -v -E '/lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
# The scripts and corpus the GPU run reads, for when the bundle travels without this worktree.
mkdir -p "$out/tree/bench" "$out/tree/tests/doctor"
cp -r bench/doctor "$out/tree/bench/"
cp -r tests/doctor/incidents "$out/tree/tests/doctor/"
ls -la "$out/lib"
