// The host-side half of the CUDA INT8 matrix product (cublaslt_int8.cc), without any CUDA call:
// the geometry of a request (rows, depth, A's strides, how C enters), and B quantized and packed
// into the padded layout cuBLASLt's IMMA kernels take. Separate so that a test can replay the
// whole product on the host where there is no GPU.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/core/status.h"
#include "kiln/ir/tensor.h"

namespace kiln::cuda {

// K and N are padded to this (IMMA needs multiples of 4; 16 keeps every column 16-byte aligned).
inline constexpr int64_t kInt8Pad = 16;
inline int64_t Int8Padded(int64_t n) { return (n + kInt8Pad - 1) / kInt8Pad * kInt8Pad; }

// M and K of A for these dims: Gemm's A is 2-D; MatMul's leading dims fold into M (a 1-D A is
// one row). A transposed A must be 2-D. The CPU INT8 kernel's rule.
StatusOr<std::pair<int64_t, int64_t>> Int8RowsAndDepth(const GemmSpec& s,
                                                       std::span<const int64_t> a);

// How C (Gemm, times beta) or the bias (FusedMatMul, unscaled) enters the epilogue: element
// (i, j) at i * row_stride + j * col_stride (0 broadcasts). The CPU kernel's broadcasting rules;
// Gemm ignores C when beta is 0.
struct Int8Addend {
  bool present = false;
  float factor = 1.f;
  int64_t row_stride = 0, col_stride = 0;
};
StatusOr<Int8Addend> ResolveInt8Addend(const GemmSpec& s, const std::vector<int64_t>* c_dims,
                                       int64_t m, int64_t n);

// A's element (i, k) sits at i * row_stride + k * col_stride.
struct Int8AStrides {
  int64_t row_stride = 0, col_stride = 1;
};
inline Int8AStrides Int8AStridesFor(const GemmSpec& s, int64_t m, int64_t k) {
  return s.trans_a ? Int8AStrides{1, m} : Int8AStrides{k, 1};
}

// B [K, N] (or [N, K] when transposed, any float type) quantized per output column with the
// INT8 contract and packed as [Np, Kp] int8 (each column's K weights contiguous, zero padded):
// cuBLASLt's A, column-major [Kp, Np], transposed. col_scale[n] = alpha * a_scale * b_scale[n]
// (0 in the padding), computed as the CPU kernel computes its output scales.
struct Int8PackedB {
  int64_t k = 0, n = 0, kp = 0, np = 0;
  std::vector<int8_t> packed;
  std::vector<float> col_scale;
};
Int8PackedB PackInt8B(const GemmSpec& s, const Tensor& b, float amax);

}  // namespace kiln::cuda
