// Test-only CUDA kernels (Relu and a broadcasting Add over f32) so the runtime's GPU tests do not
// depend on the CUDA backend's real kernels. Plain launchers: no kiln headers in nvcc's way.
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln_test_cuda {
namespace {

__global__ void Relu(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = x[i] > 0.f ? x[i] : 0.f;
  }
}

// y[i] = a[i % na] + b[i % nb]: numpy broadcasting for the trailing-dims shapes the tests use.
__global__ void Add(const float* a, int64_t na, const float* b, int64_t nb, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = a[i % na] + b[i % nb];
  }
}

int Blocks(int64_t n) { return static_cast<int>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

}  // namespace

cudaError_t LaunchRelu(const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  Relu<<<Blocks(n), 256, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, int64_t na, const float* b, int64_t nb, float* y, int64_t n,
                      cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  Add<<<Blocks(n), 256, 0, s>>>(a, na, b, nb, y, n);
  return cudaGetLastError();
}

}  // namespace kiln_test_cuda
