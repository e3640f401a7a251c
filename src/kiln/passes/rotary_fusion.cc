// Rotary position embedding (RoPE) fusion: the form exporters write for Llama's, Mistral's and
// GPT-NeoX's apply_rotary_pos_emb,
//   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = Concat(-x[..., h:], x[..., :h], axis -1)
// (the halves two Slices of the last axis or one Split in two; the negation Neg or Mul by -1;
// h = D / 2), and GPT-J's interleaved form, where rotate(x) pairs (x[2i], x[2i+1]) as
//   Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., 0::2], -1), axis -1), x's shape)
// becomes RotaryEmbedding(x, cos, sin) (kiln-internal, src/kiln/ops/rotary.cc): one pass over x
// instead of seven kernels. The halves are recognised by their slice bounds and the shapes, never
// by names; cos and sin are any values that broadcast to x (constant tables or computed from
// position ids).
//
// Partial rotary (GPT-NeoX/Pythia, Phi, GPT-J rotate only the first r elements of each head):
//   Concat(RotaryEmbedding(x[..., :r], cos, sin), x[..., r:], axis -1)
// becomes RotaryEmbedding(x, cos, sin, rotary_embedding_dim = r): no Slice copies and no Concat.
#include <algorithm>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

Pattern Negated(const Pattern& p) {
  using namespace pat;
  return OneOf({Op("Neg", {p}), Op("Mul", {p, Scalar(-1.0, 1e-6)})});
}

bool TwoInputs(const Node& n) { return n.num_inputs() == 2; }

bool WholeRotary(const Node& n) {
  return n.num_inputs() == 3 && attrs::RotaryEmbedding::rotary_embedding_dim(n) == 0;
}

Pattern PartialRotaryPattern() {
  using namespace pat;
  Pattern x = Any("x");
  return Op("Concat",
            {Op("RotaryEmbedding", {Op("Slice", {x}).Capture("lo"), Any("cos"), Any("sin")})
                 .Capture("rope")
                 .Where(WholeRotary),
             Op("Slice", {x}).Capture("hi")})
      .Capture("cat")
      .Where(TwoInputs);
}

Pattern RotaryPattern() {
  using namespace pat;
  Pattern x = Any("x");
  Pattern lo = Op("Slice", {x}).Capture("lo");
  Pattern hi = Op("Slice", {x}).Capture("hi");
  Pattern split = Op("Split", {x}).Capture("split");
  Pattern rot = OneOf({
      Op("Concat", {Negated(hi), lo}).Capture("cat").Where(TwoInputs),
      Op("Concat", {Negated(split), split}).Capture("cat").Where(TwoInputs),
      Op("Reshape", {Op("Concat", {Op("Unsqueeze", {Negated(hi)}).Capture("unsq_hi"),
                                   Op("Unsqueeze", {lo}).Capture("unsq_lo")})
                         .Capture("stack")
                         .Where(TwoInputs)})
          .Capture("flatten"),
  });
  return Op("Add", {Op("Mul", {x, Any("cos")}).Capture("mul_cos"),
                    Op("Mul", {rot, Any("sin")}).Capture("mul_sin")});
}

// An axis attribute or value normalised against `rank`; nullopt when out of range.
std::optional<int64_t> NormAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return std::nullopt;
  return axis < 0 ? axis + rank : axis;
}

struct Range {
  int64_t start = 0, end = 0, step = 1;
};

// The static [start, end) and step (clamped as ONNX Slice does) of a Slice that cuts only the last
// axis of its rank-`rank` input, whose last dim is d; nullopt otherwise.
std::optional<Range> LastAxisSlice(const Node& s, int64_t rank, int64_t d, const PassContext& ctx) {
  // Bounds that follow from a shape input's values hold for the build's values only.
  for (size_t i = 1; i < s.num_inputs(); ++i) {
    if (s.input(i) && s.input(i)->value_dependent()) return std::nullopt;
  }
  auto starts = StaticInts(s.input(1), ctx);
  auto ends = StaticInts(s.input(2), ctx);
  if (!starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
  int64_t axis = 0;
  if (s.input(3)) {
    auto axes = StaticInts(s.input(3), ctx);
    if (!axes || axes->size() != 1) return std::nullopt;
    axis = (*axes)[0];
  } else if (rank != 1) {
    return std::nullopt;  // no axes: the one start is axis 0's
  }
  if (NormAxis(axis, rank) != rank - 1) return std::nullopt;
  Range r;
  if (s.input(4)) {
    auto steps = StaticInts(s.input(4), ctx);
    if (!steps || steps->size() != 1 || (*steps)[0] <= 0) return std::nullopt;
    r.step = (*steps)[0];
  }
  auto clamp = [d](int64_t v) { return std::clamp(v < 0 ? v + d : v, int64_t{0}, d); };
  r.start = clamp((*starts)[0]);
  r.end = clamp((*ends)[0]);
  return r;
}

bool SameShape(const Value* a, const Value* b) {
  return a && b && a->has_shape() && b->has_shape() && a->shape() == b->shape();
}

// A Concat of rank-`rank` operands along their last axis (axis is a required attribute).
bool ConcatsLastAxis(const Node& n, int64_t rank) {
  return n.attrs().Has("axis") && NormAxis(n.attrs().GetInt("axis", 0), rank) == rank - 1;
}

class RotaryFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "rotary_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = RotaryPattern();
    KILN_RETURN_IF_ERROR(ForEachMatch(graph, pattern, RootOrder::kTopological, nullptr,
                                      [&](const Match& m) { Rewrite(graph, ctx, m); }));
    static const Pattern partial = PartialRotaryPattern();
    return ForEachMatch(graph, partial, RootOrder::kTopological, nullptr,
                        [&](const Match& m) { RewritePartial(graph, ctx, m); });
  }

 private:
  // Concat(RotaryEmbedding(x[..., :r], cos, sin), x[..., r:]) on the last axis, the rotation's
  // result read by the Concat alone.
  static void RewritePartial(Graph& graph, PassContext& ctx, const Match& m) {
    Value* x = m.value("x");
    const Node* rope = m.node("rope");
    if (!x->has_shape() || x->shape().empty() || x->value_dependent()) return;
    const int64_t rank = static_cast<int64_t>(x->shape().size());
    auto d = x->shape().back().static_value();
    if (!d) return;
    const Value* rotated = rope->output(0);
    if (rotated->is_graph_output() || rotated->consumers().size() != 1) return;
    if (!SameShape(x, m.root->output(0)) || !ConcatsLastAxis(*m.root, rank)) return;
    auto lo = LastAxisSlice(*m.node("lo"), rank, *d, ctx);
    auto hi = LastAxisSlice(*m.node("hi"), rank, *d, ctx);
    if (!lo || !hi || lo->step != 1 || hi->step != 1 || lo->start != 0 || hi->start != lo->end ||
        hi->end != *d || lo->end <= 0 || lo->end >= *d || lo->end % 2 != 0) {
      return;
    }
    AttributeMap attrs;
    attrs.Set("interleaved", attrs::RotaryEmbedding::interleaved(*rope));
    attrs.Set("rotary_embedding_dim", lo->end);
    ReplaceMatched(graph, ctx, m.matched, m.root, "RotaryEmbedding",
                   {x, m.value("cos"), m.value("sin")}, std::move(attrs));
  }

  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m) {
    Value* x = m.value("x");
    Value* cos = m.value("cos");
    Value* sin = m.value("sin");
    if (!x->has_shape() || x->shape().empty() || !IsFloat(x->dtype())) return;
    if (x->value_dependent()) return;  // its last dim could differ at run time
    if (cos->dtype() != x->dtype() || sin->dtype() != x->dtype()) return;
    const int64_t rank = static_cast<int64_t>(x->shape().size());
    auto d = x->shape().back().static_value();
    if (!d || *d < 2 || *d % 2 != 0) return;
    const int64_t h = *d / 2;
    // Cos and sin broadcast to x: neither product (nor the sum) is larger than x.
    Value* y = m.root->output(0);
    if (!SameShape(x, y) || !SameShape(x, m.node("mul_cos")->output(0)) ||
        !SameShape(x, m.node("mul_sin")->output(0))) {
      return;
    }
    bool interleaved = m.has("flatten");
    if (interleaved) {
      if (!InterleavedHalves(m, rank, *d, ctx)) return;
    } else if (m.has("split")) {
      if (!SplitHalves(m, rank, *d, ctx)) return;
    } else {
      auto lo = LastAxisSlice(*m.node("lo"), rank, *d, ctx);
      auto hi = LastAxisSlice(*m.node("hi"), rank, *d, ctx);
      if (!lo || !hi || lo->step != 1 || hi->step != 1 || lo->start != 0 || lo->end != h ||
          hi->start != h || hi->end != *d) {
        return;
      }
    }
    if (!interleaved && !ConcatsLastAxis(*m.node("cat"), rank)) return;
    AttributeMap attrs;
    attrs.Set("interleaved", int64_t{interleaved ? 1 : 0});
    ReplaceMatched(graph, ctx, m.matched, m.root, "RotaryEmbedding", {x, cos, sin},
                   std::move(attrs));
  }

  // Split(x) into two equal halves of the last axis, Concat(-second, first).
  static bool SplitHalves(const Match& m, int64_t rank, int64_t d, const PassContext& ctx) {
    const Node& split = *m.node("split");
    const Node& cat = *m.node("cat");
    if (split.num_outputs() != 2 || NormAxis(attrs::Split::axis(split), rank) != rank - 1) {
      return false;
    }
    // Without sizes (the importer turns the old attribute into the input) it splits evenly.
    if (split.num_inputs() > 1 && split.input(1)) {
      if (split.input(1)->value_dependent()) return false;
      auto sizes = StaticInts(split.input(1), ctx);
      if (!sizes || *sizes != std::vector<int64_t>{d / 2, d / 2}) return false;
    }
    // The negated operand must be the second half and the other the first.
    const Node* neg = cat.input(0)->producer();
    return neg && neg->input(0) == split.output(1) && cat.input(1) == split.output(0);
  }

  // x[..., 1::2] negated and x[..., 0::2], each unsqueezed at the end, concatenated there and
  // reshaped back to x's shape.
  static bool InterleavedHalves(const Match& m, int64_t rank, int64_t d, const PassContext& ctx) {
    auto lo = LastAxisSlice(*m.node("lo"), rank, d, ctx);
    auto hi = LastAxisSlice(*m.node("hi"), rank, d, ctx);
    if (!lo || !hi || lo->step != 2 || hi->step != 2 || lo->start != 0 || hi->start != 1 ||
        lo->end < d - 1 || hi->end != d) {
      return false;
    }
    for (const char* u : {"unsq_lo", "unsq_hi"}) {
      auto axes = StaticInts(m.node(u)->input(1), ctx);
      if (!axes || axes->size() != 1 || NormAxis((*axes)[0], rank + 1) != rank) return false;
    }
    if (!ConcatsLastAxis(*m.node("stack"), rank + 1)) return false;
    return SameShape(m.value("x"), m.node("flatten")->output(0));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeRotaryFusionPass() { return std::make_unique<RotaryFusionPass>(); }

}  // namespace kiln::passes
