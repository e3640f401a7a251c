#!/usr/bin/env bash
# The test suite: builds everything, then runs every CTest test (unit, conformance, integration).
# Usage: scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh
scripts/python_env.sh >/dev/null   # ONNX node-test data and onnxruntime for conformance
scripts/build.sh
ctest --test-dir build --output-on-failure -j"${KILN_TEST_JOBS:-2}" --timeout 900 "$@"
