// Checked size arithmetic (ir/sizes.h): saturating primitives, the per-tensor and total limits at
// their boundaries, errors that name the tensor and the value, and Dim arithmetic that saturates
// instead of wrapping.
#include "kiln/ir/sizes.h"

#include <gtest/gtest.h>

#include <limits>
#include <new>

#include "kiln/ir/tensor.h"

namespace kiln {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t k2to32 = int64_t{1} << 32;

TEST(Saturating, ClampsInsteadOfWrapping) {
  EXPECT_EQ(SatAdd(3, 4), 7);
  EXPECT_EQ(SatAdd(kMax, 1), kMax);
  EXPECT_EQ(SatAdd(kMin, -1), kMin);
  EXPECT_EQ(SatSub(kMin, 1), kMin);
  EXPECT_EQ(SatSub(0, kMin), kMax);
  EXPECT_EQ(SatMul(k2to32, k2to32), kMax);  // wraps to 0 unchecked: the "peak 0 B" plan
  EXPECT_EQ(SatMul(-k2to32, k2to32), kMin);
  EXPECT_EQ(SatMul(-3, 5), -15);
  EXPECT_EQ(SatFromDouble(2.9), 2);
  EXPECT_EQ(SatFromDouble(-2.9), -2);
  EXPECT_EQ(SatFromDouble(1e30), kMax);
  EXPECT_EQ(SatFromDouble(-1e30), kMin);
  EXPECT_EQ(SatFromDouble(std::numeric_limits<double>::quiet_NaN()), kMax);
  EXPECT_EQ(CheckedMul(k2to32, k2to32), std::nullopt);
  EXPECT_EQ(CheckedMul(k2to32, 4), k2to32 * 4);
  EXPECT_EQ(CheckedAdd(kMax, 1), std::nullopt);
}

TEST(CheckedTensorSize, CountsElementsAndBytes) {
  std::vector<int64_t> dims = {2, 3, 4};
  auto s = CheckedTensorSize(dims, DataType::kFloat32, ErrorCode::kTensorTooLarge, "t");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->elements, 24);
  EXPECT_EQ(s->bytes, 96);
  std::vector<int64_t> empty = {0, 5};
  s = CheckedTensorSize(empty, DataType::kFloat32, ErrorCode::kTensorTooLarge, "t");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->elements, 0);
  EXPECT_EQ(s->bytes, 0);
  s = CheckedTensorSize({}, DataType::kInt64, ErrorCode::kTensorTooLarge, "scalar");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->elements, 1);
  EXPECT_EQ(s->bytes, 8);
}

TEST(CheckedTensorSize, LimitIsInclusiveAtOneTebibyte) {
  // 2^38 floats are exactly 2^40 bytes; one more element is past the limit.
  std::vector<int64_t> at = {int64_t{1} << 38};
  auto s = CheckedTensorSize(at, DataType::kFloat32, ErrorCode::kTensorTooLarge, "t");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->bytes, kMaxTensorBytes);
  std::vector<int64_t> past = {(int64_t{1} << 38) + 1};
  s = CheckedTensorSize(past, DataType::kFloat32, ErrorCode::kTensorTooLarge, "tensor 'w'");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kTensorTooLarge);
  EXPECT_NE(s.status().message().find("tensor 'w'"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("1099511627780 bytes"), std::string::npos)
      << s.status().message();
  // The same element count in bytes is fine.
  std::vector<int64_t> bytes = {kMaxTensorBytes};
  EXPECT_TRUE(CheckedTensorSize(bytes, DataType::kUInt8, ErrorCode::kTensorTooLarge, "t").ok());
}

TEST(CheckedTensorSize, RejectsOverflowHugeAndNegativeDimsNamingTheValue) {
  std::vector<int64_t> square = {k2to32, k2to32};  // 2^64 elements: wraps to 0 unchecked
  auto s = CheckedTensorSize(square, DataType::kFloat32, ErrorCode::kProfileTooLarge, "value 'v'");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kProfileTooLarge);
  EXPECT_NE(s.status().message().find("value 'v'"), std::string::npos);
  EXPECT_NE(s.status().message().find("[4294967296,4294967296]"), std::string::npos)
      << s.status().message();

  std::vector<int64_t> huge = {1, int64_t{1} << 62};
  s = CheckedTensorSize(huge, DataType::kFloat32, ErrorCode::kTensorTooLarge, "input 'x'");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("dimension 1 is 4611686018427387904"), std::string::npos)
      << s.status().message();

  // A zero elsewhere does not excuse a huge dim (its strides would still overflow).
  std::vector<int64_t> zero_and_huge = {0, kMax};
  s = CheckedTensorSize(zero_and_huge, DataType::kFloat32, ErrorCode::kTensorTooLarge, "t");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("9223372036854775807"), std::string::npos);

  std::vector<int64_t> negative = {3, -1};
  s = CheckedTensorSize(negative, DataType::kFloat32, ErrorCode::kTensorTooLarge, "t");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("dimension 1 is negative (-1)"), std::string::npos);
}

TEST(CheckShapeSize, ChecksTheStaticPartOfSymbolicShapes) {
  const Dim batch = Dim::Symbol("batch");
  EXPECT_TRUE(
      CheckShapeSize({batch, 3, 224, 224}, DataType::kFloat32, ErrorCode::kTensorTooLarge, "x")
          .ok());
  Status s = CheckShapeSize({batch, k2to32, k2to32}, DataType::kFloat32, ErrorCode::kTensorTooLarge,
                            "graph input 'x'");
  EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge);
  EXPECT_NE(s.message().find("graph input 'x'"), std::string::npos);
  EXPECT_NE(s.message().find("[batch,4294967296,4294967296]"), std::string::npos) << s.message();
  // A saturated dim (an overflowed rule) is past the per-dim limit.
  s = CheckShapeSize({Dim(kMax)}, DataType::kFloat32, ErrorCode::kTensorTooLarge, "y");
  EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge);
  s = CheckShapeSize({Dim(kMin)}, DataType::kFloat32, ErrorCode::kTensorTooLarge, "y");
  EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge);
  EXPECT_NE(s.message().find("negative"), std::string::npos);
}

TEST(CheckedTotals, SumsAndAlignmentStayInsideTheTotalLimit) {
  EXPECT_EQ(*CheckedTotalBytes(100, 28, ErrorCode::kProfileTooLarge, "plan"), 128);
  auto over = CheckedTotalBytes(kMaxTotalBytes, 1, ErrorCode::kProfileTooLarge, "the plan's peak");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), ErrorCode::kProfileTooLarge);
  EXPECT_NE(over.status().message().find("the plan's peak"), std::string::npos);
  EXPECT_FALSE(CheckedTotalBytes(kMax, kMax, ErrorCode::kProfileTooLarge, "p").ok());
  EXPECT_FALSE(CheckedTotalBytes(-1, 1, ErrorCode::kProfileTooLarge, "p").ok());

  EXPECT_EQ(*CheckedAlignUp(0, 64, ErrorCode::kProfileTooLarge, "b"), 0);
  EXPECT_EQ(*CheckedAlignUp(1, 64, ErrorCode::kProfileTooLarge, "b"), 64);
  EXPECT_EQ(*CheckedAlignUp(128, 64, ErrorCode::kProfileTooLarge, "b"), 128);
  EXPECT_EQ(CheckedAlignUp(kMax, 64, ErrorCode::kProfileTooLarge, "b").status().code(),
            ErrorCode::kProfileTooLarge);
  EXPECT_EQ(CheckedAlignUp(-64, 64, ErrorCode::kProfileTooLarge, "b").status().code(),
            ErrorCode::kProfileTooLarge);
  EXPECT_EQ(CheckedAlignUp(64, 0, ErrorCode::kProfileTooLarge, "b").status().code(),
            ErrorCode::kInternal);
}

TEST(Dim, StaticArithmeticSaturates) {
  EXPECT_EQ((Dim(k2to32) * Dim(k2to32)).value(), kMax);
  EXPECT_EQ((Dim(kMax) + Dim(1)).value(), kMax);
  EXPECT_EQ((Dim(kMin) - Dim(1)).value(), kMin);
  EXPECT_EQ(FloorDiv(Dim(kMin), Dim(-1)).value(), kMax);  // would trap unchecked
  EXPECT_EQ(Mod(Dim(kMin), Dim(-1)).value(), 0);
  EXPECT_EQ(NumElements(Shape{k2to32, k2to32, 2}).value(), kMax);
}

TEST(Dim, SymbolicCoefficientsAndSubstitutionSaturate) {
  const Dim b = Dim::Symbol("b");
  Dim big = b * (int64_t{1} << 62) * 4;  // the coefficient 2^64 saturates
  EXPECT_EQ(big.Substitute({{"b", 1}}).value(), kMax);
  EXPECT_EQ((b * k2to32).Substitute({{"b", k2to32}}).value(), kMax);
  EXPECT_EQ((b + kMax).Substitute({{"b", 5}}).value(), kMax);
}

TEST(TensorSizes, ProductsSaturateAndOversizedTensorsAreNeverUnderAllocated) {
  EXPECT_EQ(NumElements(std::vector<int64_t>{k2to32, k2to32}), kMax);
  EXPECT_EQ(ByteSize(kMax, DataType::kFloat32), static_cast<size_t>(kMax));
  TensorView v{DataType::kFloat32, {}, nullptr};
  std::vector<int64_t> dims = {k2to32, k2to32};
  v.dims = dims;
  EXPECT_EQ(v.num_elements(), kMax);
  // Unchecked dims (a caller bug, not user input) fail to allocate instead of wrapping to 0.
  EXPECT_THROW(Tensor(DataType::kFloat32, {k2to32, k2to32}), std::bad_alloc);
}

}  // namespace
}  // namespace kiln
