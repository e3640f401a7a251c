// The FP8 contract's host-side conversions (fp8_quant.h), shared by every backend and the tests.
#include "kiln/backends/fp8_quant.h"

#include <algorithm>
#include <cmath>

namespace kiln {

std::optional<float> Fp8InputAmax(const Node& node) {
  if (!node.attrs().Has(kFp8InputAmaxAttr)) return std::nullopt;
  float amax = node.attrs().GetFloat(kFp8InputAmaxAttr, 0.f);
  if (!std::isfinite(amax) || amax <= 0.f) return std::nullopt;
  return amax;
}

uint8_t ToE4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // 448 = 1.75 * 2^8
  // The spacing of E4M3 values around a: 2^(e - 3) in the binade [2^e, 2^(e+1)); subnormals
  // below 2^-6 step by 2^-9. Division by a power of two is exact; nearbyint rounds to even.
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int binade = std::max(e - 1, -6);
  const float step = std::ldexp(1.f, binade - 3);
  const float q = std::nearbyint(a / step) * step;  // may round up into the next binade
  if (q == 0.f) return sign;
  if (q >= kFp8E4M3Max) return sign | 0x7e;
  int qe = 0;
  const float qf = std::frexp(q, &qe);  // q = qf * 2^qe
  if (qe - 1 < -6) {                    // subnormal: q = m * 2^-9, m in 1..7
    return sign | static_cast<uint8_t>(std::lround(q * 512.f));
  }
  const int mant = static_cast<int>(std::lround((qf * 2.f - 1.f) * 8.f));  // 0..7
  return sign | static_cast<uint8_t>(((qe - 1 + 7) << 3) | mant);
}

float FromE4M3(uint8_t bits) {
  const float sign = (bits & 0x80) ? -1.f : 1.f;
  const int exp = (bits >> 3) & 0xf, mant = bits & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(1.f + static_cast<float>(mant) / 8.f, exp - 7);
}

}  // namespace kiln
