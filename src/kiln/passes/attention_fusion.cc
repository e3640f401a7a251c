// Attention pattern fusion: scaled dot-product attention written out by exporters,
//   MatMul(Q, K^T) -> (Div or Mul by a scalar)? -> (Add mask | Add mask, Add mask2 |
//   Where(cond, ., fill))?
//   -> Softmax(last axis) -> MatMul(., V)
// becomes Attention(Q, K, V, mask?) (kiln-internal, see src/kiln/ops/attention.cc) with K in
// [..., Sk, D] layout: the Transpose that made K^T is rewritten (or one is added) so the fused op
// sees the standard layout. Where(cond, scores, very negative) whose cond is a top-left slice of
// a lower-triangular constant (GPT-2's causal buffer) becomes mask_kind "causal" with no mask
// tensor at all; any other boolean cond stays an input (mask_kind "boolean").
//
// Two more forms exporters write:
// - Q scaled before the product, MatMul(Mul(Q, c), K^T) (Swin, many ViTs), and K^T too,
//   MatMul(Mul(Q, c), Mul(K^T, d)) (torch's scaled_dot_product_attention export, which
//   nn.MultiheadAttention uses): c and d join the scale.
// - Shifted-window attention (Swin): the scores [N, H, S, Sk] are split into windows,
//   Reshape -> [N/P, P, H, S, Sk], a per-window mask [., P, ., S, Sk] is added, and a Reshape
//   merges them back before the Softmax. The mask depends on the batch index modulo P, which no
//   broadcast of a rank-4 mask expresses, so the fused Attention runs on rank-5 views of Q, K and
//   V (Reshapes, which are free) with the sum of both masks, and a Reshape makes its output
//   rank 4 again.
// - Grouped-query attention (Llama, Mistral): K and V repeated to Q's head count by repeat_kv
//   (Unsqueeze -> Expand -> Reshape). The same rank + 1 views run it un-repeated: Q as
//   [B, KVH, n_rep, S, D] against K and V as [B, KVH, 1, S, D], whose size-1 axis broadcasts.
//   Multi-query attention (K and V of one head broadcast over Q's, as batch_unflatten writes
//   GPT-BigCode's) is the group of one: Q as [B, 1, H, S, D], K and V as [B, 1, 1, S, D], so
//   that the layout pass reads all three in place.
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
  Pattern q = OneOf({Op("Mul", {Any("q"), Constant("q_scale").WhereValue(IsSplat)}),
                     Op("Div", {Any("q"), Constant("q_scale_div").WhereValue(IsSplat)}), Any("q")});
  // torch's scaled_dot_product_attention export scales both: Q and K^T each by sqrt(scale).
  Pattern kt = OneOf({Op("Mul", {Any("kt"), Constant("k_scale").WhereValue(IsSplat)}), Any("kt")});
  Pattern scores = Op("MatMul", {q, kt}).Capture("qk");
  Pattern scaled = OneOf({Op("Div", {scores, Constant("scale_div").WhereValue(IsSplat)}),
                          Op("Mul", {scores, Constant("scale_mul").WhereValue(IsSplat)}), scores});
  Pattern biased = OneOf({Op("Add", {scaled, Any("mask")}).Capture("mask_add"), scaled});
  Pattern windowed =
      Op("Reshape",
         {Op("Add", {Op("Reshape", {biased, Any()}).Capture("split"), Any("window_mask")}), Any()})
          .Capture("merge");
  // Two additive masks in a row (T5's relative position bias, then the padding mask): their sum
  // is the Attention's one mask.
  Pattern twice = Op("Add", {Op("Add", {scaled, Any("mask")}).Capture("mask_add"), Any("mask2")})
                      .Capture("mask_add2");
  Pattern masked = OneOf(
      {windowed, twice, Op("Add", {scaled, Any("mask")}).Capture("mask_add"),
       Op("Where", {Any("cond"), scaled, Constant("fill").WhereValue(IsSplat)}).Capture("where"),
       scaled});
  Pattern probs = Op("Softmax", {masked}).Capture("softmax").Where(SoftmaxOverLastAxis);
  return Op("MatMul", {probs, Any("v")});
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

// True when `mask` is a constant additive mask of the square scores' full [S, S] extent (any
// leading dims) that is 0 where key j <= query i and very negative (<= -1e4, -inf included) above
// the diagonal in every plane: the causal mask (torch.full(-inf).triu(1), Llama's exports).
bool IsAdditiveCausal(const Value* mask, const Shape& scores) {
  if (!mask->is_constant() || !mask->has_shape() || scores.size() < 2) return false;
  const Tensor& t = *mask->constant();
  const auto& d = t.dims();
  const size_t r = scores.size();
  if (d.size() < 2 || !(scores[r - 1] == scores[r - 2]) || !(scores[r - 1] == Dim(d.back())) ||
      d.back() != d[d.size() - 2]) {
    return false;
  }
  const int64_t n = d.back();
  const int64_t planes = n == 0 ? 0 : t.num_elements() / (n * n);
  if (planes == 0 || planes * n * n > (int64_t{1} << 24)) return false;  // keep the scan cheap
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const double v = t.GetDouble((p * n + i) * n + j);
        if (j <= i ? v != 0.0 : !(v <= -1e4)) return false;
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
    int grouped = 0;
    KILN_RETURN_IF_ERROR(ForEachMatch(graph, pattern, RootOrder::kFromOutputs, nullptr,
                                      [&](const Match& m) { Rewrite(graph, ctx, m, grouped); }));
    if (grouped > 0) {
      ctx.stats().notes.push_back(fmt::format(
          "{} grouped-query attention layer(s) read K and V un-repeated (no repeat_kv copies)",
          grouped));
    }
    return OkStatus();
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m, int& grouped) {
    Value* q = m.value("q");
    Value* kt = m.value("kt");
    Value* v = m.value("v");
    Value* scores = m.node("qk")->output(0);
    for (Value* x : {q, kt, v, scores}) {
      if (!x->has_shape() || x->shape().size() < 2 || !IsFloat(x->dtype())) return;
    }
    size_t rank = kt->shape().size();
    if (q->shape().size() != rank || v->shape().size() != rank) return;
    // Heads the target's fused kernels cannot take stay unfused (their products run there).
    if (const int64_t limit = ctx.options().attention_max_head_dim; limit > 0) {
      for (const Dim& d : {q->shape().back(), v->shape().back()}) {
        if (d.is_static() && d.value() > limit) return;
      }
    }

    AttributeMap attrs;
    double scale = 1.0;
    if (m.has("scale_div")) {
      double c = *ConstantSplat(m.value("scale_div"));
      if (c == 0.0) return;  // x / 0 is not a scale; leave the graph as written
      scale = 1.0 / c;
    }
    if (m.has("scale_mul")) scale = *ConstantSplat(m.value("scale_mul"));
    if (m.has("q_scale")) scale *= *ConstantSplat(m.value("q_scale"));
    if (m.has("q_scale_div")) {
      const double c = *ConstantSplat(m.value("q_scale_div"));
      if (c == 0.0) return;
      scale /= c;  // DistilBERT: q / sqrt(d) before the product
    }
    if (m.has("k_scale")) {
      // A scale of higher rank than K^T would broadcast the scores to another shape.
      const Value* c = m.value("k_scale");
      if (!c->has_shape() || c->shape().size() > kt->shape().size()) return;
      scale *= *ConstantSplat(c);
    }
    attrs.Set("scale", static_cast<float>(scale));

    // Shifted windows: the leading scores dim N splits into [N/P, P] around the window mask.
    std::vector<int64_t> split;  // the rank + 1 dims of the windowed scores
    if (m.has("merge")) {
      // Shapes that follow from a shape input's values hold for the build's values only.
      for (const Value* x : {q, kt, v, scores}) {
        if (x->value_dependent()) return;
      }
      auto s4 = StaticDims(scores->shape());
      Value* s5 = m.node("split")->output(0);
      auto d5 = s5->has_shape() ? StaticDims(s5->shape()) : std::nullopt;
      Value* merged = m.node("merge")->output(0);
      auto back = merged->has_shape() ? StaticDims(merged->shape()) : std::nullopt;
      if (!s4 || !d5 || !back || *back != *s4 || d5->size() != rank + 1 ||
          (*d5)[0] * (*d5)[1] != (*s4)[0] ||
          !std::equal(d5->begin() + 2, d5->end(), s4->begin() + 1)) {
        return;
      }
      // A rank-`rank` first mask must not vary along N (it is aligned to [P, ...] in rank + 1).
      if (m.has("mask_add")) {
        const Value* m1 = m.value("mask");
        if (!m1->has_shape() || m1->shape().size() > rank ||
            (m1->shape().size() == rank && !(m1->shape()[0] == Dim(1)))) {
          return;
        }
      }
      const Value* m2 = m.value("window_mask");
      if (!m2->has_shape() || m2->shape().size() > rank + 1 || m2->dtype() != q->dtype()) return;
      split = *d5;
    }

    Value* mask = nullptr;
    std::string kind = "none";
    if (!split.empty()) {
      mask = m.value("window_mask");
      if (m.has("mask_add")) {
        Value* m1 = m.value("mask");
        if (m1->dtype() != q->dtype()) return;
        Value* sum = graph.AddValue(graph.UniqueName(m.root->name() + "_window_mask"), q->dtype());
        graph.AddNode("Add", graph.UniqueName(m.root->name() + "_window_mask_add"), {m1, mask},
                      {sum});
        ctx.stats().nodes_added += 1;
        mask = sum;
      }
      kind = "additive";
    } else if (m.has("mask_add2")) {
      Value* m1 = m.value("mask");
      Value* m2 = m.value("mask2");
      if (m1->dtype() != q->dtype() || m2->dtype() != q->dtype()) return;
      mask = graph.AddValue(graph.UniqueName(m.root->name() + "_mask_sum"), q->dtype());
      graph.AddNode("Add", graph.UniqueName(m.root->name() + "_mask_sum"), {m1, m2}, {mask});
      ctx.stats().nodes_added += 1;
      kind = "additive";
    } else if (m.has("mask_add")) {
      mask = m.value("mask");
      if (mask->dtype() != q->dtype()) return;
      kind = "additive";
      if (IsAdditiveCausal(mask, scores->shape())) {
        kind = "causal";  // the kernels skip the masked keys instead of adding -inf to them
        mask = nullptr;
      }
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
    if (!split.empty()) {
      RewriteWindowed(graph, ctx, m, split, {q, k, v}, mask, std::move(attrs));
      return;
    }
    if (RewriteGrouped(graph, ctx, m, q, k, v, mask, attrs)) {
      ++grouped;
      return;
    }
    std::vector<Value*> inputs = {q, k, v};
    if (mask) inputs.push_back(mask);
    ReplaceMatched(graph, ctx, m.matched, m.root, "Attention", std::move(inputs), std::move(attrs));
  }

  // Attention over rank + 1 views [N/P, P, ...] of Q, K and V, then a Reshape back to the
  // root's rank-`rank` output.
  static void RewriteWindowed(Graph& graph, PassContext& ctx, const Match& m,
                              const std::vector<int64_t>& split, std::vector<Value*> qkv,
                              Value* mask, AttributeMap attrs) {
    Value* out = m.root->output(0);
    auto out_dims = out->has_shape() ? StaticDims(out->shape()) : std::nullopt;
    if (!out_dims) return;
    std::vector<ViewOperand> operands;
    for (Value* x : qkv) {
      auto d = x->has_shape() ? StaticDims(x->shape()) : std::nullopt;
      if (!d || d->empty() || (*d)[0] != split[0] * split[1]) return;
      std::vector<int64_t> v = {split[0], split[1]};
      v.insert(v.end(), d->begin() + 1, d->end());
      operands.push_back({x, std::move(v)});
    }
    operands.push_back({mask, {}});
    FuseOnViews(graph, ctx, m, std::move(operands), *out_dims, std::move(attrs));
  }

  // Grouped-query attention: K and V repeated from KVH to H = KVH * n heads by repeat_kv,
  //   Reshape(Expand([..., KVH, 1, S, D] -> [..., KVH, n, S, D]) -> [..., H, S, D]),
  // run un-repeated: Attention on Q viewed as [..., KVH, n, Sq, D] against K and V as
  // [..., KVH, 1, Sk, D] (the Expand's input: its size-1 axis broadcasts), the mask given the same
  // head split, and the output viewed back as [..., H, Sq, Dv]. No copy of K or V is made.
  // False (nothing changed) when K and V are not both repeats of one grouping.
  static bool RewriteGrouped(Graph& graph, PassContext& ctx, const Match& m, Value* q, Value* k,
                             Value* v, Value* mask, AttributeMap attrs) {
    const size_t rank = q->shape().size();
    if (rank < 3) return false;
    const size_t a = rank - 3;  // the head axis
    auto kr = RepeatSource(k, a);
    auto vr = RepeatSource(v, a);
    // Multi-query attention: K and V of one head that broadcasts over Q's H heads are the group
    // of one, KVH = 1 and n = H, viewed [..., 1, 1, S, D] by an Unsqueeze.
    int64_t kv_unsqueeze = -1;
    if (!kr && !vr && k->has_shape() && v->has_shape() && k->shape().size() == rank &&
        v->shape().size() == rank && k->shape()[a] == Dim(1) && v->shape()[a] == Dim(1)) {
      auto h = q->shape()[a].static_value();
      if (!h || *h < 2) return false;
      kr = Repeat{k, 1, *h};
      vr = Repeat{v, 1, *h};
      kv_unsqueeze = static_cast<int64_t>(a) + 1;
    }
    if (!kr || !vr || kr->kv_heads != vr->kv_heads || kr->n_rep != vr->n_rep) return false;
    // The views bake static dims in; shapes that follow from a shape input's values hold for the
    // build's values only.
    for (const Value* x : {q, k, v, kr->source, vr->source, m.root->output(0), mask}) {
      if (x && x->value_dependent()) return false;
    }
    const int64_t kvh = kr->kv_heads, n = kr->n_rep;
    if (!(q->shape()[a] == Dim(kvh * n))) return false;
    auto grouped = [&](const Shape& s, size_t axis) {
      Shape g = s;
      g[axis] = Dim(kvh);
      g.insert(g.begin() + static_cast<std::ptrdiff_t>(axis) + 1, Dim(n));
      return g;
    };
    auto q_view = ReshapeTarget(grouped(q->shape(), a), a);
    Value* out = m.root->output(0);
    if (!q_view || !out->has_shape() || out->shape().size() != rank) return false;
    auto out_view = ReshapeTarget(out->shape(), a);
    if (!out_view) return false;
    std::vector<ViewOperand> operands = {
        {q, *q_view}, {kr->source, {}, kv_unsqueeze}, {vr->source, {}, kv_unsqueeze}};
    if (mask) {
      // A mask of rank >= 3 has a head axis: split like Q's (H) or given a size-1 axis (1).
      if (!mask->has_shape()) return false;
      const Shape& ms = mask->shape();
      if (ms.size() >= 3) {
        const size_t hm = ms.size() - 3;
        if (ms[hm] == Dim(1)) {
          // [..., 1, Sq, Sk] -> [..., 1, 1, Sq, Sk]: an Unsqueeze, whatever dims are dynamic.
          operands.push_back({mask, {}, static_cast<int64_t>(hm) + 1});
        } else if (ms[hm] == Dim(kvh * n)) {
          auto view = ReshapeTarget(grouped(ms, hm), hm);
          if (!view) return false;
          operands.push_back({mask, *view});
        } else {
          return false;
        }
      } else {
        operands.push_back({mask, {}});
      }
    }
    FuseOnViews(graph, ctx, m, std::move(operands), *out_view, std::move(attrs));
    return true;
  }

  // The un-repeated [..., KVH, 1, S, D] source of a value repeat_kv made, with the head axis at
  // `a`; nullopt when `x` is not Reshape(Expand(source)) in that form.
  struct Repeat {
    Value* source = nullptr;
    int64_t kv_heads = 0, n_rep = 0;
  };
  static std::optional<Repeat> RepeatSource(Value* x, size_t a) {
    Node* r = x->producer();
    if (!r || !IsOp(*r, OpType::kReshape) || !x->has_shape()) return std::nullopt;
    Value* expanded = r->input(0);
    Node* e = expanded ? expanded->producer() : nullptr;
    if (!e || !IsOp(*e, OpType::kExpand)) return std::nullopt;
    Value* src = e->input(0);
    if (!src || !src->has_shape() || !expanded->has_shape()) return std::nullopt;
    const Shape& xs = x->shape();
    const Shape& es = expanded->shape();
    const Shape& ss = src->shape();
    if (es.size() != xs.size() + 1 || ss.size() != es.size() || !(ss[a + 1] == Dim(1))) {
      return std::nullopt;
    }
    auto kvh = es[a].static_value();
    auto n = es[a + 1].static_value();
    if (!kvh || !n || *kvh <= 0 || *n <= 1 || !(xs[a] == Dim(*kvh * *n))) return std::nullopt;
    for (size_t i = 0; i < es.size(); ++i) {
      // The Expand repeats along the new axis only (a batch broadcast would be read wrongly).
      if (i != a + 1 && !(es[i] == ss[i])) return std::nullopt;
      if (i != a && i != a + 1 && !(xs[i < a ? i : i - 1] == es[i])) return std::nullopt;
    }
    return Repeat{src, *kvh, *n};
  }

  // Reshape targets for a view: static dims as themselves; a dynamic dim among the first
  // `copy_prefix` (where the input has the same dim at the same position) as 0, ONNX's "copy";
  // one other dynamic dim as -1. nullopt when more are dynamic or a dim is 0 (0 would copy).
  static std::optional<std::vector<int64_t>> ReshapeTarget(const Shape& s, size_t copy_prefix) {
    std::vector<int64_t> out;
    bool inferred = false;
    for (size_t i = 0; i < s.size(); ++i) {
      if (auto d = s[i].static_value()) {
        if (*d == 0) return std::nullopt;
        out.push_back(*d);
      } else if (i < copy_prefix) {
        out.push_back(0);
      } else if (!inferred) {
        inferred = true;
        out.push_back(-1);
      } else {
        return std::nullopt;
      }
    }
    return out;
  }

  // An Attention operand: the value and the Reshape target that makes its view, or the axis an
  // Unsqueeze inserts (neither: the value is used as it is).
  struct ViewOperand {
    Value* value = nullptr;
    std::vector<int64_t> view;
    int64_t unsqueeze_axis = -1;
  };

  // Attention over operands that are one rank higher than the match's (Q, K, V and the mask, if
  // any, each reshaped to its view where one is given), and a Reshape of its output to `out_view`
  // that takes the root's place.
  static void FuseOnViews(Graph& graph, PassContext& ctx, const Match& m,
                          std::vector<ViewOperand> operands, const std::vector<int64_t>& out_view,
                          AttributeMap attrs) {
    Value* out = m.root->output(0);
    auto shape_constant = [&](const std::vector<int64_t>& dims) {
      return AddLiteralConstant(
          graph, m.root->name() + "_view_shape",
          Tensor::FromVector(DataType::kInt64, {static_cast<int64_t>(dims.size())}, dims));
    };
    std::vector<Value*> inputs;
    for (const ViewOperand& o : operands) {
      if (!o.value) continue;
      if (o.view.empty() && o.unsqueeze_axis < 0) {
        inputs.push_back(o.value);
        continue;
      }
      Value* view = graph.AddValue(graph.UniqueName(o.value->name() + "_view"), o.value->dtype());
      if (o.view.empty()) {
        graph.AddNode("Unsqueeze", graph.UniqueName(m.root->name() + "_view"),
                      {o.value, shape_constant({o.unsqueeze_axis})}, {view});
      } else {
        graph.AddNode("Reshape", graph.UniqueName(m.root->name() + "_view"),
                      {o.value, shape_constant(o.view)}, {view});
      }
      ctx.stats().nodes_added += 1;
      inputs.push_back(view);
    }
    Value* y = graph.AddValue(graph.UniqueName(out->name() + "_view"), out->dtype());
    graph.AddNode("Attention", graph.UniqueName(m.root->name() + "_fused"), std::move(inputs), {y},
                  std::move(attrs));
    ctx.stats().nodes_added += 1;
    ReplaceMatched(graph, ctx, m.matched, m.root, "Reshape", {y, shape_constant(out_view)}, {});
  }
};

}  // namespace

std::unique_ptr<Pass> MakeAttentionFusionPass() { return std::make_unique<AttentionFusionPass>(); }

}  // namespace kiln::passes
