// RMSNormalization: ONNX's op of opset 23, and what the RMSNorm fusion
// (src/kiln/passes/rms_norm_fusion.cc) makes of the decomposed form exporters emit for Llama's and
// T5's norms.
//
// RMSNormalization(X, Scale) -> Y
//   Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * Scale
// Attributes: axis (default -1), epsilon (default 1e-5), stash_type (1: FP32 statistics, the only
// kind kiln computes). Scale broadcasts to the normalized shape.
//
// SkipRMSNormalization(X, Skip, Scale) -> (Y, Sum?): kiln-internal residual Add fused into
// RMSNormalization by the skip-norm fusion (src/kiln/passes/skip_layernorm_fusion.cc):
//   Sum = X + Skip (one shape, no broadcasting); Y = RMSNormalization(Sum, Scale, axis, epsilon)
// The optional Sum is the residual stream of pre-norm decoders (Llama). Statistics are FP32 in
// every backend, over the FP32 sum (not over Sum rounded to the storage type).
#include "kiln/ops/op_schema.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

namespace {

// Scale (input `i`) is a float tensor that broadcasts to the normalized shape of x from `axis`.
Status CheckRmsScale(InferenceContext& ctx, const Shape& x, int64_t axis, size_t i) {
  if (!IsFloat(ctx.input_type(i))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "Scale type {} is not a float type",
                     ToString(ctx.input_type(i)));
  }
  Shape norm(x.begin() + axis, x.end());
  auto s = BroadcastShapes(norm, ctx.input_shape(i));
  if (!s.ok() || *s != norm) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "Scale {} does not broadcast to normalized shape {}",
                     ToString(ctx.input_shape(i)), ToString(norm));
  }
  return OkStatus();
}

}  // namespace

Status InferRMSNormalization(InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  if (!IsFloat(t)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "X type {} is not a float type", ToString(t));
  }
  const Shape& x = ctx.input_shape(0);
  int64_t rank = static_cast<int64_t>(x.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  KILN_ASSIGN_OR_RETURN(float eps, FloatAttr(ctx, "epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.Error(ErrorCode::kInvalidAttribute, "epsilon {} is negative", eps);
  KILN_ASSIGN_OR_RETURN(int64_t stash, IntAttr(ctx, "stash_type", 1));
  if (stash != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "stash_type {} is not supported (kiln computes the statistics in FP32, 1)",
                     stash);
  }
  KILN_RETURN_IF_ERROR(CheckRmsScale(ctx, x, axis, 1));
  ctx.set_output(0, t, x);
  return OkStatus();
}

Status InferSkipRMSNormalization(InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  const Shape& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, SkipNormAxis(ctx));
  KILN_RETURN_IF_ERROR(CheckRmsScale(ctx, x, axis, 2));
  for (size_t i = 0; i < ctx.num_outputs(); ++i) ctx.set_output(i, t, x);
  return OkStatus();
}

}  // namespace kiln
