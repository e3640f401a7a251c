// TopK on CUDA: one block per line of [outer, n, inner] along n. The output order is a strict
// total order (value, then lower index first), so pass p finds the best element after the one
// pass p-1 chose: k block-wide reductions, no sorting buffers and no workspace. Fine for the
// k of models (a few to a few hundred); the cost is k sweeps of the line, which stays in L2.
// sorted = false (the CPU returns the chosen k in index order) adds one ordered compaction sweep.
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTopKThreads = 256;
constexpr int kTopKWarps = kTopKThreads / 32;

// Does (av, ai) come before (bv, bi) in the output? A missing candidate (index -1) comes last.
template <typename C>
__device__ __forceinline__ bool Before(bool largest, C av, int64_t ai, C bv, int64_t bi) {
  if (bi < 0) return ai >= 0;
  if (ai < 0) return false;
  if (av == bv) return ai < bi;
  return largest ? av > bv : av < bv;
}

template <typename T>
__global__ void TopKKernel(const T* __restrict__ x, T* __restrict__ values,
                           int64_t* __restrict__ indices, int64_t outer, int64_t n, int64_t inner,
                           int64_t k, bool largest, bool sorted) {
  using C = typename Compute<T>::type;
  __shared__ C warp_v[kTopKWarps];
  __shared__ int64_t warp_i[kTopKWarps];
  __shared__ int32_t warp_count[kTopKWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t line = blockIdx.x; line < outer * inner; line += gridDim.x) {
    const int64_t o = line / inner, in = line % inner;
    const T* p = x + o * n * inner + in;
    auto out_at = [&](int64_t pos) { return (o * k + pos) * inner + in; };
    C prev_v = C(0);
    int64_t prev_i = -1;  // none chosen yet
    for (int64_t pass = 0; pass < k; ++pass) {
      C best_v = C(0);
      int64_t best_i = -1;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        C v = Load(p[j * inner]);
        bool after_prev = prev_i < 0 || Before(largest, prev_v, prev_i, v, j);
        if (after_prev && Before(largest, v, j, best_v, best_i)) {
          best_v = v;
          best_i = j;
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        C ov = __shfl_xor_sync(0xffffffffu, best_v, off);
        int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, off);
        if (Before(largest, ov, oi, best_v, best_i)) {
          best_v = ov;
          best_i = oi;
        }
      }
      if (lane == 0) {
        warp_v[warp] = best_v;
        warp_i[warp] = best_i;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < kTopKWarps; ++w) {
          if (Before(largest, warp_v[w], warp_i[w], warp_v[0], warp_i[0])) {
            warp_v[0] = warp_v[w];
            warp_i[0] = warp_i[w];
          }
        }
        if (sorted) {
          values[out_at(pass)] = Store<T>(warp_v[0]);
          indices[out_at(pass)] = warp_i[0];
        }
      }
      __syncthreads();
      prev_v = warp_v[0];
      prev_i = warp_i[0];
      __syncthreads();  // warp_v/warp_i are rewritten by the next pass
    }
    if (!sorted && k > 0) {
      // The k chosen are exactly the elements not after the k-th; write them in index order.
      int64_t base = 0;
      for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {
        int64_t j = j0 + threadIdx.x;
        C v = j < n ? Load(p[j * inner]) : C(0);
        bool chosen = j < n && !Before(largest, prev_v, prev_i, v, j);
        unsigned ballot = __ballot_sync(0xffffffffu, chosen);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int64_t pos = base + __popc(ballot & ((1u << lane) - 1u));
        int64_t total = 0;
        for (int w = 0; w < kTopKWarps; ++w) {
          if (w < warp) pos += warp_count[w];
          total += warp_count[w];
        }
        if (chosen) {
          values[out_at(pos)] = Store<T>(v);
          indices[out_at(pos)] = j;
        }
        base += total;
        __syncthreads();  // warp_count is rewritten by the next chunk
      }
    }
  }
}

}  // namespace

cudaError_t LaunchTopK(Elem t, bool largest, bool sorted, const void* x, void* values,
                       int64_t* indices, int64_t outer, int64_t n, int64_t inner, int64_t k,
                       cudaStream_t stream) {
  int64_t lines = outer * inner;
  if (lines == 0 || k == 0) return cudaSuccess;
  if (k > n) return cudaErrorInvalidValue;
  unsigned blocks = static_cast<unsigned>(lines < 132 * 8 ? lines : 132 * 8);
  return DispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    TopKKernel<T><<<blocks, kTopKThreads, 0, stream>>>(static_cast<const T*>(x),
                                                       static_cast<T*>(values), indices, outer, n,
                                                       inner, k, largest, sorted);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
