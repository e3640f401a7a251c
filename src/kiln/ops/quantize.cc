// Shape rules of explicit quantization (QDQ models): QuantizeLinear and DequantizeLinear, per
// tensor, per axis or blockwise (block_size > 0: the scale has x's rank and
// ceil(x.shape[axis] / block_size) elements along the axis). Quantized types: (u)int8, (u)int16,
// and the storage-only (u)int4, (u)int2, float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ) and float4
// E2M1; DequantizeLinear also reads int32.
#include <cmath>
#include <optional>

#include "kiln/ops/onnx_dtype.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;  // NOLINT: the shape-rule helpers of this folder

namespace {

// What QuantizeLinear may produce.
bool IsQuantizeTarget(DataType t) {
  return t == DataType::kInt8 || t == DataType::kUInt8 || t == DataType::kInt16 ||
         t == DataType::kUInt16 || t == DataType::kInt4 || t == DataType::kUInt4 ||
         t == DataType::kInt2 || t == DataType::kUInt2 || IsFloat8(t) || t == DataType::kFloat4E2M1;
}
// What DequantizeLinear reads.
bool IsQuantizedType(DataType t) { return IsQuantizeTarget(t) || t == DataType::kInt32; }

// The blockwise scale: x's rank, x's dims except ceil(x.shape[axis] / block) along the axis.
Status CheckBlockedScale(const InferenceContext& ctx, int64_t axis_attr, int64_t block_size) {
  const Shape& x = ctx.input_shape(0);
  const Shape& scale = ctx.input_shape(1);
  if (block_size < 0) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "block_size is {}; it must be positive",
                     block_size);
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, static_cast<int64_t>(x.size())));
  bool ok = scale.size() == x.size();
  for (size_t d = 0; ok && d < x.size(); ++d) {
    if (static_cast<int64_t>(d) == axis) {
      if (x[d].is_static() && scale[d].is_static()) {
        ok = scale[d].value() == (x[d].value() + block_size - 1) / block_size;
      }
    } else {
      ok = DimsEqual(scale[d], x[d]) != false;
    }
  }
  if (!ok) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "blockwise quantization (block_size {}, axis {}): the scale has shape {}; "
                     "for input {} it must have the input's dims with ceil(dim / block_size) on "
                     "the axis",
                     block_size, axis, ToString(scale), ToString(x));
  }
  if (ctx.has_input(2) && ctx.input_shape(2) != scale) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "the zero point has shape {}; the scale has shape {}",
                     ToString(ctx.input_shape(2)), ToString(scale));
  }
  return OkStatus();
}

// The scale (input 1) and zero point (input 2): a scalar or one element for the whole tensor,
// or a 1-D tensor of x.shape[axis] elements; the zero point, when given, has the scale's shape
// and the quantized type.
Status CheckScaleAndZeroPoint(const InferenceContext& ctx, int64_t axis_attr, int64_t block_size,
                              DataType quantized) {
  const Shape& x = ctx.input_shape(0);
  const Shape& scale = ctx.input_shape(1);
  if (!IsFloat(ctx.input_type(1))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "the scale has type {}; it must be a float type",
                     ToString(ctx.input_type(1)));
  }
  if (ctx.has_input(2) && ctx.input_type(2) != quantized) {
    return ctx.Error(ErrorCode::kTypeMismatch, "the zero point has type {}; expected {}",
                     ToString(ctx.input_type(2)), ToString(quantized));
  }
  // Float8 has no zero point: the one given (the type's carrier) must be zero.
  if (IsFloat8(quantized) && ctx.has_input(2)) {
    if (const Tensor* z = ctx.input_constant(2)) {
      for (int64_t i = 0; i < z->num_elements(); ++i) {
        if (z->GetDouble(i) != 0) {
          return ctx.Error(ErrorCode::kInvalidQuantization,
                           "zero point element {} is {}; float8 quantization has no zero point "
                           "(it must be 0)",
                           i, z->GetDouble(i));
        }
      }
    }
  }
  if (block_size != 0) {
    KILN_RETURN_IF_ERROR(CheckBlockedScale(ctx, axis_attr, block_size));
  } else if (scale.size() > 1) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "the scale has shape {}; it must be a scalar or 1-D (per axis)",
                     ToString(scale));
  }
  // A constant scale must be finite and positive: zero, negative, infinite or NaN scales would
  // turn every value into a saturated or undefined one without any error.
  // (A graph input's values, even a shape input's, are not read: the scale is no shape operand.)
  if (const Tensor* s = ctx.input(1).constant) {
    for (int64_t i = 0; i < s->num_elements(); ++i) {
      const double v = s->GetDouble(i);
      if (!(std::isfinite(v) && v > 0)) {
        return ctx.Error(ErrorCode::kInvalidQuantization,
                         "scale element {} is {}; quantization scales must be finite and "
                         "positive",
                         i, v);
      }
    }
  }
  const bool per_axis =
      block_size == 0 && scale.size() == 1 && !(scale[0].is_static() && scale[0].value() == 1);
  if (per_axis) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, static_cast<int64_t>(x.size())));
    if (DimsEqual(scale[0], x[static_cast<size_t>(axis)]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "the per-axis scale has {} elements; axis {} of the input has {}",
                       scale[0].ToString(), axis, x[static_cast<size_t>(axis)].ToString());
    }
  }
  if (ctx.has_input(2) && block_size == 0) {
    // The same number of elements as the scale: one (a scalar or [1], in either) or one per
    // channel of the axis.
    const Shape& zp = ctx.input_shape(2);
    auto elements = [](const Shape& s) -> std::optional<int64_t> {
      if (s.empty()) return 1;
      if (s.size() == 1 && s[0].is_static()) return s[0].value();
      return std::nullopt;
    };
    const auto zn = elements(zp), sn = elements(scale);
    const bool same =
        zn && sn ? *zn == *sn
                 : zp.size() == 1 && scale.size() == 1 && DimsEqual(zp[0], scale[0]) != false;
    if (zp.size() > 1 || !same) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "the zero point has shape {}; the scale has shape {}", ToString(zp),
                       ToString(scale));
    }
  }
  return OkStatus();
}

}  // namespace

Status InferQuantizeLinear(InferenceContext& ctx) {
  const DataType x = ctx.input_type(0);
  if (!IsFloat(x) && x != DataType::kInt32) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input type {} is not float or int32", ToString(x));
  }
  KILN_ASSIGN_OR_RETURN(
      int64_t output_dtype,
      IntAttr(ctx, "output_dtype", attrs::QuantizeLinear::output_dtype_default()));
  DataType out = ctx.has_input(2) ? ctx.input_type(2) : DataType::kUInt8;
  if (output_dtype != 0) {
    auto t = DataTypeFromOnnx(output_dtype);
    if (!t || (ctx.has_input(2) && *t != ctx.input_type(2))) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "output_dtype is ONNX type {}; it must be a type kiln quantizes to, the "
                       "zero point's type when one is given",
                       output_dtype);
    }
    out = *t;
  }
  if (!IsQuantizeTarget(out)) {
    return ctx.Error(ErrorCode::kUnimplemented,
                     "quantizing to {} is not supported ((u)int8, (u)int16, (u)int4, (u)int2, "
                     "float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz and float4e2m1 are)",
                     ToString(out));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, IntAttr(ctx, "axis", attrs::QuantizeLinear::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t block,
                        IntAttr(ctx, "block_size", attrs::QuantizeLinear::block_size_default()));
  KILN_RETURN_IF_ERROR(CheckScaleAndZeroPoint(ctx, axis, block, out));
  ctx.set_output(0, out, ctx.input_shape(0));
  return OkStatus();
}

Status InferDequantizeLinear(InferenceContext& ctx) {
  const DataType x = ctx.input_type(0);
  if (!IsQuantizedType(x)) {
    return ctx.Error(ErrorCode::kTypeMismatch,
                     "input type {} is not supported ((u)int8, (u)int16, int32, (u)int4, (u)int2, "
                     "float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz and float4e2m1 are)",
                     ToString(x));
  }
  KILN_ASSIGN_OR_RETURN(
      int64_t output_dtype,
      IntAttr(ctx, "output_dtype", attrs::DequantizeLinear::output_dtype_default()));
  DataType out = ctx.input_type(1);
  if (output_dtype != 0) {
    auto t = DataTypeFromOnnx(output_dtype);
    if (!t || !IsFloat(*t)) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "output_dtype is ONNX type {}; it must be a float type kiln has",
                       output_dtype);
    }
    out = *t;
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis,
                        IntAttr(ctx, "axis", attrs::DequantizeLinear::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t block,
                        IntAttr(ctx, "block_size", attrs::DequantizeLinear::block_size_default()));
  KILN_RETURN_IF_ERROR(CheckScaleAndZeroPoint(ctx, axis, block, x));
  ctx.set_output(0, out, ctx.input_shape(0));
  return OkStatus();
}

// DynamicQuantizeLinear(x f32) -> (y u8, y_scale f32 scalar, y_zero_point u8 scalar).
Status InferDynamicQuantizeLinear(InferenceContext& ctx) {
  if (ctx.input_type(0) != DataType::kFloat32) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input type {} must be float32",
                     ToString(ctx.input_type(0)));
  }
  ctx.set_output(0, DataType::kUInt8, ctx.input_shape(0));
  ctx.set_output(1, DataType::kFloat32, Shape{});
  ctx.set_output(2, DataType::kUInt8, Shape{});
  return OkStatus();
}

// QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): MatMul's shapes on a and b
// (8-bit integers); the result has y_zero_point's type.
Status InferQLinearMatMul(InferenceContext& ctx) {
  for (size_t i : {0, 2, 3, 5, 7}) {
    const DataType t = ctx.input_type(i);
    if (t != DataType::kInt8 && t != DataType::kUInt8) {
      return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}; int8 or uint8 is required",
                       i, ToString(t));
    }
  }
  for (size_t i : {1, 4, 6}) {
    if (!IsFloat(ctx.input_type(i))) {
      return ctx.Error(ErrorCode::kTypeMismatch, "scale input {} has type {}; a float is required",
                       i, ToString(ctx.input_type(i)));
    }
  }
  Shape a = ctx.input_shape(0), b = ctx.input_shape(3);
  if (a.size() < 2 || b.size() < 2 || DimsEqual(a.back(), b[b.size() - 2]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch, "a {} and b {} are not matrices that multiply",
                     ToString(a), ToString(b));
  }
  auto batch = BroadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  if (!batch.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", batch.status().message());
  Shape y = *batch;
  y.push_back(a[a.size() - 2]);
  y.push_back(b.back());
  ctx.set_output(0, ctx.input_type(7), y);
  return OkStatus();
}

}  // namespace kiln
