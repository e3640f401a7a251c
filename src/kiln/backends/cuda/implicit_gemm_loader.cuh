// The implicit-GEMM view of an NHWC input x (implicit_gemm_conv.h) as one thread of a block loads
// it into a stage of shared memory with cp.async, for kiln's 8-bit tensor-core convolutions
// (int8_mma_gemm.cu's mma.sync kernel, int8_wgmma_gemm.cu's warpgroup kernel). The thread's walk
// over A is ImplicitGemmThreadWalk's (rows decomposed once, the column moved a stage at a time;
// Load is called for the stages in order from the first). A chunk is one contiguous 16-byte run
// of x, or zeros for the padding around the image, a row past the last and the depth's tail.
// Where chunk c of tile row r lands in the stage is the kernel's layout (a padded row, a
// swizzle): offset(r, c), in bytes.
#pragma once

#include <cstdint>

#include "kiln/backends/cuda/implicit_gemm_conv.h"
#include "kiln/backends/cuda/mma_util.cuh"

namespace kiln::cuda {

template <int kRows, int kChunks, int kThreads>
struct ImplicitGemmStageLoader : ImplicitGemmThreadWalk<kRows, kChunks, kThreads> {
  using Walk = ImplicitGemmThreadWalk<kRows, kChunks, kThreads>;

  template <typename Offset>
  __device__ __forceinline__ void Load(uint8_t* dst, const int8_t* x, const ImplicitGemmConv& g,
                                       int tid, Offset offset) {
    const int c = tid % kChunks;
#pragma unroll
    for (int it = 0; it < Walk::kPer; ++it) {
      const int64_t off = this->Offset(g, it);
      CpAsync16(dst + offset(Walk::RowInTile(tid, it), c), off >= 0 ? x + off : x, off >= 0);
    }
    this->Next(g);
  }
};

}  // namespace kiln::cuda
