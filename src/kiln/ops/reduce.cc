// Shape rules for reductions (axes as an input, opset 18 form), ArgMax/ArgMin, Softmax,
// LogSoftmax, Hardmax, LpNormalization and LayerNormalization.
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

namespace {
Status Reduce(InferenceContext& ctx, bool float_only, bool allow_bool = false) {
  int64_t rank = static_cast<int64_t>(ctx.input_shape(0).size());
  DataType t = ctx.input_type(0);
  bool ok = float_only
                ? IsFloatingPoint(t)
                : (IsFloatingPoint(t) || IsInteger(t) || (allow_bool && t == DataType::kBool));
  if (!ok) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input type {} is not supported",
                     ToString(ctx.input_type(0)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t keepdims, IntAttr(ctx, "keepdims", 1));
  KILN_ASSIGN_OR_RETURN(int64_t noop, IntAttr(ctx, "noop_with_empty_axes", 0));
  std::vector<int64_t> axes;
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(axes, RequiredInts(ctx, 1, "axes"));
  }
  if (axes.empty() && noop) {
    ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
    return OkStatus();
  }
  std::vector<bool> reduce(rank, axes.empty());
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t n, Axis(ctx, a, rank));
    reduce[n] = true;
  }
  Shape out;
  for (int64_t i = 0; i < rank; ++i) {
    if (!reduce[i]) {
      out.push_back(ctx.input_shape(0)[i]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  ctx.set_output(0, ctx.input_type(0), out);
  return OkStatus();
}

Status ArgReduce(InferenceContext& ctx) {
  int64_t rank = static_cast<int64_t>(ctx.input_shape(0).size());
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  KILN_ASSIGN_OR_RETURN(int64_t keepdims, IntAttr(ctx, "keepdims", 1));
  KILN_RETURN_IF_ERROR(IntAttr(ctx, "select_last_index", 0).status());
  Shape out = ctx.input_shape(0);
  if (keepdims) {
    out[axis] = 1;
  } else {
    out.erase(out.begin() + axis);
  }
  ctx.set_output(0, DataType::kInt64, out);
  return OkStatus();
}

Status SoftmaxLike(InferenceContext& ctx) {
  if (!IsFloatingPoint(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input type {} is not a float type",
                     ToString(ctx.input_type(0)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, IntAttr(ctx, "axis", -1));
  KILN_RETURN_IF_ERROR(Axis(ctx, axis, static_cast<int64_t>(ctx.input_shape(0).size())).status());
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}
}  // namespace

Status InferReduceMean(InferenceContext& ctx) { return Reduce(ctx, false); }
Status InferReduceSum(InferenceContext& ctx) { return Reduce(ctx, false); }
Status InferReduceMax(InferenceContext& ctx) { return Reduce(ctx, false, true); }
Status InferReduceMin(InferenceContext& ctx) { return Reduce(ctx, false, true); }
Status InferReduceProd(InferenceContext& ctx) { return Reduce(ctx, false); }
Status InferReduceSumSquare(InferenceContext& ctx) { return Reduce(ctx, false); }
Status InferReduceL1(InferenceContext& ctx) { return Reduce(ctx, false); }
Status InferReduceL2(InferenceContext& ctx) { return Reduce(ctx, true); }
Status InferReduceLogSum(InferenceContext& ctx) { return Reduce(ctx, true); }
Status InferReduceLogSumExp(InferenceContext& ctx) { return Reduce(ctx, true); }
Status InferArgMax(InferenceContext& ctx) { return ArgReduce(ctx); }
Status InferArgMin(InferenceContext& ctx) { return ArgReduce(ctx); }
Status InferSoftmax(InferenceContext& ctx) { return SoftmaxLike(ctx); }
Status InferLogSoftmax(InferenceContext& ctx) { return SoftmaxLike(ctx); }
Status InferHardmax(InferenceContext& ctx) { return SoftmaxLike(ctx); }
Status InferLpNormalization(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t p, IntAttr(ctx, "p", attrs::LpNormalization::p_default()));
  if (p != 1 && p != 2) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "attribute 'p' is {}; it must be 1 or 2", p);
  }
  return SoftmaxLike(ctx);
}

Status InferLayerNormalization(InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  int64_t rank = static_cast<int64_t>(x.size());
  if (!IsFloat(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input type {} is not a float type",
                     ToString(ctx.input_type(0)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr,
                        IntAttr(ctx, "axis", attrs::LayerNormalization::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  KILN_ASSIGN_OR_RETURN(float eps,
                        FloatAttr(ctx, "epsilon", attrs::LayerNormalization::epsilon_default()));
  if (!(eps >= 0)) return ctx.Error(ErrorCode::kInvalidAttribute, "epsilon {} is negative", eps);
  Shape norm(x.begin() + axis, x.end());
  for (size_t i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    auto s = BroadcastShapes(norm, ctx.input_shape(i));
    if (!s.ok() || *s != norm) {
      return ctx.Error(ErrorCode::kShapeMismatch, "{} {} does not broadcast to normalized shape {}",
                       i == 1 ? "Scale" : "B", ToString(ctx.input_shape(i)), ToString(norm));
    }
  }
  ctx.set_output(0, ctx.input_type(0), x);
  Shape stat = x;
  for (int64_t i = axis; i < rank; ++i) stat[i] = 1;
  // stash_type float: the statistics are FP32 whatever X's storage.
  for (size_t i = 1; i < ctx.num_outputs(); ++i) ctx.set_output(i, DataType::kFloat32, stat);
  return OkStatus();
}

}  // namespace kiln
