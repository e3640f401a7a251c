// Float8/float4 conversions (minifloat.h): one encoder for every format, described by its
// mantissa width, bias, largest finite value and special encodings.
#include "kiln/core/minifloat.h"

#include <bit>
#include <cmath>

namespace kiln {
namespace {

struct Format {
  int mantissa_bits;
  int bias;
  double max;          // largest finite magnitude
  int sign_shift;      // 7 for float8, 3 for float4
  bool has_inf;        // E5M2: exponent all ones, mantissa 0
  bool unsigned_zero;  // FNUZ: no -0; the -0 pattern is NaN
  uint8_t nan;         // positive NaN's bits (FNUZ: 0x80, the only NaN)
  uint8_t inf;         // positive Inf's bits (has_inf)
};

constexpr Format kE4M3FN{3, 7, 448.0, 7, false, false, 0x7f, 0};
constexpr Format kE4M3FNUZ{3, 8, 240.0, 7, false, true, 0x80, 0};
constexpr Format kE5M2{2, 15, 57344.0, 7, true, false, 0x7e, 0x7c};
constexpr Format kE5M2FNUZ{2, 16, 57344.0, 7, false, true, 0x80, 0};
constexpr Format kE2M1{1, 1, 6.0, 3, false, false, 0, 0};

const Format& Get(Float8Format f) {
  switch (f) {
    case Float8Format::kE4M3FN:
      return kE4M3FN;
    case Float8Format::kE4M3FNUZ:
      return kE4M3FNUZ;
    case Float8Format::kE5M2:
      return kE5M2;
    case Float8Format::kE5M2FNUZ:
      return kE5M2FNUZ;
  }
  return kE4M3FN;
}

// |x| (finite, >= 0) rounded to nearest even on the format's grid; may exceed f.max.
double RoundToGrid(double a, const Format& f) {
  if (a == 0) return 0;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the binade is 2^(e - 1)
  const int min_normal = 1 - f.bias;
  const int binade = e - 1 < min_normal ? min_normal : e - 1;  // subnormals share the lowest step
  const double step = std::ldexp(1.0, binade - f.mantissa_bits);
  return std::nearbyint(a / step) * step;  // exact scaling; nearbyint rounds ties to even
}

// A grid value (0 < q <= max) as exponent and mantissa fields.
uint8_t EncodeMagnitude(double q, const Format& f) {
  int e = 0;
  const double m = std::frexp(q, &e);
  const int exponent = e - 1;
  const int min_normal = 1 - f.bias;
  if (exponent < min_normal) {  // subnormal: q = mantissa * 2^(min_normal - mantissa_bits)
    return static_cast<uint8_t>(std::lround(std::ldexp(q, f.mantissa_bits - min_normal)));
  }
  const int mantissa = static_cast<int>(std::lround((m * 2 - 1) * (1 << f.mantissa_bits)));
  return static_cast<uint8_t>(((exponent + f.bias) << f.mantissa_bits) | mantissa);
}

uint8_t Encode(float x, const Format& f, bool saturate) {
  const uint8_t sign = std::signbit(x) ? static_cast<uint8_t>(1u << f.sign_shift) : 0;
  if (std::isnan(x)) return f.unsigned_zero ? f.nan : static_cast<uint8_t>(sign | f.nan);
  const double q = std::isinf(x) ? HUGE_VAL : RoundToGrid(std::fabs(static_cast<double>(x)), f);
  if (q > f.max) {
    if (saturate) return static_cast<uint8_t>(sign | EncodeMagnitude(f.max, f));
    if (f.has_inf) return static_cast<uint8_t>(sign | f.inf);
    return f.unsigned_zero ? f.nan : static_cast<uint8_t>(sign | f.nan);
  }
  if (q == 0) return f.unsigned_zero ? 0 : sign;
  return static_cast<uint8_t>(sign | EncodeMagnitude(q, f));
}

float Decode(uint8_t bits, const Format& f) {
  const uint8_t sign_bit = static_cast<uint8_t>(1u << f.sign_shift);
  const uint8_t magnitude = bits & static_cast<uint8_t>(sign_bit - 1);
  const bool negative = (bits & sign_bit) != 0;
  if (f.unsigned_zero && bits == f.nan) return std::nanf("");
  if (f.sign_shift == 7 && !f.unsigned_zero && (magnitude & 0x7f) >= f.nan && !f.has_inf) {
    return negative ? -std::nanf("") : std::nanf("");  // E4M3FN: S.1111.111
  }
  const int exponent_field = magnitude >> f.mantissa_bits;
  const int mantissa = magnitude & ((1 << f.mantissa_bits) - 1);
  if (f.has_inf && exponent_field == (1 << (f.sign_shift - f.mantissa_bits)) - 1) {
    if (mantissa == 0) return negative ? -INFINITY : INFINITY;
    return negative ? -std::nanf("") : std::nanf("");
  }
  double v;
  if (exponent_field == 0) {
    v = std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -f.mantissa_bits),
                   exponent_field - f.bias);
  }
  return static_cast<float>(negative ? -v : v);
}

}  // namespace

uint8_t FloatToFloat8Bits(float x, Float8Format format, bool saturate) {
  return Encode(x, Get(format), saturate);
}

float Float8BitsToFloat(uint8_t bits, Float8Format format) { return Decode(bits, Get(format)); }

float Float8Max(Float8Format format) { return static_cast<float>(Get(format).max); }

uint8_t FloatToE8M0Bits(float x, bool saturate, E8M0Rounding rounding) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  uint32_t exponent = (b >> 23) & 0xffu;
  if (exponent == 0xffu) return 0xff;  // NaN, Inf
  bool up = false;
  switch (rounding) {
    case E8M0Rounding::kUp:
      up = (b & 0x7fffffu) != 0;
      break;
    case E8M0Rounding::kDown:
      break;
    case E8M0Rounding::kNearest: {
      // From the halfway point (mantissa 0.5) up; below the normal range (exponent field 0) a
      // value of exactly half the step stays down.
      const bool guard = (b & 0x400000u) != 0;
      const bool rest = (b & 0x3fffffu) != 0;
      up = guard && (rest || exponent > 0);
      break;
    }
  }
  if (up && !(saturate && exponent == 0xfeu)) ++exponent;  // 0xfe + 1: NaN without saturate
  return static_cast<uint8_t>(exponent);
}

float E8M0BitsToFloat(uint8_t bits) {
  if (bits == 0xff) return std::nanf("");
  return std::ldexp(1.f, static_cast<int>(bits) - 127);
}

uint8_t FloatToFloat4E2M1Bits(float x) {
  if (std::isnan(x)) return 0;
  return Encode(x, kE2M1, /*saturate=*/true);
}

float Float4E2M1BitsToFloat(uint8_t bits) { return Decode(bits & 0xf, kE2M1); }

}  // namespace kiln
