// Identity elimination: nodes that return their input unchanged (Identity, inference-mode
// Dropout, Cast to the same type, Reshape to the same shape, Transpose by the identity
// permutation, Pad by zeros, Slice of every element, Add/Sub of 0 and Mul/Div by 1 that broadcast
// nothing) are bypassed. A graph output keeps its name;
// when that would need renaming a graph input or a constant, the node stays.
// A Transpose that only moves size-1 axes (the non-1 axes keep their order: [S, 1, E] to
// [1, S, E] at batch 1) moves no data: it becomes a Reshape, a view.
#include <algorithm>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

// Shapes that follow from a shape input's values are equal for the build's values only.
bool SameShape(const Value* a, const Value* b) {
  return a && b && a->has_shape() && b->has_shape() && !a->value_dependent() &&
         !b->value_dependent() && a->shape() == b->shape();
}

// Add/Sub of a constant 0, Mul/Div by a constant 1 that broadcasts nothing (the other operand
// already has the output's shape and type), the constant a literal: the other operand. GPT-NeoX
// exports baddbmm as Add(Mul(bmm, alpha), zeros); BLOOM scales its ALiBi bias by a beta of 1.
Value* ArithmeticPassThrough(const Node& n) {
  const OpType op = OpTypeOf(n);
  if (n.num_inputs() != 2 || !n.input(0) || !n.input(1) || !n.output(0)) return nullptr;
  const double unit = op == OpType::kAdd || op == OpType::kSub ? 0.0 : 1.0;
  const bool commutes = op == OpType::kAdd || op == OpType::kMul;
  if (!(op == OpType::kAdd || op == OpType::kSub || op == OpType::kMul || op == OpType::kDiv)) {
    return nullptr;
  }
  for (int c = 1; c >= (commutes ? 0 : 1); --c) {
    Value* x = n.input(1 - c);
    // Only a literal (a Constant node, shape arithmetic): a model's zero bias is a weight, which
    // refit may replace by one that is not zero.
    const Value* k = n.input(c);
    std::optional<double> v;
    if (k->is_constant()) {
      if (ProvenanceOf(*k)->kind != WeightExpr::Kind::kLiteral) continue;
      v = ConstantSplat(k);
    } else if (const Node* fill = k->producer(); fill && IsOp(*fill, OpType::kConstantOfShape)) {
      // A fill of a runtime shape (torch.zeros of a dynamic size: GPT-NeoX's baddbmm input).
      v = 0.0;  // ConstantOfShape's default value
      if (fill->attrs().Has("value")) {
        const Tensor* t = fill->attrs().GetTensor("value");
        v = t && t->num_elements() == 1 ? std::optional<double>(t->GetDouble(0)) : std::nullopt;
      }
    }
    if (v && *v == unit && x->dtype() == n.output(0)->dtype() && SameShape(x, n.output(0))) {
      return x;
    }
  }
  return nullptr;
}

bool IsNoOp(const Node& n) {
  const OpType op = OpTypeOf(n);
  Value* in = n.input(0);
  Value* out = n.output(0);
  if (!in || !out) return false;
  if (op == OpType::kIdentity) return true;
  if (n.op_type() == "Dropout") {  // not in ops.inc (the importer rewrites it); tests build it
    // Inference: Dropout is the identity unless training_mode is a true constant; its mask
    // output must be unused.
    Value* mask = n.output(1);
    if (mask && (mask->is_graph_output() || !mask->consumers().empty())) return false;
    Value* training = n.input(2);
    if (training && (!training->is_constant() || training->constant()->GetInt(0) != 0)) {
      return false;
    }
    return true;
  }
  if (op == OpType::kCast) {
    return in->dtype() != DataType::kUndefined && in->dtype() == out->dtype();
  }
  if (op == OpType::kReshape || op == OpType::kSqueeze || op == OpType::kUnsqueeze ||
      op == OpType::kFlatten || op == OpType::kExpand) {
    return in->dtype() == out->dtype() && SameShape(in, out);
  }
  if (op == OpType::kPad) {
    // Zero pads add nothing whatever the mode (Swin's pad to a multiple of the window size when
    // the size already is one).
    const Value* pads = n.input(1);
    if (!pads || !pads->is_constant() || in->dtype() != out->dtype()) return false;
    for (int64_t i = 0; i < pads->constant()->num_elements(); ++i) {
      if (pads->constant()->GetInt(i) != 0) return false;
    }
    return true;
  }
  if (op == OpType::kSlice) {
    // Step 1 on every sliced axis and the same shape out as in: each axis keeps all of its
    // elements from the first on, so the slice is the whole tensor (the crop after a zero pad).
    const Value* steps = n.input(4);
    if (steps) {
      if (!steps->is_constant()) return false;
      for (int64_t i = 0; i < steps->constant()->num_elements(); ++i) {
        if (steps->constant()->GetInt(i) != 1) return false;
      }
    }
    return in->dtype() == out->dtype() && SameShape(in, out);
  }
  if (op == OpType::kTranspose) {
    std::vector<int64_t> perm = attrs::Transpose::perm(n);
    if (perm.empty()) return in->has_shape() && in->shape().size() <= 1;
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] != static_cast<int64_t>(i)) return false;
    }
    return true;
  }
  return false;
}

class IdentityEliminationPass final : public Pass {
 public:
  std::string_view name() const override { return "identity_elimination"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    for (Node* node : graph.nodes()) {
      if (node->is_dead()) continue;
      Value* in = IsNoOp(*node) ? node->input(0) : ArithmeticPassThrough(*node);
      if (!in) continue;
      Value* out = node->output(0);
      if (!ForwardValue(graph, out, in)) continue;
      graph.RemoveNode(node);
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_removed += 1;
    }
    for (Node* node : graph.nodes()) {
      if (node->is_dead() || !IsOp(*node, OpType::kTranspose) || !IsReorderOfOnes(*node)) continue;
      Value* shape = AddShapeConstant(graph, "transpose_view", node->output(0)->shape());
      if (!shape) continue;
      Value* in = node->input(0);
      Value* out = node->output(0);
      const std::string name = node->name();
      graph.RemoveNode(node);
      graph.AddNode("Reshape", graph.UniqueName(name + "_view"), {in, shape}, {out});
      ctx.stats().rewrites += 1;
    }
    return OkStatus();
  }

 private:
  // A Transpose whose non-1 axes stay in order (and that is not the identity, done above).
  static bool IsReorderOfOnes(const Node& n) {
    const Value* in = n.input(0);
    const Value* out = n.output(0);
    if (!in || !out || !in->has_shape() || !out->has_shape() || in->value_dependent()) {
      return false;
    }
    std::vector<int64_t> perm = attrs::Transpose::perm(n);
    const Shape& s = in->shape();
    if (perm.size() != s.size()) return false;
    int64_t last = -1;
    for (int64_t p : perm) {
      if (p < 0 || p >= static_cast<int64_t>(s.size())) return false;
      const Dim& d = s[static_cast<size_t>(p)];
      if (d.is_static() && d.value() == 1) continue;
      if (p < last) return false;
      last = p;
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeIdentityEliminationPass() {
  return std::make_unique<IdentityEliminationPass>();
}

}  // namespace kiln::passes
