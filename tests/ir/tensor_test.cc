#include "kiln/ir/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln {
namespace {

TEST(Float16, RoundTripsAndRounds) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
    float back = HalfBitsToFloat(FloatToHalfBits(f));
    EXPECT_NEAR(back, f, std::fabs(f) * 1e-3 + 1e-7) << f;
  }
  EXPECT_EQ(FloatToHalfBits(1.f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(65520.f), 0x7c00);  // rounds to inf
  EXPECT_EQ(FloatToHalfBits(-0.f), 0x8000);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(NAN))));
  EXPECT_EQ(FloatToBFloat16Bits(1.f), 0x3f80);
  EXPECT_EQ(BFloat16BitsToFloat(FloatToBFloat16Bits(3.140625f)), 3.140625f);
}

TEST(Tensor, CastAndCopyOnWrite) {
  Tensor t = Tensor::FromVector<float>(DataType::kFloat32, {2, 2}, {1.5f, -2.f, 3.25f, 4.f});
  Tensor h = t.CastTo(DataType::kFloat16);
  EXPECT_EQ(h.size_bytes(), 8u);
  EXPECT_EQ(h.GetDouble(2), 3.25);
  Tensor i = t.CastTo(DataType::kInt64);
  EXPECT_EQ(i.ToInt64Vector(), (std::vector<int64_t>{1, -2, 3, 4}));
  Tensor copy = t;
  copy.mutable_data<float>()[0] = 9.f;
  EXPECT_EQ(t.data<float>()[0], 1.5f);
  EXPECT_EQ(copy.data<float>()[0], 9.f);
}

}  // namespace
}  // namespace kiln
