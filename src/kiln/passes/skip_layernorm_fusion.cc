// Residual Add + normalization fusion (ONNX Runtime calls the results SkipLayerNormalization and
// SkipSimplifiedLayerNormalization):
//   s = Add(x, skip); y = LayerNormalization(s, scale, bias?)  -> SkipLayerNormalization
//   s = Add(x, skip); y = RMSNormalization(s, scale)           -> SkipRMSNormalization
// taking (x, skip, scale, bias?) and producing (y, s?), one pass over the activations instead of
// two. s stays an output when something else reads it (the residual stream of pre-norm
// transformers: GPT-2, Llama); post-LN models (BERT) read only y. Only same-shape Adds fuse: a
// broadcast Add is a bias (MatMul + bias, which the gemm fusion takes), not a residual.
#include <algorithm>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

Pattern SkipLayerNormPattern() {
  using namespace pat;
  // The Add may have other readers: its output then becomes the fused node's second output.
  Pattern sum = Op("Add", {Any("x"), Any("skip")}).Capture("add").Shared();
  return Op(std::vector<std::string>{"LayerNormalization", "RMSNormalization"}, {sum})
      .Capture("ln");
}

// Whether a value is read by anything (a node or the graph's outputs).
bool IsRead(const Value* v) { return v && (v->is_graph_output() || !v->consumers().empty()); }

class SkipLayerNormFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "skip_layernorm_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = SkipLayerNormPattern();
    return ForEachMatch(graph, pattern, RootOrder::kTopological, nullptr,
                        [&](const Match& m) { Rewrite(graph, ctx, m); });
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, const Match& m) {
    Node* ln = m.node("ln");
    Node* add = m.node("add");
    Value* x = m.value("x");
    Value* skip = m.value("skip");
    // The statistics outputs (Mean, InvStdDev) have no place in the fused op.
    for (size_t i = 1; i < ln->num_outputs(); ++i) {
      if (IsRead(ln->output(i))) return;
    }
    if (!x->has_shape() || !skip->has_shape() || !IsFloat(x->dtype()) ||
        x->dtype() != skip->dtype() || x->shape() != skip->shape()) {
      return;
    }
    Value* sum = add->output(0);
    Value* y = ln->output(0);
    if (!y || !sum || sum->dtype() != x->dtype()) return;
    if (IsOp(*ln, OpType::kRMSNormalization)) {
      // Scale is required; axis and epsilon carry over (FP32 statistics are RMSNormalization's
      // only stash_type).
      AttributeMap attrs;
      attrs.Set("axis", attrs::RMSNormalization::axis(*ln));
      attrs.Set("epsilon", attrs::RMSNormalization::epsilon(*ln));
      Fuse(graph, ctx, ln, add, "SkipRMSNormalization", {x, skip, ln->input(1)}, std::move(attrs));
      return;
    }
    // LayerNormalization's Scale is optional in kiln's IR; the fused op needs one (ones).
    Value* scale = ln->input(1);
    if (!scale) {
      std::vector<int64_t> norm_dims;
      int64_t rank = static_cast<int64_t>(x->shape().size());
      int64_t axis = attrs::LayerNormalization::axis(*ln);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis > rank) return;
      for (int64_t i = axis; i < rank; ++i) {
        auto d = x->shape()[i].static_value();
        if (!d) return;
        norm_dims.push_back(*d);
      }
      Tensor ones = Tensor::FromVector<float>(
          DataType::kFloat32, norm_dims,
          std::vector<float>(static_cast<size_t>(NumElements(norm_dims)), 1.f));
      scale = AddLiteralConstant(graph, ln->name() + "_scale", ones.CastTo(x->dtype()));
    }
    std::vector<Value*> inputs = {x, skip, scale};
    if (Value* bias = ln->input(2)) inputs.push_back(bias);
    AttributeMap attrs;
    attrs.Set("axis", attrs::LayerNormalization::axis(*ln));
    attrs.Set("epsilon", attrs::LayerNormalization::epsilon(*ln));
    Fuse(graph, ctx, ln, add, "SkipLayerNormalization", std::move(inputs), std::move(attrs));
  }

  // Replaces the norm and the Add with one `op_type` node producing (y, s?).
  static void Fuse(Graph& graph, PassContext& ctx, Node* norm, Node* add, const char* op_type,
                   std::vector<Value*> inputs, AttributeMap attrs) {
    Value* sum = add->output(0);
    // The sum stays an output when anything but the norm reads it.
    bool keep_sum = sum->is_graph_output();
    for (Node* c : sum->consumers()) keep_sum |= c != norm;
    std::vector<Value*> outputs = {norm->output(0)};
    if (keep_sum) outputs.push_back(sum);
    std::string name = graph.UniqueName(norm->name() + "_skip");
    // Removing both releases y and s; the fused node produces them (names and graph-output
    // marks stay with the values).
    graph.RemoveNode(norm);
    graph.RemoveNode(add);
    graph.AddNode(op_type, std::move(name), std::move(inputs), std::move(outputs),
                  std::move(attrs));
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_removed += 2;
    ctx.stats().nodes_added += 1;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeSkipLayerNormFusionPass() {
  return std::make_unique<SkipLayerNormFusionPass>();
}

}  // namespace kiln::passes
