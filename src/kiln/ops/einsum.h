// Einsum's equation, parsed once for the shape rule (ops/einsum.cc) and the kernels: each
// operand's labels (letters, and the ellipsis's broadcast axes), the output's, and the labels
// summed over. Explicit ("ij,jk->ik") and implicit ("ij,jk": the labels seen once, sorted, after
// the ellipsis) forms, repeated labels in one operand (diagonals: "ii->i") and "..." anywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/status.h"

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

}  // namespace kiln
