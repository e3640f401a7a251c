// The one graph walker over a NodeEvaluator: inputs, then each node in topological order.
#include "kiln/ir/evaluator.h"

#include <unordered_map>

namespace kiln {

StatusOr<std::map<std::string, Tensor>> EvaluateAllValues(const Graph& graph,
                                                          const std::map<std::string, Tensor>& feed,
                                                          const NodeEvaluator& evaluate) {
  if (!evaluate) return MakeError(ErrorCode::kInternal, "no node evaluator was given");
  std::map<std::string, Tensor> values = feed;
  std::unordered_map<const Value*, const Tensor*> known;
  for (const Value* in : graph.inputs()) {
    auto it = values.find(in->name());
    if (it == values.end()) {
      return MakeError(ErrorCode::kInputCountMismatch, "no value given for graph input '{}'",
                       in->name());
    }
    known[in] = &it->second;
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  std::vector<const Tensor*> ins;
  for (const Node* node : order) {
    ins.clear();
    for (const Value* v : node->inputs()) {
      if (!v) {
        ins.push_back(nullptr);
      } else if (v->constant()) {
        ins.push_back(v->constant());
      } else if (auto it = known.find(v); it != known.end()) {
        ins.push_back(it->second);
      } else {
        return MakeError(ErrorCode::kUndefinedValue, "value '{}' read by '{}' was never computed",
                         v->name(), node->name());
      }
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, evaluate(*node, ins));
    for (size_t i = 0; i < outs.size() && i < node->num_outputs(); ++i) {
      const Value* v = node->output(i);
      if (!v) continue;
      auto [it, inserted] = values.insert_or_assign(v->name(), std::move(outs[i]));
      known[v] = &it->second;
    }
  }
  return values;
}

StatusOr<std::map<std::string, Tensor>> EvaluateGraphOutputs(
    const Graph& graph, const std::map<std::string, Tensor>& inputs,
    const NodeEvaluator& evaluate) {
  KILN_ASSIGN_OR_RETURN(auto values, EvaluateAllValues(graph, inputs, evaluate));
  std::map<std::string, Tensor> result;
  for (const Value* out : graph.outputs()) {
    if (out->constant()) {
      result[out->name()] = *out->constant();
    } else if (auto it = values.find(out->name()); it != values.end()) {
      result[out->name()] = std::move(it->second);
    } else {
      return MakeError(ErrorCode::kUndefinedValue, "graph output '{}' was never computed",
                       out->name());
    }
  }
  return result;
}

}  // namespace kiln
