// Activation epilogues for the Gemm/MatMul/Conv fusions.
#include "kiln/passes/activation.h"

namespace kiln::passes {

Pattern ActivationOver(const Pattern& body) {
  using namespace pat;
  return OneOf({
      Op(std::vector<std::string>{"Relu", "Sigmoid", "HardSwish", "Gelu", "Clip"}, {body})
          .Capture("act"),
      Op("Mul", {body, Op("Sigmoid", {body})}).Capture("act"),
  });
}

bool ActivationAttrs(const Match& m, AttributeMap& attrs) {
  const Node* act = m.node("act");
  if (!act) return true;
  const std::string& op = act->op_type();
  if (op == "Relu") {
    attrs.Set("activation", std::string("relu"));
  } else if (op == "Sigmoid") {
    attrs.Set("activation", std::string("sigmoid"));
  } else if (op == "HardSwish") {
    attrs.Set("activation", std::string("hardswish"));
  } else if (op == "Mul") {
    attrs.Set("activation", std::string("silu"));
  } else if (op == "Gelu") {
    std::string approx = act->attrs().GetString("approximate", "none");
    if (approx != "none" && approx != "tanh") return false;
    attrs.Set("activation", std::string(approx == "tanh" ? "gelu_tanh" : "gelu"));
  } else if (op == "Clip") {
    attrs.Set("activation", std::string("clip"));
    for (size_t i = 1; i <= 2; ++i) {
      Value* bound = act->input(i);
      if (!bound) continue;
      auto v = ConstantSplat(bound);
      if (!v) return false;
      attrs.Set(i == 1 ? "activation_min" : "activation_max", static_cast<float>(*v));
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace kiln::passes
