// Shape rules for the recurrent layers (RNN, GRU, LSTM): X [seq, batch, input] (layout 0) or
// [batch, seq, input] (layout 1), W [dirs, gates * hidden, input], R [dirs, gates * hidden,
// hidden]; outputs Y [seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden]) and
// Y_h (LSTM also Y_c) [dirs, batch, hidden] (layout 1: [batch, dirs, hidden]). kiln runs
// ONNX's default activations only.
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

namespace {
Status Recurrent(InferenceContext& ctx, int64_t gates, const std::string& direction_default,
                 int64_t layout_default) {
  if (!IsFloatingPoint(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "X type {} is not a float type",
                     ToString(ctx.input_type(0)));
  }
  KILN_ASSIGN_OR_RETURN(int64_t hidden, RequiredIntAttr(ctx, "hidden_size"));
  KILN_ASSIGN_OR_RETURN(std::string direction, StringAttr(ctx, "direction", direction_default));
  KILN_ASSIGN_OR_RETURN(int64_t layout, IntAttr(ctx, "layout", layout_default));
  if (hidden < 1 || (layout != 0 && layout != 1) ||
      (direction != "forward" && direction != "reverse" && direction != "bidirectional")) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "hidden_size {} must be >= 1, layout {} 0 or 1, direction '{}' forward, "
                     "reverse or bidirectional",
                     hidden, layout, direction);
  }
  if (ctx.attrs().Has("activations") || ctx.attrs().Has("activation_alpha") ||
      ctx.attrs().Has("activation_beta")) {
    return ctx.Error(ErrorCode::kUnimplemented,
                     "custom activations are not supported (kiln runs ONNX's defaults)");
  }
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  const Shape& r = ctx.input_shape(2);
  if (x.size() != 3 || w.size() != 3 || r.size() != 3) {
    return ctx.Error(ErrorCode::kShapeMismatch, "X {}, W {} and R {} must be 3-D", ToString(x),
                     ToString(w), ToString(r));
  }
  const Dim rows(gates * hidden);
  if (DimsEqual(w[0], Dim(dirs)) == false || DimsEqual(w[1], rows) == false ||
      DimsEqual(w[2], x[2]) == false || DimsEqual(r[0], Dim(dirs)) == false ||
      DimsEqual(r[1], rows) == false || DimsEqual(r[2], Dim(hidden)) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "W {} must be [{}, {}, input] and R {} [{}, {}, {}] for X {}", ToString(w),
                     dirs, gates * hidden, ToString(r), dirs, gates * hidden, hidden, ToString(x));
  }
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (i == 4 || !ctx.has_input(i)) continue;  // sequence_lens is an integer
    if (ctx.input_type(i) != ctx.input_type(0)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}; X has {}", i,
                       ToString(ctx.input_type(i)), ToString(ctx.input_type(0)));
    }
  }
  if (ctx.has_input(4) && ctx.input_type(4) != DataType::kInt32) {
    return ctx.Error(ErrorCode::kTypeMismatch, "sequence_lens must be int32, not {}",
                     ToString(ctx.input_type(4)));
  }
  const Dim& seq = layout == 0 ? x[0] : x[1];
  const Dim& batch = layout == 0 ? x[1] : x[0];
  const DataType t = ctx.input_type(0);
  ctx.set_output(0, t,
                 layout == 0 ? Shape{seq, Dim(dirs), batch, Dim(hidden)}
                             : Shape{batch, seq, Dim(dirs), Dim(hidden)});
  for (size_t i = 1; i < ctx.num_outputs(); ++i) {
    ctx.set_output(
        i, t,
        layout == 0 ? Shape{Dim(dirs), batch, Dim(hidden)} : Shape{batch, Dim(dirs), Dim(hidden)});
  }
  return OkStatus();
}
}  // namespace

Status InferRNN(InferenceContext& ctx) {
  return Recurrent(ctx, 1, attrs::RNN::direction_default(), attrs::RNN::layout_default());
}

Status InferGRU(InferenceContext& ctx) {
  return Recurrent(ctx, 3, attrs::GRU::direction_default(), attrs::GRU::layout_default());
}

Status InferLSTM(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t input_forget,
                        IntAttr(ctx, "input_forget", attrs::LSTM::input_forget_default()));
  if (input_forget != 0) {
    return ctx.Error(ErrorCode::kUnimplemented, "input_forget=1 (coupled gates) is not supported");
  }
  return Recurrent(ctx, 4, attrs::LSTM::direction_default(), attrs::LSTM::layout_default());
}

}  // namespace kiln
