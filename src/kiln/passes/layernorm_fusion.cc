// LayerNormalization pattern fusion: the decomposed form exporters emit before opset 17,
//   mean = ReduceMean(x); d = x - mean; var = ReduceMean(d^2)   (Pow(d, 2) or d * d)
//   n = d / Sqrt(var + eps)   (or d * Reciprocal(Sqrt(var + eps)))
//   y = n * gamma + beta      (gamma, beta optional)
// becomes LayerNormalization(x, gamma, beta, axis, epsilon) when both means reduce the same
// trailing axes with keepdims.
#include <algorithm>

#include "kiln/ops/op_table.h"
#include "kiln/passes/norm_params.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

Pattern LayerNormPattern() {
  using namespace pat;
  Pattern x = Any("x");
  Pattern mean = Op("ReduceMean", {x}).Capture("mean");
  Pattern d = Op("Sub", {x, mean}).Capture("d");
  Pattern sq = OneOf({Op("Pow", {d, Scalar(2.0, 1e-6)}), Op("Mul", {d, d})});
  Pattern var = Op("ReduceMean", {sq}).Capture("var");
  Pattern stddev = Op("Sqrt", {Op("Add", {var, Constant("eps")})});
  Pattern n = OneOf({Op("Div", {d, stddev}), Op("Mul", {d, Op("Reciprocal", {stddev})})});
  Pattern scaled = Op("Mul", {n, Constant("gamma")});
  return OneOf({Op("Add", {scaled, Constant("beta")}), scaled, n});
}

class LayerNormFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "layernorm_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = LayerNormPattern();
    // From the outputs back, so that the beta Add (or the gamma Mul) is the root when there is one.
    return ForEachMatch(graph, pattern, RootOrder::kFromOutputs, nullptr,
                        [&](const Match& m) { Rewrite(graph, ctx, m); });
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m) {
    Value* x = m.value("x");
    if (!x->has_shape() || !IsFloat(x->dtype())) return;
    int64_t rank = static_cast<int64_t>(x->shape().size());
    auto axes = ReduceAxes(*m.node("mean"), rank);
    auto axes2 = ReduceAxes(*m.node("var"), rank);
    if (!axes || !axes2 || *axes != *axes2) return;
    // The reduced axes must be the trailing ones: [axis, rank).
    auto trailing = TrailingAxis(*axes, rank);
    if (!trailing) return;
    int64_t axis = *trailing;
    std::vector<int64_t> norm_dims;
    for (int64_t i = axis; i < rank; ++i) {
      auto d = x->shape()[i].static_value();
      if (!d) return;  // parameters need a static normalized shape
      norm_dims.push_back(*d);
    }
    auto eps = ConstantSplat(m.value("eps"));
    if (!eps) return;
    std::optional<Tensor> gamma, beta;
    if (m.has("gamma")) {
      gamma = NormParam(m.value("gamma"), norm_dims, x->dtype());
      if (!gamma) return;
    } else {
      gamma = NormParam(nullptr, norm_dims, x->dtype());
    }
    if (m.has("beta")) {
      beta = NormParam(m.value("beta"), norm_dims, x->dtype());
      if (!beta) return;
    }
    Value* scale = AddNormParam(graph, m.root->name() + "_scale",
                                m.has("gamma") ? m.value("gamma") : nullptr, norm_dims, x->dtype());
    if (!scale) return;
    std::vector<Value*> inputs = {x, scale};
    if (beta) {
      Value* b =
          AddNormParam(graph, m.root->name() + "_bias", m.value("beta"), norm_dims, x->dtype());
      if (!b) return;
      inputs.push_back(b);
    }
    AttributeMap attrs;
    attrs.Set("axis", axis - rank);
    attrs.Set("epsilon", static_cast<float>(*eps));
    ReplaceMatched(graph, ctx, m.matched, m.root, "LayerNormalization", std::move(inputs),
                   std::move(attrs));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeLayerNormFusionPass() { return std::make_unique<LayerNormFusionPass>(); }

}  // namespace kiln::passes
