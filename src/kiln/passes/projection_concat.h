// Merging projections of one input into one wider GEMM, shared by the fusions that do it
// (qkv_fusion.cc: Q, K and V; gated_activation_fusion.cc: a gated MLP's gate and up).
#pragma once

#include <span>

#include "kiln/ir/graph.h"

namespace kiln::passes {

// The projection writing `v` when it is a FusedMatMul (or a bias-less MatMul, which gemm_fusion
// leaves alone: Llama's projections) of a non-constant A with a constant 2-D f32 weight (and a
// 1-D f32 bias, if any), no activation, no transA, read only by `reader`.
const Node* ConstantProjection(const Value* v, const Node* reader);

// One FusedMatMul of the projections' common input with their weights (and biases) concatenated
// along N, in order: its output holds their outputs side by side in each row. When some have a
// bias, those without one get zeros. Null when they do not share the input, transB, alpha and
// the weight shape (nothing is changed then). The old projections stay for dead-node elimination.
Value* ConcatProjections(Graph& graph, std::span<const Node* const> p, const std::string& suffix);

}  // namespace kiln::passes
