// RMSNorm fusion: the decomposed form exporters emit for Llama's, T5's and Mistral's norms,
//   ms = ReduceMean(x^2)                 (Pow(x, 2) or x * x; trailing axes, keepdims)
//   n  = x / Sqrt(ms + eps)              (or x * Reciprocal(Sqrt(..)), x * (1 / Sqrt(..)))
//   y  = n * gamma                       (gamma optional)
// becomes RMSNormalization(x, gamma, axis, epsilon): one pass over the row instead of six
// kernels. The FP32 casts around it (Llama's hidden_states.to(float32)) are identities in an FP32
// export and go first (identity elimination).
#include "kiln/passes/norm_params.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

Pattern RmsNormPattern() {
  using namespace pat;
  Pattern x = Any("x");
  Pattern sq = OneOf({Op("Pow", {x, Scalar(2.0, 1e-6)}), Op("Mul", {x, x})});
  Pattern ms = Op("ReduceMean", {sq}).Capture("ms");
  Pattern root = Op("Sqrt", {Op("Add", {ms, Constant("eps")})});
  Pattern n = OneOf({Op("Div", {x, root}), Op("Mul", {x, Op("Reciprocal", {root})}),
                     Op("Mul", {x, Op("Div", {Scalar(1.0, 1e-6), root})})});
  return OneOf({Op("Mul", {n, Constant("gamma")}), n});
}

class RmsNormFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "rms_norm_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = RmsNormPattern();
    // From the outputs back, so that the gamma Mul is the root when there is one.
    return ForEachMatch(graph, pattern, RootOrder::kFromOutputs, nullptr,
                        [&](const Match& m) { Rewrite(graph, ctx, m); });
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m) {
    Value* x = m.value("x");
    if (!x->has_shape() || !IsFloat(x->dtype())) return;
    Value* y = m.root->output(0);
    if (!y || y->dtype() != x->dtype()) return;
    int64_t rank = static_cast<int64_t>(x->shape().size());
    auto axes = ReduceAxes(*m.node("ms"), rank);
    if (!axes) return;
    auto axis = TrailingAxis(*axes, rank);
    if (!axis) return;
    std::vector<int64_t> norm_dims;
    for (int64_t i = *axis; i < rank; ++i) {
      auto d = x->shape()[i].static_value();
      if (!d) return;  // the scale needs a static normalized shape
      norm_dims.push_back(*d);
    }
    auto eps = ConstantSplat(m.value("eps"));
    if (!eps || !(*eps >= 0)) return;
    auto gamma = NormParam(m.has("gamma") ? m.value("gamma") : nullptr, norm_dims, x->dtype());
    if (!gamma) return;
    Value* scale = AddNormParam(graph, m.root->name() + "_scale",
                                m.has("gamma") ? m.value("gamma") : nullptr, norm_dims, x->dtype());
    if (!scale) return;
    std::vector<Value*> inputs = {x, scale};
    AttributeMap attrs;
    attrs.Set("axis", *axis - rank);
    attrs.Set("epsilon", static_cast<float>(*eps));
    ReplaceMatched(graph, ctx, m.matched, m.root, "RMSNormalization", std::move(inputs),
                   std::move(attrs));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeRmsNormFusionPass() { return std::make_unique<RmsNormFusionPass>(); }

}  // namespace kiln::passes
