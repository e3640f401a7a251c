// QDQ fusion (explicit quantization): a Conv, Gemm or MatMul whose activation arrives through the
// model's QuantizeLinear -> DequantizeLinear and whose weight is a DequantizeLinear of a constant
// int8 tensor becomes one INT8 layer carrying the model's scales (ops/int8_layer.h):
//
//   Conv/Gemm/MatMul(DQ(Q(x, s, z), s, z), DQ(W_int8, s_w, 0), bias)
//     =>  Conv/Gemm/MatMul(x, DQ(W_int8, s_w, 0), bias) with s, z and s_w attached
//
// The layer reads x itself; its INT8 kernel quantizes x exactly as the Q did and uses the model's
// integer weights (the weight's DQ is left to constant folding, which makes it the float weight
// W_int8 * s_w; the kernel recovers the integers with s_w). A bias (float, or int32 through its own
// DQ) stays the layer's input and is folded the same way. Q/DQ pairs after the layer stay as ops.
// The pass runs before constant folding turns the weight's DQ into a plain constant (right after
// identity elimination, which removes the no-op Cast between Q and DQ of PyTorch's export).
//
// What it leaves alone (the layer then runs in float between its Q/DQ ops, literally, and a pass
// note says why): a per-axis activation scale, Q and DQ that disagree, 16-bit types, a weight that
// is not int8, a weight zero point other than 0, a per-axis weight scale on an axis other than the
// output channels, a MatMul B of rank other than 2, a float16 activation. A uint8 activation is
// taken: its zero point z is stored as z - 128 in the int8 domain, the same integers shifted.
#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

// A per-tensor (scale, zero point) of a Q or DQ node whose quantized side has type `quantized`,
// with the zero point moved into the int8 domain; or why it is not one kiln fuses.
struct TensorQuant {
  float scale = 0.f;
  int32_t zero_point = 0;
  bool operator==(const TensorQuant&) const = default;
};

StatusOr<TensorQuant> PerTensorQuant(const Node& n, DataType quantized) {
  const Value* s = n.input(1);
  const Value* z = n.input(2);
  if (!s || !s->constant()) return MakeError(ErrorCode::kUnimplemented, "its scale is computed");
  if (s->constant()->num_elements() != 1) {
    return MakeError(ErrorCode::kUnimplemented, "the activation is quantized per axis");
  }
  TensorQuant q;
  q.scale = static_cast<float>(s->constant()->GetDouble(0));
  if (!(std::isfinite(q.scale) && q.scale > 0.f)) {
    return MakeError(ErrorCode::kUnimplemented, "its scale is {}", q.scale);
  }
  if (quantized != DataType::kInt8 && quantized != DataType::kUInt8) {
    return MakeError(ErrorCode::kUnimplemented, "the activation is quantized to {}",
                     ToString(quantized));
  }
  if (z) {
    if (!z->constant() || z->constant()->num_elements() != 1) {
      return MakeError(ErrorCode::kUnimplemented, "its zero point is not one constant");
    }
    q.zero_point = static_cast<int32_t>(z->constant()->GetDouble(0));
  }
  if (quantized == DataType::kUInt8) q.zero_point -= 128;
  return q;
}

// Which axis of the weight holds the output channels, for the layer's op.
std::optional<int64_t> OutputChannelAxis(const Node& layer, const Tensor& w) {
  const int64_t rank = static_cast<int64_t>(w.dims().size());
  switch (OpTypeOf(layer)) {
    case OpType::kConv:
      return rank >= 3 ? std::optional<int64_t>(0) : std::nullopt;
    case OpType::kGemm:
      return rank == 2 ? std::optional<int64_t>(attrs::Gemm::transB(layer.attrs()) ? 0 : 1)
                       : std::nullopt;
    case OpType::kMatMul:
      return rank == 2 ? std::optional<int64_t>(1) : std::nullopt;
    default:
      return std::nullopt;
  }
}

// The weight's scales, one per output channel, from its DQ; or why it is not a weight kiln fuses.
StatusOr<std::vector<float>> WeightScales(const Node& layer, const Node& wdq) {
  const Value* wq = wdq.input(0);
  if (wq->dtype() != DataType::kInt8) {
    return MakeError(ErrorCode::kUnimplemented, "its weight is {}, not int8",
                     ToString(wq->dtype()));
  }
  std::optional<int64_t> axis = OutputChannelAxis(layer, *wq->constant());
  if (!axis) {
    return MakeError(ErrorCode::kUnimplemented, "its weight has rank {}",
                     wq->constant()->dims().size());
  }
  const std::vector<int64_t>& dims = wq->constant()->dims();
  const int64_t channels = dims[static_cast<size_t>(*axis)];
  if (const Value* z = wdq.input(2)) {
    std::optional<std::vector<double>> zs = ConstantValues(z);
    if (!zs) return MakeError(ErrorCode::kUnimplemented, "its weight zero point is computed");
    for (double v : *zs) {
      if (v != 0) {
        return MakeError(ErrorCode::kUnimplemented, "its weight zero point is {}, not 0", v);
      }
    }
  }
  const Value* s = wdq.input(1);
  std::optional<std::vector<double>> ss = s->constant() ? ConstantValues(s) : std::nullopt;
  if (!ss || ss->empty())
    return MakeError(ErrorCode::kUnimplemented, "its weight scale is computed");
  std::vector<float> scales;
  if (ss->size() == 1) {
    scales.assign(static_cast<size_t>(channels), static_cast<float>((*ss)[0]));
  } else {
    const int64_t rank = static_cast<int64_t>(dims.size());
    int64_t a = attrs::DequantizeLinear::axis(wdq.attrs());
    if (a < 0) a += rank;
    if (a != *axis || static_cast<int64_t>(ss->size()) != channels) {
      return MakeError(ErrorCode::kUnimplemented,
                       "its weight is quantized per axis {} ({} scales); the output channels are "
                       "axis {} ({})",
                       a, ss->size(), *axis, channels);
    }
    for (double v : *ss) scales.push_back(static_cast<float>(v));
  }
  for (float v : scales) {
    if (!(std::isfinite(v) && v > 0.f)) {
      return MakeError(ErrorCode::kUnimplemented, "a weight scale is {}", v);
    }
  }
  return scales;
}

StatusOr<ModelInt8Scales> LayerScales(const Match& m) {
  const Node& layer = *m.root;
  const Node& q = *m.node("q");
  const Node& dq = *m.node("dq");
  const Value* x = m.value("x");
  if (x->dtype() != DataType::kFloat32 || dq.output(0)->dtype() != DataType::kFloat32) {
    return MakeError(ErrorCode::kUnimplemented, "its activation is {}, not float32",
                     ToString(x->dtype()));
  }
  KILN_ASSIGN_OR_RETURN(TensorQuant qp, PerTensorQuant(q, q.output(0)->dtype()));
  KILN_ASSIGN_OR_RETURN(TensorQuant dp, PerTensorQuant(dq, dq.input(0)->dtype()));
  if (!(qp == dp) || q.output(0)->dtype() != dq.input(0)->dtype()) {
    return MakeError(ErrorCode::kUnimplemented,
                     "its QuantizeLinear (scale {}, zero point {}) and DequantizeLinear (scale {}, "
                     "zero point {}) disagree",
                     qp.scale, qp.zero_point, dp.scale, dp.zero_point);
  }
  ModelInt8Scales s;
  s.input_scale = qp.scale;
  s.input_zero_point = qp.zero_point;
  KILN_ASSIGN_OR_RETURN(s.weight_scales, WeightScales(layer, *m.node("wdq")));
  return s;
}

// The model initializer a constant is, or "" (refit checks the scales against it).
std::string InitializerName(const Value* v) {
  if (!v || !v->constant()) return "";
  WeightExprPtr e = ProvenanceOf(*v);
  return e && e->kind == WeightExpr::Kind::kInitializer ? e->name : "";
}

Pattern QdqLayerPattern() {
  using namespace pat;
  // Q and DQ may feed other readers too (one DQ read by a Conv and a residual Add): they stay for
  // those, and dead-node elimination removes them when the layers were their only readers.
  Pattern q = Op("QuantizeLinear", {Any("x"), Any()}).Capture("q").Shared();
  Pattern act = Op("DequantizeLinear", {q, Any()}).Capture("dq").Shared();
  Pattern w = Op("DequantizeLinear", {Constant("wq"), Any()}).Capture("wdq").Shared();
  return Op(std::vector<std::string>{"Conv", "Gemm", "MatMul"}, {act, w});
}

class QdqFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "qdq_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    static const Pattern pattern = QdqLayerPattern();
    return ForEachMatch(
        graph, pattern, RootOrder::kTopological,
        [](const Node& n) { return !HasModelInt8Attrs(n); },
        [&](const Match& m) {
          StatusOr<ModelInt8Scales> s = LayerScales(m);
          if (!s.ok()) {
            ctx.stats().notes.push_back(fmt::format("'{}' ({}) stays float between its Q/DQ: {}",
                                                    m.root->name(), m.root->op_type(),
                                                    s.status().message()));
            return;
          }
          s->sources = {InitializerName(m.node("q")->input(1)),
                        InitializerName(m.node("q")->input(2)),
                        InitializerName(m.node("wdq")->input(1))};
          SetModelInt8Attrs(*m.root, *s);
          graph.SetInput(m.root, 0, m.value("x"));
          ctx.stats().rewrites += 1;
        });
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQdqFusionPass() { return std::make_unique<QdqFusionPass>(); }

}  // namespace kiln::passes
