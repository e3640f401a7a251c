#!/usr/bin/env bash
# Installs the Debian packages kiln builds and tests with. Idempotent; needs root (or sudo).
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config git clang clang-format libfuzzer-14-dev patchelf curl
  libprotobuf-dev protobuf-compiler libonnx-dev
  flatbuffers-compiler libflatbuffers-dev
  libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libxxhash-dev libmimalloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev   # libdnnl-dev's CMake config needs OpenCL; Debian only recommends it
  libopenmpi-dev openmpi-bin
  prometheus-cpp-dev prometheus
  libhyperscan-dev libre2-dev
  python3 python3-dev python3-venv python3-torch python3-torchvision python3-onnx python3-pytest python3-setuptools python3-wheel python3-pip
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "kiln: installing ${#missing[@]} Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
