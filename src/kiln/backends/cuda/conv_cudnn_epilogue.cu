// The cuDNN convolutions' own epilogue kernel (conv_cudnn.h): one thread per element, FP32 math,
// f32/f16/bf16 storage.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/conv_cudnn.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void EpilogueKernel(T* y, const T* bias, const T* z, int64_t total, int64_t c,
                               int64_t hw, bool channels_last, int kind, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = Load(y[i]);
    if (bias) v += Load(bias[channels_last ? i % c : (i / hw) % c]);
    if (z) v += Load(z[i]);
    y[i] =
        Store<T>(ActivateFor<T>(static_cast<BlasAct>(kind), v, lo, hi));  // kind: FusedActivation
  }
}

template <typename T>
cudaError_t Launch(const ConvEpilogueArgs& a, cudaStream_t stream) {
  int64_t total = a.n * a.c * a.hw;
  if (total == 0) return cudaSuccess;
  int threads = 256;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  EpilogueKernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      static_cast<T*>(a.y), static_cast<const T*>(a.bias), static_cast<const T*>(a.z), total, a.c,
      a.hw, a.channels_last, a.act, a.act_min, a.act_max);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchConvEpilogue(const ConvEpilogueArgs& args, cudaStream_t stream) {
  switch (args.dtype) {
    case DataType::kFloat32:
      return Launch<float>(args, stream);
    case DataType::kFloat16:
      return Launch<__half>(args, stream);
    case DataType::kBFloat16:
      return Launch<__nv_bfloat16>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda
