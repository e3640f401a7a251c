// The GEMM epilogue kernel: what cuBLASLt's epilogues cannot do (a C operand that broadcasts
// other than per column, beta != 1 with a bias, activations other than ReLU and tanh-GELU),
// applied to the matmul's FP32 result in one launch before the single store of the output; and
// the gated activation (SwiGLU, GeGLU) with the same activation formulas.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

// In place on y (acc == nullptr): 8 elements per thread with 16-byte accesses when y is 16-byte
// aligned and 16-bit, so the pass costs one read and one write of y at full bandwidth.
template <typename T>
__global__ void ActInPlaceKernel(T* y, int64_t total, bool vec, BlasAct act, float lo, float hi) {
  constexpr int kVec = 16 / sizeof(T);
  int64_t vecs = vec ? total / kVec : 0;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vecs;
       v += stride) {
    uint4 raw = reinterpret_cast<const uint4*>(y)[v];
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) e[j] = Store<T>(ActivateFor<T>(act, Load(e[j]), lo, hi));
    reinterpret_cast<uint4*>(y)[v] = raw;
  }
  for (int64_t i = vecs * kVec + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += stride) {
    y[i] = Store<T>(ActivateFor<T>(act, Load(y[i]), lo, hi));
  }
}

template <typename T>
__global__ void GemmEpilogueKernel(GemmEpilogueParams p) {
  const T* c = static_cast<const T*>(p.c);
  T* y = static_cast<T*>(p.y);
  int64_t total = p.rows * p.cols;
  const bool dense = p.acc_ld == 0 || p.acc_ld == p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = 0, col = 0;
    if (c || !dense) {
      r = i / p.cols;
      col = i - r * p.cols;
    }
    float v = dense ? p.acc[i] : p.acc[r * p.acc_ld + col];
    if (c) v += p.beta * Load(c[r * p.c_row_stride + col * p.c_col_stride]);
    const T out = Store<T>(ActivateFor<T>(p.act, v, p.act_min, p.act_max));
    if (p.y_e4m3) {
      p.y_e4m3[i] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(__fmul_rn(Load(out), p.y_inv_scale), __NV_SATFINITE, __NV_E4M3));
    } else {
      y[i] = out;
    }
  }
}

// y[r, j] = act(a[r * stride + j]) * b[r * stride + j] for j < n: 16-byte accesses when n, the
// stride and every pointer allow (the packed gate/up halves of an even row do), else one element.
template <typename T, int kVec>
__global__ void GatedKernel(GatedActivationParams p) {
  using V = uint4;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* y = static_cast<T*>(p.y);
  const int64_t per_row = p.n / kVec;
  const int64_t total = p.rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, j = (i - r * per_row) * kVec;
    const int64_t in = r * p.stride + j;
    if constexpr (kVec == 1) {
      y[r * p.n + j] =
          Store<T>(ActivateFor<T>(p.act, Load(a[in]), p.act_min, p.act_max) * Load(b[in]));
    } else {
      V ra = *reinterpret_cast<const V*>(a + in);
      V rb = *reinterpret_cast<const V*>(b + in);
      V ry;
      const T* ea = reinterpret_cast<const T*>(&ra);
      const T* eb = reinterpret_cast<const T*>(&rb);
      T* ey = reinterpret_cast<T*>(&ry);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        ey[e] = Store<T>(ActivateFor<T>(p.act, Load(ea[e]), p.act_min, p.act_max) * Load(eb[e]));
      }
      *reinterpret_cast<V*>(y + r * p.n + j) = ry;
    }
  }
}

template <typename T>
cudaError_t LaunchGatedT(const GatedActivationParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kThreads = 256;
  auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool vec =
      p.n % kVec == 0 && p.stride % kVec == 0 && aligned(p.a) && aligned(p.b) && aligned(p.y);
  int64_t work = p.rows * (vec ? p.n / kVec : p.n);
  int64_t blocks = (work + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks);
  if (vec) {
    GatedKernel<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  } else {
    GatedKernel<T, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGemmEpilogue(const GemmEpilogueParams& p, cudaStream_t stream) {
  int64_t total = p.rows * p.cols;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  if (p.acc == nullptr) {
    if (p.c != nullptr || p.y_e4m3 != nullptr) return cudaErrorInvalidValue;
    const bool vec = reinterpret_cast<uintptr_t>(p.y) % 16 == 0;  // caller buffers may not be
    int64_t blocks = ((vec ? total / 8 : total) + kThreads - 1) / kThreads;
    blocks = blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks);
    dim3 grid(static_cast<unsigned>(blocks));
    switch (p.type) {
      case BlasType::kF32:
        ActInPlaceKernel<float><<<grid, kThreads, 0, stream>>>(static_cast<float*>(p.y), total, vec,
                                                               p.act, p.act_min, p.act_max);
        break;
      case BlasType::kF16:
        ActInPlaceKernel<__half><<<grid, kThreads, 0, stream>>>(static_cast<__half*>(p.y), total,
                                                                vec, p.act, p.act_min, p.act_max);
        break;
      case BlasType::kBF16:
        ActInPlaceKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
            static_cast<__nv_bfloat16*>(p.y), total, vec, p.act, p.act_min, p.act_max);
        break;
    }
    return cudaGetLastError();
  }
  // Grid-stride loop: a bounded grid (a few waves on any GPU) covers any size.
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536;
  dim3 grid(static_cast<unsigned>(blocks));
  switch (p.type) {
    case BlasType::kF32:
      GemmEpilogueKernel<float><<<grid, kThreads, 0, stream>>>(p);
      break;
    case BlasType::kF16:
      GemmEpilogueKernel<__half><<<grid, kThreads, 0, stream>>>(p);
      break;
    case BlasType::kBF16:
      GemmEpilogueKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchGatedActivation(const GatedActivationParams& p, cudaStream_t stream) {
  if (p.rows * p.n == 0) return cudaSuccess;
  switch (p.type) {
    case BlasType::kF32:
      return LaunchGatedT<float>(p, stream);
    case BlasType::kF16:
      return LaunchGatedT<__half>(p, stream);
    case BlasType::kBF16:
      return LaunchGatedT<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda
