// The cuDNN convolutions' own epilogue kernel (conv_cudnn.h): one thread per element, FP32 math,
// f32/f16/bf16 storage.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kiln/backends/cuda/conv_cudnn.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

// `kind` is FusedActivation's value: none, relu, clip, sigmoid, hardswish, silu, gelu, gelu_tanh.
__device__ float Activate(float x, int kind, float lo, float hi) {
  switch (kind) {
    case 0:
      return x;
    case 1:
      return x > 0.f ? x : 0.f;
    case 2:
      return fminf(fmaxf(x, lo), hi);
    case 3:
      return 1.f / (1.f + expf(-x));
    case 4:
      return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
    case 5:
      return x / (1.f + expf(-x));
    case 6:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case 7:
      return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

template <typename T>
__global__ void EpilogueKernel(T* y, const T* bias, const T* z, int64_t total, int64_t c,
                               int64_t hw, bool channels_last, int kind, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = Load(y[i]);
    if (bias) v += Load(bias[channels_last ? i % c : (i / hw) % c]);
    if (z) v += Load(z[i]);
    y[i] = Store<T>(Activate(v, kind, lo, hi));
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
