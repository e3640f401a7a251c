// ONNX's 8- and 4-bit float formats (float8 E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0; float4
// E2M1) as bits, and the sub-byte integers (int4/uint4/int2/uint2) as sign-extended bytes:
// conversions to and from float with the rounding and special-value rules of ONNX's Cast.
#pragma once

#include <cstdint>

namespace kiln {

enum class Float8Format : uint8_t {
  kE4M3FN,    // bias 7, no Inf, NaN = S.1111.111, max 448
  kE4M3FNUZ,  // bias 8, no Inf, no -0, NaN = 0x80, max 240
  kE5M2,      // bias 15, IEEE-like: Inf = S.11111.00, NaN = S.11111.xx, max 57344
  kE5M2FNUZ,  // bias 16, no Inf, no -0, NaN = 0x80, max 57344
};

// x to float8, rounding to nearest even. saturate (ONNX's default): +-Inf and values that round
// past the largest finite value become +-max. Without it they become Inf (E5M2) or NaN (the
// others). NaN stays NaN; -0 and negative values that round to 0 are +0 in the FNUZ formats.
uint8_t FloatToFloat8Bits(float x, Float8Format format, bool saturate);
float Float8BitsToFloat(uint8_t bits, Float8Format format);
// The largest finite value of the format (448, 240, 57344, 57344).
float Float8Max(Float8Format format);

// E8M0 (an exponent: 2^(bits - 127), 0xFF = NaN, no sign, no zero): the rounding of ONNX's
// Cast-24 `round_mode` on the float32 exponent. kUp rounds any fraction up, kDown drops it,
// kNearest rounds up from the halfway point (ties up). saturate keeps a value that would round
// past 2^127 at 2^127 instead of NaN. NaN and Inf become 0xFF; the sign is ignored (negative
// inputs are undefined in ONNX).
enum class E8M0Rounding : uint8_t { kUp, kDown, kNearest };
uint8_t FloatToE8M0Bits(float x, bool saturate, E8M0Rounding rounding);
float E8M0BitsToFloat(uint8_t bits);

// float4 E2M1 (bias 1; values 0, 0.5, 1, 1.5, 2, 3, 4, 6; no Inf or NaN), in the low nibble:
// round to nearest even, saturating to +-6 (also for +-Inf); NaN becomes +0.
uint8_t FloatToFloat4E2M1Bits(float x);
float Float4E2M1BitsToFloat(uint8_t bits);

// An integer wrapped to `bits` bits (two's complement: the higher bits are dropped), sign-
// extended for signed types: WrapToBits(9, 4, true) == -7, WrapToBits(-1, 4, false) == 15.
inline int64_t WrapToBits(int64_t v, int bits, bool is_signed) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const uint64_t u = static_cast<uint64_t>(v) & mask;
  if (is_signed && (u >> (bits - 1)) != 0) return static_cast<int64_t>(u | ~mask);
  return static_cast<int64_t>(u);
}

}  // namespace kiln
