// Optimization profiles: the min/opt/max dims of each dynamic input that a build plans for and an
// engine accepts. Plain data; the builder fills it, the planner sizes from its max, the engine
// file stores it and the runtime checks bindings against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// min/opt/max dims for one dynamic input.
struct InputProfile {
  std::string input;
  std::vector<int64_t> min, opt, max;
};

// The values of a shape input (an integer input that feeds a shape operand: Reshape's shape,
// Slice's starts, Tile's repeats...), as TensorRT's setShapeValues: the engine's shapes, memory
// plan and tactics are made for them; other values at run time re-specialize the context
// (docs/architecture.md, "Shape inputs"). Row-major elements of the input's static shape.
struct ShapeInputValues {
  std::string input;
  std::vector<int64_t> values;
};

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
