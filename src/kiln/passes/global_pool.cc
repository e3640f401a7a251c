// Spatial mean as a global pool: ReduceMean over every spatial axis (2 .. rank-1) of a float
// tensor of rank >= 4, with keepdims, is GlobalAveragePool by definition; the dynamo exporter
// writes squeeze-excite blocks and classifier heads this way. As GlobalAveragePool the layout
// pass can keep the pool channels-last (the op has the kChannelsLast trait) instead of putting a
// transpose pair around a reduction. Rank 3 is left alone: there the last axis is also a
// transformer's hidden axis, which the normalisation fusions look for as ReduceMean.
#include <algorithm>
#include <vector>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

bool IsSpatialMean(const Node& n) {
  if (!IsOp(n, OpType::kReduceMean) || n.num_outputs() != 1) return false;
  const Value* x = n.input(0);
  const Value* axes = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (!x || !x->has_shape() || !IsFloat(x->dtype()) || attrs::ReduceMean::keepdims(n) != 1) {
    return false;
  }
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank < 4 || !axes || !axes->is_constant()) return false;
  const Tensor& t = *axes->constant();
  if (t.num_elements() != rank - 2) return false;
  std::vector<int64_t> got;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const int64_t a = t.GetInt(i);
    got.push_back(a < 0 ? a + rank : a);
  }
  std::sort(got.begin(), got.end());
  for (int64_t i = 0; i < rank - 2; ++i) {
    if (got[static_cast<size_t>(i)] != i + 2) return false;
  }
  return true;
}

class GlobalPoolPass final : public Pass {
 public:
  std::string_view name() const override { return "global_pool"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    std::vector<Node*> nodes;  // a copy: the rewrite adds nodes
    for (Node* node : graph.nodes()) nodes.push_back(node);
    for (Node* node : nodes) {
      if (node->is_dead() || !IsSpatialMean(*node)) continue;
      ReplaceMatched(graph, ctx, {node}, node, "GlobalAveragePool", {node->input(0)}, {});
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeGlobalPoolPass() { return std::make_unique<GlobalPoolPass>(); }

}  // namespace kiln::passes
