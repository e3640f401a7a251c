// Shape rules of ops whose output dims follow from their input VALUES (docs/architecture.md,
// "Data-dependent shapes"): NonZero, Unique, Compress, NonMaxSuppression. Each such dim is a
// data-dependent symbol (InferenceContext::DataDependentDim) with an upper bound over the input
// dims; the kernel reports the value at run time.
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

Status InferNonZero(InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  // A scalar counts as one element of rank 1 (numpy's nonzero of a 0-d array).
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(x.size()));
  Dim n = ctx.DataDependentDim(0, 1, NumElements(x));
  ctx.set_output(0, DataType::kInt64, {Dim(rank), n});
  return OkStatus();
}

Status InferUnique(InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(int64_t sorted, IntAttr(ctx, "sorted", attrs::Unique::sorted_default()));
  if (sorted != 0 && sorted != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "sorted must be 0 or 1; got {}", sorted);
  }
  Shape y;
  Dim inverse_len;
  Dim bound;
  std::optional<int64_t> axis;
  if (ctx.attrs().Has("axis")) {
    KILN_ASSIGN_OR_RETURN(int64_t a, RequiredIntAttr(ctx, "axis"));
    KILN_ASSIGN_OR_RETURN(axis, Axis(ctx, a, static_cast<int64_t>(x.size())));
  }
  if (axis) {
    bound = x[*axis];
    inverse_len = x[*axis];
  } else {
    bound = NumElements(x);
    inverse_len = bound;
  }
  // One count for Y's axis, indices and counts: every output registers the same symbol.
  Dim n = ctx.DataDependentDim(0, 0, bound);
  if (axis) {
    y = x;
    y[*axis] = n;
  } else {
    y = {n};
  }
  ctx.set_output(0, ctx.input_type(0), y);
  for (size_t i : {size_t{1}, size_t{3}}) {
    if (i < ctx.num_outputs()) {
      ctx.output(i).data_dependent = ctx.output(0).data_dependent;
      ctx.set_output(i, DataType::kInt64, {n});
    }
  }
  if (ctx.num_outputs() > 2) ctx.set_output(2, DataType::kInt64, {inverse_len});
  return OkStatus();
}

Status InferLoopGuard(InferenceContext& ctx) {
  const Shape& active = ctx.input_shape(0);
  if (ctx.input_type(0) != DataType::kBool || active.size() != 1 || !active[0].is_static() ||
      active[0].value() < 1) {
    return ctx.Error(ErrorCode::kShapeMismatch, "active must be a static bool[B+1]; got {} {}",
                     ToString(ctx.input_type(0)), ToString(active));
  }
  if (ctx.num_outputs() != ctx.num_inputs()) {
    return ctx.Error(ErrorCode::kInvalidModel, "{} input(s) but {} output(s); one state each",
                     ctx.num_inputs(), ctx.num_outputs());
  }
  ctx.set_output(0, DataType::kInt64, {ctx.DataDependentDim(0, 0, Dim(active[0].value() - 1))});
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    ctx.set_output(i, ctx.input_type(i), ctx.input_shape(i));
  }
  return OkStatus();
}

Status InferCompress(InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (ctx.input_type(1) != DataType::kBool) {
    return ctx.Error(ErrorCode::kTypeMismatch, "condition must be bool; got {}",
                     ToString(ctx.input_type(1)));
  }
  if (ctx.input_shape(1).size() != 1) {
    return ctx.Error(ErrorCode::kShapeMismatch, "condition must have rank 1; got {}",
                     ToString(ctx.input_shape(1)));
  }
  if (ctx.attrs().Has("axis")) {
    KILN_ASSIGN_OR_RETURN(int64_t a, RequiredIntAttr(ctx, "axis"));
    KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, a, static_cast<int64_t>(x.size())));
    Shape y = x;
    y[axis] = ctx.DataDependentDim(0, axis, x[axis]);
    ctx.set_output(0, ctx.input_type(0), y);
  } else {
    ctx.set_output(0, ctx.input_type(0), {ctx.DataDependentDim(0, 0, NumElements(x))});
  }
  return OkStatus();
}

Status InferNonMaxSuppression(InferenceContext& ctx) {
  const Shape& boxes = ctx.input_shape(0);
  const Shape& scores = ctx.input_shape(1);
  if (boxes.size() != 3 || scores.size() != 3) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "boxes must be [batch, boxes, 4] and scores [batch, classes, boxes]; got {} "
                     "and {}",
                     ToString(boxes), ToString(scores));
  }
  if (DimsEqual(boxes[2], Dim(4)) == false || DimsEqual(boxes[0], scores[0]) == false ||
      DimsEqual(boxes[1], scores[2]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "boxes {} and scores {} disagree (boxes [batch, boxes, 4], scores [batch, "
                     "classes, boxes])",
                     ToString(boxes), ToString(scores));
  }
  if (!IsFloat(ctx.input_type(0)) || ctx.input_type(1) != ctx.input_type(0)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "boxes and scores must be one float type; got {}/{}",
                     ToString(ctx.input_type(0)), ToString(ctx.input_type(1)));
  }
  KILN_ASSIGN_OR_RETURN(
      int64_t center,
      IntAttr(ctx, "center_point_box", attrs::NonMaxSuppression::center_point_box_default()));
  if (center != 0 && center != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "center_point_box must be 0 or 1; got {}",
                     center);
  }
  // At most max_output_boxes_per_class boxes per (batch, class) when that is a constant (a graph
  // input is read at run time: the bound is then every box).
  Dim per_class = boxes[1];
  if (ctx.has_input(2)) {
    // Only a real constant: a graph input's value is read by the kernel, never specialized on.
    if (const Tensor* k = ctx.input(2).constant;
        k && k->num_elements() == 1 && IsInteger(k->dtype())) {
      const int64_t kv = std::max<int64_t>(0, k->GetInt(0));
      // A symbolic box count bounds it (k may be INT64_MAX, exporters' "all"; a Min of a
      // symbol would stay opaque to the memory plan's bounds).
      per_class = boxes[1].is_static() ? Dim(std::min(kv, boxes[1].value())) : boxes[1];
    }
  } else {
    per_class = 0;  // the default max_output_boxes_per_class selects nothing
  }
  Dim n = ctx.DataDependentDim(0, 0, boxes[0] * scores[1] * per_class);
  ctx.set_output(0, DataType::kInt64, {n, Dim(3)});
  return OkStatus();
}

}  // namespace kiln
