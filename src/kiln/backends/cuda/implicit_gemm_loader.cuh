// The implicit-GEMM view of an NHWC input x (implicit_gemm_conv.h) as one thread of a block loads
// it into a stage of shared memory with cp.async, for kiln's 8-bit tensor-core convolutions
// (int8_mma_gemm.cu's mma.sync kernel, int8_wgmma_gemm.cu's warpgroup kernel).
//
// A stage is kRows rows of A by kChunks 16-byte chunks (kChunks * 16 bytes of depth). Thread tid
// of kThreads copies chunk tid % kChunks of rows (tid + it * kThreads) / kChunks, so its rows stay
// fixed (decomposed once, Init) and its column moves one stage at a time (Load, called for the
// stages in order from the first): no division per chunk. A chunk is one contiguous 16-byte run of
// x, or zeros for the padding around the image, a row past the last and the depth's tail. Where
// chunk c of tile row r lands in the stage is the kernel's layout (a padded row, a swizzle):
// offset(r, c), in bytes.
#pragma once

#include <cstdint>

#include "kiln/backends/cuda/implicit_gemm_conv.h"
#include "kiln/backends/cuda/mma_util.cuh"

namespace kiln::cuda {

template <int kRows, int kChunks, int kThreads>
struct ImplicitGemmStageLoader {
  static_assert(kThreads % kChunks == 0, "a thread's chunk is the same one in each of its rows");
  static constexpr int kPer = kRows * kChunks / kThreads;
  static_assert(kPer * kThreads == kRows * kChunks, "every thread copies the same chunks");
  ImplicitGemmRow rows[kPer];
  ImplicitGemmColumn col;

  __device__ __forceinline__ void Init(const ImplicitGemmConv& g, int64_t row0, int tid) {
    const int64_t last = g.rows();
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int64_t m = row0 + (tid + it * kThreads) / kChunks;
      rows[it] = m < last ? RowOf(g, m) : NoRow();
    }
    col = ColumnOf(g, (tid % kChunks) * 16);
  }

  template <typename Offset>
  __device__ __forceinline__ void Load(uint8_t* dst, const int8_t* x, const ImplicitGemmConv& g,
                                       int tid, Offset offset) {
    const int c = tid % kChunks;
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int r = (tid + it * kThreads) / kChunks;
      const int64_t off = OffsetAt(g, rows[it], col);
      CpAsync16(dst + offset(r, c), off >= 0 ? x + off : x, off >= 0);
    }
    Advance(g, col, kChunks * 16);
  }
};

}  // namespace kiln::cuda
