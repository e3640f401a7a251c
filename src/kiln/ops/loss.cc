// Shape rules for the loss ops (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss): class scores
// [N, C, d1..dk], integer targets [N, d1..dk], optional per-class weights [C].
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

namespace {
Status Loss(InferenceContext& ctx, const std::string& reduction_default) {
  const Shape& x = ctx.input_shape(0);
  const Shape& target = ctx.input_shape(1);
  if (!IsFloatingPoint(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "scores type {} is not a float type",
                     ToString(ctx.input_type(0)));
  }
  if (ctx.input_type(1) != DataType::kInt64 && ctx.input_type(1) != DataType::kInt32) {
    return ctx.Error(ErrorCode::kTypeMismatch, "target type {} must be int64 or int32",
                     ToString(ctx.input_type(1)));
  }
  if (x.size() < 2 || target.size() + 1 != x.size()) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "scores {} must be [N, C, d1..dk] and target {} [N, d1..dk]", ToString(x),
                     ToString(target));
  }
  for (size_t i = 0; i < target.size(); ++i) {
    const Dim& want = x[i == 0 ? 0 : i + 1];
    if (DimsEqual(target[i], want) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "target {} does not match scores {} at dim {}",
                       ToString(target), ToString(x), i);
    }
  }
  if (ctx.has_input(2)) {
    const Shape& w = ctx.input_shape(2);
    if (ctx.input_type(2) != ctx.input_type(0) || w.size() != 1 || DimsEqual(w[0], x[1]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "weight {} ({}) must be [C] = [{}] of type {}",
                       ToString(w), ToString(ctx.input_type(2)), x[1].ToString(),
                       ToString(ctx.input_type(0)));
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string reduction, StringAttr(ctx, "reduction", reduction_default));
  if (reduction != "none" && reduction != "sum" && reduction != "mean") {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "attribute 'reduction' is '{}'; it must be 'none', 'sum' or 'mean'",
                     reduction);
  }
  KILN_RETURN_IF_ERROR(IntAttr(ctx, "ignore_index", 0).status());
  ctx.set_output(0, ctx.input_type(0), reduction == "none" ? target : Shape{});
  return OkStatus();
}
}  // namespace

Status InferNegativeLogLikelihoodLoss(InferenceContext& ctx) {
  return Loss(ctx, attrs::NegativeLogLikelihoodLoss::reduction_default());
}

Status InferSoftmaxCrossEntropyLoss(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(Loss(ctx, attrs::SoftmaxCrossEntropyLoss::reduction_default()));
  // The optional second output: the log-probabilities, scores' shape.
  if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}

}  // namespace kiln
