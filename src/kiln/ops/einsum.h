// Einsum's equation, parsed once for the shape rule (ops/einsum.cc) and the kernels: each
// operand's labels (letters, and the ellipsis's broadcast axes), the output's, and the labels
// summed over. Explicit ("ij,jk->ik") and implicit ("ij,jk": the labels seen once, sorted, after
// the ellipsis) forms, repeated labels in one operand (diagonals: "ii->i") and "..." anywhere.
// Then the iteration plan for bound shapes, the one every backend's kernel walks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/tensor.h"

namespace kiln {

struct EinsumEquation {
  // Axes of the iteration space: 0..ellipsis_rank-1 are the ellipsis's axes (right-aligned
  // broadcast of every operand's), then one per distinct letter in first-seen order.
  int64_t ellipsis_rank = 0;
  std::vector<char> letters;  // letter of axis ellipsis_rank + k
  // Per operand, the axis of each of its dimensions, in order (an ellipsis operand of fewer
  // ellipsis dims than ellipsis_rank maps to the last ones).
  std::vector<std::vector<int64_t>> operand_axes;
  std::vector<int64_t> output_axes;  // the output's dimensions, in order
  int64_t num_axes() const { return ellipsis_rank + static_cast<int64_t>(letters.size()); }
};

// Parses `equation` for operands of the given ranks; KILN-E2008-style errors (kInvalidAttribute)
// name what is wrong.
StatusOr<EinsumEquation> ParseEinsum(const std::string& equation,
                                     const std::vector<int64_t>& operand_ranks);

// An equation over bound operand shapes: each output element sums, over the summed axes, the
// product of the operands' elements, each operand read through one element stride per axis (a
// label repeated in one operand adds its strides: the diagonal; an ellipsis dimension of extent 1
// that broadcasts has stride 0).
struct EinsumPlan {
  std::vector<int64_t> extent;               // per axis
  std::vector<std::vector<int64_t>> stride;  // per operand, per axis
  std::vector<int64_t> out_axes, red_axes;   // output axes in order; summed axes, ascending
  int64_t out_size = 1, red_size = 1;
};

// The plan for the operands' bound shapes (their dims; the data is not read). KILN-E2015
// (kTensorTooLarge) when output elements x summed combinations exceed int64.
StatusOr<EinsumPlan> PlanEinsum(const EinsumEquation& e, std::span<const TensorView> operands);

}  // namespace kiln
