// Attention pattern fusion: scaled dot-product attention written out by exporters,
//   MatMul(Q, K^T) -> (Div or Mul by a scalar)? -> (Add mask | Where(cond, ., fill))?
//   -> Softmax(last axis) -> MatMul(., V)
// becomes Attention(Q, K, V, mask?) (kiln-internal, see src/kiln/ops/attention.cc) with K in
// [..., Sk, D] layout: the Transpose that made K^T is rewritten (or one is added) so the fused op
// sees the standard layout. Where(cond, scores, very negative) whose cond is a top-left slice of
// a lower-triangular constant (GPT-2's causal buffer) becomes mask_kind "causal" with no mask
// tensor at all; any other boolean cond stays an input (mask_kind "boolean").
#include <algorithm>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

bool IsSplat(const Value& v) { return ConstantSplat(&v).has_value(); }

bool SoftmaxOverLastAxis(const Node& n) {
  Value* in = n.input(0);
  if (!in || !in->has_shape()) return false;
  int64_t rank = static_cast<int64_t>(in->shape().size());
  int64_t axis = attrs::Softmax::axis(n);
  return axis == -1 || axis == rank - 1;
}

Pattern AttentionPattern() {
  using namespace pat;
  Pattern scores = Op("MatMul", {Any("q"), Any("kt")}).Capture("qk");
  Pattern scaled = OneOf({Op("Div", {scores, Constant("scale_div").WhereValue(IsSplat)}),
                          Op("Mul", {scores, Constant("scale_mul").WhereValue(IsSplat)}), scores});
  Pattern masked = OneOf(
      {Op("Add", {scaled, Any("mask")}).Capture("mask_add"),
       Op("Where", {Any("cond"), scaled, Constant("fill").WhereValue(IsSplat)}).Capture("where"),
       scaled});
  Pattern probs = Op("Softmax", {masked}).Capture("softmax").Where(SoftmaxOverLastAxis);
  return Op("MatMul", {probs, Any("v")});
}

// Static integer elements of a value (a constant or a dims-value).
std::optional<std::vector<int64_t>> StaticInts(const Value* v, const PassContext& ctx) {
  if (!v) return std::nullopt;
  if (v->is_constant() && IsInteger(v->constant()->dtype())) return v->constant()->ToInt64Vector();
  if (const std::vector<Dim>* dv = ctx.dims_value(v)) {
    std::vector<int64_t> out;
    for (const Dim& d : *dv) {
      if (!d.is_static()) return std::nullopt;
      out.push_back(d.value());
    }
    return out;
  }
  return std::nullopt;
}

// True when `cond` is C[..., 0:a, 0:b] of a constant boolean C with C[..., i, j] = (j <= i), so
// that it equals the causal mask wherever it is read.
bool IsTopLeftCausal(const Value* cond, const PassContext& ctx) {
  const Value* c = cond;
  while (c && c->producer() && IsOp(*c->producer(), OpType::kSlice)) {
    const Node& s = *c->producer();
    const Value* data = s.input(0);
    if (!data || !data->has_shape()) return false;
    int64_t rank = static_cast<int64_t>(data->shape().size());
    auto starts = StaticInts(s.input(1), ctx);
    if (!starts) return false;
    std::vector<int64_t> axes;
    if (s.input(3)) {
      auto a = StaticInts(s.input(3), ctx);
      if (!a) return false;
      axes = *a;
    } else {
      for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
    }
    if (s.input(4)) {
      auto steps = StaticInts(s.input(4), ctx);
      if (!steps || std::any_of(steps->begin(), steps->end(), [](int64_t x) { return x != 1; })) {
        return false;
      }
    }
    if (axes.size() != starts->size()) return false;
    for (size_t i = 0; i < axes.size(); ++i) {
      int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
      if (axis >= rank - 2) {
        if ((*starts)[i] != 0) return false;
      } else if (!(data->shape()[axis] == Dim(1))) {
        return false;  // slicing a leading axis of size > 1 could pick another mask
      }
    }
    c = data;
  }
  if (!c || !c->is_constant()) return false;
  const Tensor& t = *c->constant();
  if (t.dtype() != DataType::kBool || t.dims().size() < 2) return false;
  int64_t rows = t.dims()[t.dims().size() - 2], cols = t.dims().back();
  int64_t planes = rows * cols == 0 ? 0 : t.num_elements() / (rows * cols);
  // Bools are one byte each (GPT-2 exports a 1024 x 1024 mask: read it directly, not per
  // element through Tensor::GetInt).
  const auto* b = static_cast<const uint8_t*>(t.raw());
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < rows; ++i) {
      const uint8_t* row = b + (p * rows + i) * cols;
      for (int64_t j = 0; j < cols; ++j) {
        if ((row[j] != 0) != (j <= i)) return false;
      }
    }
  }
  return true;
}

class AttentionFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "attention_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = AttentionPattern();
    return ForEachMatch(graph, pattern, RootOrder::kFromOutputs, nullptr,
                        [&](const Match& m) { Rewrite(graph, ctx, m); });
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m) {
    Value* q = m.value("q");
    Value* kt = m.value("kt");
    Value* v = m.value("v");
    Value* scores = m.node("qk")->output(0);
    for (Value* x : {q, kt, v, scores}) {
      if (!x->has_shape() || x->shape().size() < 2 || !IsFloat(x->dtype())) return;
    }
    size_t rank = kt->shape().size();
    if (q->shape().size() != rank || v->shape().size() != rank) return;

    AttributeMap attrs;
    double scale = 1.0;
    if (m.has("scale_div")) {
      double c = *ConstantSplat(m.value("scale_div"));
      if (c == 0.0) return;  // x / 0 is not a scale; leave the graph as written
      scale = 1.0 / c;
    }
    if (m.has("scale_mul")) scale = *ConstantSplat(m.value("scale_mul"));
    attrs.Set("scale", static_cast<float>(scale));

    Value* mask = nullptr;
    std::string kind = "none";
    if (m.has("mask_add")) {
      mask = m.value("mask");
      if (mask->dtype() != q->dtype()) return;
      kind = "additive";
    } else if (m.has("where")) {
      Value* cond = m.value("cond");
      double fill = *ConstantSplat(m.value("fill"));
      const Shape& s = scores->shape();
      bool square = s[rank - 1] == s[rank - 2];
      bool covers = cond->has_shape() && cond->shape().size() >= 2 &&
                    cond->shape()[cond->shape().size() - 1] == s[rank - 1] &&
                    cond->shape()[cond->shape().size() - 2] == s[rank - 2];
      if (square && covers && fill <= -1e4 && IsTopLeftCausal(cond, ctx)) {
        kind = "causal";
      } else {
        if (cond->dtype() != DataType::kBool) return;
        mask = cond;
        kind = "boolean";
        attrs.Set("mask_fill", static_cast<float>(fill));
      }
    }
    attrs.Set("mask_kind", kind);

    // K in [..., Sk, D]: undo the last-two-axes swap that made K^T.
    std::vector<int64_t> swap(rank);
    for (size_t i = 0; i < rank; ++i) swap[i] = static_cast<int64_t>(i);
    std::swap(swap[rank - 1], swap[rank - 2]);
    Value* k_src = kt;
    std::vector<int64_t> perm = swap;
    if (Node* t = kt->producer(); t && IsOp(*t, OpType::kTranspose)) {
      std::vector<int64_t> p = attrs::Transpose::perm(*t);
      if (p.size() == rank) {
        std::swap(p[rank - 1], p[rank - 2]);
        k_src = t->input(0);
        perm = p;
      }
    }
    bool identity = true;
    for (size_t i = 0; i < rank; ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
    Value* k = k_src;
    if (!identity) {
      k = graph.AddValue(graph.UniqueName(kt->name() + "_k"), kt->dtype());
      AttributeMap tattrs;
      tattrs.Set("perm", perm);
      graph.AddNode("Transpose", graph.UniqueName(m.root->name() + "_k_transpose"), {k_src}, {k},
                    std::move(tattrs));
      ctx.stats().nodes_added += 1;
    }
    std::vector<Value*> inputs = {q, k, v};
    if (mask) inputs.push_back(mask);
    ReplaceMatched(graph, ctx, m.matched, m.root, "Attention", std::move(inputs), std::move(attrs));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeAttentionFusionPass() { return std::make_unique<AttentionFusionPass>(); }

}  // namespace kiln::passes
