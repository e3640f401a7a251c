// Shape rules for elementwise ops: unary ops keep their input's type and shape; binary ops
// broadcast.
#include "kiln/ops/op_schema.h"

namespace kiln {

namespace {
Status SameAsInput(InferenceContext& ctx) {
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}

Status Broadcast(InferenceContext& ctx) {
  if (ctx.input_type(0) != ctx.input_type(1)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "operand types differ: {} and {}",
                     ToString(ctx.input_type(0)), ToString(ctx.input_type(1)));
  }
  auto shape = BroadcastShapes(ctx.input_shape(0), ctx.input_shape(1));
  if (!shape.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", shape.status().message());
  ctx.set_output(0, ctx.input_type(0), *shape);
  return OkStatus();
}
}  // namespace

Status InferIdentity(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(SameAsInput(ctx));
  if (auto v = ctx.input_dims_value(0)) ctx.set_output_dims_value(0, *v);
  return OkStatus();
}
Status InferRelu(InferenceContext& ctx) { return SameAsInput(ctx); }
Status InferAdd(InferenceContext& ctx) { return Broadcast(ctx); }

}  // namespace kiln
