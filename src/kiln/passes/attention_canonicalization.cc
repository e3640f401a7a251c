// Attention canonicalization: the scores before a Softmax, as decoders' exports write them, put in
// the order attention_fusion matches (mask last, one additive mask):
//
//   Div|Mul(Where(c, s, f), k)  ->  Where(c, Div|Mul(s, k), f / k | f * k)
//     GPT-J scales after the causal Where; f and k are scalar constants, so the masked scores
//     keep a fill as negative as before.
//   Add(Where(c, s, f), m)      ->  Add(s, Add(Where(c, 0, f), m))
//     GPT-Neo and GPT-NeoX apply the causal Where, then add the padding mask: one additive mask,
//     computed once per layer (constants fold; common_subexpression merges the layers' twins).
//     Where c holds, s + 0 + m; elsewhere s + f + m, which equals f + m to FP32 rounding when f is
//     the very negative fill these exports use (-3.4e38: |s| is below its ulp).
//   Where(c, f, s)              ->  Where(Not(c), s, f)
//     DistilBERT fills the masked positions (c true) with f; an Expand of c to the scores' shape
//     goes (Where broadcasts).
//   Max(Add(s, m), L)           ->  Add(s, Max(m, L / 2))
//     OPT clamps the masked scores to the lowest float L. With the mask clamped to L / 2 instead,
//     no score plus mask overflows to -inf, and for scores below 1e30 in magnitude (their ulp
//     there is 1e31) a row masked whole is uniform, as OPT's.
//
// Only on the input of a Softmax over the last axis, s the output of a MatMul (possibly scaled),
// each rewritten value read only by the next step. The fusion then sees MatMul -> scale -> Add
// mask -> Softmax.
#include <fmt/format.h>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

// Very negative: a fill that masks a score (as attention_fusion's Where form requires).
constexpr double kMaskingFill = -1e4;

// The scores: a MatMul's output, possibly scaled by a scalar constant.
bool IsScores(const Value* s) {
  const Node* n = s->producer();
  if (n && (IsOp(*n, OpType::kDiv) || IsOp(*n, OpType::kMul)) && n->input(1) &&
      ConstantSplat(n->input(1))) {
    n = n->input(0) ? n->input(0)->producer() : nullptr;
  }
  return n && IsOp(*n, OpType::kMatMul);
}

// Where(c, s, f) with f a very negative scalar constant and s the scores: {c, s, f}.
struct MaskedScores {
  Node* where;
  double fill;
};
std::optional<MaskedScores> MaskedScoresOf(const Value* v) {
  Node* w = ProducerIf(v, OpType::kWhere);
  if (!w || w->num_inputs() != 3 || !w->input(1) || !w->input(2)) return std::nullopt;
  std::optional<double> fill = ConstantSplat(w->input(2));
  if (!fill || *fill > kMaskingFill || !IsFloat(w->input(1)->dtype()) ||
      w->input(2)->dtype() != w->input(1)->dtype() || !w->input(2)->has_shape() ||
      w->input(2)->shape().size() > 1 || !IsScores(w->input(1))) {
    return std::nullopt;
  }
  return MaskedScores{w, *fill};
}

Value* ScalarLike(Graph& graph, const Value* like, double x, const std::string& name) {
  Tensor t = Tensor::FromVector<float>(DataType::kFloat32, {}, {static_cast<float>(x)});
  if (like->dtype() != DataType::kFloat32) t = t.CastTo(like->dtype());
  // A literal: refit keeps it (a fill or scale that was a model initializer is checked unchanged).
  return AddLiteralConstant(graph, name, std::move(t));
}

class AttentionCanonicalizationPass final : public Pass {
 public:
  std::string_view name() const override { return "attention_canonicalization"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (Node* sm : order) {
      if (sm->is_dead() || !IsOp(*sm, OpType::kSoftmax) || !sm->input(0)) continue;
      Value* x = sm->input(0);
      if (!x->has_shape() || x->is_graph_output()) continue;
      const int64_t axis = attrs::Softmax::axis(*sm);
      if (axis != -1 && axis != static_cast<int64_t>(x->shape().size()) - 1) continue;
      // The fill's branch first, then the scale (it may sit under the Add), then the mask.
      if (Value* w = FillInTheFalseBranch(graph, ctx, x, sm)) {
        graph.SetInput(sm, 0, w);
        x = w;
      }
      if (Node* add = ProducerIf(x, OpType::kAdd)) {
        for (int i = 0; i < 2; ++i) {
          if (Value* scaled = ScaleAboveWhere(graph, ctx, add->input(i), add)) {
            graph.SetInput(add, i, scaled);
          }
        }
      } else if (Value* scaled = ScaleAboveWhere(graph, ctx, x, sm)) {
        graph.SetInput(sm, 0, scaled);
      }
      if (Value* sum = OneAdditiveMask(graph, ctx, sm->input(0), sm)) graph.SetInput(sm, 0, sum);
      if (Value* sum = ClampInTheMask(graph, ctx, sm->input(0), sm)) graph.SetInput(sm, 0, sum);
      // What the rewrites bypassed goes at once, so that attention_fusion, later in this
      // round, finds the scores read by the new chain alone (before gemm_fusion takes the
      // product after the Softmax, say).
      RemoveUnread(graph, ctx, bypassed_);
      bypassed_.clear();
    }
    return OkStatus();
  }

 private:
  std::vector<Node*> bypassed_;  // readers before what they read

  // Div|Mul(Where(c, s, f), k) read by `reader` alone -> Where(c, Div|Mul(s, k), f'). Returns the
  // new Where's output (the caller points `reader` at it), or null when `v` is not that form.
  Value* ScaleAboveWhere(Graph& graph, PassContext& ctx, Value* v, const Node* reader) {
    Node* d = v ? v->producer() : nullptr;
    if (!d || !(IsOp(*d, OpType::kDiv) || IsOp(*d, OpType::kMul)) || !ReadOnlyBy(v, reader)) {
      return nullptr;
    }
    Value* k = d->input(1);
    // A scale of higher rank than the scores would broadcast them to another shape.
    if (!k || !k->has_shape() || k->shape().size() > 1 || k->dtype() != v->dtype()) return nullptr;
    const std::optional<double> c = ConstantSplat(k);
    std::optional<MaskedScores> w = MaskedScoresOf(d->input(0));
    if (!c.has_value() || !w || !ReadOnlyBy(d->input(0), d)) return nullptr;
    const double scale = *c;
    const bool div = IsOp(*d, OpType::kDiv);
    if (div && scale == 0.0) return nullptr;
    const double fill = div ? w->fill / scale : w->fill * scale;
    if (!(fill <= kMaskingFill)) return nullptr;  // a negative scale would unmask
    Value* s = w->where->input(1);
    Value* scaled = graph.AddValue(graph.UniqueName(s->name() + "_scaled"), s->dtype());
    graph.AddNode(std::string(d->op_type()), graph.UniqueName(d->name() + "_before_mask"), {s, k},
                  {scaled});
    Value* out = graph.AddValue(graph.UniqueName(v->name() + "_masked"), v->dtype());
    graph.AddNode("Where", graph.UniqueName(w->where->name() + "_after_scale"),
                  {w->where->input(0), scaled, ScalarLike(graph, s, fill, d->name() + "_fill")},
                  {out});
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_added += 2;
    bypassed_.insert(bypassed_.end(), {d, w->where});  // dead once `reader` reads `out`
    return out;
  }

  // Where(c, f, s) read by `reader` alone, f a very negative scalar and s the scores (DistilBERT's
  // masked_fill of the masked positions) -> Where(Not(c'), s, f), c' being c without an Expand to
  // the scores' shape (Where broadcasts it there itself).
  Value* FillInTheFalseBranch(Graph& graph, PassContext& ctx, Value* v, const Node* reader) {
    Node* w = ProducerIf(v, OpType::kWhere);
    if (!w || w->num_inputs() != 3 || !ReadOnlyBy(v, reader)) return nullptr;
    Value* c = w->input(0);
    Value* f = w->input(1);
    Value* s = w->input(2);
    if (!c || !f || !s || c->dtype() != DataType::kBool || !IsScores(s) ||
        s->dtype() != v->dtype() || f->dtype() != v->dtype() || !f->has_shape() ||
        f->shape().size() > 1 || !s->has_shape() || !(s->shape() == v->shape())) {
      return nullptr;
    }
    std::optional<double> fill = ConstantSplat(f);
    if (!fill || *fill > kMaskingFill) return nullptr;
    if (Node* e = ProducerIf(c, OpType::kExpand);
        e && e->input(0) && e->input(0)->has_shape() && e->input(0)->dtype() == DataType::kBool &&
        e->input(0)->shape().size() <= v->shape().size()) {
      c = e->input(0);  // broadcasts to s's shape, which is the output's
    }
    Value* keep = graph.AddValue(graph.UniqueName(c->name() + "_keep"), DataType::kBool);
    graph.AddNode("Not", graph.UniqueName(w->name() + "_keep"), {c}, {keep});
    Value* out = graph.AddValue(graph.UniqueName(v->name() + "_masked"), v->dtype());
    graph.AddNode("Where", graph.UniqueName(w->name() + "_scores_kept"), {keep, s, f}, {out});
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_added += 2;
    bypassed_.push_back(w);
    return out;
  }

  // Max(Add(s, m), L) read by `reader` alone, L a very negative scalar constant (OPT clamps the
  // masked scores to the lowest float, so that a masked row of scores that overflowed to -inf
  // stays finite) -> Add(s, Max(m, L / 2)): the masked entries stay very negative, and no sum of
  // a score and the clamped mask reaches -inf, so a row masked whole is still uniform (for scores
  // below 1e30 in magnitude).
  Value* ClampInTheMask(Graph& graph, PassContext& ctx, Value* v, const Node* reader) {
    Node* mx = ProducerIf(v, OpType::kMax);
    if (!mx || mx->num_inputs() != 2 || !ReadOnlyBy(v, reader)) return nullptr;
    for (int c = 0; c < 2; ++c) {
      const Value* l = mx->input(c);
      std::optional<double> low = l ? ConstantSplat(l) : std::nullopt;
      Node* add = ProducerIf(mx->input(1 - c), OpType::kAdd);
      if (!low || *low > -1e30 || !l->has_shape() || l->shape().size() > 1 || !add ||
          add->num_inputs() != 2 || !ReadOnlyBy(add->output(0), mx)) {
        continue;
      }
      for (int i = 0; i < 2; ++i) {
        Value* s = add->input(i);
        Value* m = add->input(1 - i);
        if (!s || !m || !IsScores(s) || m->dtype() != v->dtype() || s->dtype() != v->dtype()) {
          continue;
        }
        Value* clamped = graph.AddValue(graph.UniqueName(m->name() + "_clamped"), m->dtype());
        graph.AddNode("Max", graph.UniqueName(mx->name() + "_mask"),
                      {m, ScalarLike(graph, m, *low / 2, mx->name() + "_half_lowest")}, {clamped});
        Value* out = graph.AddValue(graph.UniqueName(v->name() + "_biased"), v->dtype());
        graph.AddNode("Add", graph.UniqueName(add->name() + "_scores"), {s, clamped}, {out});
        ctx.stats().rewrites += 1;
        ctx.stats().nodes_added += 2;
        bypassed_.insert(bypassed_.end(), {mx, add});
        return out;
      }
    }
    return nullptr;
  }

  // Add(Where(c, s, f), m) read by `reader` alone -> Add(s, Add(Where(c, 0, f), m)).
  Value* OneAdditiveMask(Graph& graph, PassContext& ctx, Value* v, const Node* reader) {
    Node* add = ProducerIf(v, OpType::kAdd);
    if (!add || add->num_inputs() != 2 || !ReadOnlyBy(v, reader)) return nullptr;
    for (int i = 0; i < 2; ++i) {
      std::optional<MaskedScores> w = MaskedScoresOf(add->input(i));
      Value* m = add->input(1 - i);
      if (!w || !m || m->dtype() != v->dtype() || !ReadOnlyBy(add->input(i), add)) continue;
      Value* s = w->where->input(1);
      Value* gate = graph.AddValue(graph.UniqueName(add->name() + "_causal_mask"), s->dtype());
      graph.AddNode("Where", graph.UniqueName(w->where->name() + "_as_mask"),
                    {w->where->input(0), ScalarLike(graph, s, 0.0, add->name() + "_zero"),
                     w->where->input(2)},
                    {gate});
      Value* mask = graph.AddValue(graph.UniqueName(add->name() + "_mask"), s->dtype());
      graph.AddNode("Add", graph.UniqueName(add->name() + "_mask_sum"), {gate, m}, {mask});
      Value* out = graph.AddValue(graph.UniqueName(v->name() + "_biased"), v->dtype());
      graph.AddNode("Add", graph.UniqueName(add->name() + "_scores"), {s, mask}, {out});
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_added += 3;
      bypassed_.insert(bypassed_.end(), {add, w->where});
      return out;
    }
    return nullptr;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeAttentionCanonicalizationPass() {
  return std::make_unique<AttentionCanonicalizationPass>();
}

}  // namespace kiln::passes
