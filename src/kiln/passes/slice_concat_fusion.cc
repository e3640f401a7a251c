// Slices read in place by the Concat they feed: Concat(axis a) whose inputs include Slices of a
// range of axis a only (step 1, constant bounds) becomes one ConcatSlices that reads each range
// where it lies, instead of copying every range out first and the copies again into the result.
// torch.roll exports as exactly this (Concat(x[..., s:, ...], x[..., :s, ...]) per rolled axis:
// Swin's shifted windows), and so do crops concatenated along their own axis. The Slices stay
// for any other reader. Runs late (after the layout pass), on the final axes.
#include <algorithm>
#include <limits>
#include <vector>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// The CUDA kernel's part limit (cuda_launch.h's kMaxConcatParts).
constexpr size_t kMaxParts = 32;

struct Part {
  Value* source = nullptr;
  int64_t start = 0, length = 0;
  bool sliced = false;
};

int64_t Normalized(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

// ONNX Slice's clamping of one bound against a dim of n (step 1).
int64_t ClampBound(int64_t v, int64_t n) {
  if (v < 0) v += n;
  return std::clamp<int64_t>(v, 0, n);
}

// `v` as a range of axis `axis` of another value: v = Slice(x, [b], [e], [axis]) with step 1.
std::optional<Part> SliceRange(const Value* v, int64_t axis, int64_t rank, const PassContext& ctx) {
  const Node* s = v->producer();
  if (!s || !IsOp(*s, OpType::kSlice) || s->num_outputs() != 1) return std::nullopt;
  Value* x = s->input(0);
  if (!x || !x->has_shape() || static_cast<int64_t>(x->shape().size()) != rank ||
      x->dtype() != v->dtype() || x->value_dependent()) {
    return std::nullopt;
  }
  for (size_t i = 1; i < s->num_inputs(); ++i) {
    if (s->input(i) && s->input(i)->value_dependent()) return std::nullopt;
  }
  auto starts = StaticInts(s->input(1), ctx);
  auto ends = StaticInts(s->input(2), ctx);
  if (!starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
  int64_t slice_axis = 0;
  if (s->num_inputs() > 3 && s->input(3)) {
    auto axes = StaticInts(s->input(3), ctx);
    if (!axes || axes->size() != 1) return std::nullopt;
    slice_axis = Normalized((*axes)[0], rank);
  }
  if (s->num_inputs() > 4 && s->input(4)) {
    auto steps = StaticInts(s->input(4), ctx);
    if (!steps || steps->size() != 1 || (*steps)[0] != 1) return std::nullopt;
  }
  const Dim& d = x->shape()[static_cast<size_t>(axis)];
  if (slice_axis != axis || !d.is_static()) return std::nullopt;
  const int64_t b = ClampBound((*starts)[0], d.value());
  const int64_t e = ClampBound((*ends)[0], d.value());
  return Part{x, b, std::max<int64_t>(0, e - b), true};
}

class SliceConcatFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "slice_concat_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    std::vector<Node*> nodes;  // a copy: the rewrite adds nodes
    for (Node* node : graph.nodes()) nodes.push_back(node);
    for (Node* node : nodes) {
      if (node->is_dead() || !IsOp(*node, OpType::kConcat) || node->num_inputs() > kMaxParts) {
        continue;
      }
      const Value* y = node->output(0);
      // Float data only: an integer Concat is usually a shape being computed (Concat of Slices
      // of Shape), whose values later shape rules read through Concat's dims-value rule.
      if (!y->has_shape() || y->value_dependent() || !IsFloat(y->dtype()) ||
          ctx.dims_value(y) != nullptr) {
        continue;
      }
      const int64_t rank = static_cast<int64_t>(y->shape().size());
      if (rank == 0) continue;
      const int64_t axis = Normalized(node->attrs().GetInt("axis", 0), rank);
      if (axis < 0 || axis >= rank) continue;
      std::vector<Part> parts;
      bool ok = true, any_slice = false;
      for (size_t i = 0; i < node->num_inputs() && ok; ++i) {
        Value* v = node->input(i);
        if (std::optional<Part> p = SliceRange(v, axis, rank, ctx)) {
          parts.push_back(*p);
          any_slice = true;
          continue;
        }
        ok = v->has_shape() && v->shape()[static_cast<size_t>(axis)].is_static();
        if (ok) parts.push_back({v, 0, v->shape()[static_cast<size_t>(axis)].value(), false});
      }
      if (!ok || !any_slice) continue;
      std::vector<Value*> inputs;
      std::vector<int64_t> starts, lengths;
      for (const Part& p : parts) {
        inputs.push_back(p.source);
        starts.push_back(p.start);
        lengths.push_back(p.length);
      }
      AttributeMap attrs;
      attrs.Set("axis", axis);
      attrs.Set("starts", starts);
      attrs.Set("lengths", lengths);
      ReplaceMatched(graph, ctx, {node}, node, "ConcatSlices", std::move(inputs), std::move(attrs));
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeSliceConcatFusionPass() {
  return std::make_unique<SliceConcatFusionPass>();
}

}  // namespace kiln::passes
