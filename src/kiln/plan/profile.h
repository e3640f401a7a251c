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

struct OptimizationProfile {
  std::vector<InputProfile> inputs;
  const InputProfile* Find(const std::string& input) const {
    for (const auto& p : inputs) {
      if (p.input == input) return &p;
    }
    return nullptr;
  }
};

}  // namespace kiln
