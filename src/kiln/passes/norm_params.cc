// Helpers the normalization fusions share (norm_params.h).
#include "kiln/passes/norm_params.h"

#include <algorithm>

#include "kiln/ir/weight_program.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {

std::optional<std::vector<int64_t>> ReduceAxes(const Node& n, int64_t rank) {
  if (n.attrs().GetInt("keepdims", 1) != 1) return std::nullopt;
  std::vector<int64_t> axes;
  if (Value* a = n.input(1)) {
    if (!a->is_constant()) return std::nullopt;
    axes = a->constant()->ToInt64Vector();
  } else {
    axes = n.attrs().GetInts("axes");
  }
  if (axes.empty()) return std::nullopt;  // all axes (or noop_with_empty_axes): not a row norm
  for (int64_t& a : axes) {
    if (a < -rank || a >= rank) return std::nullopt;
    if (a < 0) a += rank;
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

std::optional<int64_t> TrailingAxis(const std::vector<int64_t>& axes, int64_t rank) {
  if (axes.empty() || axes.back() != rank - 1) return std::nullopt;
  int64_t axis = axes.front();
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] != axis + static_cast<int64_t>(i)) return std::nullopt;
  }
  return axis;
}

namespace {

constexpr std::string_view kNormParamOp = "NormParam";

std::optional<Tensor> NormParamOf(const Tensor* src, const std::vector<int64_t>& norm_dims,
                                  DataType dtype) {
  int64_t n = NumElements(norm_dims);
  if (!src) {
    return Tensor::FromVector<float>(DataType::kFloat32, norm_dims,
                                     std::vector<float>(static_cast<size_t>(n), 1.f))
        .CastTo(dtype);
  }
  const Tensor& t = *src;
  // Leading 1s only: a parameter that varies along a non-normalized axis is not a norm one.
  size_t lead = t.dims().size() > norm_dims.size() ? t.dims().size() - norm_dims.size() : 0;
  for (size_t i = 0; i < lead; ++i) {
    if (t.dims()[i] != 1) return std::nullopt;
  }
  std::vector<float> values(static_cast<size_t>(n));
  if (t.num_elements() == n) {
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(t.GetDouble(i));
  } else if (t.num_elements() == 1) {
    std::fill(values.begin(), values.end(), static_cast<float>(t.GetDouble(0)));
  } else {
    return std::nullopt;
  }
  return Tensor::FromVector<float>(DataType::kFloat32, norm_dims, values).CastTo(dtype);
}

// The weight op: NormParamOf with attributes dims and dtype (a kiln DataType).
StatusOr<std::vector<Tensor>> NormParamOp(const AttributeMap& a,
                                          std::span<const Tensor* const> in) {
  auto t = NormParamOf(in.empty() ? nullptr : in[0], a.GetInts("dims"),
                       static_cast<DataType>(a.GetInt("dtype", 0)));
  if (!t) return MakeError(ErrorCode::kInternal, "{}: the parameter does not fit", kNormParamOp);
  std::vector<Tensor> out;
  out.push_back(std::move(*t));
  return out;
}

const bool kNormParamRegistered = RegisterWeightOp(std::string(kNormParamOp), NormParamOp);

}  // namespace

std::optional<Tensor> NormParam(const Value* v, const std::vector<int64_t>& norm_dims,
                                DataType dtype) {
  return NormParamOf(v ? v->constant() : nullptr, norm_dims, dtype);
}

Value* AddNormParam(Graph& graph, const std::string& prefix, Value* v,
                    const std::vector<int64_t>& norm_dims, DataType dtype) {
  if (!v) {
    auto ones = NormParamOf(nullptr, norm_dims, dtype);
    return AddLiteralConstant(graph, prefix, std::move(*ones));
  }
  AttributeMap attrs;
  attrs.Set("dims", norm_dims);
  attrs.Set("dtype", static_cast<int64_t>(dtype));
  return DeriveConstant(graph, prefix, std::string(kNormParamOp), attrs, {v});
}

}  // namespace kiln::passes
