// Attribute and dims-value helpers for the shape rules.
#include "kiln/ops/rule_util.h"

namespace kiln::ops_internal {

namespace {
template <typename T>
StatusOr<const T*> Typed(const InferenceContext& ctx, const std::string& name, AttributeKind want) {
  const Attribute* a = ctx.attrs().Find(name);
  if (!a) return static_cast<const T*>(nullptr);
  if (const T* v = std::get_if<T>(a)) return v;
  return ctx.Error(ErrorCode::kInvalidAttribute, "attribute '{}' must be of kind {}, not {}", name,
                   ToString(want), ToString(KindOf(*a)));
}
}  // namespace

StatusOr<int64_t> IntAttr(const InferenceContext& ctx, const std::string& name, int64_t def) {
  KILN_ASSIGN_OR_RETURN(const int64_t* v, Typed<int64_t>(ctx, name, AttributeKind::kInt));
  return v ? *v : def;
}

StatusOr<int64_t> RequiredIntAttr(const InferenceContext& ctx, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(const int64_t* v, Typed<int64_t>(ctx, name, AttributeKind::kInt));
  if (!v)
    return ctx.Error(ErrorCode::kInvalidAttribute, "required attribute '{}' is missing", name);
  return *v;
}

StatusOr<float> FloatAttr(const InferenceContext& ctx, const std::string& name, float def) {
  const Attribute* a = ctx.attrs().Find(name);
  if (a && std::holds_alternative<int64_t>(*a)) return static_cast<float>(std::get<int64_t>(*a));
  KILN_ASSIGN_OR_RETURN(const float* v, Typed<float>(ctx, name, AttributeKind::kFloat));
  return v ? *v : def;
}

StatusOr<std::string> StringAttr(const InferenceContext& ctx, const std::string& name,
                                 const std::string& def) {
  KILN_ASSIGN_OR_RETURN(const std::string* v,
                        Typed<std::string>(ctx, name, AttributeKind::kString));
  return v ? *v : def;
}

StatusOr<std::optional<std::vector<int64_t>>> IntsAttr(const InferenceContext& ctx,
                                                       const std::string& name) {
  KILN_ASSIGN_OR_RETURN(const std::vector<int64_t>* v,
                        Typed<std::vector<int64_t>>(ctx, name, AttributeKind::kInts));
  if (!v) return std::optional<std::vector<int64_t>>();
  return std::optional<std::vector<int64_t>>(*v);
}

StatusOr<int64_t> Axis(const InferenceContext& ctx, int64_t axis, int64_t rank) {
  auto a = NormalizeAxis(axis, rank);
  if (!a.ok()) return ctx.Error(ErrorCode::kInvalidAttribute, "{}", a.status().message());
  return *a;
}

StatusOr<std::vector<int64_t>> RequiredInts(const InferenceContext& ctx, size_t i,
                                            const char* what) {
  auto v = ctx.input_ints(i);
  if (!v) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "input {} ({}) must be a constant or computed from shapes", i, what);
  }
  return *v;
}

std::optional<bool> DimsEqual(const Dim& a, const Dim& b) {
  if (a == b) return true;
  if (a.is_static() && b.is_static()) return false;
  // A symbolic size is never negative.
  if ((a.is_static() && a.value() < 0) || (b.is_static() && b.value() < 0)) return false;
  return std::nullopt;
}

StatusOr<int64_t> SkipNormAxis(const InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  if (!IsFloat(t) || ctx.input_type(1) != t) {
    return ctx.Error(ErrorCode::kTypeMismatch, "X and Skip must share one float type; got {}, {}",
                     ToString(t), ToString(ctx.input_type(1)));
  }
  const Shape& x = ctx.input_shape(0);
  const Shape& skip = ctx.input_shape(1);
  bool same = x.size() == skip.size();
  for (size_t i = 0; same && i < x.size(); ++i) {
    // Unknown-equal symbolic dims pass here; kernels check the bound sizes at Prepare.
    same = DimsEqual(x[i], skip[i]).value_or(true);
  }
  if (!same) {
    return ctx.Error(ErrorCode::kShapeMismatch, "Skip {} must have X's shape {}", ToString(skip),
                     ToString(x));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, static_cast<int64_t>(x.size())));
  KILN_ASSIGN_OR_RETURN(float eps, FloatAttr(ctx, "epsilon", 1e-5f));
  if (!(eps >= 0)) return ctx.Error(ErrorCode::kInvalidAttribute, "epsilon {} is negative", eps);
  return axis;
}

Status RequireFloat(const InferenceContext& ctx, size_t i) {
  if (!IsFloat(ctx.input_type(i))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}; a float type is required", i,
                     ToString(ctx.input_type(i)));
  }
  if (i > 0 && ctx.input_type(i) != ctx.input_type(0)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}; input 0 has {}", i,
                     ToString(ctx.input_type(i)), ToString(ctx.input_type(0)));
  }
  return OkStatus();
}

}  // namespace kiln::ops_internal
