// Reference evaluation as an interface: a NodeEvaluator runs one node on host tensors, and the
// graph walker below runs a whole graph with one. The layers that need reference values
// (passes' constant folding, precision's calibration and INT8 sensitivity) take a NodeEvaluator
// and never name a backend; backends/cpu implements it (cpu_eval.h) and registers it as the
// reference (backends/reference.h), and the builder hands it in.
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"

namespace kiln {

// Evaluates one node on host tensors (nullptr for omitted optional inputs); returns its outputs
// in order.
using NodeEvaluator =
    std::function<StatusOr<std::vector<Tensor>>(const Node&, std::span<const Tensor* const>)>;

// Runs every node of `graph` in topological order with `evaluate`, starting from `feed` (graph
// inputs by name; KILN-E5000 names a graph input without a value), and returns every value it
// holds afterwards by name: the feed, then each node's outputs. A node's error is returned as the
// evaluator gave it.
StatusOr<std::map<std::string, Tensor>> EvaluateAllValues(const Graph& graph,
                                                          const std::map<std::string, Tensor>& feed,
                                                          const NodeEvaluator& evaluate);

// The same, returning the graph outputs only (constant outputs included), by name.
StatusOr<std::map<std::string, Tensor>> EvaluateGraphOutputs(
    const Graph& graph, const std::map<std::string, Tensor>& inputs, const NodeEvaluator& evaluate);

}  // namespace kiln
