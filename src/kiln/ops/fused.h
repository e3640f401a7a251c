// The activation epilogue that kiln's fused ops (fused.cc) carry as attributes, parsed once for
// the shape rules and every backend's kernels.
#pragma once

#include <cstdint>
#include <limits>
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

// kiln's fused Attention (ops/attention.cc documents its attributes).
enum class AttentionMask : uint8_t { kNone, kAdditive, kBoolean, kCausal };
enum class AttentionLayout : uint8_t {
  kBhsd,  // [B, H, S, D] per operand (and any leading batch dims)
  kBshd,  // [B, S, H, D]
  kBsd,   // [B, S, H*D] with num_heads = H; qkv_packed: [B, S, 3*H*D], Q, K, V side by side
};
struct AttentionAttrs {
  AttentionMask mask = AttentionMask::kNone;
  AttentionLayout layout = AttentionLayout::kBhsd;
  int64_t heads = 0;  // kBsd
  bool qkv_packed = false;
  float scale = 1.f;
  bool default_scale = true;  // no "scale" attribute: 1/sqrt(D)
  // Boolean masks: the score where the mask is false.
  float mask_fill = -std::numeric_limits<float>::infinity();
};

// Reads mask_kind, layout, num_heads, qkv_packed, scale and mask_fill; KILN-E2009 (invalid
// attribute) for an unknown mask kind or layout, bsd without num_heads > 0, or qkv_packed
// without bsd.
StatusOr<AttentionAttrs> ReadAttentionAttrs(const AttributeMap& attrs);

}  // namespace kiln
