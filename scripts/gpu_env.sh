# Sourced on the GPU machine: unpacks the bundle made by scripts/bundle_gpu.sh and points the
# library path at it, CUDA, cuDNN and NCCL (GPU.md).
#   source scripts/gpu_env.sh && kiln doctor
# KILN_BUNDLE names the archive (default .bundle.tgz in the checkout). It is unpacked afresh on
# every call: a warm machine keeps ignored files from earlier calls, and a stale bundle there
# must never win over the one just carried.
KILN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KILN_BUNDLE=${KILN_BUNDLE:-$KILN_ROOT/.bundle.tgz}
if [ -f "$KILN_BUNDLE" ]; then
  rm -rf "$KILN_ROOT/.bundle"
  tar -C "$KILN_ROOT" -xf "$KILN_BUNDLE"  # gzip or xz
else
  echo "gpu_env.sh: no bundle at $KILN_BUNDLE (make one with scripts/bundle_gpu.sh)" >&2
fi
V=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH=$KILN_ROOT/.bundle/lib:$V/cudnn/lib:$V/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$KILN_ROOT/.bundle/bin:$PATH
