#include "kiln/ir/dim.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(Dim, StaticArithmetic) {
  EXPECT_EQ((Dim(3) + Dim(4)).value(), 7);
  EXPECT_EQ((Dim(3) * Dim(4)).value(), 12);
  EXPECT_EQ(FloorDiv(Dim(-7), Dim(2)).value(), -4);
  EXPECT_EQ(Mod(Dim(-7), Dim(2)).value(), 1);
  EXPECT_EQ(CeilDiv(Dim(7), Dim(2)).value(), 4);
  EXPECT_TRUE(Dim(0).is_static());
  EXPECT_EQ(Dim(0).value(), 0);
}

TEST(Dim, SymbolicPolynomials) {
  Dim b = Dim::Symbol("batch"), s = Dim::Symbol("seq");
  Dim bs = b * s;
  EXPECT_EQ(bs.ToString(), "batch*seq");
  EXPECT_EQ((b * s * 12).ToString(), "12*batch*seq");
  EXPECT_EQ(FloorDiv(b * s * 768, Dim(12)).ToString(), "64*batch*seq");
  EXPECT_EQ(FloorDiv(b * s * 768, s), b * 768);
  EXPECT_EQ(b + b, b * 2);
  EXPECT_EQ(b - b, Dim(0));
  EXPECT_EQ((s * 2 + 1).ToString(), "2*seq+1");
  EXPECT_FALSE(FloorDiv(s, Dim(2)).is_static());
  EXPECT_EQ(FloorDiv(s, Dim(2)).ToString(), "floordiv(seq,2)");
}

TEST(Dim, Substitution) {
  Dim b = Dim::Symbol("batch"), s = Dim::Symbol("seq");
  Dim e = b * s * 3 + 1;
  EXPECT_EQ(e.Substitute({{"batch", 2}, {"seq", 5}}).value(), 31);
  EXPECT_EQ(e.Substitute({{"batch", 2}}).ToString(), "6*seq+1");
  EXPECT_EQ(e.Symbols(), (std::vector<std::string>{"batch", "seq"}));
}

TEST(Shape, Helpers) {
  Shape s{Dim::Symbol("n"), 3, 4};
  EXPECT_EQ(ToString(s), "[n,3,4]");
  EXPECT_FALSE(IsStatic(s));
  EXPECT_EQ(NumElements(s).ToString(), "12*n");
  EXPECT_EQ(*StaticDims(MakeShape({2, 3})), (std::vector<int64_t>{2, 3}));
}

}  // namespace
}  // namespace kiln
