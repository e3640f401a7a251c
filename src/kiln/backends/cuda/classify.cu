// IsNaN and IsInf on CUDA: float storage in, bool out, one thread per element.
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void ClassifyKernel(const T* __restrict__ x, bool* __restrict__ y, int64_t n, bool nan,
                               bool pos, bool neg) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = Load(x[i]);
    y[i] = nan ? isnan(v) : (isinf(v) && ((v > 0 && pos) || (v < 0 && neg)));
  }
}

}  // namespace

cudaError_t LaunchIsNanInf(Elem t, bool nan, bool detect_positive, bool detect_negative,
                           const void* x, bool* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    ClassifyKernel<T><<<GridFor(n), 256, 0, stream>>>(static_cast<const T*>(x), y, n, nan,
                                                      detect_positive, detect_negative);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
