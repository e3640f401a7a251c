# Sourced on the GPU machine: unpacks .bundle.tgz (made by scripts/bundle_gpu.sh) if the bundle
# is not there yet and points the library path at the bundle, CUDA, cuDNN and NCCL (GPU.md).
#   source scripts/gpu_env.sh && .bundle/bin/kiln doctor
KILN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ ! -d "$KILN_ROOT/.bundle/bin" ] && [ -f "$KILN_ROOT/.bundle.tgz" ]; then
  tar -C "$KILN_ROOT" -xzf "$KILN_ROOT/.bundle.tgz"
fi
V=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH=$KILN_ROOT/.bundle/lib:$V/cudnn/lib:$V/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$KILN_ROOT/.bundle/bin:$PATH
