// Gemm/MatMul + bias + activation fusion:
//   MatMul(A, B) -> Add(bias over the last axis)? -> act?   => FusedMatMul(A, B, bias?)
//   Gemm(A, B, C?) -> Add(bias, when Gemm has no C)? -> act? => FusedGemm(A, B, C?)
//   FusedMatMul(A, B, bias?) without an activation -> act     => FusedMatMul with it
// with the activation as an attribute (kiln/ops/fused.h). At least a bias or an activation must
// be absorbed; a lone MatMul/Gemm stays as it is.
#include "kiln/ir/weight_program.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/passes/activation.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// The weight op: the input's bytes with other dims (attribute dims; same element count).
StatusOr<std::vector<Tensor>> ReshapeBytes(const AttributeMap& a,
                                           std::span<const Tensor* const> in) {
  std::vector<int64_t> dims = a.GetInts("dims");
  if (in.size() != 1 || !in[0] || NumElements(dims) != in[0]->num_elements()) {
    return MakeError(ErrorCode::kInternal, "{}: one input of {} elements", kReshapeBytesOp,
                     NumElements(dims));
  }
  // The same bytes under new dims, shared (a Tensor copy shares its storage; writes copy first).
  auto source = std::make_shared<const Tensor>(*in[0]);
  std::vector<Tensor> out;
  out.push_back(Tensor::Borrow(source->dtype(), std::move(dims), source->raw(), source));
  return out;
}
const bool kReshapeRegistered = RegisterWeightOp(std::string(kReshapeBytesOp), ReshapeBytes);

// Add(x, bias) where bias is a constant over the last axis ([N] or [1, ..., 1, N]) that does not
// change x's shape.
bool LastAxisBias(const Node& add) {
  Value* a = add.input(0);
  Value* b = add.input(1);
  if (!a || !b) return false;
  Value* bias = b->is_constant() ? b : a;
  Value* x = bias == b ? a : b;
  Value* out = add.output(0);
  if (!bias->is_constant() || x->is_constant() || !x->has_shape() || !out->has_shape() ||
      !(x->shape() == out->shape()) || x->value_dependent() || x->shape().empty() ||
      bias->dtype() != x->dtype()) {
    return false;
  }
  const auto& dims = bias->constant()->dims();
  if (dims.empty() || dims.size() > x->shape().size()) return false;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    if (dims[i] != 1) return false;
  }
  return x->shape().back() == Dim(dims.back());
}

bool GemmWithoutC(const Node& gemm) { return !gemm.input(2); }

// Add(gemm_out, C) that Gemm can take as its C: broadcastable to [M, N] without changing shape.
bool GemmBias(const Node& add) {
  Value* a = add.input(0);
  Value* b = add.input(1);
  if (!a || !b) return false;
  Value* bias = b->is_constant() ? b : a;
  Value* x = bias == b ? a : b;
  Value* out = add.output(0);
  return bias->is_constant() && !x->is_constant() && x->has_shape() && out->has_shape() &&
         x->shape() == out->shape() && bias->constant()->dims().size() <= 2 &&
         bias->dtype() == x->dtype();
}

Pattern MatMulPattern() {
  using namespace pat;
  Pattern mm = Op("MatMul", {Any("a"), Any("b")}).Capture("mm");
  Pattern biased = Op("Add", {mm, Constant("bias")}).Capture("add").Where(LastAxisBias);
  return OneOf({ActivationOver(OneOf({biased, mm})), biased});
}

// A FusedMatMul without an activation, then one: what the other passes leave when the product
// and its activation met only after them (views between them merged, a BatchNorm folded).
bool WithoutActivation(const Node& n) { return n.attrs().GetString("activation", "") == ""; }

Pattern FusedActivationPattern() {
  using namespace pat;
  return ActivationOver(
      Op("FusedMatMul", {Any("a"), Any("b")}).Capture("fmm").Where(WithoutActivation));
}

Pattern GemmPattern() {
  using namespace pat;
  Pattern g = Op("Gemm", {Any("a"), Any("b")}).Capture("gemm");
  Pattern biased =
      Op("Add", {g.Where(GemmWithoutC), Constant("bias")}).Capture("add").Where(GemmBias);
  Pattern body = OneOf({biased, g});
  // HF GPT-2's Conv1D: Gemm on [B*S, K], Reshape back to [B, S, N], then the activation. An
  // elementwise activation commutes with the Reshape, so it moves into the Gemm.
  Pattern reshaped = Op("Reshape", {body, Any("shape")}).Capture("reshape");
  return OneOf({ActivationOver(body), ActivationOver(reshaped), biased});
}

class GemmFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "gemm_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern matmul = MatMulPattern();
    static const Pattern gemm = GemmPattern();
    static const Pattern fused_act = FusedActivationPattern();
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* node = *it;
      if (node->is_dead()) continue;
      if (auto m = MatchAt(matmul, node)) {
        FuseMatMul(graph, ctx, *m);
      } else if (auto g = MatchAt(gemm, node)) {
        FuseGemm(graph, ctx, *g);
      } else if (auto f = MatchAt(fused_act, node)) {
        Node* fmm = f->node("fmm");
        AttributeMap attrs = fmm->attrs();
        if (!ActivationAttrs(*f, attrs)) continue;
        std::vector<Value*> inputs(fmm->inputs().begin(), fmm->inputs().end());
        ReplaceMatched(graph, ctx, f->matched, f->root, "FusedMatMul", std::move(inputs),
                       std::move(attrs));
      }
    }
    return OkStatus();
  }

 private:
  static void FuseMatMul(Graph& graph, PassContext& ctx, const Match& m) {
    AttributeMap attrs;
    if (!ActivationAttrs(m, attrs)) return;
    // A QDQ model's INT8 scales (qdq_fusion) go with the product into its fused form.
    const std::optional<ModelInt8Scales> int8 = ModelInt8ScalesOf(*m.node("mm"));
    std::vector<Value*> inputs = {m.value("a"), m.value("b")};
    if (Value* bias = m.value("bias")) {
      const Tensor& t = *bias->constant();
      if (t.dims().size() == 1) {
        inputs.push_back(bias);
      } else {
        AttributeMap flat;
        flat.Set("dims", std::vector<int64_t>{t.dims().back()});
        Value* b =
            DeriveConstant(graph, bias->name() + "_1d", std::string(kReshapeBytesOp), flat, {bias});
        if (!b) return;
        inputs.push_back(b);
      }
    }
    Node* fused = ReplaceMatched(graph, ctx, m.matched, m.root, "FusedMatMul", std::move(inputs),
                                 std::move(attrs));
    if (int8) SetModelInt8Attrs(*fused, *int8);
  }

  static void FuseGemm(Graph& graph, PassContext& ctx, const Match& m) {
    Node* gemm = m.node("gemm");
    AttributeMap attrs = gemm->attrs();
    if (!ActivationAttrs(m, attrs)) return;
    std::vector<Value*> inputs = {m.value("a"), m.value("b")};
    if (Value* bias = m.value("bias")) {
      inputs.push_back(bias);
      attrs.Set("beta", 1.0f);
    } else if (gemm->input(2)) {
      inputs.push_back(gemm->input(2));
    }
    if (Node* reshape = m.node("reshape")) {
      // FusedGemm -> the same Reshape, which keeps producing the root's output.
      Value* y =
          graph.AddValue(graph.UniqueName(gemm->name() + "_fused_out"), gemm->output(0)->dtype());
      graph.AddNode("FusedGemm", graph.UniqueName(gemm->name() + "_fused"), std::move(inputs), {y},
                    std::move(attrs));
      ctx.stats().nodes_added += 1;
      ReplaceMatched(graph, ctx, m.matched, m.root, "Reshape", {y, m.value("shape")},
                     reshape->attrs());
      return;
    }
    ReplaceMatched(graph, ctx, m.matched, m.root, "FusedGemm", std::move(inputs), std::move(attrs));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeGemmFusionPass() { return std::make_unique<GemmFusionPass>(); }

}  // namespace kiln::passes
