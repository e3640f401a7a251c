// Conv + BatchNormalization folding. Inference-mode BN is a per-channel affine map:
//   y = (c - mean) / sqrt(var + eps) * scale + bias  =  c * f + (bias - mean * f),
//   f = scale / sqrt(var + eps)
// so W'[oc, ...] = W[oc, ...] * f[oc] and B'[oc] = (B[oc] - mean[oc]) * f[oc] + bias[oc].
// For ConvTranspose the output channel is W's dim 1 within each group. Arithmetic is in double,
// stored in W's dtype.
#include <cmath>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

bool InferenceBatchNorm(const Node& bn) {
  if (attrs::BatchNormalization::training_mode(bn) != 0) return false;
  for (size_t i = 1; i < bn.num_outputs(); ++i) {
    Value* v = bn.output(i);
    if (v && (v->is_graph_output() || !v->consumers().empty())) return false;
  }
  return true;
}

bool ConstantBiasOrNone(const Node& conv) {
  // A layer with a QDQ model's INT8 scales keeps the model's integer weights: BN stays an op.
  if (HasModelInt8Attrs(conv)) return false;
  Value* b = conv.input(2);
  return !b || b->is_constant();
}

Pattern ConvBnPattern() {
  using namespace pat;
  Pattern conv = Op(std::vector<std::string>{"Conv", "ConvTranspose"}, {Any("x"), Constant("w")})
                     .Capture("conv")
                     .Where(ConstantBiasOrNone);
  return Op("BatchNormalization",
            {conv, Constant("scale"), Constant("bias"), Constant("mean"), Constant("var")})
      .Capture("bn")
      .Where(InferenceBatchNorm);
}

constexpr std::string_view kFoldOp = "ConvBatchNormFold";

// The weight op: inputs W, scale, bias, mean, var and the conv's bias (optional); attributes
// transpose, group, epsilon; outputs W' and B' in W's dtype. The pass checked the sizes.
StatusOr<std::vector<Tensor>> FoldConvBatchNorm(const AttributeMap& a,
                                                std::span<const Tensor* const> in) {
  if (in.size() != 6 || !in[0] || !in[1] || !in[2] || !in[3] || !in[4] ||
      in[0]->dims().size() < 2) {
    return MakeError(ErrorCode::kInternal, "{}: needs W, scale, bias, mean and var", kFoldOp);
  }
  const Tensor& w = *in[0];
  const bool transpose = a.GetInt("transpose", 0) != 0;
  const int64_t group = a.GetInt("group", 1);
  const double eps = a.GetFloat("epsilon", 1e-5f);
  const int64_t out_channels = transpose ? w.dims()[1] * group : w.dims()[0];
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i] && in[i]->num_elements() != out_channels) {
      return MakeError(ErrorCode::kInternal, "{}: input {} has {} elements for {} channels",
                       kFoldOp, i, in[i]->num_elements(), out_channels);
    }
  }
  const Tensor &scale = *in[1], &bias = *in[2], &mean = *in[3], &var = *in[4];
  std::vector<double> f(out_channels), new_bias(out_channels);
  for (int64_t c = 0; c < out_channels; ++c) {
    f[c] = scale.GetDouble(c) / std::sqrt(var.GetDouble(c) + eps);
    double b = in[5] ? in[5]->GetDouble(c) : 0.0;
    new_bias[c] = (b - mean.GetDouble(c)) * f[c] + bias.GetDouble(c);
  }
  // W is [M, C/g, k...] for Conv and [C, M/g, k...] for ConvTranspose. An f32 W is read in
  // place and written once into the result.
  Tensor cast = w.dtype() == DataType::kFloat32 ? Tensor() : w.CastTo(DataType::kFloat32);
  const float* src = w.dtype() == DataType::kFloat32 ? w.data<float>() : cast.data<float>();
  Tensor w32(DataType::kFloat32, w.dims());
  float* wd = w32.mutable_data<float>();
  int64_t inner = 1;
  for (size_t i = 2; i < w.dims().size(); ++i) inner *= w.dims()[i];
  int64_t d0 = w.dims()[0], d1 = w.dims()[1];
  for (int64_t i = 0; i < d0; ++i) {
    for (int64_t j = 0; j < d1; ++j) {
      int64_t oc = transpose ? (i / (d0 / group)) * d1 + j : i;
      const int64_t at = (i * d1 + j) * inner;
      for (int64_t k = 0; k < inner; ++k) wd[at + k] = static_cast<float>(src[at + k] * f[oc]);
    }
  }
  std::vector<float> b32(new_bias.begin(), new_bias.end());
  std::vector<Tensor> out;
  // An f32 weight is already in its dtype: no second copy of what is most of a CNN's bytes.
  out.push_back(w.dtype() == DataType::kFloat32 ? std::move(w32) : w32.CastTo(w.dtype()));
  out.push_back(
      Tensor::FromVector<float>(DataType::kFloat32, {out_channels}, b32).CastTo(w.dtype()));
  return out;
}

const bool kFoldRegistered = RegisterWeightOp(std::string(kFoldOp), FoldConvBatchNorm);

class ConvBatchNormFoldingPass final : public Pass {
 public:
  std::string_view name() const override { return "conv_bn_folding"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = ConvBnPattern();
    for (Node* node : graph.nodes()) {
      if (node->is_dead() || !IsOp(*node, OpType::kBatchNormalization)) continue;
      auto m = MatchAt(pattern, node);
      if (m) {
        Fold(graph, ctx, *m);
      } else {
        FoldIntoProduct(graph, ctx, node);
      }
    }
    return OkStatus();
  }

 private:
  // BatchNormalization of a 2-D [M, C] product, or of a Flatten/Reshape to [M, C] of a product
  // [..., C] (LeViT's Linear then BatchNorm1d over the flattened tokens; BatchNorm1d after a
  // Linear in MLP heads): the per-column affine map goes into the product's weight columns and
  // bias, MatMul(A, W) [+ b] -> FusedMatMul(A, W * f, (b - mean) * f + beta), and the view, if
  // any, stays after it.
  static void FoldIntoProduct(Graph& graph, PassContext& ctx, Node* bn) {
    // A graph output keeps its name and producer (the fold would rename it).
    if (!InferenceBatchNorm(*bn) || bn->num_inputs() < 5 || bn->output(0)->is_graph_output()) {
      return;
    }
    for (int i = 1; i < 5; ++i) {
      if (!bn->input(i) || !bn->input(i)->is_constant()) return;
    }
    Value* x = bn->input(0);
    if (!x || !x->has_shape() || x->shape().size() != 2 || x->is_graph_output()) return;
    Node* view = x->producer();
    Value* prod_out = x;
    if (view && (IsOp(*view, OpType::kFlatten) || IsOp(*view, OpType::kReshape))) {
      prod_out = view->input(0);
      if (x->consumers().size() != 1) return;
    } else {
      view = nullptr;
    }
    Node* mm = prod_out ? prod_out->producer() : nullptr;
    if (!mm || prod_out->is_graph_output() || prod_out->consumers().size() != 1) return;
    const bool fused = IsOp(*mm, OpType::kFusedMatMul);
    if (!(fused || IsOp(*mm, OpType::kMatMul)) || HasModelInt8Attrs(*mm)) return;
    if (fused &&
        (mm->attrs().GetString("activation", "") != "" || mm->attrs().GetInt("transA", 0) != 0 ||
         mm->attrs().GetInt("transB", 0) != 0 || mm->attrs().GetFloat("alpha", 1.f) != 1.f)) {
      return;
    }
    Value* w = mm->input(1);
    Value* b = mm->num_inputs() > 2 ? mm->input(2) : nullptr;
    if (!w || !w->is_constant() || w->constant()->dims().size() != 2 ||
        w->constant()->dtype() != DataType::kFloat32 || (b && !b->is_constant())) {
      return;
    }
    const int64_t c = w->constant()->dims()[1];
    // The view keeps the product's last axis as the channels: [..., C] -> [M, C].
    if (!prod_out->has_shape() || prod_out->shape().empty() ||
        !(prod_out->shape().back() == Dim(c)) || !(x->shape()[1] == Dim(c))) {
      return;
    }
    for (int i = 1; i < 5; ++i) {
      if (bn->input(i)->constant()->num_elements() != c) return;
    }
    if (b && b->constant()->num_elements() != c) return;
    // The fold op's ConvTranspose layout with one group scales W's dim 1: the columns.
    AttributeMap fold;
    fold.Set("transpose", int64_t{1});
    fold.Set("group", int64_t{1});
    fold.Set("epsilon", attrs::BatchNormalization::epsilon(*bn));
    std::vector<Value*> made = DeriveConstants(
        graph, {w->name() + "_bnfold", mm->name() + "_bias_bnfold"}, std::string(kFoldOp), fold,
        {w, bn->input(1), bn->input(2), bn->input(3), bn->input(4), b});
    if (made.empty()) return;
    Value* y = graph.AddValue(graph.UniqueName(prod_out->name() + "_bn"), prod_out->dtype());
    if (fused) {
      graph.AddNode("FusedMatMul", graph.UniqueName(mm->name() + "_bn"),
                    {mm->input(0), made[0], made[1]}, {y}, mm->attrs());
    } else {
      // A MatMul and its bias Add: gemm_fusion then takes them with the activation after them
      // (LeViT's Hardswish).
      Value* p =
          graph.AddValue(graph.UniqueName(prod_out->name() + "_bn_product"), prod_out->dtype());
      graph.AddNode("MatMul", graph.UniqueName(mm->name() + "_bn"), {mm->input(0), made[0]}, {p});
      graph.AddNode("Add", graph.UniqueName(mm->name() + "_bn_bias"), {p, made[1]}, {y});
    }
    Value* out = bn->output(0);
    if (view) {
      graph.SetInput(view, 0, y);
      graph.ReplaceAllUses(out, x);
    } else {
      graph.ReplaceAllUses(out, y);
    }
    graph.RemoveNode(bn);
    graph.RemoveNode(mm);
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_removed += 2;
    ctx.stats().nodes_added += 1;
  }

  static void Fold(Graph& graph, PassContext& ctx, const Match& m) {
    Node* conv = m.node("conv");
    Node* bn = m.node("bn");
    const Tensor& w = *m.value("w")->constant();
    if (w.dims().size() < 2) return;
    bool transpose = IsOp(*conv, OpType::kConvTranspose);
    int64_t group = attrs::Conv::group(*conv);
    int64_t out_channels = transpose ? w.dims()[1] * group : w.dims()[0];
    auto scale = ConstantValues(m.value("scale"));
    auto bias = ConstantValues(m.value("bias"));
    auto mean = ConstantValues(m.value("mean"));
    auto var = ConstantValues(m.value("var"));
    std::optional<std::vector<double>> conv_bias;
    if (conv->input(2)) conv_bias = ConstantValues(conv->input(2));
    auto sized = [&](const std::optional<std::vector<double>>& v) {
      return v && static_cast<int64_t>(v->size()) == out_channels;
    };
    if (!sized(scale) || !sized(bias) || !sized(mean) || !sized(var)) return;
    if (conv->input(2) && !sized(conv_bias)) return;
    AttributeMap fold;
    fold.Set("transpose", int64_t{transpose ? 1 : 0});
    fold.Set("group", group);
    fold.Set("epsilon", attrs::BatchNormalization::epsilon(*bn));
    std::vector<Value*> inputs = {m.value("w"),    m.value("scale"), m.value("bias"),
                                  m.value("mean"), m.value("var"),   conv->input(2)};
    std::vector<Value*> made =
        DeriveConstants(graph, {m.value("w")->name() + "_bnfold", conv->name() + "_bias_bnfold"},
                        std::string(kFoldOp), fold, inputs);
    if (made.empty()) return;
    Value* new_w = made[0];
    Value* new_b = made[1];
    Node* folded = ReplaceMatched(graph, ctx, m.matched, bn, conv->op_type(),
                                  {m.value("x"), new_w, new_b}, conv->attrs());
    folded->set_name(graph.UniqueName(conv->name() + "_bn"));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeConvBatchNormFoldingPass() {
  return std::make_unique<ConvBatchNormFoldingPass>();
}

}  // namespace kiln::passes
