// The element-wise halves of the INT8 matrix product (cublaslt_int8.cc): activations to int8 with
// the INT8 contract's rounding (kiln/backends/int8_quant.h: x * inv_scale in FP32, saturate to
// [-127, 127] with NaN to +127, round half to even), bit-identical to the CPU's; and the
// dequantize/bias/activation epilogue on cuBLASLt's int32 result, in FP32, stored once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/int8_kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// Four consecutive outputs of one row per thread, stored as one 32-bit word.
template <typename T>
__global__ void Int8QuantizeKernel(Int8QuantizeParams p) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t per_row = p.ldq / 4;
  const int64_t total = p.rows * per_row;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < total;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = w / per_row, k0 = (w - r * per_row) * 4;
    char4 out;
    int8_t* e = reinterpret_cast<int8_t*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = k0 + j;
      e[j] = k < p.depth
                 ? QuantizeInt8Device(Load(x[r * p.row_stride + k * p.col_stride]), p.inv_scale)
                 : int8_t{0};
    }
    reinterpret_cast<char4*>(p.q + r * p.ldq)[k0 / 4] = out;
  }
}

// Rows side by side (col_stride 1), 8 elements per thread: one 16-byte load of halves (two of
// floats), one 8-byte store, 32-bit indexing (fp8_gemm.cu's Fp8QuantizeRowsKernel, for int8).
template <typename T>
__global__ void Int8QuantizeRowsKernel(Int8QuantizeParams p, uint32_t per_row, uint32_t total) {
  const T* x = static_cast<const T*>(p.x);
  const uint32_t groups = static_cast<uint32_t>(p.depth / 8);
  for (uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < total; w += gridDim.x * blockDim.x) {
    const uint32_t r = w / per_row, g = w - r * per_row;
    uint2 out = {0u, 0u};
    if (g < groups) {
      const T* row = x + static_cast<int64_t>(r) * p.row_stride + static_cast<int64_t>(g) * 8;
      float v[8];
      LoadRow8(row, v);
      int8_t* e = reinterpret_cast<int8_t*>(&out);
#pragma unroll
      for (int j = 0; j < 8; ++j) e[j] = QuantizeInt8Device(v[j], p.inv_scale);
    }
    reinterpret_cast<uint2*>(p.q + static_cast<int64_t>(r) * p.ldq)[g] = out;
  }
}

template <typename T>
cudaError_t LaunchInt8QuantizeTyped(const Int8QuantizeParams& p, cudaStream_t stream) {
  const int64_t per_row8 = p.ldq / 8;
  const int64_t total8 = p.rows * per_row8;
  const bool rows_fast = QuantRowsVectorizable(p);
  if (rows_fast) {
    Int8QuantizeRowsKernel<T><<<GridFor(total8, kThreads), kThreads, 0, stream>>>(
        p, static_cast<uint32_t>(per_row8), static_cast<uint32_t>(total8));
  } else {
    Int8QuantizeKernel<T><<<GridFor(p.rows * (p.ldq / 4), kThreads), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// I: the index type, 32-bit where every index fits (a 64-bit division per element made the
// epilogue compute-bound).
template <typename T, typename I>
__global__ void Int8EpilogueKernel(Int8EpilogueParams p) {
  const T* c = static_cast<const T*>(p.c);
  T* y = static_cast<T*>(p.y);
  const I total = static_cast<I>(p.rows * p.cols), cols = static_cast<I>(p.cols);
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I r = i / cols, col = i - r * cols;
    float v = static_cast<float>(p.acc[r * p.ld_acc + col]) * p.col_scale[col];
    if (c) v += p.beta * Load(c[r * p.c_row_stride + col * p.c_col_stride]);
    y[i] = Store<T>(ActivateFor<T>(p.act, v, p.act_min, p.act_max));
  }
}

}  // namespace

cudaError_t LaunchInt8Quantize(const Int8QuantizeParams& p, cudaStream_t stream) {
  if (p.ldq % 4 != 0 || reinterpret_cast<uintptr_t>(p.q) % 4 != 0 || p.depth > p.ldq) {
    return cudaErrorInvalidValue;
  }
  if (p.rows * (p.ldq / 4) == 0) return cudaSuccess;
  switch (p.type) {
    case BlasType::kF32:
      return LaunchInt8QuantizeTyped<float>(p, stream);
    case BlasType::kF16:
      return LaunchInt8QuantizeTyped<__half>(p, stream);
    case BlasType::kBF16:
      return LaunchInt8QuantizeTyped<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchInt8Epilogue(const Int8EpilogueParams& p, cudaStream_t stream) {
  const int64_t total = p.rows * p.cols;
  if (p.z != nullptr) return cudaErrorInvalidValue;  // a residual: kiln's own kernels only
  if (total == 0) return cudaSuccess;
  dim3 grid(GridFor(total, kThreads));
  // Every offset the kernel forms (acc, C and y) within 32 bits, or the 64-bit kernel.
  const int64_t reach = std::max(
      {total, p.rows * p.ld_acc + p.cols, p.rows * p.c_row_stride + p.cols * p.c_col_stride});
  const bool narrow = reach < (int64_t{1} << 31) - int64_t{kThreads} * grid.x;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    if (narrow) {
      Int8EpilogueKernel<T, uint32_t><<<grid, kThreads, 0, stream>>>(p);
    } else {
      Int8EpilogueKernel<T, int64_t><<<grid, kThreads, 0, stream>>>(p);
    }
  };
  switch (p.type) {
    case BlasType::kF32:
      launch(float{});
      break;
    case BlasType::kF16:
      launch(__half{});
      break;
    case BlasType::kBF16:
      launch(__nv_bfloat16{});
      break;
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
