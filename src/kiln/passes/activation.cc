// Activation epilogues for the Gemm/MatMul/Conv fusions: the ops with the kEpilogue trait
// (ops.inc) and the activations they become (activations.inc), plus SiLU and Swish by pattern.
#include "kiln/passes/activation.h"

#include <cmath>

#include "kiln/ops/fused.h"
#include "kiln/ops/op_table.h"

namespace kiln::passes {

namespace {
// The ops the fusions absorb: those with the kEpilogue trait in ops.inc.
const std::vector<std::string>& EpilogueOps() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v;
    for (const OpSchema& s : AllOpSchemas()) {
      if (HasTrait(s.type, op_traits::kEpilogue)) v.emplace_back(s.name);
    }
    return v;
  }();
  return ops;
}
}  // namespace

Pattern ActivationOver(const Pattern& body) {
  using namespace pat;
  return OneOf({
      Op(EpilogueOps(), {body}).Capture("act"),
      Op("Mul", {body, Op("Sigmoid", {body})}).Capture("act"),
      // x * Sigmoid(alpha * x), alpha a constant scalar (CLIP's QuickGELU, ONNX Swish)
      Op("Mul", {body, Op("Sigmoid", {Op("Mul", {body, Constant("swish_alpha")})})}).Capture("act"),
  });
}

bool ActivationAttrs(const Match& m, AttributeMap& attrs) {
  const Node* act = m.node("act");
  if (!act) return true;
  const OpType op = OpTypeOf(*act);
  std::optional<FusedActivation> kind = FusedActivationOf(op);
  if (op == OpType::kMul) {
    kind = FusedActivation::kSilu;
    if (const Value* alpha = m.value("swish_alpha")) {
      auto v = ConstantSplat(alpha);
      if (!v || !std::isfinite(*v)) return false;
      kind = FusedActivation::kSwish;
      attrs.Set("activation_alpha", static_cast<float>(*v));
    }
  } else if (op == OpType::kGelu) {
    std::string approx = attrs::Gelu::approximate(*act);
    if (approx != "none" && approx != "tanh") return false;
    if (approx == "tanh") kind = FusedActivation::kGeluTanh;
  }
  if (!kind) return false;
  attrs.Set("activation", std::string(ToString(*kind)));
  if (*kind == FusedActivation::kClip) {
    for (size_t i = 1; i <= 2; ++i) {
      Value* bound = act->input(i);
      if (!bound) continue;
      auto v = ConstantSplat(bound);
      if (!v) return false;
      attrs.Set(i == 1 ? "activation_min" : "activation_max", static_cast<float>(*v));
    }
  }
  return true;
}

}  // namespace kiln::passes
