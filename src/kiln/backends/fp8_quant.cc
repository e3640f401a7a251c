// The FP8 contract's host-side conversions (fp8_quant.h), shared by every backend and the tests.
#include "kiln/backends/fp8_quant.h"

#include <cmath>

#include "kiln/core/minifloat.h"

namespace kiln {

namespace {
std::optional<float> UsableAmax(const Node& node, const char* attr) {
  if (!node.attrs().Has(attr)) return std::nullopt;
  float amax = node.attrs().GetFloat(attr, 0.f);
  if (!std::isfinite(amax) || amax <= 0.f) return std::nullopt;
  return amax;
}
}  // namespace

std::optional<float> Fp8InputAmax(const Node& node) { return UsableAmax(node, kFp8InputAmaxAttr); }

std::optional<float> Fp8OutputAmax(const Node& node) {
  return UsableAmax(node, kFp8OutputAmaxAttr);
}

// The general float8 conversion (core/minifloat.h) with saturation; NaN is 0x7f whatever its sign,
// as CUDA's conversion gives it.
uint8_t ToE4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  return FloatToFloat8Bits(x, Float8Format::kE4M3FN, /*saturate=*/true);
}

float FromE4M3(uint8_t bits) { return Float8BitsToFloat(bits, Float8Format::kE4M3FN); }

}  // namespace kiln
