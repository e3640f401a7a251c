// ArgMax and ArgMin on CUDA over [outer, n, inner]. Contiguous rows (inner == 1) long enough to
// share get one warp each (lanes take strided elements, then a shuffle reduction of (value,
// index) pairs); otherwise one thread walks each line in order, coalesced across inner. Both give
// the CPU's answer: the first index of the best value, or the last with select_last.
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

// Is (v, i) preferred to the current best (bv, bi)? Ties go to the lower index, or the higher
// with select_last; the candidate indices may arrive in any order.
template <typename C>
__device__ __forceinline__ bool Better(bool is_max, bool last, C v, int64_t i, C bv, int64_t bi) {
  if (v == bv) return last ? i > bi : i < bi;
  return is_max ? v > bv : v < bv;
}

template <typename T>
__global__ void ArgLineKernel(const T* __restrict__ x, int64_t* __restrict__ y, int64_t outer,
                              int64_t n, int64_t inner, bool is_max, bool last) {
  using C = typename Compute<T>::type;
  int64_t lines = outer * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < lines;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* p = x + (t / inner) * n * inner + t % inner;
    C best = Load(p[0]);
    int64_t bi = 0;
    for (int64_t j = 1; j < n; ++j) {
      C v = Load(p[j * inner]);
      if (Better(is_max, last, v, j, best, bi)) {
        best = v;
        bi = j;
      }
    }
    y[t] = bi;
  }
}

template <typename T>
__global__ void ArgRowWarpKernel(const T* __restrict__ x, int64_t* __restrict__ y, int64_t rows,
                                 int64_t n, bool is_max, bool last) {
  using C = typename Compute<T>::type;
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += warps) {
    const T* p = x + row * n;
    // n >= 32 here, so every lane starts with an element.
    C best = Load(p[lane]);
    int64_t bi = lane;
    for (int64_t j = lane + 32; j < n; j += 32) {
      C v = Load(p[j]);
      if (Better(is_max, last, v, j, best, bi)) {
        best = v;
        bi = j;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      C ov = __shfl_xor_sync(0xffffffffu, best, o);
      int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (Better(is_max, last, ov, oi, best, bi)) {
        best = ov;
        bi = oi;
      }
    }
    if (lane == 0) y[row] = bi;
  }
}

}  // namespace

cudaError_t LaunchArgReduce(Elem t, bool is_max, bool select_last, const void* x, int64_t* y,
                            int64_t outer, int64_t n, int64_t inner, cudaStream_t stream) {
  int64_t lines = outer * inner;
  if (lines == 0) return cudaSuccess;
  if (n < 1) return cudaErrorInvalidValue;  // ArgMax of an empty axis has no answer
  return DispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x);
    if (inner == 1 && n >= 64) {
      // One row per warp (8 per block): a grid-stride loop over lines * 32 threads.
      ArgRowWarpKernel<T>
          <<<GridFor(lines * 32), 256, 0, stream>>>(px, y, lines, n, is_max, select_last);
    } else {
      ArgLineKernel<T>
          <<<GridFor(lines), 256, 0, stream>>>(px, y, outer, n, inner, is_max, select_last);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
