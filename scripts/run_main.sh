#!/usr/bin/env bash
# kiln's main job on the embedded default model: build its engine for the best backend present,
# run it, check it against the FP32 reference, print the build report and the run summary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/build.sh --target kiln >&2
exec build/tools/kiln/kiln demo "$@"
