// Constant folding: a node whose inputs are all constants is evaluated once at build time and its
// outputs become constants. Outputs above the size limit stay computed (a broadcast of a scalar to
// a huge shape is cheaper to run than to store).
#include <cstdint>

#include "kiln/core/logging.h"
#include "kiln/ir/sizes.h"
#include "kiln/ir/weight_program.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

class ConstantFoldingPass final : public Pass {
 public:
  std::string_view name() const override { return "constant_folding"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    const PassOptions& opts = ctx.options();
    if (!opts.evaluator) return OkStatus();
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (Node* node : order) {
      if (!Foldable(*node, opts.fold_size_limit_bytes)) continue;
      std::vector<const Tensor*> inputs;
      for (Value* v : node->inputs()) inputs.push_back(v ? v->constant() : nullptr);
      auto outputs = opts.evaluator(*node, inputs);
      if (!outputs.ok()) {
        // Not an error: the node simply stays and runs at execution time.
        KILN_LOG(Debug, BUILD, "constant folding: node '{}' ({}) stays: {}", node->name(),
                 node->op_type(), outputs.status().ToString());
        continue;
      }
      if (outputs->size() != node->num_outputs()) continue;
      // Refit replays the node on new weights with the same evaluator (weight_program.h).
      std::vector<WeightExprPtr> provenance = FoldedNodeOutputs(*node, inputs, *outputs);
      std::vector<Value*> outs = node->outputs();
      graph.RemoveNode(node);
      for (size_t i = 0; i < outs.size(); ++i) {
        if (!outs[i]) continue;
        outs[i]->set_constant(std::move((*outputs)[i]));
        outs[i]->set_provenance(provenance[i]);
      }
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_removed += 1;
    }
    return OkStatus();
  }

 private:
  static bool Foldable(const Node& node, int64_t limit) {
    if (node.num_outputs() == 0) return false;
    for (Value* v : node.inputs()) {
      if (v && !v->is_constant()) return false;
    }
    int64_t bytes = 0;
    for (Value* out : node.outputs()) {
      if (!out) continue;
      if (!out->has_shape() || out->dtype() == DataType::kUndefined) return false;
      auto dims = StaticDims(out->shape());
      if (!dims) return false;
      // Inferred shapes are size-checked (InferNode); saturating keeps a sum of them honest.
      bytes = SatAdd(bytes, static_cast<int64_t>(ByteSize(NumElements(*dims), out->dtype())));
    }
    return bytes <= limit;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeConstantFoldingPass() { return std::make_unique<ConstantFoldingPass>(); }

}  // namespace kiln::passes
