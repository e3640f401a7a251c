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
#include "kiln/ops/op_schema.h"
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
  for (size_t i = 0; i < ctx.num_outputs(); ++i) ctx.set_output(i, t, x);
  return OkStatus();
}

}  // namespace kiln
