// What every CUDA kernel file shares: turning CUDA, cuBLASLt and cuDNN failures into catalog
// errors that carry the library's own message, and the per-thread library handles.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <optional>
#include <string>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/core/status.h"
#include "kiln/ir/dtype.h"

// cuBLASLt is loaded lazily (generated stubs, cmake/gen_lazy_stubs.py): empty when it loaded,
// else dlopen's reason.
extern "C" const char* kiln_cublaslt_load_error();

namespace kiln::cuda {

// The BLAS/attention kernels' storage type for a kiln dtype (FP32, FP16, BF16), else none.
inline std::optional<BlasType> ToBlasType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return BlasType::kF32;
    case DataType::kFloat16:
      return BlasType::kF16;
    case DataType::kBFloat16:
      return BlasType::kBF16;
    default:
      return std::nullopt;
  }
}

// KILN-E6002/E6003 with CUDA's own name and message for the failed call `what`.
Status CudaStatus(cudaError_t err, const char* what);
// KILN-E6004 with cuBLAS's status name.
Status CublasStatus(cublasStatus_t st, const char* what);
// KILN-E6005 with cuDNN's error string and its last error message.
Status CudnnStatus(cudnnStatus_t st, const char* what);

// This thread's library handles on the current device, created on first use and kept for the
// thread's life (handle creation costs milliseconds; never do it per layer or per run).
StatusOr<cublasLtHandle_t> CublasLtHandle();
StatusOr<cudnnHandle_t> CudnnHandle();

// "sm_90" for the current device.
std::string ArchName(int major, int minor);

}  // namespace kiln::cuda

#define KILN_CUDA_RETURN_IF_ERROR(expr)                                                        \
  do {                                                                                         \
    cudaError_t kiln_cuda_err_ = (expr);                                                       \
    if (kiln_cuda_err_ != cudaSuccess) return ::kiln::cuda::CudaStatus(kiln_cuda_err_, #expr); \
  } while (0)

#define KILN_CUBLAS_RETURN_IF_ERROR(expr)                        \
  do {                                                           \
    cublasStatus_t kiln_cublas_st_ = (expr);                     \
    if (kiln_cublas_st_ != CUBLAS_STATUS_SUCCESS)                \
      return ::kiln::cuda::CublasStatus(kiln_cublas_st_, #expr); \
  } while (0)

#define KILN_CUDNN_RETURN_IF_ERROR(expr)                       \
  do {                                                         \
    cudnnStatus_t kiln_cudnn_st_ = (expr);                     \
    if (kiln_cudnn_st_ != CUDNN_STATUS_SUCCESS)                \
      return ::kiln::cuda::CudnnStatus(kiln_cudnn_st_, #expr); \
  } while (0)
