// Conv + bias + residual + activation fusion (the ResNet block tail):
//   Conv(X, W, B?) -> Add(per-channel constant)? -> Add(Z of the output's shape)? -> act?
//   => FusedConv(X, W, B', Z?) with the activation as an attribute (kiln/ops/fused.h).
// A per-channel Add alone folds into Conv's own bias (the result stays a plain Conv). A zero Pad
// of the spatial axes before a Conv goes into the Conv's pads.
#include <algorithm>

#include "kiln/ir/sizes.h"
#include "kiln/ir/weight_program.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/activation.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

// The weight op: the extra bias plus the conv's own (optional), per channel, in the extra's dtype.
constexpr std::string_view kBiasSumOp = "ConvBiasSum";
StatusOr<std::vector<Tensor>> ConvBiasSum(const AttributeMap&, std::span<const Tensor* const> in) {
  if (in.size() != 2 || !in[0] || (in[1] && in[1]->num_elements() != in[0]->num_elements())) {
    return MakeError(ErrorCode::kInternal, "{}: two biases of one size", kBiasSumOp);
  }
  const Tensor& e = *in[0];
  const int64_t channels = e.num_elements();
  std::vector<float> sum(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    sum[c] = static_cast<float>(e.GetDouble(c) + (in[1] ? in[1]->GetDouble(c) : 0.0));
  }
  std::vector<Tensor> out;
  out.push_back(Tensor::FromVector<float>(DataType::kFloat32, {channels}, sum).CastTo(e.dtype()));
  return out;
}
const bool kBiasSumRegistered = RegisterWeightOp(std::string(kBiasSumOp), ConvBiasSum);

bool ConstantBiasOrNone(const Node& conv) { return !conv.input(2) || conv.input(2)->is_constant(); }

// Add(conv_out, c) where c is a constant over the channel axis ([C,1,1] or [1,C,1,1]).
bool ChannelBias(const Node& add) {
  Value* a = add.input(0);
  Value* b = add.input(1);
  if (!a || !b) return false;
  Value* bias = b->is_constant() ? b : a;
  Value* x = bias == b ? a : b;
  Value* out = add.output(0);
  if (!bias->is_constant() || x->is_constant() || !x->has_shape() || !out->has_shape() ||
      !(x->shape() == out->shape()) || x->value_dependent() || x->shape().size() < 3 ||
      bias->dtype() != x->dtype()) {
    return false;
  }
  const auto& dims = bias->constant()->dims();
  size_t rank = x->shape().size();
  if (dims.size() > rank || dims.size() < rank - 1) return false;
  size_t channel = 1 - (rank - dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i != channel && dims[i] != 1) return false;
  }
  return x->shape()[1] == Dim(dims[channel]);
}

bool SameShapeResidual(const Node& add) {
  Value* a = add.input(0);
  Value* b = add.input(1);
  Value* out = add.output(0);
  return a && b && a != b && a->has_shape() && b->has_shape() && out->has_shape() &&
         !a->value_dependent() && !b->value_dependent() && a->shape() == out->shape() &&
         b->shape() == out->shape() && a->dtype() == b->dtype();
}

Pattern ConvPattern() {
  using namespace pat;
  Pattern conv = Op("Conv", {Any("x"), Any("w")}).Capture("conv").Where(ConstantBiasOrNone);
  Pattern biased = Op("Add", {conv, Constant("cbias")}).Capture("bias_add").Where(ChannelBias);
  Pattern s1 = OneOf({biased, conv});
  Pattern res = Op("Add", {s1, Any("z")}).Capture("res_add").Where(SameShapeResidual);
  return OneOf({ActivationOver(OneOf({res, s1})), res, biased});
}

class ConvFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "conv_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = ConvPattern();
    for (Node* n : graph.nodes()) {
      if (!n->is_dead() && (IsOp(*n, OpType::kConv) || IsOp(*n, OpType::kFusedConv))) {
        FoldPad(graph, ctx, n);
      }
    }
    return ForEachMatch(graph, pattern, RootOrder::kFromOutputs, nullptr,
                        [&](const Match& m) { Fuse(graph, ctx, m); });
  }

 private:
  // Pad(x, pads) with zeros on the spatial axes only, read by the convolution alone, goes into
  // the convolution's own pads (TensorFlow-ported CNNs pad explicitly: HF's MobileNetV2, "same"
  // padding): one pass over the activation fewer.
  static void FoldPad(Graph& graph, PassContext& ctx, Node* conv) {
    Value* x = conv->input(0);
    Node* pad = x ? x->producer() : nullptr;
    if (!pad || !IsOp(*pad, OpType::kPad) || x->is_graph_output() || x->consumers().size() != 1 ||
        attrs::Pad::mode(*pad) != "constant" || attrs::Conv::auto_pad(*conv) != "NOTSET") {
      return;
    }
    Value* in = pad->input(0);
    if (!in || !in->has_shape() || in->shape().size() < 3) return;
    const size_t rank = in->shape().size();
    const Value* pv = pad->input(1);
    if (!pv || !pv->is_constant()) return;
    if (pad->num_inputs() > 2 && pad->input(2)) {
      std::optional<double> fill = ConstantSplat(pad->input(2));
      if (!fill || *fill != 0.0) return;
    }
    std::vector<int64_t> axes;
    if (pad->num_inputs() > 3 && pad->input(3)) {
      if (!pad->input(3)->is_constant()) return;
      axes = pad->input(3)->constant()->ToInt64Vector();
      for (int64_t& a : axes) a = a < 0 ? a + static_cast<int64_t>(rank) : a;
    } else {
      for (size_t i = 0; i < rank; ++i) axes.push_back(static_cast<int64_t>(i));
    }
    const std::vector<int64_t> pads = pv->constant()->ToInt64Vector();
    if (pads.size() != 2 * axes.size()) return;
    const size_t spatial = rank - 2;
    std::vector<int64_t> cp = attrs::Conv::pads(*conv);
    if (cp.empty()) cp.assign(2 * spatial, 0);
    if (cp.size() != 2 * spatial) return;
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = axes[i];
      const int64_t begin = pads[i], end = pads[i + axes.size()];
      if (a < 0 || a >= static_cast<int64_t>(rank) || begin < 0 || end < 0) return;
      if (a < 2) {
        if (begin != 0 || end != 0) return;  // batch or channels padded
        continue;
      }
      // A hostile model's pads must not wrap the sum: such a Pad stays.
      const std::optional<int64_t> b = CheckedAdd(cp[a - 2], begin);
      const std::optional<int64_t> e = CheckedAdd(cp[a - 2 + spatial], end);
      if (!b || !e) return;
      cp[a - 2] = *b;
      cp[a - 2 + spatial] = *e;
    }
    AttributeMap attrs = conv->attrs();
    attrs.Set("pads", cp);
    conv->mutable_attrs() = std::move(attrs);
    graph.SetInput(conv, 0, in);
    graph.RemoveNode(pad);
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_removed += 1;
  }

  static void Fuse(Graph& graph, PassContext& ctx, const Match& m) {
    Node* conv = m.node("conv");
    AttributeMap attrs = conv->attrs();
    if (!ActivationAttrs(m, attrs)) return;
    Value* z = m.value("z");
    // The residual must come from outside the fused nodes.
    if (z && z->producer() &&
        std::find(m.matched.begin(), m.matched.end(), z->producer()) != m.matched.end()) {
      return;
    }
    Value* b = conv->input(2);
    if (Value* extra = m.value("cbias")) {
      const Tensor& e = *extra->constant();
      int64_t channels = e.num_elements();
      if (b && b->constant()->num_elements() != channels) return;
      b = DeriveConstant(graph, conv->name() + "_bias_fused", std::string(kBiasSumOp), {},
                         {extra, b});
      if (!b) return;
    }
    bool fused = z || m.has("act");
    std::vector<Value*> inputs = {m.value("x"), m.value("w"), b};
    if (z) inputs.push_back(z);
    while (!inputs.empty() && !inputs.back()) inputs.pop_back();
    ReplaceMatched(graph, ctx, m.matched, m.root, fused ? "FusedConv" : "Conv", std::move(inputs),
                   std::move(attrs));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeConvFusionPass() { return std::make_unique<ConvFusionPass>(); }

}  // namespace kiln::passes
