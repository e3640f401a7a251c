// The depthwise convolution kernel (conv_depthwise.h): one thread per output pixel and group of
// kVec channels (16 bytes of f16/bf16, or one channel when C or the pointers do not allow it),
// so that neighbouring threads read neighbouring channels of the same input pixel: every tap is
// one coalesced load. Taps are read through the cache; FP32 accumulation; the epilogue (bias,
// residual, activation) before the single store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/conv_depthwise.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) DwVec {
  T v[kVec];
};

template <typename T, int kVec>
__global__ void DepthwiseConvKernel(DepthwiseConvArgs a) {
  using V = DwVec<T, kVec>;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const T* bias = static_cast<const T*>(a.bias);
  const T* z = static_cast<const T*>(a.z);
  T* y = static_cast<T*>(a.y);
  const int64_t cv = a.c / kVec;
  const int64_t total = a.n * a.oh * a.ow * cv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t cg = i % cv;
    int64_t p = i / cv;
    const int64_t ox = p % a.ow;
    p /= a.ow;
    const int64_t oy = p % a.oh;
    const int64_t n = p / a.oh;
    const int64_t c0 = cg * kVec;
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = 0.f;
    const int64_t iy0 = oy * a.stride_h - a.pad_h;
    const int64_t ix0 = ox * a.stride_w - a.pad_w;
    for (int ky = 0; ky < a.r; ++ky) {
      const int64_t iy = iy0 + ky;
      if (iy < 0 || iy >= a.h) continue;
      const T* row = x + ((n * a.h + iy) * a.w_in) * a.c + c0;
      for (int kx = 0; kx < a.s; ++kx) {
        const int64_t ix = ix0 + kx;
        if (ix < 0 || ix >= a.w_in) continue;
        V xv = *reinterpret_cast<const V*>(row + ix * a.c);
        V wv = *reinterpret_cast<const V*>(w + (ky * a.s + kx) * a.c + c0);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += Load(xv.v[e]) * Load(wv.v[e]);
      }
    }
    const int64_t out = ((n * a.oh + oy) * a.ow + ox) * a.c + c0;
    V bv, zv, ov;
    if (bias) bv = *reinterpret_cast<const V*>(bias + c0);
    if (z) zv = *reinterpret_cast<const V*>(z + out);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float v = acc[e];
      if (bias) v += Load(bv.v[e]);
      if (z) v += Load(zv.v[e]);
      ov.v[e] = Store<T>(Activate(static_cast<BlasAct>(a.act), v, a.act_min, a.act_max));
    }
    *reinterpret_cast<V*>(y + out) = ov;
  }
}

// The same convolution with each thread computing kTile horizontally adjacent outputs for one
// kVec group of channels: a filter row of width kS reads (kTile - 1) * kStride + kS input
// vectors once into registers and uses each up to kS times, where the kernel above loads every
// tap again (ConvNeXt's 7x7: 10 loads per row for 4 outputs instead of 28). Same products in the
// same order per output as the kernel above; taps outside the input add a zero product instead
// of being skipped, which changes nothing unless a weight is infinite or NaN.
template <typename T, int kVec, int kS, int kStride, int kTile>
__global__ void DepthwiseRowTileKernel(DepthwiseConvArgs a) {
  using V = DwVec<T, kVec>;
  constexpr int kSpan = (kTile - 1) * kStride + kS;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const T* bias = static_cast<const T*>(a.bias);
  const T* z = static_cast<const T*>(a.z);
  T* y = static_cast<T*>(a.y);
  const int64_t cv = a.c / kVec;
  const int64_t tiles = (a.ow + kTile - 1) / kTile;
  const int64_t total = a.n * a.oh * tiles * cv;
  V zero;
#pragma unroll
  for (int e = 0; e < kVec; ++e) zero.v[e] = Store<T>(0.f);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t cg = i % cv;
    int64_t p = i / cv;
    const int64_t tx = p % tiles;
    p /= tiles;
    const int64_t oy = p % a.oh;
    const int64_t n = p / a.oh;
    const int64_t c0 = cg * kVec;
    const int64_t ox0 = tx * kTile;
    float acc[kTile][kVec];
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[t][e] = 0.f;
    }
    const int64_t iy0 = oy * a.stride_h - a.pad_h;
    const int64_t ix0 = ox0 * kStride - a.pad_w;
    for (int ky = 0; ky < a.r; ++ky) {
      const int64_t iy = iy0 + ky;
      if (iy < 0 || iy >= a.h) continue;
      const T* row = x + ((n * a.h + iy) * a.w_in) * a.c + c0;
      // The row's inputs in FP32, converted once (conversions, not loads, bound the kernel
      // above: it converts every tap of every output).
      float in[kSpan][kVec];
#pragma unroll
      for (int j = 0; j < kSpan; ++j) {
        const int64_t ix = ix0 + j;
        const V v = ix >= 0 && ix < a.w_in ? *reinterpret_cast<const V*>(row + ix * a.c) : zero;
#pragma unroll
        for (int e = 0; e < kVec; ++e) in[j][e] = Load(v.v[e]);
      }
#pragma unroll
      for (int kx = 0; kx < kS; ++kx) {
        const V wv = *reinterpret_cast<const V*>(w + (ky * kS + kx) * a.c + c0);
        float wf[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) wf[e] = Load(wv.v[e]);
#pragma unroll
        for (int t = 0; t < kTile; ++t) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[t][e] += in[t * kStride + kx][e] * wf[e];
        }
      }
    }
    V bv;
    if (bias) bv = *reinterpret_cast<const V*>(bias + c0);
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      const int64_t ox = ox0 + t;
      if (ox >= a.ow) break;
      const int64_t out = ((n * a.oh + oy) * a.ow + ox) * a.c + c0;
      V zv, ov;
      if (z) zv = *reinterpret_cast<const V*>(z + out);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float v = acc[t][e];
        if (bias) v += Load(bv.v[e]);
        if (z) v += Load(zv.v[e]);
        ov.v[e] = Store<T>(Activate(static_cast<BlasAct>(a.act), v, a.act_min, a.act_max));
      }
      *reinterpret_cast<V*>(y + out) = ov;
    }
  }
}

bool Aligned(const void* p, size_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <typename T>
cudaError_t LaunchT(const DepthwiseConvArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kThreads = 256;
  const bool vec = a.c % kVec == 0 && Aligned(a.x, 16) && Aligned(a.w, 16) && Aligned(a.bias, 16) &&
                   Aligned(a.z, 16) && Aligned(a.y, 16);
  if (vec && (a.stride_w == 1 || a.stride_w == 2) && (a.s == 3 || a.s == 5 || a.s == 7)) {
    constexpr int kTile = 4;
    const int64_t work = a.n * a.oh * ((a.ow + kTile - 1) / kTile) * (a.c / kVec);
    int64_t blocks = (work + kThreads - 1) / kThreads;
    blocks = blocks < 1 ? 1 : (blocks > 132 * 64 ? 132 * 64 : blocks);
    const dim3 grid(static_cast<unsigned>(blocks));
#define KILN_DW_TILE(S, STRIDE)                                                          \
  if (a.s == S && a.stride_w == STRIDE) {                                                \
    DepthwiseRowTileKernel<T, kVec, S, STRIDE, kTile><<<grid, kThreads, 0, stream>>>(a); \
    return cudaGetLastError();                                                           \
  }
    KILN_DW_TILE(3, 1)
    KILN_DW_TILE(5, 1)
    KILN_DW_TILE(7, 1)
    KILN_DW_TILE(3, 2)
    KILN_DW_TILE(5, 2)
    KILN_DW_TILE(7, 2)
#undef KILN_DW_TILE
  }
  const int64_t work = a.n * a.oh * a.ow * (vec ? a.c / kVec : a.c);
  int64_t blocks = (work + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > 132 * 64 ? 132 * 64 : blocks);
  if (vec) {
    DepthwiseConvKernel<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  } else {
    DepthwiseConvKernel<T, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDepthwiseConv(const DepthwiseConvArgs& a, cudaStream_t stream) {
  if (a.n * a.oh * a.ow * a.c == 0) return cudaSuccess;
  return DispatchFloat(a.dtype, [&](auto tag) { return LaunchT<decltype(tag)>(a, stream); });
}

}  // namespace kiln::cuda
