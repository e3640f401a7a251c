// The pattern matcher on its own: commutativity, repeated captures, alternatives, constants and
// the private-intermediate rule. Needs no kernels.
#include "kiln/passes/pattern.h"

#include <gtest/gtest.h>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using testing::Const;
using testing::Op;

TEST(Pattern, CommutativeOpsMatchEitherOperandOrder) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4});
  Value* c = Const(g, testing::Scalar(2.f));
  Value* y = Op(g, "Add", {c, x});  // constant first, as BERT's bias adds are
  g.MarkOutput(y);
  Pattern p = pat::Op("Add", {pat::Any("x"), pat::Constant("c")});
  auto m = MatchAt(p, y->producer());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->value("x"), x);
  EXPECT_EQ(m->value("c"), c);
  // Sub is not commutative: the same operand order fails.
  Value* z = Op(g, "Sub", {c, x});
  EXPECT_FALSE(MatchAt(pat::Op("Sub", {pat::Any("x"), pat::Constant("c")}), z->producer()));
}

TEST(Pattern, RepeatedCaptureMustBindTheSameValue) {
  Graph g;
  Value* a = g.AddInput("a", DataType::kFloat32, {4});
  Value* b = g.AddInput("b", DataType::kFloat32, {4});
  Value* aa = Op(g, "Mul", {a, a});
  Value* ab = Op(g, "Mul", {a, b});
  Pattern square = pat::Op("Mul", {pat::Any("x"), pat::Any("x")});
  auto m = MatchAt(square, aa->producer());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->value("x"), a);
  EXPECT_FALSE(MatchAt(square, ab->producer()));
}

TEST(Pattern, BacktracksThroughNestedCommutativeOps) {
  // x * (1 + erf(x)): the outer Mul's operand order decides which side binds x first.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4});
  Value* e = Op(g, "Erf", {x});
  Value* one_plus = Op(g, "Add", {Const(g, testing::Scalar(1.f)), e});
  Value* y = Op(g, "Mul", {one_plus, x});
  Pattern p = pat::Op(
      "Mul", {pat::Any("x"), pat::Op("Add", {pat::Op("Erf", {pat::Any("x")}), pat::Scalar(1.0)})});
  auto m = MatchAt(p, y->producer());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->value("x"), x);
  EXPECT_EQ(m->matched.size(), 3u);
  EXPECT_EQ(m->matched.front(), y->producer());
}

TEST(Pattern, ScalarChecksEveryElement) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2});
  Value* half = Const(g, Tensor::FromVector<float>(DataType::kFloat32, {2}, {0.5f, 0.5f}));
  Value* mixed = Const(g, Tensor::FromVector<float>(DataType::kFloat32, {2}, {0.5f, 0.25f}));
  Value* y1 = Op(g, "Mul", {x, half});
  Value* y2 = Op(g, "Mul", {x, mixed});
  Pattern p = pat::Op("Mul", {pat::Any("x"), pat::Scalar(0.5)});
  EXPECT_TRUE(MatchAt(p, y1->producer()).has_value());
  EXPECT_FALSE(MatchAt(p, y2->producer()).has_value());
}

TEST(Pattern, OneOfTriesAlternativesAndRecordsTheirCaptures) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4});
  Value* d = Op(g, "Div", {x, Const(g, testing::Scalar(2.f))});
  Value* y = Op(g, "Relu", {d});
  Pattern scaled = pat::OneOf({pat::Op("Mul", {pat::Any("x"), pat::Constant("k")}).Capture("mul"),
                               pat::Op("Div", {pat::Any("x"), pat::Constant("k")}).Capture("div")});
  auto m = MatchAt(pat::Op("Relu", {scaled}), y->producer());
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->has("mul"));
  EXPECT_EQ(m->node("div"), d->producer());
}

TEST(Pattern, IntermediateReadOutsideTheMatchDoesNotMatch) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4});
  Value* s = Op(g, "Add", {x, Const(g, testing::Scalar(1.f))});
  Value* y = Op(g, "Relu", {s});
  g.MarkOutput(y);
  Pattern p = pat::Op("Relu", {pat::Op("Add", {pat::Any("x"), pat::Constant()})});
  EXPECT_TRUE(MatchAt(p, y->producer()).has_value());
  Value* other = Op(g, "Neg", {s});  // a second reader of the intermediate
  g.MarkOutput(other);
  EXPECT_FALSE(MatchAt(p, y->producer()).has_value());
  // Shared() allows it: the rewrite keeps that node for its other reader.
  Pattern shared = pat::Op("Relu", {pat::Op("Add", {pat::Any("x"), pat::Constant()}).Shared()});
  EXPECT_TRUE(MatchAt(shared, y->producer()).has_value());
  // An intermediate that is a graph output is read outside too.
  g.RemoveNode(other->producer());
  g.UnmarkOutput(other);
  g.MarkOutput(s);
  EXPECT_FALSE(MatchAt(p, y->producer()).has_value());
}

TEST(Pattern, NodePredicatesFilter) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 3});
  Value* y = Op(g, "Softmax", {x}, testing::Attrs(std::pair{"axis", int64_t{0}}));
  auto last_axis = [](const Node& n) { return n.attrs().GetInt("axis", -1) == -1; };
  EXPECT_FALSE(MatchAt(pat::Op("Softmax", {pat::Any()}).Where(last_axis), y->producer()));
  EXPECT_TRUE(MatchAt(pat::Op("Softmax", {pat::Any()}), y->producer()));
}

}  // namespace
}  // namespace kiln::passes
