#!/usr/bin/env bash
# Creates (or refreshes) the Python environment used by the model zoo: a venv at .venv in
# the repository root, made from Debian's /usr/bin/python3 with --system-site-packages so
# that Debian's python3-torch (1.13) and python3-torchvision (0.14) are visible, plus the
# pinned onnx and onnxruntime from tools/zoo/requirements.txt.
#
# Idempotent: a second run only verifies. Safe to run in CI on a fresh Debian 12 machine
# (needs root for apt-get when a Debian package is missing).
#
# Why the pins look the way they do:
#   - onnx 1.22.0 is the last release whose wheel ships onnx/backend/test/data/node.
#   - numpy stays Debian's 1.24.x (constraint below): torch 1.13 is compiled against numpy
#     1.x, and a numpy 2 wheel in the venv would break `import torch` / tensor.numpy().
#   - protobuf 7 in the venv shadows Debian's protobuf 3.21; torch.onnx.export serializes
#     with its own C++ protobuf, so it is unaffected (checked below).
#
# Usage: scripts/python_env.sh            # prints the venv path on the last line
#        KILN_VENV=/some/path scripts/python_env.sh
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KILN_VENV:-${repo_root}/.venv}"
requirements="${repo_root}/tools/zoo/requirements.txt"
sys_python=/usr/bin/python3

log() { echo "[python_env] $*" >&2; }
die() { echo "[python_env] error: $*" >&2; exit 1; }

apt_updated=0
apt_install() {
  if [[ "$(id -u)" != 0 ]]; then
    die "Debian packages missing ($*); run as root or: apt-get install -y $*"
  fi
  if [[ "${apt_updated}" == 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install -y $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

[[ -x "${sys_python}" ]] || apt_install python3

# Debian packages the zoo needs from the system interpreter.
missing=()
"${sys_python}" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
"${sys_python}" -c 'import torch' 2>/dev/null || missing+=(python3-torch)
"${sys_python}" -c 'import torchvision' 2>/dev/null || missing+=(python3-torchvision)
"${sys_python}" -c 'import numpy' 2>/dev/null || missing+=(python3-numpy)
if ((${#missing[@]})); then
  apt_install "${missing[@]}"
fi

# (Re)create the venv unless a usable one with system site packages is already there.
if [[ -x "${venv}/bin/python" ]] && grep -qi '^include-system-site-packages *= *true' \
    "${venv}/pyvenv.cfg" 2>/dev/null && "${venv}/bin/python" -c 'import sys' 2>/dev/null; then
  log "reusing ${venv}"
else
  log "creating ${venv}"
  rm -rf "${venv}"
  "${sys_python}" -m venv --system-site-packages "${venv}"
fi
py="${venv}/bin/python"

# Keep Debian's numpy: constrain pip to exactly the version the system has.
sys_numpy="$("${sys_python}" -c 'import numpy; print(numpy.__version__)')"
constraints="$(mktemp)"
trap 'rm -f "${constraints}"' EXIT
echo "numpy==${sys_numpy}" >"${constraints}"

# pip answers "already satisfied" without touching the network when the pins are met.
if ! "${py}" -m pip install --disable-pip-version-check --no-input -q \
    -r "${requirements}" -c "${constraints}" >&2; then
  die "pip install failed (see above); requirements: ${requirements}"
fi

# Verify the combination actually works: torch from Debian, onnx/onnxruntime from the venv,
# the backend node test data present, and torch.onnx.export -> onnx.checker -> onnxruntime.
"${py}" - <<'EOF' >&2
import io, os, warnings
import numpy, torch, torchvision, onnx, onnxruntime
node_data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
assert os.path.isdir(node_data) and os.listdir(node_data), "no ONNX backend node test data: " + node_data
assert numpy.__version__.startswith("1."), "numpy %s in venv; torch 1.13 needs numpy 1.x" % numpy.__version__
m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.GELU()).eval()
f = io.BytesIO()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(m, torch.randn(1, 3, 8, 8), f, opset_version=17, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
proto = onnx.load_from_string(f.getvalue())
onnx.checker.check_model(proto, full_check=True)
x = numpy.random.default_rng(0).standard_normal((2, 3, 8, 8), dtype=numpy.float32)
sess = onnxruntime.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
got = sess.run(None, {"x": x})[0]
want = m(torch.from_numpy(x)).detach().numpy()
assert numpy.allclose(got, want, rtol=1e-4, atol=1e-5), "onnxruntime disagrees with torch"
print("[python_env] ok: python %s torch %s torchvision %s numpy %s onnx %s onnxruntime %s (%d node tests)"
      % (".".join(map(str, __import__("sys").version_info[:3])), torch.__version__,
         torchvision.__version__, numpy.__version__, onnx.__version__, onnxruntime.__version__,
         len(os.listdir(node_data))))
EOF

echo "${venv}"
