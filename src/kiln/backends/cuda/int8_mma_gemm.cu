// kiln's own INT8 matrix product on tensor cores (mma.sync.m16n8k32, int8 x int8 -> int32), with
// the INT8 epilogue fused: y = act(float(acc) * col_scale[n] + beta * C) stored once in the
// layer's float type, or, on an INT8 edge (ops/quant_edge.h), quantized to int8 for the consumer.
// cuBLASLt's IMMA kernels write int32 results (4 bytes per output) that a second pass reads back
// (int8_gemm.cu's epilogue); here the accumulators never leave the registers. The operands are
// cublaslt_int8.cc's: A quantized [M, Kp], B packed [Np, Kp], each row's K bytes contiguous (Kp a
// multiple of 16).
//
// A block computes a kBm x kBn tile of Y with kWm x kWn warps (each a kBm/kWm x kBn/kWn tile, as
// 16 x 8 mma tiles); K advances 64 bytes per stage, kStages stages in flight (cp.async). Shared
// rows are padded to 80 bytes, so the 8 rows an ldmatrix reads fall in distinct banks. The
// epilogue stages the tile's accumulators through shared memory (see there). Both
// operands are "K contiguous", so the m16n8k32 fragments of A (row) and B (col) come straight
// from ldmatrix as for 16-bit data (four int8 per 32-bit lane). Tiles past M, Np or Kp are
// zero-filled, so no shape needs padding beyond cublaslt_int8.cc's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/cuda/mma_util.cuh"
#include "kiln/backends/cuda/smem_opt_in.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBk = 64;              // bytes of K per stage
constexpr int kRowBytes = kBk + 16;  // a shared row, padded
constexpr int kAccPad = 8;           // int32s of padding per row of the staged accumulators

__device__ __forceinline__ void MmaS8(int* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rows [row0, row0 + kRows) x bytes [k0, k0 + kBk) of a [rows, ld] int8 operand into one stage.
template <int kRows, int kThreads>
__device__ __forceinline__ void LoadStage(uint8_t* dst, const int8_t* src, int64_t ld, int64_t row0,
                                          int64_t rows, int64_t k0, int64_t depth, int tid) {
  constexpr int kChunks = kRows * (kBk / 16);
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i >> 2, c = i & 3;
    const int64_t gr = row0 + r, gk = k0 + c * 16;
    const bool valid = gr < rows && gk < depth;
    CpAsync16(dst + r * kRowBytes + c * 16, valid ? src + gr * ld + gk : src, valid);
  }
}

// One output: the storage type's rounding, or the INT8 contract with inv_scale for an int8 Y.
template <typename Y>
__device__ __forceinline__ Y Convert(float v, float inv_scale) {
  if constexpr (std::is_same_v<Y, int8_t>) {
    return QuantizeInt8Device(v, inv_scale);
  } else {
    return Store<Y>(v);
  }
}

template <typename Y>
__device__ __forceinline__ uint32_t Bits16(float v) {
  const Y h = Store<Y>(v);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// Eight outputs to dst (8 * sizeof(Y)-byte aligned) in one or two 16-byte stores (8 bytes for
// int8), packed in registers.
template <typename Y>
__device__ __forceinline__ void StoreEight(Y* dst, const float (&v)[8], float inv_scale) {
  if constexpr (sizeof(Y) == 1) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      w[e / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(Convert<Y>(v[e], inv_scale)))
                  << (8 * (e % 4));
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

// T: the float type of C and of the arithmetic's rounding; Y: T, or int8_t for an INT8 edge.
template <typename T, typename Y, int kBm, int kBn, int kWm, int kWn, int kStages>
__global__ void __launch_bounds__(kWm* kWn * 32)
    Int8MmaGemmKernel(Int8MmaGemmParams p, bool vec, bool bias_vec) {
  constexpr int kThreads = kWm * kWn * 32;
  constexpr int kTm = kBm / kWm, kTn = kBn / kWn;  // a warp's tile
  constexpr int kMi = kTm / 16, kNj = kTn / 8;
  static_assert(kTm % 16 == 0 && kTn % 16 == 0, "warp tiles are whole pairs of mma tiles");
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sa = smem;
  uint8_t* sb = smem + kStages * kBm * kRowBytes;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / kWn, wn = warp % kWn;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBm;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBn;
  const int ktiles = static_cast<int>((p.depth + kBk - 1) / kBk);

  int acc[kMi][kNj][4];
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int j = 0; j < kNj; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
  }

  auto load = [&](int kt, int slot) {
    LoadStage<kBm, kThreads>(sa + slot * kBm * kRowBytes, p.a, p.lda, m0, p.epi.rows,
                             static_cast<int64_t>(kt) * kBk, p.depth, tid);
    LoadStage<kBn, kThreads>(sb + slot * kBn * kRowBytes, p.b, p.ldb, n0, p.np,
                             static_cast<int64_t>(kt) * kBk, p.depth, tid);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load(s, s);
    CpAsyncCommit();
  }
  // Per lane, the shared offsets its ldmatrix rows start at (A: rows 0-15 x the two 16-byte
  // halves of a k32 step; B: two n8 tiles x the two halves).
  const int a_off = (wm * kTm + (lane & 15)) * kRowBytes + (lane >> 4) * 16;
  const int b_off =
      (wn * kTn + ((lane >> 4) & 1) * 8 + (lane & 7)) * kRowBytes + ((lane >> 3) & 1) * 16;
  for (int kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage kt is in; every warp is done with the slot loaded next
    const int next = kt + kStages - 1;
    if (next < ktiles) load(next, next % kStages);
    CpAsyncCommit();
    const uint8_t* ta = sa + (kt % kStages) * kBm * kRowBytes + a_off;
    const uint8_t* tb = sb + (kt % kStages) * kBn * kRowBytes + b_off;
#pragma unroll
    for (int ks = 0; ks < kBk / 32; ++ks) {
      uint32_t af[kMi][4], bf[kNj][2];
#pragma unroll
      for (int i = 0; i < kMi; ++i) LdMatrixX4(af[i], ta + i * 16 * kRowBytes + ks * 32);
#pragma unroll
      for (int j = 0; j < kNj; j += 2) {
        uint32_t r[4];
        LdMatrixX4(r, tb + j * 8 * kRowBytes + ks * 32);
        bf[j][0] = r[0];
        bf[j][1] = r[1];
        bf[j + 1][0] = r[2];
        bf[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kMi; ++i) {
#pragma unroll
        for (int j = 0; j < kNj; ++j) MmaS8(acc[i][j], af[i], bf[j]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the stages: the accumulators take their place

  // The accumulators go through shared memory ([kBm][kBn + kAccPad] int32), then each thread
  // finishes 8 consecutive outputs of a row at a time in a loop: the epilogue's code (the
  // activation above all) stays one loop body instead of one copy per register, which made the
  // kernel instruction-fetch bound, and the stores are 8-wide and coalesced.
  int* tile = reinterpret_cast<int*>(smem);
  {
    // Lane (g, t) holds rows g and g + 8 of each 16 x 8 mma tile, columns 2t and 2t + 1.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm * kTm + i * 16 + g + h * 8, col = wn * kTn + j * 8 + 2 * t;
          *reinterpret_cast<int2*>(tile + r * (kBn + kAccPad) + col) =
              make_int2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
  }
  __syncthreads();
  Y* y = static_cast<Y*>(p.epi.y);
  const T* c = static_cast<const T*>(p.epi.c);
  constexpr int kGroups = kBm * kBn / 8;
#pragma unroll 1
  for (int gi = tid; gi < kGroups; gi += kThreads) {
    const int r = gi / (kBn / 8), c8 = (gi % (kBn / 8)) * 8;
    const int64_t row = m0 + r, col = n0 + c8;
    if (row >= p.epi.rows || col >= p.epi.cols) continue;
    const int4* src = reinterpret_cast<const int4*>(tile + r * (kBn + kAccPad) + c8);
    const int4 a0 = src[0], a1 = src[1];
    const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    // col_scale has Np entries (a multiple of 16 >= col + 8), zero in the padding.
    const float4 s0 = *reinterpret_cast<const float4*>(p.epi.col_scale + col);
    const float4 s1 = *reinterpret_cast<const float4*>(p.epi.col_scale + col + 4);
    const float sc[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    const int count = p.epi.cols - col < 8 ? static_cast<int>(p.epi.cols - col) : 8;
    float v[8], add[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (bias_vec && count == 8) {
      LoadRow8(c + col, add);  // a row bias: 8 consecutive values, one or two 16-byte loads
    } else if (c) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < count) add[e] = Load(c[row * p.epi.c_row_stride + (col + e) * p.epi.c_col_stride]);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = static_cast<float>(a[e]) * sc[e];
      if (c) v[e] += p.epi.beta * add[e];
      v[e] = ActivateFor<T>(p.epi.act, v[e], p.epi.act_min, p.epi.act_max);
    }
    Y* dst = y + row * p.epi.cols + col;
    if (vec && count == 8) {
      StoreEight(dst, v, p.y_inv_scale);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < count) dst[e] = Convert<Y>(v[e], p.y_inv_scale);
      }
    }
  }
}

struct TileConfig {
  const char* name;
};
// Index = Int8MmaGemmParams::tile.
constexpr TileConfig kTiles[] = {{"128x128"}, {"128x256"}, {"64x128"}, {"128x64"}, {"128x128w8"}};

template <typename T, typename Y, int kBm, int kBn, int kWm, int kWn, int kStages>
cudaError_t LaunchTile(const Int8MmaGemmParams& p, cudaStream_t stream) {
  constexpr int kStageBytes = kStages * (kBm + kBn) * kRowBytes;
  constexpr int kAccBytes = kBm * (kBn + kAccPad) * 4;
  constexpr int kSmem = kStageBytes > kAccBytes ? kStageBytes : kAccBytes;
  auto* kernel = Int8MmaGemmKernel<T, Y, kBm, kBn, kWm, kWn, kStages>;
  static const cudaError_t opt_in = OptInSharedMemory(kernel, kSmem);
  if (opt_in != cudaSuccess) return opt_in;
  const int64_t grid_m = (p.epi.rows + kBm - 1) / kBm, grid_n = (p.epi.cols + kBn - 1) / kBn;
  if (grid_m > 65535 || grid_n > 2147483647) return cudaErrorInvalidConfiguration;
  // 8 outputs per store where every row starts 8-aligned.
  const bool vec =
      p.epi.cols % 8 == 0 && reinterpret_cast<uintptr_t>(p.epi.y) % (8 * sizeof(Y)) == 0;
  // C a row bias (the same N values for every row) whose groups of 8 are 16-byte aligned.
  const bool bias_vec = p.epi.c != nullptr && p.epi.c_row_stride == 0 && p.epi.c_col_stride == 1 &&
                        p.epi.cols % 8 == 0 && reinterpret_cast<uintptr_t>(p.epi.c) % 16 == 0;
  kernel<<<dim3(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m)), kWm * kWn * 32,
           kSmem, stream>>>(p, vec, bias_vec);
  return cudaGetLastError();
}

template <typename T, typename Y>
cudaError_t LaunchTiled(const Int8MmaGemmParams& p, cudaStream_t stream) {
  switch (p.tile) {
    case 0:
      return LaunchTile<T, Y, 128, 128, 2, 2, 4>(p, stream);
    case 1:
      return LaunchTile<T, Y, 128, 256, 2, 4, 3>(p, stream);
    case 2:
      return LaunchTile<T, Y, 64, 128, 2, 2, 4>(p, stream);
    case 3:
      return LaunchTile<T, Y, 128, 64, 2, 2, 4>(p, stream);
    case 4:  // eight warps of 64 x 32: more warps to hide the latencies, fewer registers each
      return LaunchTile<T, Y, 128, 128, 2, 4, 4>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t LaunchTyped(const Int8MmaGemmParams& p, cudaStream_t stream) {
  return p.y_int8 ? LaunchTiled<T, int8_t>(p, stream) : LaunchTiled<T, T>(p, stream);
}

}  // namespace

int Int8MmaTileCount() { return static_cast<int>(sizeof(kTiles) / sizeof(kTiles[0])); }

const char* Int8MmaTileName(int tile) {
  return tile >= 0 && tile < Int8MmaTileCount() ? kTiles[tile].name : "?";
}

cudaError_t LaunchInt8MmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream) {
  if (p.depth % 16 != 0 || p.lda % 16 != 0 || p.ldb % 16 != 0 || p.np < p.epi.cols ||
      p.np % 16 != 0 || reinterpret_cast<uintptr_t>(p.a) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.b) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.epi.col_scale) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.epi.rows == 0 || p.epi.cols == 0) return cudaSuccess;
  switch (p.epi.type) {
    case BlasType::kF32:
      return LaunchTyped<float>(p, stream);
    case BlasType::kF16:
      return LaunchTyped<__half>(p, stream);
    case BlasType::kBF16:
      return LaunchTyped<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda
