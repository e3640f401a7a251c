// Float8/float4/E8M0 conversions and sub-byte integer wrapping (core/minifloat.h) on each format's
// edge cases: largest finite value, saturation against Inf/NaN, ties to even, subnormals, signed
// zeros. (An exhaustive comparison with ml_dtypes over every float16 value and the midpoints of
// every float8 grid agreed bit for bit when this was written.)
#include "kiln/core/minifloat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::nanf("");

uint8_t F8(float x, Float8Format f, bool saturate = true) {
  return FloatToFloat8Bits(x, f, saturate);
}

TEST(Minifloat, E4M3FN) {
  constexpr auto f = Float8Format::kE4M3FN;
  EXPECT_EQ(Float8Max(f), 448.f);
  EXPECT_EQ(F8(1.f, f), 0x38);
  EXPECT_EQ(F8(448.f, f), 0x7e);
  EXPECT_EQ(F8(464.f, f, false), 0x7e);  // halfway to 480: ties to even (mantissa 110)
  EXPECT_EQ(F8(465.f, f), 0x7e);         // saturates
  EXPECT_EQ(F8(465.f, f, false), 0x7f);  // no Inf: NaN
  EXPECT_EQ(F8(-465.f, f, false), 0xff);
  EXPECT_EQ(F8(kInf, f), 0x7e);
  EXPECT_EQ(F8(-kInf, f), 0xfe);
  EXPECT_EQ(F8(kInf, f, false), 0x7f);
  EXPECT_EQ(F8(kNaN, f), 0x7f);
  EXPECT_EQ(F8(-0.f, f), 0x80);
  EXPECT_EQ(F8(1.0625f, f), 0x38);                 // tie between 1 and 1.125: even
  EXPECT_EQ(F8(1.1875f, f), 0x3a);                 // tie between 1.125 and 1.25: even
  EXPECT_EQ(F8(std::ldexp(1.f, -9), f), 0x01);     // smallest subnormal
  EXPECT_EQ(F8(std::ldexp(1.f, -10), f), 0x00);    // half of it: ties to even zero
  EXPECT_EQ(F8(std::ldexp(1.5f, -10), f), 0x01);   // above half
  EXPECT_EQ(F8(std::ldexp(1.f, -6), f), 0x08);     // smallest normal
  EXPECT_EQ(F8(std::ldexp(0.875f, -6), f), 0x07);  // largest subnormal
  EXPECT_EQ(Float8BitsToFloat(0x7e, f), 448.f);
  EXPECT_EQ(Float8BitsToFloat(0x01, f), std::ldexp(1.f, -9));
  EXPECT_TRUE(std::isnan(Float8BitsToFloat(0x7f, f)));
  EXPECT_TRUE(std::isnan(Float8BitsToFloat(0xff, f)));
  EXPECT_TRUE(std::signbit(Float8BitsToFloat(0x80, f)));
  EXPECT_EQ(Float8BitsToFloat(0x80, f), 0.f);
}

TEST(Minifloat, E4M3FNUZ) {
  constexpr auto f = Float8Format::kE4M3FNUZ;
  EXPECT_EQ(Float8Max(f), 240.f);
  EXPECT_EQ(F8(1.f, f), 0x40);  // bias 8
  EXPECT_EQ(F8(240.f, f), 0x7f);
  EXPECT_EQ(F8(248.f, f), 0x7f);         // saturates
  EXPECT_EQ(F8(248.f, f, false), 0x80);  // the tie rounds to even 256: past max, NaN
  EXPECT_EQ(F8(247.f, f, false), 0x7f);
  EXPECT_EQ(F8(-kInf, f), 0xff);
  EXPECT_EQ(F8(kInf, f, false), 0x80);
  EXPECT_EQ(F8(kNaN, f), 0x80);
  EXPECT_EQ(F8(-0.f, f), 0x00);                   // no negative zero
  EXPECT_EQ(F8(-std::ldexp(1.f, -12), f), 0x00);  // rounds to zero: +0, never the NaN pattern
  EXPECT_EQ(F8(std::ldexp(1.f, -10), f), 0x01);   // smallest subnormal
  EXPECT_TRUE(std::isnan(Float8BitsToFloat(0x80, f)));
  EXPECT_EQ(Float8BitsToFloat(0xff, f), -240.f);
}

TEST(Minifloat, E5M2) {
  constexpr auto f = Float8Format::kE5M2;
  EXPECT_EQ(Float8Max(f), 57344.f);
  EXPECT_EQ(F8(1.f, f), 0x3c);
  EXPECT_EQ(F8(57344.f, f), 0x7b);
  EXPECT_EQ(F8(61439.f, f, false), 0x7b);  // below the halfway point
  EXPECT_EQ(F8(61440.f, f, false), 0x7c);  // the tie rounds to even 65536: Inf
  EXPECT_EQ(F8(61440.f, f), 0x7b);         // saturates
  EXPECT_EQ(F8(kInf, f), 0x7b);
  EXPECT_EQ(F8(kInf, f, false), 0x7c);
  EXPECT_EQ(F8(-kInf, f, false), 0xfc);
  EXPECT_EQ(F8(kNaN, f), 0x7e);
  EXPECT_EQ(F8(-0.f, f), 0x80);
  EXPECT_EQ(F8(std::ldexp(1.f, -16), f), 0x01);
  EXPECT_EQ(F8(1.125f, f), 0x3c);  // tie between 1 and 1.25: even
  EXPECT_EQ(F8(1.375f, f), 0x3e);  // tie between 1.25 and 1.5: even
  EXPECT_EQ(Float8BitsToFloat(0x7c, f), kInf);
  EXPECT_EQ(Float8BitsToFloat(0xfc, f), -kInf);
  EXPECT_TRUE(std::isnan(Float8BitsToFloat(0x7d, f)));
}

TEST(Minifloat, E5M2FNUZ) {
  constexpr auto f = Float8Format::kE5M2FNUZ;
  EXPECT_EQ(Float8Max(f), 57344.f);
  EXPECT_EQ(F8(1.f, f), 0x40);  // bias 16
  EXPECT_EQ(F8(57344.f, f), 0x7f);
  EXPECT_EQ(F8(61440.f, f, false), 0x80);
  EXPECT_EQ(F8(kInf, f, false), 0x80);
  EXPECT_EQ(F8(-kInf, f), 0xff);
  EXPECT_EQ(F8(-0.f, f), 0x00);
  EXPECT_EQ(F8(std::ldexp(1.f, -17), f), 0x01);
  EXPECT_TRUE(std::isnan(Float8BitsToFloat(0x80, f)));
}

TEST(Minifloat, Float4E2M1) {
  EXPECT_EQ(FloatToFloat4E2M1Bits(6.f), 0x7);
  EXPECT_EQ(FloatToFloat4E2M1Bits(1000.f), 0x7);  // saturates (no Inf or NaN)
  EXPECT_EQ(FloatToFloat4E2M1Bits(-kInf), 0xf);
  EXPECT_EQ(FloatToFloat4E2M1Bits(kNaN), 0x0);
  EXPECT_EQ(FloatToFloat4E2M1Bits(0.25f), 0x0);  // tie between 0 and 0.5: even
  EXPECT_EQ(FloatToFloat4E2M1Bits(0.75f), 0x2);  // tie between 0.5 and 1: even
  EXPECT_EQ(FloatToFloat4E2M1Bits(5.f), 0x6);    // tie between 4 and 6: even
  EXPECT_EQ(FloatToFloat4E2M1Bits(-3.5f), 0xe);  // tie between 3 and 4: even (-4)
  EXPECT_EQ(FloatToFloat4E2M1Bits(-0.f), 0x8);
  const float values[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint8_t b = 0; b < 8; ++b) {
    EXPECT_EQ(Float4E2M1BitsToFloat(b), values[b]);
    EXPECT_EQ(Float4E2M1BitsToFloat(b | 0x8), -values[b]);
  }
}

TEST(Minifloat, E8M0RoundingModes) {
  using enum E8M0Rounding;
  EXPECT_EQ(FloatToE8M0Bits(1.f, true, kUp), 127);
  EXPECT_EQ(FloatToE8M0Bits(1.25f, true, kUp), 128);  // any fraction rounds up
  EXPECT_EQ(FloatToE8M0Bits(1.75f, true, kDown), 127);
  EXPECT_EQ(FloatToE8M0Bits(1.49f, true, kNearest), 127);
  EXPECT_EQ(FloatToE8M0Bits(1.5f, true, kNearest), 128);  // ties up
  EXPECT_EQ(FloatToE8M0Bits(0.f, true, kUp), 0);
  EXPECT_EQ(FloatToE8M0Bits(kNaN, true, kUp), 0xff);
  EXPECT_EQ(FloatToE8M0Bits(kInf, true, kUp), 0xff);
  const float big = std::ldexp(1.5f, 127);
  EXPECT_EQ(FloatToE8M0Bits(big, true, kUp), 0xfe);   // saturates at 2^127
  EXPECT_EQ(FloatToE8M0Bits(big, false, kUp), 0xff);  // NaN without saturate
  EXPECT_EQ(E8M0BitsToFloat(127), 1.f);
  EXPECT_EQ(E8M0BitsToFloat(0), std::ldexp(1.f, -127));
  EXPECT_TRUE(std::isnan(E8M0BitsToFloat(0xff)));
}

TEST(Minifloat, WrapToBits) {
  EXPECT_EQ(WrapToBits(7, 4, true), 7);
  EXPECT_EQ(WrapToBits(8, 4, true), -8);
  EXPECT_EQ(WrapToBits(-9, 4, true), 7);
  EXPECT_EQ(WrapToBits(-1, 4, false), 15);
  EXPECT_EQ(WrapToBits(20, 4, false), 4);
  EXPECT_EQ(WrapToBits(2, 2, true), -2);
  EXPECT_EQ(WrapToBits(-3, 2, true), 1);
  EXPECT_EQ(WrapToBits(-1, 2, false), 3);
}

}  // namespace
}  // namespace kiln
