// The activation epilogue that kiln's fused ops (fused.cc) carry as attributes, parsed once for
// the shape rules and every backend's kernels.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/core/status.h"
#include "kiln/ir/attribute.h"

namespace kiln {

enum class FusedActivation : uint8_t {
  kNone,
  kRelu,
  kClip,  // min(max(x, activation_min), activation_max); "relu6" is Clip(0, 6)
  kSigmoid,
  kHardSwish,  // x * clip(x / 6 + 1/2, 0, 1) (ONNX HardSwish)
  kSilu,       // x * sigmoid(x)
  kGelu,       // exact: 0.5 x (1 + erf(x / sqrt 2))
  kGeluTanh,   // tanh approximation
};

struct FusedActivationSpec {
  FusedActivation kind = FusedActivation::kNone;
  float min = 0.f, max = 0.f;  // kClip bounds
};

// Reads the "activation" (default "none"), "activation_min" and "activation_max" attributes.
StatusOr<FusedActivationSpec> ParseFusedActivation(const AttributeMap& attrs);

}  // namespace kiln
