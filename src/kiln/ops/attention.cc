// Attention: kiln-internal scaled dot-product attention, created by the attention fusion pass
// (src/kiln/passes/attention_fusion.cc), never imported.
//
// Attention(Q, K, V, mask?) -> Y
//   Q [..., Sq, D], K [..., Sk, D], V [..., Sk, Dv] (same rank, batch dims broadcast as MatMul's)
//   Y [..., Sq, Dv] = softmax(masked(scale * Q K^T), last axis) V
// Attributes:
//   scale      float (default 1/sqrt(D))
//   mask_kind  "none" (default): no mask input
//              "additive": mask (Q's dtype) broadcast to [..., Sq, Sk] is added to the scores
//              "boolean":  mask (bool) broadcast to [..., Sq, Sk]; false entries become mask_fill
//              "causal":   no mask input; key j is visible to query i iff j <= i + (Sk - Sq)
//   mask_fill  float, for "boolean" (default -inf)
// Softmax runs in FP32 with max subtraction in every backend.
#include "kiln/ops/op_schema.h"

namespace kiln {

Status InferAttention(InferenceContext& ctx) {
  std::string kind = ctx.attrs().GetString("mask_kind", "none");
  bool has_mask = ctx.has_input(3);
  if (kind == "none" || kind == "causal") {
    if (has_mask) {
      return ctx.Error(ErrorCode::kInvalidModel, "mask_kind '{}' takes no mask input", kind);
    }
  } else if (kind == "additive" || kind == "boolean") {
    if (!has_mask) {
      return ctx.Error(ErrorCode::kInvalidModel, "mask_kind '{}' needs a mask input", kind);
    }
  } else {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "mask_kind '{}' is not one of none, additive, boolean, causal", kind);
  }
  DataType t = ctx.input_type(0);
  if (!IsFloat(t) || ctx.input_type(1) != t || ctx.input_type(2) != t) {
    return ctx.Error(ErrorCode::kTypeMismatch, "Q, K, V must share one float type; got {}, {}, {}",
                     ToString(t), ToString(ctx.input_type(1)), ToString(ctx.input_type(2)));
  }
  const Shape& q = ctx.input_shape(0);
  const Shape& k = ctx.input_shape(1);
  const Shape& v = ctx.input_shape(2);
  size_t rank = q.size();
  if (rank < 2 || k.size() != rank || v.size() != rank) {
    return ctx.Error(ErrorCode::kShapeMismatch, "Q {}, K {}, V {} must have one rank >= 2",
                     ToString(q), ToString(k), ToString(v));
  }
  auto differ = [](const Dim& a, const Dim& b) {
    return a.is_static() && b.is_static() && !(a == b);
  };
  if (differ(q[rank - 1], k[rank - 1]) || differ(k[rank - 2], v[rank - 2])) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "Q {} and K {} need the same last dim, K and V the same Sk (V {})",
                     ToString(q), ToString(k), ToString(v));
  }
  Shape qb(q.begin(), q.end() - 2), kb(k.begin(), k.end() - 2), vb(v.begin(), v.end() - 2);
  auto batch = BroadcastShapes(qb, kb);
  if (batch.ok()) batch = BroadcastShapes(*batch, vb);
  if (!batch.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", batch.status().message());
  if (has_mask) {
    DataType mt = ctx.input_type(3);
    if ((kind == "additive" && mt != t) || (kind == "boolean" && mt != DataType::kBool)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "a {} mask must be {}, got {}", kind,
                       kind == "boolean" ? "bool" : ToString(t), ToString(mt));
    }
    Shape scores = *batch;
    scores.push_back(q[rank - 2]);
    scores.push_back(k[rank - 2]);
    auto joined = BroadcastShapes(scores, ctx.input_shape(3));
    if (!joined.ok() || joined->size() != scores.size()) {
      return ctx.Error(ErrorCode::kShapeMismatch, "mask {} does not broadcast to the scores {}",
                       ToString(ctx.input_shape(3)), ToString(scores));
    }
  }
  Shape out = *batch;
  out.push_back(q[rank - 2]);
  out.push_back(v[rank - 1]);
  ctx.set_output(0, t, std::move(out));
  return OkStatus();
}

}  // namespace kiln
