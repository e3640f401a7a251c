// Pad (constant, edge, wrap, reflect) and Tile on CUDA as one per-axis index map: each output
// element finds its source coordinate axis by axis, or takes the fill value. Pads that live on
// the device are read once per block into shared memory (no host reads, so graphs can capture
// the layer).
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

// Input coordinate for padded coordinate i of an axis of n, or -1 for the fill value; the same
// rules as the CPU's PadIndex (reflect mirrors without repeating the edge).
__device__ __forceinline__ int64_t PadIndex(int64_t i, int64_t n, PadMode mode) {
  if (i >= 0 && i < n) return i;
  if (mode == PadMode::kConstant || n == 0) return -1;
  if (mode == PadMode::kEdge) return i < 0 ? 0 : n - 1;
  if (mode == PadMode::kWrap) return ((i % n) + n) % n;
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  int64_t m = ((i % period) + period) % period;
  return m < n ? m : period - m;
}

template <typename I>
__device__ void ReadBegins(const PadDesc& d, int64_t* begin) {
  for (int a = 0; a < d.rank; ++a) begin[a] = 0;
  for (int j = 0; j < d.count; ++j) {
    int64_t ax = d.axes ? static_cast<int64_t>(static_cast<const I*>(d.axes)[j]) : j;
    if (ax < 0) ax += d.rank;
    if (ax < 0 || ax >= d.rank) continue;  // the shape rule rejected such axes at build time
    begin[ax] = static_cast<int64_t>(static_cast<const I*>(d.pads)[j]);
  }
}

template <typename U>
__global__ void PadKernel(const U* __restrict__ x, U* __restrict__ y, PadDesc d, int64_t n) {
  __shared__ int64_t begin[kMaxRank], in_stride[kMaxRank];
  __shared__ U fill;
  if (threadIdx.x == 0) {
    if (d.pads) {
      if (d.idx64) {
        ReadBegins<int64_t>(d, begin);
      } else {
        ReadBegins<int32_t>(d, begin);
      }
    } else {
      for (int a = 0; a < d.rank; ++a) begin[a] = d.begin[a];
    }
    int64_t s = 1;
    for (int a = d.rank - 1; a >= 0; --a) {
      in_stride[a] = s;
      s *= d.in[a];
    }
    fill = d.fill ? *static_cast<const U*>(d.fill) : U{};
  }
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i, off = 0;
    uint32_t r32 = static_cast<uint32_t>(i);
    bool inside = true;
    for (int a = d.rank - 1; a >= 0; --a) {
      int64_t o;
      if (d.div32) {
        const uint32_t q = (__umulhi(r32, d.div_mul[a]) + r32) >> d.div_shift[a];
        o = static_cast<int64_t>(r32 - q * static_cast<uint32_t>(d.out[a]));
        r32 = q;
      } else {
        o = r % d.out[a];
        r /= d.out[a];
      }
      int64_t src = PadIndex(o - begin[a], d.in[a], d.mode);
      inside = inside && src >= 0;
      off += src * in_stride[a];
    }
    y[i] = inside ? x[off] : fill;
  }
}

}  // namespace

cudaError_t LaunchPad(size_t elem_size, const PadDesc& d, const void* x, void* y, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (d.rank < 1 || d.rank > kMaxRank || d.count > kMaxRank) return cudaErrorInvalidValue;
  PadDesc fast = d;
  fast.div32 = n <= INT32_MAX;
  for (int a = 0; a < d.rank && fast.div32; ++a) {
    if (d.out[a] <= 0 || d.out[a] > INT32_MAX) {
      fast.div32 = false;
      break;
    }
    FastDivisor f = MakeFastDivisor(static_cast<uint32_t>(d.out[a]));
    fast.div_mul[a] = f.mul;
    fast.div_shift[a] = f.shift;
  }
  return DispatchBytes(elem_size, [&](auto tag) {
    using U = decltype(tag);
    PadKernel<U>
        <<<GridFor(n), 256, 0, stream>>>(static_cast<const U*>(x), static_cast<U*>(y), fast, n);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
