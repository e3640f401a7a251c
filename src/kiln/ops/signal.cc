// Shape rules of the signal-processing ops: DFT (opset 20 form; DFT-17's axis attribute becomes
// input 2 at import), STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix. Lengths (the
// DFT length, frame step and length, window size, mel bins) decide output shapes, so they must be
// constants, computed from shapes, or graph inputs read as shape inputs.
#include <optional>

#include "kiln/ir/sizes.h"
#include "kiln/ops/onnx_dtype.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

namespace {

using ops_internal::IntAttr;

// A scalar (or one-element) integer input as a dim: a constant, a shape input's value, or
// computed from shapes.
std::optional<Dim> ScalarDim(const InferenceContext& ctx, size_t i) {
  if (!ctx.has_input(i) || !IsInteger(ctx.input_type(i))) return std::nullopt;
  auto v = ctx.input_dims_value(i);
  if (!v || v->size() != 1) return std::nullopt;
  return (*v)[0];
}

Status RequireScalarLength(const InferenceContext& ctx, size_t i, const char* what,
                           std::optional<Dim>* out) {
  *out = ScalarDim(ctx, i);
  if (!*out) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "{} (input {}) must be an integer scalar known when the engine is built: a "
                     "constant, computed from shapes, or a graph input given as a shape input",
                     what, i);
  }
  if ((*out)->is_static() && (*out)->value() < 1) {
    return ctx.Error(ErrorCode::kInvalidModel, "{} is {}; it must be at least 1", what,
                     (*out)->value());
  }
  return OkStatus();
}

StatusOr<DataType> OutputDatatype(const InferenceContext& ctx, int64_t def) {
  KILN_ASSIGN_OR_RETURN(int64_t code, IntAttr(ctx, "output_datatype", def));
  auto t = DataTypeFromOnnx(code);
  if (!t || !(IsFloatingPoint(*t) || IsInteger(*t)) || IsStorageOnly(*t)) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "output_datatype is ONNX type {}; kiln computes float, double, float16, "
                     "bfloat16 and integer outputs",
                     code);
  }
  return *t;
}

Status RequireFloatSignal(const InferenceContext& ctx) {
  if (!IsFloat(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input 0 has type {}; a float type is required",
                     ToString(ctx.input_type(0)));
  }
  return OkStatus();
}

Status WindowRule(InferenceContext& ctx) {
  std::optional<Dim> size;
  KILN_RETURN_IF_ERROR(RequireScalarLength(ctx, 0, "size", &size));
  KILN_ASSIGN_OR_RETURN(int64_t periodic, IntAttr(ctx, "periodic", 1));
  if (periodic != 0 && periodic != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "periodic is {}; it must be 0 or 1", periodic);
  }
  KILN_ASSIGN_OR_RETURN(DataType t, OutputDatatype(ctx, 1));
  ctx.set_output(0, t, {*size});
  return OkStatus();
}

}  // namespace

Status InferHannWindow(InferenceContext& ctx) { return WindowRule(ctx); }
Status InferHammingWindow(InferenceContext& ctx) { return WindowRule(ctx); }
Status InferBlackmanWindow(InferenceContext& ctx) { return WindowRule(ctx); }

// DFT(input [..., n, ..., 1|2], dft_length?, axis?) (opset 20): the transform along `axis` (of
// the full rank, the last axis excluded). Output [..., m, ..., 2], or [..., m, ..., 1] for an
// inverse one-sided (real) result; m is dft_length (default the input's length, 2 * (n - 1) for
// an inverse one-sided input), floor(m / 2) + 1 for a forward one-sided result.
Status InferDFT(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloatSignal(ctx));
  const Shape& x = ctx.input_shape(0);
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank < 2 || !(x.back() == Dim(1) || x.back() == Dim(2))) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "input {} must have rank >= 2 and a last axis of 1 (real) or 2 (complex)",
                     ToString(x));
  }
  KILN_ASSIGN_OR_RETURN(int64_t inverse, IntAttr(ctx, "inverse", 0));
  KILN_ASSIGN_OR_RETURN(int64_t onesided, IntAttr(ctx, "onesided", 0));
  if ((inverse != 0 && inverse != 1) || (onesided != 0 && onesided != 1)) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "inverse and onesided must be 0 or 1");
  }
  int64_t axis = -2;
  if (ctx.has_input(2)) {
    auto a = ctx.input_ints(2);
    if (!a || a->size() != 1) {
      return ctx.Error(ErrorCode::kDataDependentShape,
                       "axis (input 2) must be an integer scalar known when the engine is built");
    }
    axis = (*a)[0];
  }
  if (axis < -rank || axis >= rank - 1 + (axis < 0 ? 1 : 0) || axis == -1) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "axis {} is not a signal axis of input {} (the last axis holds the complex "
                     "parts)",
                     axis, ToString(x));
  }
  if (axis < 0) axis += rank;
  Dim length = x[static_cast<size_t>(axis)];
  if (ctx.has_input(1)) {
    std::optional<Dim> m;
    KILN_RETURN_IF_ERROR(RequireScalarLength(ctx, 1, "dft_length", &m));
    length = *m;
  } else if (inverse && onesided) {
    length = (length - Dim(1)) * Dim(2);
  }
  Shape y = x;
  y[static_cast<size_t>(axis)] = !inverse && onesided ? FloorDiv(length, Dim(2)) + Dim(1) : length;
  y.back() = Dim(inverse && onesided ? 1 : 2);
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

// STFT(signal [B, L, 1|2], frame_step, window [W]?, frame_length?) -> [B, frames, bins, 2] with
// frames = (L - W) / frame_step + 1 and bins = W / 2 + 1 (onesided) or W.
Status InferSTFT(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloatSignal(ctx));
  const Shape& x = ctx.input_shape(0);
  if (x.size() != 3 || !(x[2] == Dim(1) || x[2] == Dim(2))) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "signal {} must be [batch, length, 1] (real) or [batch, length, 2] (complex)",
                     ToString(x));
  }
  KILN_ASSIGN_OR_RETURN(int64_t onesided, IntAttr(ctx, "onesided", 1));
  if (onesided != 0 && onesided != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "onesided must be 0 or 1");
  }
  if (onesided && x[2] == Dim(2)) {
    return ctx.Error(ErrorCode::kInvalidModel, "a complex signal has no one-sided transform");
  }
  std::optional<Dim> step;
  KILN_RETURN_IF_ERROR(RequireScalarLength(ctx, 1, "frame_step", &step));
  std::optional<Dim> window_length;
  if (ctx.has_input(2)) {
    const Shape& w = ctx.input_shape(2);
    if (w.size() != 1 || ctx.input_type(2) != ctx.input_type(0)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "window {} must be 1-D of the signal's type",
                       ToString(w));
    }
    window_length = w[0];
  }
  Dim frame = x[1];
  if (ctx.has_input(3)) {
    std::optional<Dim> f;
    KILN_RETURN_IF_ERROR(RequireScalarLength(ctx, 3, "frame_length", &f));
    frame = *f;
    if (window_length && ops_internal::DimsEqual(*window_length, frame) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "window has {} values; frame_length is {}",
                       window_length->ToString(), frame.ToString());
    }
  } else if (window_length) {
    frame = *window_length;
  }
  if (!step->is_static()) {
    return ctx.Error(ErrorCode::kDataDependentShape, "frame_step must be a constant");
  }
  const Dim frames = FloorDiv(x[1] - frame, *step) + Dim(1);
  if (frames.is_static() && frames.value() < 1) {
    return ctx.Error(ErrorCode::kShapeMismatch, "the signal ({}) is shorter than a frame ({})",
                     x[1].ToString(), frame.ToString());
  }
  const Dim bins = onesided ? FloorDiv(frame, Dim(2)) + Dim(1) : frame;
  ctx.set_output(0, ctx.input_type(0), {x[0], frames, bins, Dim(2)});
  return OkStatus();
}

// MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz)
// -> [dft_length / 2 + 1, num_mel_bins] of output_datatype.
Status InferMelWeightMatrix(InferenceContext& ctx) {
  std::optional<Dim> bins, dft;
  KILN_RETURN_IF_ERROR(RequireScalarLength(ctx, 0, "num_mel_bins", &bins));
  KILN_RETURN_IF_ERROR(RequireScalarLength(ctx, 1, "dft_length", &dft));
  if (!IsInteger(ctx.input_type(2)) || !IsFloat(ctx.input_type(3)) || !IsFloat(ctx.input_type(4))) {
    return ctx.Error(ErrorCode::kTypeMismatch,
                     "sample_rate must be an integer, lower/upper_edge_hertz floats");
  }
  KILN_ASSIGN_OR_RETURN(DataType t, OutputDatatype(ctx, 1));
  ctx.set_output(0, t, {FloorDiv(*dft, Dim(2)) + Dim(1), *bins});
  return OkStatus();
}

}  // namespace kiln
