// The GEMM epilogue kernel: what cuBLASLt's epilogues cannot do (a C operand that broadcasts
// other than per column, beta != 1 with a bias, activations other than ReLU and tanh-GELU),
// applied to the matmul's FP32 result in one launch before the single store of the output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
    for (int j = 0; j < kVec; ++j) e[j] = Store<T>(Activate(act, Load(e[j]), lo, hi));
    reinterpret_cast<uint4*>(y)[v] = raw;
  }
  for (int64_t i = vecs * kVec + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += stride) {
    y[i] = Store<T>(Activate(act, Load(y[i]), lo, hi));
  }
}

template <typename T>
__global__ void GemmEpilogueKernel(GemmEpilogueParams p) {
  const T* c = static_cast<const T*>(p.c);
  T* y = static_cast<T*>(p.y);
  int64_t total = p.rows * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = p.acc[i];
    if (c) {
      int64_t r = i / p.cols, col = i - r * p.cols;
      v += p.beta * Load(c[r * p.c_row_stride + col * p.c_col_stride]);
    }
    y[i] = Store<T>(Activate(p.act, v, p.act_min, p.act_max));
  }
}

}  // namespace

cudaError_t LaunchGemmEpilogue(const GemmEpilogueParams& p, cudaStream_t stream) {
  int64_t total = p.rows * p.cols;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  if (p.acc == nullptr) {
    if (p.c != nullptr) return cudaErrorInvalidValue;
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

}  // namespace kiln::cuda
