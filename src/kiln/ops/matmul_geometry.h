// The geometry of one MatMul (ONNX MatMul, and kiln's FusedMatMul with its transposes) for given
// operand dims: numpy broadcasting of the batch dims, 1-D operands promoted and never transposed.
// Every backend's MatMul kernel plans its GEMM calls from this.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/core/status.h"

namespace kiln {

struct MatMulGeometry {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;      // transposes that apply (not to a 1-D operand)
  std::vector<int64_t> batch_dims;  // the output's broadcast batch dims
  int64_t batch = 1;                // their product
  // B has no batch dims and A is not transposed: A's batch dims are the output's, and A is one
  // [batch * m, k] matrix (one large GEMM; the BERT case).
  bool fold = false;
  // Per batch index (row-major over batch_dims), where that batch's A and B matrices start, in
  // elements; filled only when asked for and the batch is not folded.
  std::vector<int64_t> a_offsets, b_offsets;
};

// KILN-E2008 (kShapeMismatch) for a scalar operand, inner dims that differ, or batch dims that do
// not broadcast.
StatusOr<MatMulGeometry> ResolveMatMulGeometry(bool trans_a, bool trans_b,
                                               std::span<const int64_t> a_dims,
                                               std::span<const int64_t> b_dims, bool offsets);

}  // namespace kiln
