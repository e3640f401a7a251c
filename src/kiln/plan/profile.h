// Optimization profiles: the min/opt/max dims of each dynamic input that a build plans for and an
// engine accepts. Plain data; the builder fills it, the planner sizes from its max, the engine
// file stores it and the runtime checks bindings against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "kiln/ir/tensor.h"

namespace kiln {

// min/opt/max dims for one dynamic input.
struct InputProfile {
  std::string input;
  std::vector<int64_t> min, opt, max;
};

// The values of a shape input (a small input that feeds a shape operand: Reshape's shape, Slice's
// starts, Tile's repeats, Resize's scales, Range's bounds, OneHot's depth...), as TensorRT's
// setShapeValues: the engine's shapes, memory plan and tactics are made for them; other values at
// run time re-specialize the context (docs/architecture.md, "Shape inputs"). Row-major elements
// of the input's static shape: in `values` for an integer input, in `float_values` for a
// floating-point one (the other stays empty; doubles hold every f32/f16/bf16 value exactly,
// int64 every integer one, INT64_MAX slice ends included).
struct ShapeInputValues {
  std::string input;
  std::vector<int64_t> values;
  std::vector<double> float_values = {};
};

// Whether `v` fits an input of type `dtype` and static dims `dims`: an integer or floating-point
// type, and as many values (in the member for that type) as the dims hold.
inline bool ShapeValuesFit(const ShapeInputValues& v, DataType dtype,
                           const std::vector<int64_t>& dims) {
  const auto n = static_cast<size_t>(NumElements(dims));
  if (IsInteger(dtype)) return v.float_values.empty() && v.values.size() == n;
  if (IsFloatingPoint(dtype)) return v.values.empty() && v.float_values.size() == n;
  return false;
}

// The values as a tensor of the input's type and dims (ShapeValuesFit holds), rounded to it as a
// Cast would.
inline Tensor ShapeValuesTensor(const ShapeInputValues& v, DataType dtype,
                                std::vector<int64_t> dims) {
  Tensor t = IsInteger(dtype)
                 ? Tensor::FromVector<int64_t>(DataType::kInt64, std::move(dims), v.values)
                 : Tensor::FromVector<double>(DataType::kFloat64, std::move(dims), v.float_values);
  return t.dtype() == dtype ? t : t.CastTo(dtype);
}

// The values as text, for messages: "2,-1" or "1,1,0.6,0.6".
inline std::string ShapeValuesText(const ShapeInputValues& v) {
  return v.float_values.empty() ? fmt::format("{}", fmt::join(v.values, ","))
                                : fmt::format("{}", fmt::join(v.float_values, ","));
}

struct OptimizationProfile {
  std::vector<InputProfile> inputs;
  std::vector<ShapeInputValues> shape_values;
  const InputProfile* Find(const std::string& input) const {
    for (const auto& p : inputs) {
      if (p.input == input) return &p;
    }
    return nullptr;
  }
  const ShapeInputValues* FindShapeValues(const std::string& input) const {
    for (const auto& v : shape_values) {
      if (v.input == input) return &v;
    }
    return nullptr;
  }
};

}  // namespace kiln
