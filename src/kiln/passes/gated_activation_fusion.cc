// Gated-activation fusion: the gated MLPs of Llama (SwiGLU: silu(gate) * up), T5 v1.1 and Gemma
// (GeGLU: gelu(gate) * up) and GLU variants,
//   y = Mul(act(a), b)        a, b of one shape; act any fused-op epilogue (activation.h)
// becomes GatedActivation(a, b): one elementwise pass instead of two or three (Sigmoid, Mul, Mul).
// Runs before gemm_fusion, which would otherwise take the activation into the gate projection
// and leave the Mul on its own. A plain SiLU, x * Sigmoid(x), is not a gate and stays for the
// epilogues, as does Swish, x * Sigmoid(c * x) (CLIP's QuickGELU); a broadcast Mul
// (squeeze-excite's per-channel scale) is not one either.
// Then, after gemm_fusion, gated_projection_merge: when the gate and up come from two projections
// of one input with constant weights, they become one GEMM of twice the width whose output
// GatedActivation reads packed (gate and up side by side in each row): one launch and one read
// of the input instead of two.
#include "kiln/ops/op_table.h"
#include "kiln/passes/activation.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"
#include "kiln/passes/projection_concat.h"

namespace kiln::passes {
namespace {

Pattern GatedPattern() {
  using namespace pat;
  return Op("Mul", {ActivationOver(Any("a")), Any("b")});
}

// x * Sigmoid(x) or x * Sigmoid(x * c) (c constant) in either order: SiLU or Swish itself.
bool IsSilu(const Node& mul) {
  for (size_t i = 0; i < 2; ++i) {
    const Node* p = mul.input(i) ? mul.input(i)->producer() : nullptr;
    if (!p || !IsOp(*p, OpType::kSigmoid)) continue;
    const Value* x = mul.input(1 - i);
    if (p->input(0) == x) return true;
    const Node* scale = p->input(0) ? p->input(0)->producer() : nullptr;
    if (scale && IsOp(*scale, OpType::kMul) && scale->num_inputs() == 2) {
      for (size_t j = 0; j < 2; ++j) {
        if (scale->input(j) == x && scale->input(1 - j) && scale->input(1 - j)->is_constant()) {
          return true;
        }
      }
    }
  }
  return false;
}

class GatedActivationFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "gated_activation_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = GatedPattern();
    // A Mul that is SiLU or Swish itself (x * Sigmoid(x), x * Sigmoid(c * x)) is not a gate.
    return ForEachMatch(
        graph, pattern, RootOrder::kFromOutputs,
        [](const Node& n) { return n.num_inputs() == 2 && !IsSilu(n); },
        [&](const Match& m) { Rewrite(graph, ctx, m); });
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m) {
    Value* a = m.value("a");
    Value* b = m.value("b");
    Value* y = m.root->output(0);
    if (a == b || !y || !a->has_shape() || !b->has_shape() || !IsFloat(a->dtype()) ||
        a->dtype() != b->dtype() || y->dtype() != a->dtype() || a->shape() != b->shape()) {
      return;
    }
    if (a->is_constant() || b->is_constant()) return;  // a scaled activation, not a gate
    AttributeMap attrs;
    if (!ActivationAttrs(m, attrs)) return;
    ReplaceMatched(graph, ctx, m.matched, m.root, "GatedActivation", {a, b}, std::move(attrs));
  }
};

class GatedProjectionMergePass final : public Pass {
 public:
  std::string_view name() const override { return "gated_projection_merge"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (Node* node : order) {
      if (node->is_dead() || !IsOp(*node, OpType::kGatedActivation) || node->num_inputs() != 2) {
        continue;
      }
      const Node* p[2] = {ConstantProjection(node->input(0), node),
                          ConstantProjection(node->input(1), node)};
      if (!p[0] || !p[1] || p[0] == p[1]) continue;
      Value* packed = ConcatProjections(graph, p, "_gate_up");
      if (!packed) continue;
      Value* y = node->output(0);
      AttributeMap attrs = node->attrs();
      std::string name = node->name();
      graph.RemoveNode(node);  // the two projections are dead now; dead-node elimination goes next
      graph.AddNode("GatedActivation", graph.UniqueName(name + "_packed"), {packed}, {y},
                    std::move(attrs));
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_removed += 1;
      ctx.stats().nodes_added += 2;
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeGatedActivationFusionPass() {
  return std::make_unique<GatedActivationFusionPass>();
}

std::unique_ptr<Pass> MakeGatedProjectionMergePass() {
  return std::make_unique<GatedProjectionMergePass>();
}

}  // namespace kiln::passes
