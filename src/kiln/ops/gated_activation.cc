// GatedActivation: kiln-internal, from the gated-activation fusion
// (src/kiln/passes/gated_activation_fusion.cc), never imported. The gated MLPs of Llama (SwiGLU),
// T5 v1.1 and Gemma (GeGLU):
//
// GatedActivation(A, B) -> Y          Y = act(A) * B, A and B of one shape (no broadcasting)
// GatedActivation(H) -> Y             H [..., 2n] (the gate and up projections side by side, from
//                                     one GEMM): Y [..., n] = act(H[..., :n]) * H[..., n:]
// Attributes: activation, activation_min, activation_max, as the fused ops' epilogues
// (kiln/ops/fused.h); activation is never "none".
#include "kiln/ops/fused.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

Status InferGatedActivation(InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  if (!IsFloat(t)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "A type {} is not a float type", ToString(t));
  }
  auto act = ParseFusedActivation(ctx.node().attrs());
  if (!act.ok()) return ctx.Error(act.status().code(), "{}", act.status().message());
  if (act->kind == FusedActivation::kNone) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "activation must not be none");
  }
  const Shape& a = ctx.input_shape(0);
  if (ctx.has_input(1)) {
    const Shape& b = ctx.input_shape(1);
    bool same = ctx.input_type(1) == t && a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = DimsEqual(a[i], b[i]).value_or(true);
    if (!same) {
      return ctx.Error(ErrorCode::kShapeMismatch, "B {} {} must have A's type and shape {} {}",
                       ToString(ctx.input_type(1)), ToString(b), ToString(t), ToString(a));
    }
    ctx.set_output(0, t, a);
    return OkStatus();
  }
  if (a.empty() || !a.back().is_static() || a.back().value() % 2 != 0) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "the packed input's last axis must be static and even; shape {}", ToString(a));
  }
  Shape y = a;
  y.back() = Dim(a.back().value() / 2);
  ctx.set_output(0, t, y);
  return OkStatus();
}

}  // namespace kiln
