// The depthwise convolution kernel (conv_depthwise.h): one thread per output pixel and group of
// kVec channels (16 bytes of f16/bf16, or one channel when C or the pointers do not allow it),
// so that neighbouring threads read neighbouring channels of the same input pixel: every tap is
// one coalesced load. Taps are read through the cache; FP32 accumulation; the epilogue (bias,
// residual, activation) before the single store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

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
      ov.v[e] = Store<T>(ActivateFor<T>(static_cast<BlasAct>(a.act), v, a.act_min, a.act_max));
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
        ov.v[e] = Store<T>(ActivateFor<T>(static_cast<BlasAct>(a.act), v, a.act_min, a.act_max));
      }
      *reinterpret_cast<V*>(y + out) = ov;
    }
  }
}

// The same convolution with the block's input tile staged in shared memory (FP16/BF16, square
// kS x kS filter, stride kStride both ways, C a multiple of 8). A block computes kRows output rows
// x kCols output columns x kChannels channels: 16 lanes share one output row, each lane a channel
// pair (half2) and kCols outputs along the row, so a thread keeps one input row of
// (kCols - 1) * kStride + kS pairs in registers and uses each up to kS times; every input pixel is
// read from global memory once per block (the row-tiled kernel above reads it up to kS * kS / 4
// times through the cache, and its 130 registers a thread leave a few warps per SM to hide that).
// The two half-warps read rows kStride apart; the tile's row pitch is padded so that they land on
// the other 16 banks. Same products in the same order per output as the kernels above.
constexpr int kSmemLanes = 16;                              // channel pairs per block
constexpr int kSmemChannels = 2 * kSmemLanes;               // 32 channels: 64 bytes of a pixel
constexpr int kSmemCols = 8;                                // outputs per thread, along a row
constexpr int SmemRows(int stride) { return 16 / stride; }  // output rows per block
constexpr int SmemTileW(int s, int stride) { return (kSmemCols - 1) * stride + s; }
constexpr int SmemTileH(int s, int stride) { return (SmemRows(stride) - 1) * stride + s; }
// Row pitch in 4-byte words: a pixel is 16 words; the pad puts rows kStride apart 16 banks apart.
constexpr int SmemPitch(int s, int stride) {
  const int words = SmemTileW(s, stride) * kSmemLanes;
  if (stride == 1) return SmemTileW(s, stride) % 2 == 0 ? words + 16 : words;
  return words + 8;  // stride 2: 2 * pitch = 16 (mod 32) needs pitch = 8 (mod 16)
}

template <typename T, int kS, int kStride>
__global__ void __launch_bounds__(kSmemLanes* SmemRows(kStride))
    DepthwiseSmemKernel(DepthwiseConvArgs a) {
  constexpr int kRows = SmemRows(kStride);
  constexpr int kTileW = SmemTileW(kS, kStride);
  constexpr int kTileH = SmemTileH(kS, kStride);
  constexpr int kPitch = SmemPitch(kS, kStride);
  constexpr int kThreads = kSmemLanes * kRows;
  __shared__ __align__(16) uint32_t tile[kTileH * kPitch];
  using T2 = typename std::conditional<std::is_same_v<T, __half>, __half2, __nv_bfloat162>::type;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const T* bias = static_cast<const T*>(a.bias);
  const T* z = static_cast<const T*>(a.z);
  T* y = static_cast<T*>(a.y);

  const int64_t col_tiles = (a.ow + kSmemCols - 1) / kSmemCols;
  const int64_t row_tiles = (a.oh + kRows - 1) / kRows;
  int64_t b = blockIdx.x;
  const int64_t ct = b % col_tiles;
  b /= col_tiles;
  const int64_t rt = b % row_tiles;
  b /= row_tiles;
  const int64_t n = b;
  const int64_t c_base = static_cast<int64_t>(blockIdx.y) * kSmemChannels;
  const int64_t oy0 = rt * kRows, ox0 = ct * kSmemCols;
  const int64_t iy_base = oy0 * kStride - a.pad_h, ix_base = ox0 * kStride - a.pad_w;

  // Stage the tile: 16-byte chunks (8 channels), zeros outside the image and past C.
  constexpr int kChunks = kTileH * kTileW * (kSmemChannels / 8);
  for (int q = threadIdx.x; q < kChunks; q += kThreads) {
    const int part = q % (kSmemChannels / 8);
    const int pix = q / (kSmemChannels / 8);
    const int ty = pix / kTileW, tx = pix % kTileW;
    const int64_t gy = iy_base + ty, gx = ix_base + tx;
    const int64_t c = c_base + part * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (gy >= 0 && gy < a.h && gx >= 0 && gx < a.w_in && c < a.c) {
      v = *reinterpret_cast<const uint4*>(x + ((n * a.h + gy) * a.w_in + gx) * a.c + c);
    }
    *reinterpret_cast<uint4*>(&tile[ty * kPitch + tx * kSmemLanes + part * 4]) = v;
  }
  __syncthreads();

  const int lane = threadIdx.x % kSmemLanes;
  const int row = threadIdx.x / kSmemLanes;
  const int64_t c = c_base + 2 * lane;
  const int64_t oy = oy0 + row;
  if (c >= a.c || oy >= a.oh) return;
  float2 acc[kSmemCols];
#pragma unroll
  for (int t = 0; t < kSmemCols; ++t) acc[t] = make_float2(0.f, 0.f);
#pragma unroll
  for (int ky = 0; ky < kS; ++ky) {
    const uint32_t* src = &tile[(row * kStride + ky) * kPitch + lane];
    float2 in[kTileW];
#pragma unroll
    for (int j = 0; j < kTileW; ++j) {
      const uint32_t bits = src[j * kSmemLanes];
      const T2 v = *reinterpret_cast<const T2*>(&bits);
      in[j] = make_float2(Load(v.x), Load(v.y));
    }
#pragma unroll
    for (int kx = 0; kx < kS; ++kx) {
      const T2 wv = *reinterpret_cast<const T2*>(w + (ky * kS + kx) * a.c + c);
      const float2 wf = make_float2(Load(wv.x), Load(wv.y));
#pragma unroll
      for (int t = 0; t < kSmemCols; ++t) {
        acc[t].x += in[t * kStride + kx].x * wf.x;
        acc[t].y += in[t * kStride + kx].y * wf.y;
      }
    }
  }
  float2 bf = make_float2(0.f, 0.f);
  if (bias) {
    const T2 bv = *reinterpret_cast<const T2*>(bias + c);
    bf = make_float2(Load(bv.x), Load(bv.y));
  }
  const BlasAct act = static_cast<BlasAct>(a.act);
#pragma unroll
  for (int t = 0; t < kSmemCols; ++t) {
    const int64_t ox = ox0 + t;
    if (ox >= a.ow) break;
    const int64_t out = ((n * a.oh + oy) * a.ow + ox) * a.c + c;
    float v0 = acc[t].x + bf.x, v1 = acc[t].y + bf.y;
    if (z) {
      const T2 zv = *reinterpret_cast<const T2*>(z + out);
      v0 += Load(zv.x);
      v1 += Load(zv.y);
    }
    T2 o;
    o.x = Store<T>(ActivateFor<T>(act, v0, a.act_min, a.act_max));
    o.y = Store<T>(ActivateFor<T>(act, v1, a.act_min, a.act_max));
    *reinterpret_cast<T2*>(y + out) = o;
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

template <typename T>
cudaError_t LaunchSmemT(const DepthwiseConvArgs& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    return cudaErrorNotSupported;
  } else {
    const int64_t col_tiles = (a.ow + kSmemCols - 1) / kSmemCols;
    const int64_t c_blocks = (a.c + kSmemChannels - 1) / kSmemChannels;
#define KILN_DW_SMEM(S, STRIDE)                                                               \
  if (a.s == S && a.stride_w == STRIDE) {                                                     \
    const int64_t row_tiles = (a.oh + SmemRows(STRIDE) - 1) / SmemRows(STRIDE);               \
    const dim3 grid(static_cast<unsigned>(a.n * row_tiles * col_tiles),                       \
                    static_cast<unsigned>(c_blocks));                                         \
    DepthwiseSmemKernel<T, S, STRIDE><<<grid, kSmemLanes * SmemRows(STRIDE), 0, stream>>>(a); \
    return cudaGetLastError();                                                                \
  }
    KILN_DW_SMEM(3, 1)
    KILN_DW_SMEM(5, 1)
    KILN_DW_SMEM(7, 1)
    KILN_DW_SMEM(3, 2)
    KILN_DW_SMEM(5, 2)
    KILN_DW_SMEM(7, 2)
#undef KILN_DW_SMEM
    return cudaErrorNotSupported;
  }
}

}  // namespace

bool DepthwiseSmemSupports(Elem dtype, int64_t c, int r, int s, int stride_h, int stride_w) {
  return (dtype == Elem::kF16 || dtype == Elem::kBF16) && c % 8 == 0 && r == s &&
         (s == 3 || s == 5 || s == 7) && stride_h == stride_w && (stride_w == 1 || stride_w == 2);
}

cudaError_t LaunchDepthwiseConv(const DepthwiseConvArgs& a, cudaStream_t stream) {
  if (a.n * a.oh * a.ow * a.c == 0) return cudaSuccess;
  if (a.variant == DepthwiseVariant::kSharedTile) {
    if (!DepthwiseSmemSupports(a.dtype, a.c, a.r, a.s, a.stride_h, a.stride_w)) {
      return cudaErrorNotSupported;
    }
    // A view of another tensor may start off the 16-byte grid, and a grid past CUDA's limits
    // (2^31 - 1 blocks along x, 65535 along y) cannot launch: the register-tiled kernel then.
    // Smallest rows per block (stride 2) bound the blocks along x.
    const int64_t blocks_x =
        a.n * ((a.oh + SmemRows(2) - 1) / SmemRows(2)) * ((a.ow + kSmemCols - 1) / kSmemCols);
    const int64_t blocks_y = (a.c + kSmemChannels - 1) / kSmemChannels;
    if (Aligned(a.x, 16) && Aligned(a.w, 4) && Aligned(a.bias, 4) && Aligned(a.z, 4) &&
        Aligned(a.y, 4) && blocks_x <= INT32_MAX && blocks_y <= 65535) {
      return DispatchFloat(a.dtype,
                           [&](auto tag) { return LaunchSmemT<decltype(tag)>(a, stream); });
    }
  }
  return DispatchFloat(a.dtype, [&](auto tag) { return LaunchT<decltype(tag)>(a, stream); });
}

}  // namespace kiln::cuda
