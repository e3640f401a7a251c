// The epilogue of kiln's own 8-bit tensor-core products (int8_mma_gemm.cu's mma.sync kernel,
// int8_wgmma_gemm.cu's Hopper warpgroup kernels, INT8 and FP8), after a block has staged its tile
// of accumulators (int32, or FP32 for FP8) in shared memory: y = act(float(acc) * col_scale[n] +
// beta * C + Z) in the layer's float type, or quantized to the operands' 8-bit type on an INT8 or
// FP8 edge (ops/quant_edge.h). Each thread finishes 8 consecutive outputs of a row at a time in a
// loop, so the epilogue's code (the activation above all) stays one loop body instead of one copy
// per accumulator register (which made the first mma kernel instruction-fetch bound), and the
// stores are 8-wide and coalesced.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/int8_kernels.h"

namespace kiln::cuda::int8_tile {

constexpr int kAccPad = 8;  // int32s of padding per row of the staged accumulators

// An E4M3 output byte (an FP8 edge's producer): Y's element type where the layer's is T.
struct E4m3Out {
  uint8_t bits;
};

// One output: the storage type T's rounding; for an int8 Y the INT8 contract with inv_scale; for
// an E4M3 Y the FP8 contract on the value rounded to T first (what the consumer's own
// quantization of T would see, as blas_kernels.cu's epilogue does): times inv_scale, round to
// nearest even, saturate to +-448.
template <typename T, typename Y>
__device__ __forceinline__ Y Convert(float v, float inv_scale) {
  if constexpr (std::is_same_v<Y, int8_t>) {
    return QuantizeInt8Device(v, inv_scale);
  } else if constexpr (std::is_same_v<Y, E4m3Out>) {
    return E4m3Out{static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(__fmul_rn(Load(Store<T>(v)), inv_scale), __NV_SATFINITE, __NV_E4M3))};
  } else {
    return Store<Y>(v);
  }
}
template <typename Y>
__device__ __forceinline__ uint8_t Byte(Y y) {
  if constexpr (std::is_same_v<Y, E4m3Out>) {
    return y.bits;
  } else {
    return static_cast<uint8_t>(y);
  }
}

template <typename Y>
__device__ __forceinline__ uint32_t Bits16(float v) {
  const Y h = Store<Y>(v);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// Eight outputs to dst (8 * sizeof(Y)-byte aligned) in one or two 16-byte stores (8 bytes for
// 8-bit Y), packed in registers.
template <typename T, typename Y>
__device__ __forceinline__ void StoreEight(Y* dst, const float (&v)[8], float inv_scale) {
  if constexpr (sizeof(Y) == 1) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      w[e / 4] |= static_cast<uint32_t>(Byte(Convert<T, Y>(v[e], inv_scale))) << (8 * (e % 4));
    }
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else if constexpr (sizeof(Y) == 2) {
    uint4 w;
    w.x = Bits16<Y>(v[0]) | (Bits16<Y>(v[1]) << 16);
    w.y = Bits16<Y>(v[2]) | (Bits16<Y>(v[3]) << 16);
    w.z = Bits16<Y>(v[4]) | (Bits16<Y>(v[5]) << 16);
    w.w = Bits16<Y>(v[6]) | (Bits16<Y>(v[7]) << 16);
    *reinterpret_cast<uint4*>(dst) = w;
  } else {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// The activations FinishTile has a loop of its own for (WholeTile): the common ones (none, ReLU
// and its clipped form, GELU in both forms).
inline bool WholeTileActivation(BlasAct act) {
  return act == BlasAct::kNone || act == BlasAct::kRelu || act == BlasAct::kClip ||
         act == BlasAct::kGelu || act == BlasAct::kGeluTanh;
}

// How a launch may vectorize the epilogue: `out` 8 outputs per store where every row of Y starts
// 8-aligned; `bias` C a row bias (the same N values for every row) whose groups of 8 are 16-byte
// aligned; `z` the residual read 8 at a time (rows 8-aligned, 16-byte aligned). `whole`: a tile
// inside Y takes WholeTile (out, C absent or `bias`, Z absent or `z`, an activation of
// WholeTileActivation).
struct Vectors {
  bool out = false, bias = false, z = false, whole = false;
};
template <typename Y>
inline Vectors VectorsFor(const Int8MmaGemmParams& p) {
  const Int8EpilogueParams& e = p.epi;
  Vectors v;
  v.out = e.cols % 8 == 0 && reinterpret_cast<uintptr_t>(e.y) % (8 * sizeof(Y)) == 0;
  v.bias = e.c != nullptr && e.c_row_stride == 0 && e.c_col_stride == 1 && e.cols % 8 == 0 &&
           reinterpret_cast<uintptr_t>(e.c) % 16 == 0;
  v.z = e.z != nullptr && e.cols % 8 == 0 && reinterpret_cast<uintptr_t>(e.z) % 16 == 0;
  v.whole =
      v.out && (e.c == nullptr || v.bias) && (e.z == nullptr || v.z) && WholeTileActivation(e.act);
  return v;
}

// Checks the operand requirements the own kernels share (int8_kernels.h), then calls
// launch(T{}, Y{}) with T the float type of epi.type and Y T or, for y_quantized, Q (int8_t, or
// E4m3Out for FP8): the launchers' common front.
template <typename Q, typename F>
cudaError_t DispatchOwnKernel(const Int8MmaGemmParams& p, F&& launch) {
  if (p.depth % 16 != 0 || p.lda % 16 != 0 || p.ldb % 16 != 0 || p.np < p.epi.cols ||
      p.np % 16 != 0 || reinterpret_cast<uintptr_t>(p.a) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.b) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.epi.col_scale) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.epi.rows == 0 || p.epi.cols == 0) return cudaSuccess;
  auto typed = [&](auto t) { return p.y_quantized ? launch(t, Q{}) : launch(t, t); };
  switch (p.epi.type) {
    case BlasType::kF32:
      return typed(float{});
    case BlasType::kF16:
      return typed(__half{});
    case BlasType::kBF16:
      return typed(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// The grid of a bm x bn tiling of Y (blockIdx.x over columns, blockIdx.y over rows), or an error
// where it passes the launch limits.
inline cudaError_t TileGrid(const Int8MmaGemmParams& p, int bm, int bn, dim3* grid) {
  const int64_t grid_m = (p.epi.rows + bm - 1) / bm, grid_n = (p.epi.cols + bn - 1) / bn;
  if (grid_m > kInt8MaxRowBlocks || grid_n > 2147483647) return cudaErrorInvalidConfiguration;
  *grid = dim3(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m));
  return cudaSuccess;
}

// Eight staged accumulators (16-byte aligned) as floats.
__device__ __forceinline__ void LoadAccumulators(const int* src, float (&a)[8]) {
  const int4 a0 = reinterpret_cast<const int4*>(src)[0], a1 = reinterpret_cast<const int4*>(src)[1];
  const int v[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) a[e] = static_cast<float>(v[e]);
}
__device__ __forceinline__ void LoadAccumulators(const float* src, float (&a)[8]) {
  const float4 a0 = reinterpret_cast<const float4*>(src)[0];
  const float4 a1 = reinterpret_cast<const float4*>(src)[1];
  a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w;
  a[4] = a1.x, a[5] = a1.y, a[6] = a1.z, a[7] = a1.w;
}

// FinishTile's loop for a tile inside Y where vectors.whole: no bounds, every load and store 8
// wide, the activation kAct compiled in. The same arithmetic, value for value (the general loop
// below spent about 27 instructions an output on its checks and its activation switch, which
// made the epilogue most of a BERT-base product's time on an H100, session 34). The block's
// threads cover whole rows of 8-column groups, kThreads / (kBn / 8) rows a pass (where kBn / 8
// does not divide kThreads, the threads past the last whole row of groups sit the loop out: 4 of
// 256 for 96 columns, 16 for 192), so each thread's columns are the same in every iteration and
// their scales and bias are loaded once, before the loop: reloaded per row, their global loads
// were the epilogue's longest waits (Nsight Compute, H100, session 35).
template <typename T, typename Y, BlasAct kAct, int kBm, int kBn, int kThreads, typename Acc>
__device__ __forceinline__ void WholeTile(const Int8MmaGemmParams& p, const Acc* tile, int64_t m0,
                                          int64_t n0, int tid) {
  constexpr int kRowGroups = kBn / 8, kRowsPerPass = kThreads / kRowGroups;
  static_assert(kRowsPerPass >= 1, "a pass covers at least one row");
  if (tid >= kRowsPerPass * kRowGroups) return;
  const Int8EpilogueParams& e = p.epi;
  Y* y = static_cast<Y*>(e.y);
  const T* c = static_cast<const T*>(e.c);
  const T* z = static_cast<const T*>(e.z);
  const int c8 = (tid % kRowGroups) * 8;
  float sc[8], add[8];
  LoadRow8(e.col_scale + n0 + c8, sc);
  if (c) LoadRow8(c + n0 + c8, add);
#pragma unroll 2
  for (int r = tid / kRowGroups; r < kBm; r += kRowsPerPass) {
    const int64_t at = (m0 + r) * e.cols + n0 + c8;
    float a[8], v[8];
    LoadAccumulators(tile + r * (kBn + kAccPad) + c8, a);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = a[k] * sc[k];
    if (c) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] += e.beta * add[k];
    }
    if (z) {
      float res[8];
      LoadRow8(z + at, res);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] += res[k];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = ActivateFor<T>(kAct, v[k], e.act_min, e.act_max);
    StoreEight<T, Y>(y + at, v, p.y_inv_scale);
  }
}

// The block's kBm x kBn tile of accumulators, [kBm][kBn + kAccPad] Acc (int32 or FP32) in shared
// memory, at rows m0.. and columns n0.. of Y. T: the float type of C and of the arithmetic's
// rounding; Y: T, or int8_t / E4m3Out for an INT8 / FP8 edge.
template <typename T, typename Y, int kBm, int kBn, int kThreads, typename Acc>
__device__ __forceinline__ void FinishTile(const Int8MmaGemmParams& p, const Acc* tile, int64_t m0,
                                           int64_t n0, int tid, Vectors vectors) {
  if (vectors.whole && m0 + kBm <= p.epi.rows && n0 + kBn <= p.epi.cols) {
    switch (p.epi.act) {
      case BlasAct::kRelu:
        return WholeTile<T, Y, BlasAct::kRelu, kBm, kBn, kThreads>(p, tile, m0, n0, tid);
      case BlasAct::kClip:
        return WholeTile<T, Y, BlasAct::kClip, kBm, kBn, kThreads>(p, tile, m0, n0, tid);
      case BlasAct::kGelu:
        return WholeTile<T, Y, BlasAct::kGelu, kBm, kBn, kThreads>(p, tile, m0, n0, tid);
      case BlasAct::kGeluTanh:
        return WholeTile<T, Y, BlasAct::kGeluTanh, kBm, kBn, kThreads>(p, tile, m0, n0, tid);
      case BlasAct::kNone:
        return WholeTile<T, Y, BlasAct::kNone, kBm, kBn, kThreads>(p, tile, m0, n0, tid);
      default:
        break;  // not WholeTileActivation's: vectors.whole is false
    }
  }
  Y* y = static_cast<Y*>(p.epi.y);
  const T* c = static_cast<const T*>(p.epi.c);
  constexpr int kGroups = kBm * kBn / 8;
#pragma unroll 1
  for (int gi = tid; gi < kGroups; gi += kThreads) {
    const int r = gi / (kBn / 8), c8 = (gi % (kBn / 8)) * 8;
    const int64_t row = m0 + r, col = n0 + c8;
    if (row >= p.epi.rows || col >= p.epi.cols) continue;
    float a[8];
    LoadAccumulators(tile + r * (kBn + kAccPad) + c8, a);
    // col_scale has Np entries (a multiple of 16 >= col + 8), zero in the padding.
    const float4 s0 = *reinterpret_cast<const float4*>(p.epi.col_scale + col);
    const float4 s1 = *reinterpret_cast<const float4*>(p.epi.col_scale + col + 4);
    const float sc[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    const int count = p.epi.cols - col < 8 ? static_cast<int>(p.epi.cols - col) : 8;
    float v[8], add[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float res[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const T* z = static_cast<const T*>(p.epi.z);
    if (vectors.z && count == 8) {
      LoadRow8(z + row * p.epi.cols + col, res);
    } else if (z) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < count) res[e] = Load(z[row * p.epi.cols + col + e]);
      }
    }
    if (vectors.bias && count == 8) {
      LoadRow8(c + col, add);  // a row bias: 8 consecutive values, one or two 16-byte loads
    } else if (c) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < count) add[e] = Load(c[row * p.epi.c_row_stride + (col + e) * p.epi.c_col_stride]);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = a[e] * sc[e];
      if (c) v[e] += p.epi.beta * add[e];
      if (z) v[e] += res[e];
      v[e] = ActivateFor<T>(p.epi.act, v[e], p.epi.act_min, p.epi.act_max);
    }
    Y* dst = y + row * p.epi.cols + col;
    if (vectors.out && count == 8) {
      StoreEight<T, Y>(dst, v, p.y_inv_scale);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < count) dst[e] = Convert<T, Y>(v[e], p.y_inv_scale);
      }
    }
  }
}

}  // namespace kiln::cuda::int8_tile
