#!/usr/bin/env bash
# Installs kiln's Debian dependencies (first run only) and builds the default preset.
# Usage: scripts/build.sh [extra cmake --build args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh
jobs=${KILN_BUILD_JOBS:-$(nproc)}
# Paths under the checkout are hashed relative to it, so clones and worktrees share ccache hits.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
if [ ! -f build/build.ninja ]; then
  cmake --preset default >/dev/null
fi
cmake --build build -j"${jobs}" "$@"
