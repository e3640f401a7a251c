// SkipLayerNormalization: kiln-internal residual Add fused into LayerNormalization, created by the
// skip-layernorm fusion pass (src/kiln/passes/skip_layernorm_fusion.cc), never imported.
//
// SkipLayerNormalization(X, Skip, Scale, B?) -> (Y, Sum?)
//   Sum = X + Skip                      (X and Skip of one shape: no broadcasting)
//   Y   = LayerNormalization(Sum, Scale, B, axis, epsilon)
// Attributes: axis (default -1) and epsilon (default 1e-5), as LayerNormalization's.
// The optional Sum output is the residual stream when other layers read it (pre-LN transformers
// such as GPT-2); post-LN ones (BERT) leave it out. Statistics are FP32 in every backend, over the
// FP32 sum (not over Sum rounded to the storage type).
// On an INT8 or FP8 edge (ops/quant_edge.h) Y is int8 (kInt8OutputScaleAttr) or E4M3
// (kFp8OutputAmaxAttr), or an optional third output Yq holds a copy of Y (kInt8CopyScaleAttr,
// kFp8CopyAmaxAttr), each quantized by its contract from Y rounded to X's storage type.
#include "kiln/ops/op_schema.h"
#include "kiln/ops/quant_edge.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

Status InferSkipLayerNormalization(InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  const Shape& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, SkipNormAxis(ctx));
  Shape norm(x.begin() + axis, x.end());
  for (size_t i = 2; i < 4; ++i) {
    if (!ctx.has_input(i)) continue;
    if (!IsFloat(ctx.input_type(i))) {
      return ctx.Error(ErrorCode::kTypeMismatch, "{} type {} is not a float type",
                       i == 2 ? "Scale" : "B", ToString(ctx.input_type(i)));
    }
    auto s = BroadcastShapes(norm, ctx.input_shape(i));
    if (!s.ok() || *s != norm) {
      return ctx.Error(ErrorCode::kShapeMismatch, "{} {} does not broadcast to normalized shape {}",
                       i == 2 ? "Scale" : "B", ToString(ctx.input_shape(i)), ToString(norm));
    }
  }
  // Y is int8 or E4M3 where it is an INT8 or FP8 edge's value; Yq a copy's (ops/quant_edge.h).
  const Node& n = ctx.node();
  const DataType y = ProductOutputType(n, t);
  const DataType yq = QuantCopyType(n);
  if (ctx.num_outputs() > 2 && yq == DataType::kUndefined) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "output Yq needs {} or {}", kInt8CopyScaleAttr,
                     kFp8CopyAmaxAttr);
  }
  for (size_t i = 0; i < ctx.num_outputs(); ++i) ctx.set_output(i, i == 2 ? yq : i == 0 ? y : t, x);
  return OkStatus();
}

}  // namespace kiln
