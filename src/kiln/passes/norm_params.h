// Helpers the normalization fusions share (layernorm_fusion.cc, rms_norm_fusion.cc): the axes a
// ReduceMean reduces, and a constant turned into a per-element parameter of the normalized shape.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

// The reduced axes of a keepdims ReduceMean (input 1 since opset 18, attribute before),
// normalised against `rank` and sorted; nullopt for all axes, keepdims 0 or non-constant axes.
std::optional<std::vector<int64_t>> ReduceAxes(const Node& n, int64_t rank);

// The first axis when `axes` are exactly the trailing axes [axis, rank); nullopt otherwise.
std::optional<int64_t> TrailingAxis(const std::vector<int64_t>& axes, int64_t rank);

// A per-element parameter of the normalized shape: the constant reshaped (or a splat expanded)
// to `norm_dims`, in `dtype`; ones when `v` is null. nullopt when the constant varies along a
// non-normalized axis or has another element count.
std::optional<Tensor> NormParam(const Value* v, const std::vector<int64_t>& norm_dims,
                                DataType dtype);
// The same as a new constant of `graph`, recorded for refit (a literal of ones when `v` is null);
// nullptr when it does not fit.
Value* AddNormParam(Graph& graph, const std::string& prefix, Value* v,
                    const std::vector<int64_t>& norm_dims, DataType dtype);

}  // namespace kiln::passes
