// LayerNormalization pattern fusion: the decomposed form exporters emit before opset 17,
//   mean = ReduceMean(x); d = x - mean; var = ReduceMean(d^2)   (Pow(d, 2) or d * d)
//   n = d / Sqrt(var + eps)   (or d * Reciprocal(Sqrt(var + eps)))
//   y = n * gamma + beta      (gamma, beta optional)
// becomes LayerNormalization(x, gamma, beta, axis, epsilon) when both means reduce the same
// trailing axes with keepdims.
#include <algorithm>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

// The reduced axes of a ReduceMean (input 1 since opset 18, attribute before), normalised.
std::optional<std::vector<int64_t>> ReduceAxes(const Node& n, int64_t rank) {
  if (attrs::ReduceMean::keepdims(n) != 1) return std::nullopt;
  std::vector<int64_t> axes;
  if (Value* a = n.input(1)) {
    if (!a->is_constant()) return std::nullopt;
    axes = a->constant()->ToInt64Vector();
  } else {
    axes = n.attrs().GetInts("axes");
  }
  if (axes.empty()) return std::nullopt;  // all axes (or noop_with_empty_axes): not a LayerNorm
  for (int64_t& a : axes) {
    if (a < -rank || a >= rank) return std::nullopt;
    if (a < 0) a += rank;
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

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

// A per-element parameter of the normalized shape: the constant reshaped (or a splat expanded)
// to `norm_dims`, in `dtype`; ones when `v` is null (no gamma: LayerNormalization needs a scale).
std::optional<Tensor> NormParam(const Value* v, const std::vector<int64_t>& norm_dims,
                                DataType dtype) {
  int64_t n = NumElements(norm_dims);
  if (!v) {
    return Tensor::FromVector<float>(DataType::kFloat32, norm_dims,
                                     std::vector<float>(static_cast<size_t>(n), 1.f))
        .CastTo(dtype);
  }
  const Tensor& t = *v->constant();
  // Leading 1s only: a parameter that varies along a non-normalized axis is not a LayerNorm one.
  size_t lead = t.dims().size() > norm_dims.size() ? t.dims().size() - norm_dims.size() : 0;
  for (size_t i = 0; i < lead; ++i) {
    if (t.dims()[i] != 1) return std::nullopt;
  }
  std::vector<float> values(static_cast<size_t>(n));
  if (t.num_elements() == n) {
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(t.GetDouble(i));
  } else if (t.num_elements() == 1) {
    std::fill(values.begin(), values.end(), static_cast<float>(t.GetDouble(0)));
  } else {
    return std::nullopt;
  }
  return Tensor::FromVector<float>(DataType::kFloat32, norm_dims, values).CastTo(dtype);
}

class LayerNormFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "layernorm_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = LayerNormPattern();
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* node = *it;
      if (node->is_dead()) continue;
      const std::string& op = node->op_type();
      if (op != "Add" && op != "Mul" && op != "Div") continue;
      auto m = MatchAt(pattern, node);
      if (!m) continue;
      Rewrite(graph, ctx, *m);
    }
    return OkStatus();
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
    int64_t axis = axes->front();
    for (size_t i = 0; i < axes->size(); ++i) {
      if ((*axes)[i] != axis + static_cast<int64_t>(i)) return;
    }
    if (axes->back() != rank - 1) return;
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
    std::vector<Value*> inputs = {x, AddConstant(graph, m.root->name() + "_scale", *gamma)};
    if (beta) inputs.push_back(AddConstant(graph, m.root->name() + "_bias", *beta));
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
