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
// zero-filled, so no shape needs padding beyond cublaslt_int8.cc's. The same kernel runs an INT8
// NHWC convolution as an implicit GEMM (LaunchInt8MmaConv): only A's loader differs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kiln/backends/cuda/implicit_gemm_conv.h"
#include "kiln/backends/cuda/implicit_gemm_loader.cuh"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/cuda/int8_tile_epilogue.cuh"
#include "kiln/backends/cuda/mma_util.cuh"
#include "kiln/backends/cuda/smem_opt_in.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBk = 64;              // bytes of K per stage
constexpr int kRowBytes = kBk + 16;  // a shared row, padded
using int8_tile::kAccPad;

__device__ __forceinline__ void MmaS8(int* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Where chunk c of tile row r goes in a stage: the padded rows.
struct PaddedChunk {
  __device__ __forceinline__ int operator()(int r, int c) const { return r * kRowBytes + c * 16; }
};

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
    CpAsync16(dst + PaddedChunk{}(r, c), valid ? src + gr * ld + gk : src, valid);
  }
}

// T: the float type of C and of the arithmetic's rounding; Y: T, or int8_t for an INT8 edge.
// kConv: A is the implicit-GEMM view `conv` of the NHWC input p.a (LaunchInt8MmaConv).
template <typename T, typename Y, int kBm, int kBn, int kWm, int kWn, int kStages, bool kConv>
__global__ void __launch_bounds__(kWm* kWn * 32)
    Int8MmaGemmKernel(Int8MmaGemmParams p, int8_tile::Vectors vectors, ImplicitGemmConv conv) {
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

  // kConv: the stages are loaded in order, kt = 0, 1, ...
  ImplicitGemmStageLoader<kBm, kBk / 16, kThreads> conv_a;
  if constexpr (kConv) conv_a.Init(conv, m0, tid);
  auto load = [&](int kt, int slot) {
    if constexpr (kConv) {
      conv_a.Load(sa + slot * kBm * kRowBytes, p.a, conv, tid, PaddedChunk{});
    } else {
      LoadStage<kBm, kThreads>(sa + slot * kBm * kRowBytes, p.a, p.lda, m0, p.epi.rows,
                               static_cast<int64_t>(kt) * kBk, p.depth, tid);
    }
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

  // The accumulators go through shared memory ([kBm][kBn + kAccPad] int32) to the shared
  // epilogue (int8_tile_epilogue.cuh).
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
  int8_tile::FinishTile<T, Y, kBm, kBn, kThreads>(p, tile, m0, n0, tid, vectors);
}

struct TileConfig {
  const char* name;
  int rows;  // kBm of LaunchTiled's case
};
// Index = Int8MmaGemmParams::tile.
constexpr TileConfig kTiles[] = {
    {"128x128", 128}, {"128x256", 128}, {"64x128", 64}, {"128x64", 128}, {"128x128w8", 128}};

template <typename T, typename Y, int kBm, int kBn, int kWm, int kWn, int kStages, bool kConv>
cudaError_t LaunchTile(const Int8MmaGemmParams& p, cudaStream_t stream,
                       const ImplicitGemmConv& conv) {
  constexpr int kStageBytes = kStages * (kBm + kBn) * kRowBytes;
  constexpr int kAccBytes = kBm * (kBn + kAccPad) * 4;
  constexpr int kSmem = kStageBytes > kAccBytes ? kStageBytes : kAccBytes;
  auto* kernel = Int8MmaGemmKernel<T, Y, kBm, kBn, kWm, kWn, kStages, kConv>;
  static SharedMemoryOptIn opt_in;
  if (cudaError_t e = opt_in.For(kernel, kSmem); e != cudaSuccess) return e;
  dim3 grid;
  if (cudaError_t e = int8_tile::TileGrid(p, kBm, kBn, &grid); e != cudaSuccess) return e;
  kernel<<<grid, kWm * kWn * 32, kSmem, stream>>>(p, int8_tile::VectorsFor<Y>(p), conv);
  return cudaGetLastError();
}

template <typename T, typename Y, bool kConv = false>
cudaError_t LaunchTiled(const Int8MmaGemmParams& p, cudaStream_t stream,
                        const ImplicitGemmConv& conv = {}) {
  switch (p.tile) {
    case 0:
      return LaunchTile<T, Y, kTiles[0].rows, 128, 2, 2, 4, kConv>(p, stream, conv);
    case 1:
      return LaunchTile<T, Y, kTiles[1].rows, 256, 2, 4, 3, kConv>(p, stream, conv);
    case 2:
      return LaunchTile<T, Y, kTiles[2].rows, 128, 2, 2, 4, kConv>(p, stream, conv);
    case 3:
      return LaunchTile<T, Y, kTiles[3].rows, 64, 2, 2, 4, kConv>(p, stream, conv);
    case 4:  // eight warps of 64 x 32: more warps to hide the latencies, fewer registers each
      return LaunchTile<T, Y, kTiles[4].rows, 128, 2, 4, 4, kConv>(p, stream, conv);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

int Int8MmaTileCount() { return static_cast<int>(sizeof(kTiles) / sizeof(kTiles[0])); }

const char* Int8MmaTileName(int tile) {
  return tile >= 0 && tile < Int8MmaTileCount() ? kTiles[tile].name : "?";
}

int Int8MmaTileRows(int tile) {
  return tile >= 0 && tile < Int8MmaTileCount() ? kTiles[tile].rows : 0;
}

cudaError_t LaunchInt8MmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream) {
  return int8_tile::DispatchOwnKernel<int8_t>(
      p, [&](auto t, auto y) { return LaunchTiled<decltype(t), decltype(y)>(p, stream); });
}

cudaError_t LaunchInt8MmaConv(const Int8MmaGemmParams& p, const ImplicitGemmConv& conv,
                              cudaStream_t stream) {
  if (!ImplicitGemmLaunchable(conv, p.epi.rows, p.depth)) return cudaErrorInvalidValue;
  return int8_tile::DispatchOwnKernel<int8_t>(p, [&](auto t, auto y) {
    return LaunchTiled<decltype(t), decltype(y), true>(p, stream, conv);
  });
}

}  // namespace kiln::cuda
