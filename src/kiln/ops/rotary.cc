// RotaryEmbedding: kiln-internal rotary position embedding, created by the rotary fusion pass
// (src/kiln/passes/rotary_fusion.cc), never imported.
//
// RotaryEmbedding(X, Cos, Sin) -> Y
//   Y = X * Cos + rotate(X) * Sin, over the last axis of X (D elements, D even; h = D / 2):
//   interleaved 0 (default, "rotate half", Llama/GPT-NeoX):
//     rotate(X)[j] = -X[j + h] for j < h, X[j - h] for j >= h
//   interleaved 1 (GPT-J): rotate(X)[2i] = -X[2i + 1], rotate(X)[2i + 1] = X[2i]
//   Cos and Sin broadcast to X's shape (numpy rules; in practice [S, D] tables against
//   [B, H, S, D]); Y has X's shape and type. Every backend computes in FP32.
#include "kiln/ops/op_schema.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

Status InferRotaryEmbedding(InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  if (!IsFloat(t) || ctx.input_type(1) != t || ctx.input_type(2) != t) {
    return ctx.Error(ErrorCode::kTypeMismatch,
                     "X, Cos and Sin must share one float type; got {}, {}, {}", ToString(t),
                     ToString(ctx.input_type(1)), ToString(ctx.input_type(2)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t interleaved, IntAttr(ctx, "interleaved", 0));
  if (interleaved != 0 && interleaved != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "interleaved is {}; 0 or 1", interleaved);
  }
  const Shape& x = ctx.input_shape(0);
  if (x.empty()) return ctx.Error(ErrorCode::kShapeMismatch, "X is a scalar; it needs an axis");
  if (x.back().is_static() && x.back().value() % 2 != 0) {
    return ctx.Error(ErrorCode::kShapeMismatch, "the last dim of X {} is odd; it must be even",
                     ToString(x));
  }
  for (size_t i = 1; i < 3; ++i) {
    auto s = BroadcastShapes(x, ctx.input_shape(i));
    if (!s.ok() || *s != x) {
      return ctx.Error(ErrorCode::kShapeMismatch, "{} {} does not broadcast to X {}",
                       i == 1 ? "Cos" : "Sin", ToString(ctx.input_shape(i)), ToString(x));
    }
  }
  ctx.set_output(0, t, x);
  return OkStatus();
}

}  // namespace kiln
