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
//   rotary_embedding_dim r (0: D): only X's first r elements of the last axis rotate, as above
//   with D = r (h = r / 2) and Cos and Sin broadcasting to X's shape with last dim r; the other
//   D - r pass through unchanged (partial rotary: GPT-NeoX/Pythia, Phi, GPT-J).
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
  KILN_ASSIGN_OR_RETURN(int64_t rot, IntAttr(ctx, "rotary_embedding_dim", 0));
  const Shape& x = ctx.input_shape(0);
  if (x.empty()) return ctx.Error(ErrorCode::kShapeMismatch, "X is a scalar; it needs an axis");
  if (rot < 0 || rot % 2 != 0) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "rotary_embedding_dim is {}; it must be even and at least 0", rot);
  }
  // The rotated part of X: its whole last axis, or the first `rot` elements of it.
  Shape rotated = x;
  if (rot > 0) {
    if (x.back().is_static() && rot > x.back().value()) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "rotary_embedding_dim {} is larger than the last dim of X {}", rot,
                       ToString(x));
    }
    rotated.back() = Dim(rot);
  }
  if (rotated.back().is_static() && rotated.back().value() % 2 != 0) {
    return ctx.Error(ErrorCode::kShapeMismatch, "the last dim of X {} is odd; it must be even",
                     ToString(x));
  }
  for (size_t i = 1; i < 3; ++i) {
    auto s = BroadcastShapes(rotated, ctx.input_shape(i));
    if (!s.ok() || *s != rotated) {
      return ctx.Error(ErrorCode::kShapeMismatch, "{} {} does not broadcast to {} {}",
                       i == 1 ? "Cos" : "Sin", ToString(ctx.input_shape(i)),
                       rot > 0 ? "the rotated part of X" : "X", ToString(rotated));
    }
  }
  ctx.set_output(0, t, x);
  return OkStatus();
}

}  // namespace kiln
