// CumSum on CUDA over [outer, n, inner] along n. Contiguous lines (inner == 1) get one warp each,
// which scans 32 elements at a time (shuffle scan) and carries the running total; strided lines
// get one thread each, walking the axis in order (coalesced across inner). Floats accumulate in
// FP32, integers in their own type (wrapping as the CPU's).
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void CumSumLineKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                 int64_t n, int64_t inner, bool exclusive, bool reverse) {
  using C = typename Compute<T>::type;
  int64_t lines = outer * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < lines;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base = (t / inner) * n * inner + t % inner;
    C acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      int64_t k = base + (reverse ? n - 1 - s : s) * inner;
      C v = Load(x[k]);
      if (exclusive) {
        y[k] = Store<T>(acc);
        acc = static_cast<C>(acc + v);
      } else {
        acc = static_cast<C>(acc + v);
        y[k] = Store<T>(acc);
      }
    }
  }
}

template <typename T>
__global__ void CumSumRowWarpKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                    int64_t n, bool exclusive, bool reverse) {
  using C = typename Compute<T>::type;
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += warps) {
    const T* p = x + row * n;
    T* q = y + row * n;
    C carry = 0;
    for (int64_t s0 = 0; s0 < n; s0 += 32) {
      int64_t s = s0 + lane;
      int64_t k = reverse ? n - 1 - s : s;
      C v = s < n ? Load(p[k]) : C(0);
      // Inclusive scan of this chunk across the warp (Hillis-Steele).
      C inc = v;
      for (int o = 1; o < 32; o <<= 1) {
        C other = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc = static_cast<C>(inc + other);
      }
      C before = __shfl_up_sync(0xffffffffu, inc, 1);
      if (lane == 0) before = 0;
      if (s < n) q[k] = Store<T>(static_cast<C>(carry + (exclusive ? before : inc)));
      carry = static_cast<C>(carry + __shfl_sync(0xffffffffu, inc, 31));
    }
  }
}

}  // namespace

cudaError_t LaunchCumSum(Elem t, bool exclusive, bool reverse, const void* x, void* y,
                         int64_t outer, int64_t n, int64_t inner, cudaStream_t stream) {
  int64_t lines = outer * inner;
  if (lines == 0 || n == 0) return cudaSuccess;
  return DispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (inner == 1 && n >= 64) {
      // One row per warp (8 per block): a grid-stride loop over lines * 32 threads.
      CumSumRowWarpKernel<T>
          <<<GridFor(lines * 32), 256, 0, stream>>>(px, py, lines, n, exclusive, reverse);
    } else {
      CumSumLineKernel<T>
          <<<GridFor(lines), 256, 0, stream>>>(px, py, outer, n, inner, exclusive, reverse);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
