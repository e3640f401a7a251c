// LayerNormalization pattern fusion: the decomposed form exporters emit before opset 17,
//   mean = ReduceMean(x); d = x - mean; var = ReduceMean(d^2)   (Pow(d, 2) or d * d)
//   n = d / Sqrt(var + eps)   (or d * Reciprocal(Sqrt(var + eps)))
//   y = n * gamma + beta      (gamma, beta optional)
// becomes LayerNormalization(x, gamma, beta, axis, epsilon) when both means reduce the same
// trailing axes with keepdims; over axis 1 alone (channels-first), a LayerNormalization of the
// channels-last Transpose, transposed back.
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
    // The reduced axes must be the trailing ones: [axis, rank), or the channels of a
    // channels-first activation (below).
    auto trailing = TrailingAxis(*axes, rank);
    if (!trailing) {
      if (*axes == std::vector<int64_t>{1} && rank >= 3) RewriteChannelsFirst(graph, ctx, m);
      return;
    }
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

  // The statistics over axis 1 of [N, C, ...] (HF's ConvNeXt and ConvNeXt V2 LayerNorm with
  // data_format channels_first, gamma and beta [C, 1, 1]): Transpose to channels-last, a
  // LayerNormalization over the last axis, Transpose back. Under the channels-last layout
  // (layout_nhwc) the Transposes meet the layout's and cancel; elsewhere two transposes replace
  // eight elementwise and reduction passes.
  static void RewriteChannelsFirst(Graph& graph, PassContext& ctx, const Match& m) {
    Value* x = m.value("x");
    const int64_t rank = static_cast<int64_t>(x->shape().size());
    auto c = x->shape()[1].static_value();
    auto eps = ConstantSplat(m.value("eps"));
    if (!c || !eps) return;
    const std::vector<int64_t> norm_dims = {*c};
    if (m.has("gamma") && !NormParam(m.value("gamma"), norm_dims, x->dtype())) return;
    if (m.has("beta") && !NormParam(m.value("beta"), norm_dims, x->dtype())) return;
    Value* scale = AddNormParam(graph, m.root->name() + "_scale",
                                m.has("gamma") ? m.value("gamma") : nullptr, norm_dims, x->dtype());
    if (!scale) return;
    std::vector<Value*> inputs = {nullptr, scale};
    if (m.has("beta")) {
      Value* b =
          AddNormParam(graph, m.root->name() + "_bias", m.value("beta"), norm_dims, x->dtype());
      if (!b) return;
      inputs.push_back(b);
    }
    std::vector<int64_t> to_last = {0}, back = {0, rank - 1};
    for (int64_t i = 2; i < rank; ++i) to_last.push_back(i);
    to_last.push_back(1);
    for (int64_t i = 1; i + 1 < rank; ++i) back.push_back(i);
    Value* t = graph.AddValue(graph.UniqueName(x->name() + "_channels_last"), x->dtype());
    AttributeMap ta;
    ta.Set("perm", to_last);
    graph.AddNode("Transpose", graph.UniqueName(m.root->name() + "_to_channels_last"), {x}, {t},
                  std::move(ta));
    inputs[0] = t;
    Value* n = graph.AddValue(graph.UniqueName(m.root->name() + "_normalized"), x->dtype());
    AttributeMap la;
    la.Set("axis", int64_t{-1});
    la.Set("epsilon", static_cast<float>(*eps));
    graph.AddNode("LayerNormalization", graph.UniqueName(m.root->name() + "_ln"), inputs, {n},
                  std::move(la));
    ctx.stats().nodes_added += 2;
    AttributeMap tb;
    tb.Set("perm", back);
    ReplaceMatched(graph, ctx, m.matched, m.root, "Transpose", {n}, std::move(tb));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeLayerNormFusionPass() { return std::make_unique<LayerNormFusionPass>(); }

}  // namespace kiln::passes
