// Activations to FP8 E4M3 for the FP8 matrix product (cublaslt_fp8.cc), with the FP8 contract's
// rounding (kiln/backends/fp8_quant.h): x * inv_scale in FP32, then CUDA's round-to-nearest-even,
// saturating conversion, which the host's ToE4M3 reproduces bit for bit (tested).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/fp8_kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// Four consecutive outputs of one row per thread, stored as one 32-bit word.
template <typename T>
__global__ void Fp8QuantizeKernel(Fp8QuantizeParams p) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t per_row = p.ldq / 4;
  const int64_t total = p.rows * per_row;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < total;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = w / per_row, k0 = (w - r * per_row) * 4;
    uchar4 out;
    uint8_t* e = reinterpret_cast<uint8_t*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = k0 + j;
      e[j] = k < p.depth ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(
                               __fmul_rn(Load(x[r * p.row_stride + k * p.col_stride]), p.inv_scale),
                               __NV_SATFINITE, __NV_E4M3))
                         : uint8_t{0};
    }
    reinterpret_cast<uchar4*>(p.q + r * p.ldq)[k0 / 4] = out;
  }
}

// Rows side by side (col_stride 1), 8 elements per thread: one 16-byte load of halves (two of
// floats) and one 8-byte store, the row found with 32-bit division. The general kernel's 64-bit
// division per 4 elements made it compute-bound: quantizing BERT-base's 4096 x 768 FP16 LayerNorm
// output took about as long as the FP8 product gained.
template <typename T>
__global__ void Fp8QuantizeRowsKernel(Fp8QuantizeParams p, uint32_t per_row, uint32_t total) {
  const T* x = static_cast<const T*>(p.x);
  const uint32_t groups = static_cast<uint32_t>(p.depth / 8);
  for (uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < total; w += gridDim.x * blockDim.x) {
    const uint32_t r = w / per_row, g = w - r * per_row;
    uint2 out = {0u, 0u};
    if (g < groups) {
      const T* row = x + static_cast<int64_t>(r) * p.row_stride + static_cast<int64_t>(g) * 8;
      float v[8];
      LoadRow8(row, v);
      uint8_t* e = reinterpret_cast<uint8_t*>(&out);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        e[j] = static_cast<uint8_t>(
            __nv_cvt_float_to_fp8(__fmul_rn(v[j], p.inv_scale), __NV_SATFINITE, __NV_E4M3));
      }
    }
    reinterpret_cast<uint2*>(p.q + static_cast<int64_t>(r) * p.ldq)[g] = out;
  }
}

template <typename T>
cudaError_t LaunchFp8QuantizeTyped(const Fp8QuantizeParams& p, cudaStream_t stream) {
  const int64_t per_row8 = p.ldq / 8;
  const int64_t total8 = p.rows * per_row8;
  const bool rows_fast = QuantRowsVectorizable(p);
  if (rows_fast) {
    Fp8QuantizeRowsKernel<T><<<GridFor(total8, kThreads), kThreads, 0, stream>>>(
        p, static_cast<uint32_t>(per_row8), static_cast<uint32_t>(total8));
  } else {
    Fp8QuantizeKernel<T><<<GridFor(p.rows * (p.ldq / 4), kThreads), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFp8Quantize(const Fp8QuantizeParams& p, cudaStream_t stream) {
  if (p.ldq % 4 != 0 || reinterpret_cast<uintptr_t>(p.q) % 4 != 0 || p.depth > p.ldq) {
    return cudaErrorInvalidValue;
  }
  if (p.rows * (p.ldq / 4) == 0) return cudaSuccess;
  switch (p.type) {
    case BlasType::kF32:
      return LaunchFp8QuantizeTyped<float>(p, stream);
    case BlasType::kF16:
      return LaunchFp8QuantizeTyped<__half>(p, stream);
    case BlasType::kBF16:
      return LaunchFp8QuantizeTyped<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda
