// Device helpers shared by kiln's attention kernels (attention.cu: the SIMT and wmma kernels;
// attention_mma.cu: the mma.sync flash kernel).
#pragma once

#include <cstdint>

#include "kiln/backends/cuda/blas_kernels.h"

namespace kiln::cuda {

// Operand offsets of output batch b (numpy broadcasting over the batch dims).
__device__ __forceinline__ void AttentionBatchOffsets(const AttentionParams& p, int64_t b,
                                                      int64_t& qo, int64_t& ko, int64_t& vo,
                                                      int64_t& mo, int64_t& yo) {
  qo = ko = vo = mo = yo = 0;
  int64_t rem = b;
  for (int i = p.batch_rank - 1; i >= 0; --i) {
    const int64_t c = rem % p.out_batch_dims[i];
    rem /= p.out_batch_dims[i];
    qo += c * p.q_stride[i];
    ko += c * p.k_stride[i];
    vo += c * p.v_stride[i];
    mo += c * p.m_stride[i];
    yo += c * p.y_stride[i];
  }
}

}  // namespace kiln::cuda
