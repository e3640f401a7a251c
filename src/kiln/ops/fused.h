// The activation epilogue that kiln's fused ops (fused.cc) carry as attributes, parsed once for
// the shape rules and every backend's kernels.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/ir/attribute.h"
#include "kiln/ops/op_schema.h"

namespace kiln {

// The activations listed in activations.inc, in its order (the CUDA kernels mirror the values).
enum class FusedActivation : uint8_t {
#define KILN_ACTIVATION(kind, name, source, formula) k##kind,
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
};

// The "activation" attribute value of a kind ("relu", "gelu_tanh", ...).
std::string_view ToString(FusedActivation kind);
// The activation a fusion absorbs for an op of this type (activations.inc's source column);
// nullopt for ops that are not one (SiLU and tanh-Gelu are recognised by pattern and attribute).
std::optional<FusedActivation> FusedActivationOf(OpType op);

struct FusedActivationSpec {
  FusedActivation kind = FusedActivation::kNone;
  // kClip's bounds; kSwish's alpha is `min` (activations.inc's formulas read both as lo, hi, and
  // every backend's epilogue passes them on)
  float min = 0.f, max = 0.f;
};

// Reads the "activation" (default "none"), "activation_min" and "activation_max" attributes, and
// "activation_alpha" for "swish".
StatusOr<FusedActivationSpec> ParseFusedActivation(const AttributeMap& attrs);

// kiln's fused Attention (ops/attention.cc documents its attributes).
enum class AttentionMask : uint8_t { kNone, kAdditive, kBoolean, kCausal };
enum class AttentionLayout : uint8_t {
  kBhsd,  // [B, H, S, D] per operand (and any leading batch dims)
  kBshd,  // [B, S, H, D]
  kBsd,   // [B, S, H*D] with num_heads = H; qkv_packed: [B, S, 3*H*D], Q, K, V side by side
  kSbd,   // [S, B, H*D] (sequence first) with num_heads = H; qkv_packed as kBsd
};
struct AttentionAttrs {
  AttentionMask mask = AttentionMask::kNone;
  AttentionLayout layout = AttentionLayout::kBhsd;
  int64_t heads = 0;  // kBsd, kSbd
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
