#include "kiln/ir/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

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

// CastTo's typed float paths give exactly what the element-by-element path through double gives
// (StoreFromDouble), over normal, subnormal, huge, infinite, NaN and signed-zero values.
TEST(Tensor, TypedFloatCastsMatchTheGenericPath) {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -2.5f,
                          65504.f,
                          65519.f,
                          65520.f,
                          1e9f,
                          -1e9f,
                          6.1035156e-05f,
                          5.9604645e-08f,
                          2.9802322e-08f,
                          1e-30f,
                          0.333333f,
                          INFINITY,
                          -INFINITY,
                          NAN,
                          3.4e38f};
  for (int i = 0; i < 1000; ++i) v.push_back(std::ldexp(std::sin(i * 0.37f), (i % 60) - 30));
  Tensor f32 = Tensor::FromVector<float>(DataType::kFloat32, {static_cast<int64_t>(v.size())}, v);
  for (DataType to : {DataType::kFloat16, DataType::kBFloat16}) {
    Tensor fast = f32.CastTo(to);
    Tensor slow(to, f32.dims());
    for (int64_t i = 0; i < f32.num_elements(); ++i) {
      StoreFromDouble(slow.view(), i, f32.GetDouble(i));
    }
    ASSERT_EQ(std::memcmp(fast.raw(), slow.raw(), fast.size_bytes()), 0) << ToString(to);
    Tensor back = fast.CastTo(DataType::kFloat32);
    for (int64_t i = 0; i < back.num_elements(); ++i) {
      const double want = fast.GetDouble(i);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(back.data<float>()[i]));
      } else {
        EXPECT_EQ(back.data<float>()[i], want) << i;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
