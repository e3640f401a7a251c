// Launcher for the FP8 activation quantization of the FP8 matrix product (cublaslt_fp8.cc,
// fp8_gemm.cu). Plain structs and cudaError_t only, like blas_kernels.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backends/cuda/blas_kernels.h"

namespace kiln::cuda {

// q[i * ldq + k] = E4M3(x(i, k) * inv_scale) (round to nearest even, saturate to +-448) for
// k < depth, 0 for depth <= k < ldq, over rows x ldq; x(i, k) is x[i * row_stride + k *
// col_stride] in storage type `type`. ldq must be a multiple of 4 and q 4-byte aligned.
struct Fp8QuantizeParams {
  const void* x = nullptr;
  BlasType type = BlasType::kF32;
  uint8_t* q = nullptr;
  int64_t rows = 0, depth = 0, ldq = 0;
  int64_t row_stride = 0, col_stride = 1;
  float inv_scale = 1.f;
};
cudaError_t LaunchFp8Quantize(const Fp8QuantizeParams& p, cudaStream_t stream);

}  // namespace kiln::cuda
