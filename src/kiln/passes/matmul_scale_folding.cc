// MatMul scale folding: a per-column scale after a matrix product with constant weights goes
// into the weights,
//   Mul(MatMul(A, B) [+ bias], gamma)  =>  MatMul(A, B * gamma) [+ bias * gamma]
// for MatMul, FusedMatMul, Gemm and FusedGemm without an activation, gamma a constant over the
// output's last axis ([N] or [1, ..., 1, N]) or a scalar. This is ConvNeXt's and CaiT's layer
// scale, and any other per-channel scale a model applies to a projection: one elementwise pass
// over the activation fewer. Only float32 weights are folded; the products are rounded once, as
// the unfused Mul would round them.
#include <fmt/format.h>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// The weight op: W * gamma along one axis of W (attribute `axis`, counted from the end: 1 is the
// last axis, 2 the one before), gamma a vector of that axis' length or a single value.
constexpr std::string_view kScaleOp = "ScaleAxis";

StatusOr<std::vector<Tensor>> ScaleAxis(const AttributeMap& a, std::span<const Tensor* const> in) {
  const int64_t from_end = a.GetInt("axis", 1);
  if (in.size() != 2 || !in[0] || !in[1] || in[0]->dtype() != DataType::kFloat32 ||
      in[1]->dtype() != DataType::kFloat32) {
    return MakeError(ErrorCode::kInternal, "{}: two float32 inputs", kScaleOp);
  }
  const Tensor& w = *in[0];
  const Tensor& g = *in[1];
  const auto& d = w.dims();
  if (from_end < 1 || from_end > static_cast<int64_t>(d.size())) {
    return MakeError(ErrorCode::kInternal, "{}: axis {} from the end of a rank-{} tensor", kScaleOp,
                     from_end, d.size());
  }
  const size_t axis = d.size() - static_cast<size_t>(from_end);
  const int64_t len = d[axis];
  if (g.num_elements() != len && g.num_elements() != 1) {
    return MakeError(ErrorCode::kInternal, "{}: {} scales for an axis of {}", kScaleOp,
                     g.num_elements(), len);
  }
  int64_t inner = 1;
  for (size_t i = axis + 1; i < d.size(); ++i) inner *= d[i];
  Tensor out(DataType::kFloat32, d);
  const float* src = w.data<float>();
  const float* scale = g.data<float>();
  float* dst = out.mutable_data<float>();
  const int64_t n = w.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = g.num_elements() == 1 ? 0 : (i / inner) % len;
    dst[i] = src[i] * scale[k];
  }
  std::vector<Tensor> result;
  result.push_back(std::move(out));
  return result;
}

const bool kScaleRegistered = RegisterWeightOp(std::string(kScaleOp), ScaleAxis);

bool IsProduct(OpType op) {
  return op == OpType::kMatMul || op == OpType::kFusedMatMul || op == OpType::kGemm ||
         op == OpType::kFusedGemm;
}

// A constant over the last axis of a rank-`rank` output with `n` columns: [n], [1, ..., 1, n] or
// a single value, of rank <= `rank`.
bool IsColumnScale(const Value* v, size_t rank, int64_t n) {
  if (!v || !v->is_constant() || v->dtype() != DataType::kFloat32) return false;
  const auto& d = v->constant()->dims();
  if (d.size() > rank) return false;
  if (v->constant()->num_elements() == 1) return true;
  for (size_t i = 0; i + 1 < d.size(); ++i) {
    if (d[i] != 1) return false;
  }
  return !d.empty() && d.back() == n;
}

class MatMulScaleFoldingPass final : public Pass {
 public:
  std::string_view name() const override { return "matmul_scale_folding"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    for (Node* mul : graph.nodes()) {
      if (mul->is_dead() || !IsOp(*mul, OpType::kMul) || mul->num_inputs() != 2) continue;
      Fold(graph, ctx, mul);
    }
    return OkStatus();
  }

 private:
  static void Fold(Graph& graph, PassContext& ctx, Node* mul) {
    Value* a = mul->input(0);
    Value* b = mul->input(1);
    Value* gamma = b->is_constant() ? b : a;
    Value* y = gamma == b ? a : b;
    Value* out = mul->output(0);
    if (!gamma->is_constant() || y->is_constant() || !y->has_shape() || !out->has_shape() ||
        !(y->shape() == out->shape()) || y->value_dependent() || y->shape().empty() ||
        !y->shape().back().is_static()) {
      return;
    }
    Node* m = y->producer();
    if (!m || m->is_dead() || !IsProduct(OpTypeOf(*m)) || y->is_graph_output() ||
        y->consumers().size() != 1) {
      return;
    }
    const OpType op = OpTypeOf(*m);
    if ((op == OpType::kFusedMatMul || op == OpType::kFusedGemm) &&
        m->attrs().GetString("activation", "none") != "none") {
      return;
    }
    // A layer with a QDQ model's INT8 scales keeps the model's integer weights.
    if (HasModelInt8Attrs(*m)) return;
    const int64_t n = y->shape().back().value();
    if (!IsColumnScale(gamma, y->shape().size(), n)) return;
    Value* w = m->input(1);
    if (!w || !w->is_constant() || w->dtype() != DataType::kFloat32 ||
        w->constant()->dims().size() < 2) {
      return;
    }
    // B's output-column axis: the last, or the one before under transB.
    const bool trans_b = op != OpType::kMatMul && m->attrs().GetInt("transB", 0) != 0;
    AttributeMap w_axis;
    w_axis.Set("axis", int64_t{trans_b ? 2 : 1});
    Value* bias = m->num_inputs() > 2 ? m->input(2) : nullptr;
    if (bias) {
      // The bias (Gemm's C) is scaled over its last axis, which must be the columns (or one value).
      if (!bias->is_constant() || bias->dtype() != DataType::kFloat32) return;
      const auto& bd = bias->constant()->dims();
      if (bias->constant()->num_elements() != 1 && (bd.empty() || bd.back() != n)) return;
      if (bias->constant()->num_elements() == 1 && gamma->constant()->num_elements() != 1) return;
    }
    Value* w2 =
        DeriveConstant(graph, w->name() + "_scaled", std::string(kScaleOp), w_axis, {w, gamma});
    if (!w2) return;
    std::vector<Value*> inputs = m->inputs();
    inputs[1] = w2;
    if (bias) {
      AttributeMap last;
      last.Set("axis", int64_t{1});
      Value* b2 = DeriveConstant(graph, bias->name() + "_scaled", std::string(kScaleOp), last,
                                 {bias, gamma});
      if (!b2) return;
      inputs[2] = b2;
    }
    std::string op_type = m->op_type();
    std::string name = m->name();
    AttributeMap attrs = m->attrs();
    graph.RemoveNode(mul);  // releases `out`, which the folded product now makes
    graph.RemoveNode(m);
    graph.AddNode(std::move(op_type), graph.UniqueName(name + "_scaled"), std::move(inputs), {out},
                  std::move(attrs));
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_removed += 2;
    ctx.stats().nodes_added += 1;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeMatMulScaleFoldingPass() {
  return std::make_unique<MatMulScaleFoldingPass>();
}

}  // namespace kiln::passes
