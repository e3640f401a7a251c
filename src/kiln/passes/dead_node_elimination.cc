// Dead-node elimination: removes nodes none of whose outputs is read or is a graph output.
// Visiting consumers before producers removes a whole dead chain in one run.
#include <algorithm>

#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

bool IsLive(const Node& node) {
  for (Value* out : node.outputs()) {
    if (out && (out->is_graph_output() || !out->consumers().empty())) return true;
  }
  return false;
}

class DeadNodeEliminationPass final : public Pass {
 public:
  std::string_view name() const override { return "dead_node_elimination"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    std::reverse(order.begin(), order.end());
    for (Node* node : order) {
      if (IsLive(*node)) continue;
      graph.RemoveNode(node);
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_removed += 1;
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeDeadNodeEliminationPass() {
  return std::make_unique<DeadNodeEliminationPass>();
}

}  // namespace kiln::passes
