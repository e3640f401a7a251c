// Reference evaluation on the CPU backend, one node or a whole graph at a time, with host
// tensors. Used by constant folding, by pass tests (outputs before vs after a pass) and as the
// reference other backends are compared with. Not the fast path: the runtime is.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/evaluator.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"

namespace kiln::cpu {

// Runs one node on the given inputs (nullptr for omitted optional inputs) with the CPU backend's
// heuristic tactic. Output shapes come from the op's shape rule. This is the reference
// NodeEvaluator (ir/evaluator.h), registered as backends/reference.h's ReferenceEvaluator().
StatusOr<std::vector<Tensor>> EvaluateNode(const Node& node, std::span<const Tensor* const> inputs);

// Runs a whole graph; `inputs` by graph-input name. Returns graph outputs by name
// (EvaluateGraphOutputs with EvaluateNode).
StatusOr<std::map<std::string, Tensor>> EvaluateGraph(const Graph& graph,
                                                      const std::map<std::string, Tensor>& inputs);

}  // namespace kiln::cpu
