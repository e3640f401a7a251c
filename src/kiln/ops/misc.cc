// Shape rules of assorted ONNX ops kiln runs on the CPU only (issue 21's block of ops.inc): Det,
// GroupNormalization, ReverseSequence, AffineGrid, TensorScatter, MaxUnpool, MatMulInteger,
// ConvInteger, DeformConv and RoiAlign.
#include <optional>

#include "kiln/ir/sizes.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

namespace {

using ops_internal::DimsEqual;
using ops_internal::IntAttr;

bool Is8Bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

// Runs a float shape rule on a view of the first `n` inputs with their types shown as f32, then
// sets output 0 to `out_type` (the integer ops' geometry is their float twin's).
Status InferAsFloat(InferenceContext& ctx, size_t n, Status (*rule)(InferenceContext&),
                    DataType out_type) {
  std::vector<ValueInfo> copies(n);
  std::vector<const ValueInfo*> view(n, nullptr);
  for (size_t i = 0; i < n && i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    copies[i] = ctx.input(i);
    copies[i].dtype = DataType::kFloat32;
    copies[i].constant = nullptr;  // a constant's bytes are of the real type
    view[i] = &copies[i];
  }
  std::vector<ValueInfo> outs(1);
  InferenceContext inner(ctx.node(), view, outs);
  KILN_RETURN_IF_ERROR(rule(inner));
  ctx.set_output(0, out_type, outs[0].shape);
  return OkStatus();
}

// A zero point (input i, optional): of the data's type, a scalar or a vector.
Status CheckZeroPoint(const InferenceContext& ctx, size_t i, size_t data) {
  if (!ctx.has_input(i)) return OkStatus();
  if (ctx.input_type(i) != ctx.input_type(data) || ctx.input_shape(i).size() > 1) {
    return ctx.Error(ErrorCode::kTypeMismatch,
                     "zero point (input {}) must be a scalar or vector of input {}'s type {}", i,
                     data, ToString(ctx.input_type(data)));
  }
  return OkStatus();
}

Status MatMulFloatView(InferenceContext& ctx) { return InferMatMulLike(ctx, false, false); }

}  // namespace

// Det(X [..., M, M]) -> [...].
Status InferDet(InferenceContext& ctx) {
  if (!IsFloatingPoint(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input has type {}; Det needs a float type",
                     ToString(ctx.input_type(0)));
  }
  const Shape& x = ctx.input_shape(0);
  if (x.size() < 2 || DimsEqual(x[x.size() - 1], x[x.size() - 2]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} must be [..., M, M]", ToString(x));
  }
  ctx.set_output(0, ctx.input_type(0), Shape(x.begin(), x.end() - 2));
  return OkStatus();
}

// GroupNormalization-21: X [N, C, ...], scale and bias [C]; num_groups divides C.
Status InferGroupNormalization(InferenceContext& ctx) {
  for (size_t i = 0; i < 3; ++i) KILN_RETURN_IF_ERROR(ops_internal::RequireFloat(ctx, i));
  const Shape& x = ctx.input_shape(0);
  if (x.size() < 2) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} must be [N, C, ...]", ToString(x));
  }
  if (!ctx.attrs().Has("num_groups")) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "num_groups is required");
  }
  KILN_ASSIGN_OR_RETURN(int64_t groups, IntAttr(ctx, "num_groups", 1));
  KILN_ASSIGN_OR_RETURN(int64_t stash, IntAttr(ctx, "stash_type", 1));
  if (stash != 1) {
    return ctx.Error(ErrorCode::kUnimplemented, "stash_type {} (kiln computes in float)", stash);
  }
  if (groups < 1 || (x[1].is_static() && x[1].value() % groups != 0)) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "num_groups {} does not divide {} channels",
                     groups, x[1].ToString());
  }
  for (size_t i = 1; i < 3; ++i) {
    const Shape& p = ctx.input_shape(i);
    if (p.size() != 1 || DimsEqual(p[0], x[1]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "input {} has shape {}; expected [{}]", i,
                       ToString(p), x[1].ToString());
    }
  }
  ctx.set_output(0, ctx.input_type(0), x);
  return OkStatus();
}

// ReverseSequence(input [.. batch, time ..], sequence_lens [batch]) -> input's shape.
Status InferReverseSequence(InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  KILN_ASSIGN_OR_RETURN(int64_t batch_axis, IntAttr(ctx, "batch_axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t time_axis, IntAttr(ctx, "time_axis", 0));
  if (x.size() < 2 || (batch_axis != 0 && batch_axis != 1) || (time_axis != 0 && time_axis != 1) ||
      batch_axis == time_axis) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "batch_axis {} and time_axis {} must be 0 and 1 (either order) of an input "
                     "of rank >= 2 ({})",
                     batch_axis, time_axis, ToString(x));
  }
  const Shape& lens = ctx.input_shape(1);
  if (!IsInteger(ctx.input_type(1)) || lens.size() != 1 ||
      DimsEqual(lens[0], x[static_cast<size_t>(batch_axis)]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch, "sequence_lens {} must be integers [{}]",
                     ToString(lens), x[static_cast<size_t>(batch_axis)].ToString());
  }
  ctx.set_output(0, ctx.input_type(0), x);
  return OkStatus();
}

// AffineGrid(theta [N, 2, 3] | [N, 3, 4], size [N, C, H, W] | [N, C, D, H, W]) -> grid
// [N, H, W, 2] | [N, D, H, W, 3].
Status InferAffineGrid(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(ops_internal::RequireFloat(ctx, 0));
  const Shape& theta = ctx.input_shape(0);
  auto size = ctx.input_dims_value(1);
  if (!size) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "size (input 1) must be a constant, computed from shapes or a shape input");
  }
  const size_t r = size->size() == 4 ? 2 : size->size() == 5 ? 3 : 0;
  if (r == 0 || theta.size() != 3 || DimsEqual(theta[1], Dim(int64_t(r))) == false ||
      DimsEqual(theta[2], Dim(int64_t(r + 1))) == false ||
      DimsEqual(theta[0], (*size)[0]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "theta {} must be [N, 2, 3] with a size of 4 values or [N, 3, 4] with 5",
                     ToString(theta));
  }
  Shape y = {theta[0]};
  for (size_t i = 2; i < size->size(); ++i) y.push_back((*size)[i]);
  y.push_back(Dim(int64_t(r)));
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

// TensorScatter(past_cache, update, write_indices [batch]?) -> past_cache's shape; update matches
// past_cache except along `axis` (not the batch axis 0), where it is not longer.
Status InferTensorScatter(InferenceContext& ctx) {
  const Shape& past = ctx.input_shape(0);
  const Shape& update = ctx.input_shape(1);
  const int64_t rank = static_cast<int64_t>(past.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, IntAttr(ctx, "axis", -2));
  KILN_ASSIGN_OR_RETURN(std::string mode, ops_internal::StringAttr(ctx, "mode", "linear"));
  if (mode != "linear" && mode != "circular") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "mode '{}' is not linear or circular", mode);
  }
  if (axis < 0) axis += rank;
  if (rank < 2 || axis < 1 || axis >= rank) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "axis must name a non-batch axis of {}",
                     ToString(past));
  }
  if (ctx.input_type(1) != ctx.input_type(0) || update.size() != past.size()) {
    return ctx.Error(ErrorCode::kTypeMismatch, "update {} must have past_cache's type and rank",
                     ToString(update));
  }
  for (int64_t i = 0; i < rank; ++i) {
    const Dim &p = past[static_cast<size_t>(i)], &u = update[static_cast<size_t>(i)];
    const bool bad = i == axis ? (p.is_static() && u.is_static() && u.value() > p.value())
                               : DimsEqual(p, u) == false;
    if (bad) {
      return ctx.Error(ErrorCode::kShapeMismatch, "update {} does not fit past_cache {} (axis {})",
                       ToString(update), ToString(past), axis);
    }
  }
  if (ctx.has_input(2)) {
    const Shape& w = ctx.input_shape(2);
    if (!IsInteger(ctx.input_type(2)) || w.size() != 1 || DimsEqual(w[0], past[0]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "write_indices {} must be integers [{}]",
                       ToString(w), past[0].ToString());
    }
  }
  ctx.set_output(0, ctx.input_type(0), past);
  return OkStatus();
}

// MaxUnpool(X [N, C, D...], I (X's shape, int64), output_shape?) -> output_shape, or the shape
// MaxPool's inverse gives: (D - 1) * stride - pads + kernel.
Status InferMaxUnpool(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(ops_internal::RequireFloat(ctx, 0));
  const Shape& x = ctx.input_shape(0);
  if (x.size() < 3 || ctx.input_type(1) != DataType::kInt64 ||
      ctx.input_shape(1).size() != x.size()) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "X {} must be [N, C, D...] and I int64 of its shape", ToString(x));
  }
  const size_t r = x.size() - 2;
  if (!ctx.attrs().Has("kernel_shape")) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "kernel_shape is required");
  }
  std::vector<int64_t> kernel = ctx.attrs().GetInts("kernel_shape");
  std::vector<int64_t> strides = ctx.attrs().GetInts("strides");
  std::vector<int64_t> pads = ctx.attrs().GetInts("pads");
  if (strides.empty()) strides.assign(r, 1);
  if (pads.empty()) pads.assign(2 * r, 0);
  if (kernel.size() != r || strides.size() != r || pads.size() != 2 * r) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "kernel_shape, strides and pads must have {}, {} and {} entries", r, r, 2 * r);
  }
  Shape inferred = {x[0], x[1]};
  for (size_t i = 0; i < r; ++i) {
    if (kernel[i] < 1 || kernel[i] > kMaxDim || strides[i] < 1 || strides[i] > kMaxDim ||
        pads[i] < 0 || pads[i + r] < 0 || pads[i] > kMaxDim || pads[i + r] > kMaxDim) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "kernel_shape and strides must be positive, pads not negative");
    }
    inferred.push_back((x[i + 2] - Dim(1)) * Dim(strides[i]) +
                       Dim(kernel[i] - pads[i] - pads[i + r]));
  }
  if (!ctx.has_input(2)) {
    ctx.set_output(0, ctx.input_type(0), std::move(inferred));
    return OkStatus();
  }
  auto shape = ctx.input_dims_value(2);
  if (!shape || shape->size() != x.size()) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "output_shape (input 2) must hold {} values known when the engine is built",
                     x.size());
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const Dim& d = (*shape)[i];
    const bool smaller =
        d.is_static() && inferred[i].is_static() && d.value() < inferred[i].value();
    if (smaller || (i < 2 && DimsEqual(d, x[i]) == false)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "output_shape {} is smaller than {}",
                       ToString(Shape(shape->begin(), shape->end())), ToString(inferred));
    }
  }
  ctx.set_output(0, ctx.input_type(0), Shape(shape->begin(), shape->end()));
  return OkStatus();
}

// MatMulInteger(A, B, a_zero_point?, b_zero_point?) of int8/uint8 -> int32 MatMul.
Status InferMatMulInteger(InferenceContext& ctx) {
  if (!Is8Bit(ctx.input_type(0)) || !Is8Bit(ctx.input_type(1))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "A and B must be int8 or uint8 (are {} and {})",
                     ToString(ctx.input_type(0)), ToString(ctx.input_type(1)));
  }
  KILN_RETURN_IF_ERROR(CheckZeroPoint(ctx, 2, 0));
  KILN_RETURN_IF_ERROR(CheckZeroPoint(ctx, 3, 1));
  return InferAsFloat(ctx, 2, MatMulFloatView, DataType::kInt32);
}

// ConvInteger(x, w, x_zero_point?, w_zero_point?) of int8/uint8 -> int32 Conv (no bias).
Status InferConvInteger(InferenceContext& ctx) {
  if (!Is8Bit(ctx.input_type(0)) || !Is8Bit(ctx.input_type(1))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "x and w must be int8 or uint8 (are {} and {})",
                     ToString(ctx.input_type(0)), ToString(ctx.input_type(1)));
  }
  KILN_RETURN_IF_ERROR(CheckZeroPoint(ctx, 2, 0));
  KILN_RETURN_IF_ERROR(CheckZeroPoint(ctx, 3, 1));
  if (ctx.has_input(2) && NumElements(ctx.input_shape(2)) != Dim(1)) {
    return ctx.Error(ErrorCode::kShapeMismatch, "x_zero_point must be a scalar");
  }
  return InferAsFloat(ctx, 2, InferConvLike, DataType::kInt32);
}

// DeformConv(X [N, C, H, W], W [M, C / group, kH, kW], offset [N, offset_group * kH * kW * 2, oH,
// oW], B [M]?, mask [N, offset_group * kH * kW, oH, oW]?) -> [N, M, oH, oW] (2-D only, as the
// spec's reference); the geometry is Conv's.
Status InferDeformConv(InferenceContext& ctx) {
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{4}}) {
    if (i == 0 || ctx.has_input(i)) KILN_RETURN_IF_ERROR(ops_internal::RequireFloat(ctx, i));
  }
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  if (x.size() != 4 || w.size() != 4 || !w[2].is_static() || !w[3].is_static()) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "kiln runs 2-D DeformConv: X {} must be [N, C, H, W] and W {} [M, C / "
                     "group, kH, kW] with a static kernel",
                     ToString(x), ToString(w));
  }
  KILN_ASSIGN_OR_RETURN(int64_t offset_group, IntAttr(ctx, "offset_group", 1));
  if (offset_group < 1 || (x[1].is_static() && x[1].value() % offset_group != 0)) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "offset_group {} does not divide {} channels",
                     offset_group, x[1].ToString());
  }
  KILN_RETURN_IF_ERROR(InferAsFloat(ctx, 2, InferConvLike, ctx.input_type(0)));
  const Shape y = ctx.output(0).shape;
  const int64_t taps = w[2].value() * w[3].value();
  const Shape& off = ctx.input_shape(2);
  if (off.size() != 4 || DimsEqual(off[0], x[0]) == false ||
      DimsEqual(off[1], Dim(offset_group * taps * 2)) == false ||
      DimsEqual(off[2], y[2]) == false || DimsEqual(off[3], y[3]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch, "offset {} must be [N, {}, {}, {}]", ToString(off),
                     offset_group * taps * 2, y[2].ToString(), y[3].ToString());
  }
  if (ctx.has_input(3)) {
    const Shape& b = ctx.input_shape(3);
    if (b.size() != 1 || DimsEqual(b[0], w[0]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "B {} must be [{}]", ToString(b),
                       w[0].ToString());
    }
  }
  if (ctx.has_input(4)) {
    const Shape& m = ctx.input_shape(4);
    if (m.size() != 4 || DimsEqual(m[1], Dim(offset_group * taps)) == false ||
        DimsEqual(m[2], y[2]) == false || DimsEqual(m[3], y[3]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "mask {} must be [N, {}, {}, {}]", ToString(m),
                       offset_group * taps, y[2].ToString(), y[3].ToString());
    }
  }
  return OkStatus();
}

// RoiAlign-16(X [N, C, H, W], rois [R, 4], batch_indices [R]) -> [R, C, output_height,
// output_width].
Status InferRoiAlign(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(ops_internal::RequireFloat(ctx, 0));
  if (!IsFloat(ctx.input_type(1))) {  // kept FP32 under reduced precision (a fixed input)
    return ctx.Error(ErrorCode::kTypeMismatch, "rois has type {}; a float type is required",
                     ToString(ctx.input_type(1)));
  }
  const Shape& x = ctx.input_shape(0);
  const Shape& rois = ctx.input_shape(1);
  const Shape& idx = ctx.input_shape(2);
  if (x.size() != 4 || rois.size() != 2 || DimsEqual(rois[1], Dim(4)) == false || idx.size() != 1 ||
      !IsInteger(ctx.input_type(2)) || DimsEqual(idx[0], rois[0]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "X {} must be [N, C, H, W], rois {} [R, 4] and batch_indices {} integers [R]",
                     ToString(x), ToString(rois), ToString(idx));
  }
  KILN_ASSIGN_OR_RETURN(int64_t oh, IntAttr(ctx, "output_height", 1));
  KILN_ASSIGN_OR_RETURN(int64_t ow, IntAttr(ctx, "output_width", 1));
  KILN_ASSIGN_OR_RETURN(int64_t ratio, IntAttr(ctx, "sampling_ratio", 0));
  KILN_ASSIGN_OR_RETURN(std::string mode, ops_internal::StringAttr(ctx, "mode", "avg"));
  KILN_ASSIGN_OR_RETURN(std::string ctm, ops_internal::StringAttr(
                                             ctx, "coordinate_transformation_mode", "half_pixel"));
  if (oh < 1 || ow < 1 || oh > kMaxDim || ow > kMaxDim || ratio < 0 ||
      (mode != "avg" && mode != "max") || (ctm != "half_pixel" && ctm != "output_half_pixel")) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "output_height/width must be positive, sampling_ratio not negative, mode avg "
                     "or max, coordinate_transformation_mode half_pixel or output_half_pixel");
  }
  ctx.set_output(0, ctx.input_type(0), {rois[0], x[1], Dim(oh), Dim(ow)});
  return OkStatus();
}

}  // namespace kiln
