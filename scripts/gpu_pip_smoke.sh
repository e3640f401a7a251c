#!/usr/bin/env bash
# Runs ON the GPU machine: `pip install` of the package (with the bundle's libkiln_c.so and
# kiln._fast) into a fresh venv that sees the machine's torch, then scripts/gpu_python_smoke.py
# from outside the checkout, so that the installed kiln is the one imported.
# The machine's torch lives in its own venv (/opt/torch/.venv). A venv made from that interpreter
# with --system-site-packages would see the base Python's packages, not that venv's; a .pth file
# in the new venv adds torch's site-packages instead.
# Usage (after `source scripts/gpu_env.sh`, with .bundle.tgz carried): scripts/gpu_pip_smoke.sh
# TORCH_VENV names torch's venv; VENV where to make the new one (default: a temporary folder).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
torch_venv=${TORCH_VENV:-/opt/torch/.venv}
venv=${VENV:-$(mktemp -d)/kiln-venv}
"$torch_venv/bin/python" -m venv "$venv"
site=$("$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mine=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$mine/torch_venv.pth"
# setup.py takes the library (and kiln._fast beside it) from KILN_LIBRARY: no CMake here.
KILN_LIBRARY=$PWD/.bundle/lib/libkiln_c.so "$venv/bin/python" -m pip install -q \
  --no-build-isolation --no-deps --no-index .
smoke=$PWD/scripts/gpu_python_smoke.py
cd "$(dirname "$venv")"
env -u KILN_LIBRARY -u PYTHONPATH "$venv/bin/python" "$smoke"
