// Shape rules for elementwise ops: unary ops keep their input's type and shape; binary, variadic
// and ternary ops broadcast (numpy rules). Arithmetic and comparisons on dims-values (Shape
// outputs) are folded here so shape subgraphs give static or symbolic target shapes.
#include <functional>

#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

namespace {

enum class Accept { kAny, kFloat, kFloatingPoint, kNumeric, kBool, kSigned, kInteger, kUnsigned };

Status CheckType(InferenceContext& ctx, size_t i, Accept accept) {
  DataType t = ctx.input_type(i);
  bool ok = true;
  switch (accept) {
    case Accept::kAny:
      break;
    case Accept::kFloat:
      ok = IsFloat(t);
      break;
    case Accept::kFloatingPoint:
      ok = IsFloatingPoint(t);
      break;
    case Accept::kNumeric:
      ok = IsFloatingPoint(t) || IsInteger(t);
      break;
    case Accept::kBool:
      ok = t == DataType::kBool;
      break;
    case Accept::kInteger:
      ok = IsInteger(t);
      break;
    case Accept::kUnsigned:
      ok = IsUnsigned(t);
      break;
    case Accept::kSigned:
      ok = IsFloatingPoint(t) || (IsInteger(t) && !IsUnsigned(t));
      break;
  }
  if (!ok) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}, which the op does not take",
                     i, ToString(t));
  }
  return OkStatus();
}

Status Unary(InferenceContext& ctx, Accept accept, DataType out = DataType::kUndefined) {
  KILN_RETURN_IF_ERROR(CheckType(ctx, 0, accept));
  ctx.set_output(0, out == DataType::kUndefined ? ctx.input_type(0) : out, ctx.input_shape(0));
  return OkStatus();
}

// Broadcasts every present input; all must share input 0's type unless `same_type` is false.
Status Broadcast(InferenceContext& ctx, size_t first, Accept accept, DataType out,
                 bool same_type = true) {
  Shape shape = ctx.input_shape(first);
  for (size_t i = first; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    KILN_RETURN_IF_ERROR(CheckType(ctx, i, accept));
    if (same_type && ctx.input_type(i) != ctx.input_type(first)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "operand types differ: {} and {}",
                       ToString(ctx.input_type(first)), ToString(ctx.input_type(i)));
    }
    auto s = BroadcastShapes(shape, ctx.input_shape(i));
    if (!s.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", s.status().message());
    shape = *s;
  }
  ctx.set_output(0, out == DataType::kUndefined ? ctx.input_type(first) : out, shape);
  return OkStatus();
}

// Whether arithmetic on values of type t folds as dims: signed integers only (dims are signed
// 64-bit; an unsigned result wraps where a Dim would go negative).
bool FoldsDims(DataType t) { return IsInteger(t) && !IsUnsigned(t); }

// Elementwise fold of dims-values (rank 0 or 1, broadcasting a single element). `fn` returns
// nullopt when an element cannot be known.
void FoldDims(InferenceContext& ctx, const std::vector<size_t>& ins,
              const std::function<std::optional<Dim>(const std::vector<Dim>&)>& fn) {
  std::vector<std::vector<Dim>> vals;
  size_t n = 1;
  for (size_t i : ins) {
    auto v = ctx.input_dims_value(i);
    if (!v) return;
    if (v->size() != 1) {
      if (n != 1 && v->size() != n) return;
      n = v->size();
    }
    vals.push_back(std::move(*v));
  }
  std::vector<Dim> out;
  for (size_t k = 0; k < n; ++k) {
    std::vector<Dim> args;
    for (const auto& v : vals) args.push_back(v.size() == 1 ? v[0] : v[k]);
    auto r = fn(args);
    if (!r) return;
    out.push_back(*r);
  }
  ctx.set_output_dims_value(0, std::move(out));
}

Status Arith(InferenceContext& ctx,
             const std::function<std::optional<Dim>(const Dim&, const Dim&)>& f) {
  KILN_RETURN_IF_ERROR(Broadcast(ctx, 0, Accept::kNumeric, DataType::kUndefined));
  if (FoldsDims(ctx.input_type(0))) {
    FoldDims(ctx, {0, 1}, [&](const std::vector<Dim>& a) { return f(a[0], a[1]); });
  }
  return OkStatus();
}

Status Variadic(InferenceContext& ctx, const std::function<Dim(const Dim&, const Dim&)>& f) {
  KILN_RETURN_IF_ERROR(Broadcast(ctx, 0, Accept::kNumeric, DataType::kUndefined));
  if (f && FoldsDims(ctx.input_type(0))) {
    std::vector<size_t> ins;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) ins.push_back(i);
    FoldDims(ctx, ins, [&](const std::vector<Dim>& a) -> std::optional<Dim> {
      Dim r = a[0];
      for (size_t i = 1; i < a.size(); ++i) r = f(r, a[i]);
      return r;
    });
  }
  return OkStatus();
}

Status Compare(InferenceContext& ctx, Accept accept) {
  return Broadcast(ctx, 0, accept, DataType::kBool);
}
}  // namespace

// Unary ops. Float-only activations (f64 included) reject integer inputs at build time.
#define KILN_FLOAT_UNARY(Name) \
  Status Infer##Name(InferenceContext& ctx) { return Unary(ctx, Accept::kFloatingPoint); }
KILN_FLOAT_UNARY(Acos)
KILN_FLOAT_UNARY(Acosh)
KILN_FLOAT_UNARY(Asin)
KILN_FLOAT_UNARY(Asinh)
KILN_FLOAT_UNARY(Atan)
KILN_FLOAT_UNARY(Atanh)
KILN_FLOAT_UNARY(Celu)
KILN_FLOAT_UNARY(Ceil)
KILN_FLOAT_UNARY(Cos)
KILN_FLOAT_UNARY(Cosh)
KILN_FLOAT_UNARY(Elu)
KILN_FLOAT_UNARY(Erf)
KILN_FLOAT_UNARY(Exp)
KILN_FLOAT_UNARY(Floor)
KILN_FLOAT_UNARY(HardSigmoid)
KILN_FLOAT_UNARY(HardSwish)
KILN_FLOAT_UNARY(LeakyRelu)
KILN_FLOAT_UNARY(Log)
KILN_FLOAT_UNARY(Mish)
KILN_FLOAT_UNARY(Reciprocal)
KILN_FLOAT_UNARY(Round)
KILN_FLOAT_UNARY(Selu)
KILN_FLOAT_UNARY(Shrink)
KILN_FLOAT_UNARY(Sigmoid)
KILN_FLOAT_UNARY(Sin)
KILN_FLOAT_UNARY(Sinh)
KILN_FLOAT_UNARY(Softplus)
KILN_FLOAT_UNARY(Softsign)
KILN_FLOAT_UNARY(Sqrt)
KILN_FLOAT_UNARY(Tan)
KILN_FLOAT_UNARY(Tanh)
KILN_FLOAT_UNARY(ThresholdedRelu)
#undef KILN_FLOAT_UNARY

Status InferRelu(InferenceContext& ctx) { return Unary(ctx, Accept::kSigned); }
Status InferAbs(InferenceContext& ctx) { return Unary(ctx, Accept::kNumeric); }
Status InferSign(InferenceContext& ctx) { return Unary(ctx, Accept::kNumeric); }
Status InferNeg(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(Unary(ctx, Accept::kSigned));
  FoldDims(ctx, {0}, [](const std::vector<Dim>& a) -> std::optional<Dim> { return Dim(0) - a[0]; });
  return OkStatus();
}
Status InferNot(InferenceContext& ctx) { return Unary(ctx, Accept::kBool); }
Status InferIsNaN(InferenceContext& ctx) { return Unary(ctx, Accept::kFloat, DataType::kBool); }
Status InferIsInf(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(
      IntAttr(ctx, "detect_negative", attrs::IsInf::detect_negative_default()).status());
  KILN_RETURN_IF_ERROR(
      IntAttr(ctx, "detect_positive", attrs::IsInf::detect_positive_default()).status());
  return Unary(ctx, Accept::kFloat, DataType::kBool);
}

Status InferGelu(InferenceContext& ctx) {
  // Compared in place: GCC 12 warned (falsely) that a std::string moved out of the StatusOr
  // might be uninitialized.
  StatusOr<std::string> approx = StringAttr(ctx, "approximate", attrs::Gelu::approximate_default());
  if (!approx.ok()) return approx.status();
  if (*approx != "none" && *approx != "tanh") {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "attribute 'approximate' is '{}'; it must be 'none' or 'tanh'", *approx);
  }
  return Unary(ctx, Accept::kFloatingPoint);
}

Status InferIdentity(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(Unary(ctx, Accept::kAny));
  if (auto v = ctx.input_dims_value(0)) ctx.set_output_dims_value(0, *v);
  return OkStatus();
}

Status InferClip(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(Unary(ctx, Accept::kNumeric));
  for (size_t i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    if (ctx.input_type(i) != ctx.input_type(0) || NumElements(ctx.input_shape(i)) != Dim(1)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "input {} ({}) must be a scalar of type {}", i,
                       i == 1 ? "min" : "max", ToString(ctx.input_type(0)));
    }
  }
  return OkStatus();
}

Status InferPRelu(InferenceContext& ctx) {
  // The slope broadcasts to X (unidirectionally): the output has X's shape.
  KILN_RETURN_IF_ERROR(Broadcast(ctx, 0, Accept::kSigned, DataType::kUndefined));
  if (ctx.output(0).shape != ctx.input_shape(0)) {
    return ctx.Error(ErrorCode::kShapeMismatch, "slope {} does not broadcast to X {}",
                     ToString(ctx.input_shape(1)), ToString(ctx.input_shape(0)));
  }
  return OkStatus();
}

// Binary arithmetic, with folding on integer dims-values.
Status InferAdd(InferenceContext& ctx) {
  return Arith(ctx, [](const Dim& a, const Dim& b) -> std::optional<Dim> { return a + b; });
}
Status InferSub(InferenceContext& ctx) {
  return Arith(ctx, [](const Dim& a, const Dim& b) -> std::optional<Dim> { return a - b; });
}
Status InferMul(InferenceContext& ctx) {
  return Arith(ctx, [](const Dim& a, const Dim& b) -> std::optional<Dim> { return a * b; });
}
Status InferDiv(InferenceContext& ctx) {
  return Arith(ctx, [](const Dim& a, const Dim& b) -> std::optional<Dim> {
    if (b == Dim(0)) return std::nullopt;
    // ONNX integer division truncates; dims are non-negative, so floor division agrees unless a
    // static operand is negative.
    if (a.is_static() && b.is_static()) {
      return b.value() == -1 ? Dim(0) - a : Dim(a.value() / b.value());  // INT64_MIN / -1 traps
    }
    if (b.is_static() && b.value() < 0) return std::nullopt;
    return FloorDiv(a, b);
  });
}
Status InferMod(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t fmod, IntAttr(ctx, "fmod", attrs::Mod::fmod_default()));
  if (fmod != 0 && fmod != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "attribute 'fmod' is {}; it must be 0 or 1",
                     fmod);
  }
  if (fmod == 0 && IsFloatingPoint(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "Mod on floats needs fmod=1 (ONNX rule)");
  }
  return Broadcast(ctx, 0, Accept::kNumeric, DataType::kUndefined);
}
Status InferPow(InferenceContext& ctx) {
  // Base and exponent may have different types; the output has the base's.
  return Broadcast(ctx, 0, Accept::kNumeric, DataType::kUndefined, /*same_type=*/false);
}

Status InferMax(InferenceContext& ctx) {
  return Variadic(ctx, [](const Dim& a, const Dim& b) { return Max(a, b); });
}
Status InferMin(InferenceContext& ctx) {
  return Variadic(ctx, [](const Dim& a, const Dim& b) { return Min(a, b); });
}
Status InferSum(InferenceContext& ctx) {
  return Variadic(ctx, [](const Dim& a, const Dim& b) { return a + b; });
}
Status InferMean(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(CheckType(ctx, 0, Accept::kFloatingPoint));
  return Variadic(ctx, nullptr);
}

// Comparisons give bool. Equal folds on dims-values: PyTorch exports
// `Where(Equal(shape, -1), ones, shape)` around Expand/Reshape targets.
Status InferEqual(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(Compare(ctx, Accept::kAny));
  if (FoldsDims(ctx.input_type(0))) {
    FoldDims(ctx, {0, 1}, [](const std::vector<Dim>& a) -> std::optional<Dim> {
      auto eq = DimsEqual(a[0], a[1]);
      if (!eq) return std::nullopt;
      return Dim(*eq ? 1 : 0);
    });
  }
  return OkStatus();
}
Status InferLess(InferenceContext& ctx) { return Compare(ctx, Accept::kNumeric); }
Status InferLessOrEqual(InferenceContext& ctx) { return Compare(ctx, Accept::kNumeric); }
Status InferGreater(InferenceContext& ctx) { return Compare(ctx, Accept::kNumeric); }
Status InferGreaterOrEqual(InferenceContext& ctx) { return Compare(ctx, Accept::kNumeric); }
Status InferAnd(InferenceContext& ctx) { return Compare(ctx, Accept::kBool); }
Status InferOr(InferenceContext& ctx) { return Compare(ctx, Accept::kBool); }
Status InferXor(InferenceContext& ctx) { return Compare(ctx, Accept::kBool); }

// Bitwise ops: integer operands of one type (ONNX's T), broadcasting; BitShift only on unsigned
// types and with a required direction.
Status InferBitwiseAnd(InferenceContext& ctx) {
  return Broadcast(ctx, 0, Accept::kInteger, DataType::kUndefined);
}
Status InferBitwiseOr(InferenceContext& ctx) {
  return Broadcast(ctx, 0, Accept::kInteger, DataType::kUndefined);
}
Status InferBitwiseXor(InferenceContext& ctx) {
  return Broadcast(ctx, 0, Accept::kInteger, DataType::kUndefined);
}
Status InferBitwiseNot(InferenceContext& ctx) { return Unary(ctx, Accept::kInteger); }
Status InferBitShift(InferenceContext& ctx) {
  StatusOr<std::string> direction = StringAttr(ctx, "direction", "");
  if (!direction.ok()) return direction.status();
  if (*direction != "LEFT" && *direction != "RIGHT") {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "attribute 'direction' is '{}'; it must be 'LEFT' or 'RIGHT'", *direction);
  }
  return Broadcast(ctx, 0, Accept::kUnsigned, DataType::kUndefined);
}

Status InferWhere(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(CheckType(ctx, 0, Accept::kBool));
  if (ctx.input_type(1) != ctx.input_type(2)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "X and Y types differ: {} and {}",
                     ToString(ctx.input_type(1)), ToString(ctx.input_type(2)));
  }
  auto s = BroadcastShapes(ctx.input_shape(0), ctx.input_shape(1));
  if (s.ok()) s = BroadcastShapes(*s, ctx.input_shape(2));
  if (!s.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", s.status().message());
  ctx.set_output(0, ctx.input_type(1), *s);
  if (FoldsDims(ctx.input_type(1))) {
    FoldDims(ctx, {0, 1, 2}, [](const std::vector<Dim>& a) -> std::optional<Dim> {
      if (!a[0].is_static()) return std::nullopt;
      return a[0].value() != 0 ? a[1] : a[2];
    });
  }
  return OkStatus();
}

}  // namespace kiln
