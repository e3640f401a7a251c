// GELU pattern fusion. Before opset 20 exporters write GELU out:
//   erf form   x * 0.5 * (1 + erf(x / sqrt(2)))                      -> Gelu(approximate="none")
//   tanh form  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  -> Gelu(approximate="tanh")
//              (also with the polynomial factored, sqrt(2/pi) * x * (1 + 0.044715 x x): BLOOM)
// The three factors come in any association and operand order (PyTorch: (x * (1+erf)) * 0.5;
// others: (x * 0.5) * (1+erf), x * ((1+erf) * 0.5)); Mul/Add match either operand order, so the
// three association shapes cover them all.
#include <cmath>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kSqrt2OverPi = 0.7978845608028654;

// x * 0.5 * (1 + inner), in the three association shapes.
Pattern HalfXTimesOnePlus(const Pattern& x, const Pattern& inner) {
  using namespace pat;
  Pattern one_plus = Op("Add", {inner, Scalar(1.0, 1e-5)});
  Pattern half = Scalar(0.5, 1e-5);
  return OneOf({
      Op("Mul", {Op("Mul", {x, one_plus}), half}),
      Op("Mul", {Op("Mul", {x, half}), one_plus}),
      Op("Mul", {x, Op("Mul", {one_plus, half})}),
  });
}

Pattern ErfGelu() {
  using namespace pat;
  Pattern x = Any("x");
  Pattern scaled =
      OneOf({Op("Div", {x, Scalar(kSqrt2, 1e-4)}), Op("Mul", {x, Scalar(1 / kSqrt2, 1e-4)})});
  return HalfXTimesOnePlus(x, Op("Erf", {scaled}));
}

Pattern TanhGelu() {
  using namespace pat;
  Pattern x = Any("x");
  Pattern cube = OneOf({Op("Pow", {x, Scalar(3.0, 1e-6)}), Op("Mul", {x, Op("Mul", {x, x})})});
  Pattern poly = Op("Add", {x, Op("Mul", {cube, Scalar(0.044715, 1e-4)})});
  // BLOOM factors x out: sqrt(2/pi) * x * (1 + 0.044715 * x * x), the same polynomial.
  Pattern square_term = OneOf({Op("Mul", {Op("Mul", {x, Scalar(0.044715, 1e-4)}), x}),
                               Op("Mul", {Op("Mul", {x, x}), Scalar(0.044715, 1e-4)})});
  Pattern factored = Op("Mul", {Op("Mul", {x, Scalar(kSqrt2OverPi, 1e-4)}),
                                Op("Add", {square_term, Scalar(1.0, 1e-5)})});
  Pattern arg = OneOf({Op("Mul", {poly, Scalar(kSqrt2OverPi, 1e-4)}), factored});
  return HalfXTimesOnePlus(x, Op("Tanh", {arg}));
}

class GeluFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "gelu_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern erf = ErfGelu();
    static const Pattern tanh = TanhGelu();
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    // Consumers first, so the outermost Mul is the root.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* node = *it;
      if (node->is_dead() || !IsOp(*node, OpType::kMul)) continue;
      std::string approximate = "none";
      auto m = MatchAt(erf, node);
      if (!m) {
        m = MatchAt(tanh, node);
        approximate = "tanh";
      }
      if (!m || !IsFloat(m->value("x")->dtype())) continue;
      AttributeMap attrs;
      attrs.Set("approximate", approximate);
      ReplaceMatched(graph, ctx, m->matched, node, "Gelu", {m->value("x")}, std::move(attrs));
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeGeluFusionPass() { return std::make_unique<GeluFusionPass>(); }

}  // namespace kiln::passes
