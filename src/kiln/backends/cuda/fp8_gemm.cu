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

}  // namespace

cudaError_t LaunchFp8Quantize(const Fp8QuantizeParams& p, cudaStream_t stream) {
  if (p.ldq % 4 != 0 || reinterpret_cast<uintptr_t>(p.q) % 4 != 0 || p.depth > p.ldq) {
    return cudaErrorInvalidValue;
  }
  const int64_t work = p.rows * (p.ldq / 4);
  if (work == 0) return cudaSuccess;
  dim3 grid(GridFor(work, kThreads));
  switch (p.type) {
    case BlasType::kF32:
      Fp8QuantizeKernel<float><<<grid, kThreads, 0, stream>>>(p);
      break;
    case BlasType::kF16:
      Fp8QuantizeKernel<__half><<<grid, kThreads, 0, stream>>>(p);
      break;
    case BlasType::kBF16:
      Fp8QuantizeKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
