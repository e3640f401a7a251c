// Shape rules past kiln's size limits: every rule's result goes through InferNode's size check,
// so ConstantOfShape, Expand, Tile, Pad, Range, Resize, Conv and Reshape to huge (or overflowing)
// shapes are KILN-E2015 naming the node, the output and the value, never a wrapped shape.
#include <gtest/gtest.h>

#include <limits>

#include "kiln/ir/graph.h"
#include "kiln/ir/sizes.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

constexpr int64_t k2to40 = int64_t{1} << 40;
constexpr int64_t k2to62 = int64_t{1} << 62;

Tensor I64(std::vector<int64_t> dims, std::vector<int64_t> v) {
  return Tensor::FromVector(DataType::kInt64, std::move(dims), v);
}
Tensor F32(std::vector<int64_t> dims, std::vector<float> v) {
  return Tensor::FromVector(DataType::kFloat32, std::move(dims), v);
}

struct Operand {
  Operand(Shape s) : shape(std::move(s)) {}      // NOLINT: a graph input of this shape
  Operand(Tensor t) : constant(std::move(t)) {}  // NOLINT: a constant
  Shape shape;
  std::optional<Tensor> constant;
};

// One node "n" with output "y" over float inputs and constants; the inference status.
Status Infer(const std::string& op, std::vector<Operand> ins, AttributeMap attrs = {}) {
  Graph g;
  std::vector<Value*> values;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = fmt::format("i{}", i);
    values.push_back(ins[i].constant ? g.AddConstant(name, *ins[i].constant)
                                     : g.AddInput(name, DataType::kFloat32, ins[i].shape));
  }
  g.AddNode(op, "n", values, {g.AddValue("y")}, std::move(attrs));
  return InferShapes(g).status();
}

AttributeMap Attrs(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  AttributeMap a;
  for (auto& [k, v] : kv) a.Set(k, v);
  return a;
}

// The refusal every case expects: KILN-E2015 naming node, output and (part of) the value.
void ExpectTooLarge(const Status& s, const std::string& value) {
  EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("node 'n'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("output 'y'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(value), std::string::npos) << s.message();
}

TEST(SizeRules, ConstantOfShapeExpandAndTileToHugeShapes) {
  ExpectTooLarge(Infer("ConstantOfShape", {I64({1}, {k2to40})}), "1099511627776");
  ExpectTooLarge(Infer("ConstantOfShape", {I64({2}, {int64_t{1} << 32, int64_t{1} << 32})}),
                 "4294967296,4294967296");
  ExpectTooLarge(Infer("Expand", {Shape{1, 3}, I64({2}, {k2to40, 3})}), "1099511627776");
  ExpectTooLarge(Infer("Tile", {Shape{2, 3}, I64({2}, {k2to40, 1})}), "2199023255552");
  // Tile reps whose product with the dim overflows int64: saturated, still refused.
  ExpectTooLarge(Infer("Tile", {Shape{8, 3}, I64({2}, {k2to62, 1})}), "9223372036854775807");
  // A shape just inside the limits is fine: 2^28 floats.
  EXPECT_TRUE(Infer("ConstantOfShape", {I64({1}, {int64_t{1} << 28})}).ok());
}

TEST(SizeRules, PadRangeAndResizeToHugeShapes) {
  ExpectTooLarge(Infer("Pad", {Shape{1, 3}, I64({4}, {0, 0, 0, k2to40})}), "1099511627779");
  // 2^62 + 2^62 + 3 overflows: saturated, refused.
  ExpectTooLarge(Infer("Pad", {Shape{1, 3}, I64({4}, {0, k2to62, 0, k2to62})}),
                 "9223372036854775807");
  ExpectTooLarge(Infer("Range", {F32({}, {0}), F32({}, {1.1529215e18f}), F32({}, {1})}),
                 "1152921504606846976");
  // A float range whose count is past int64 (1e30 elements) saturates rather than trapping.
  ExpectTooLarge(Infer("Range", {F32({}, {0}), F32({}, {1e30f}), F32({}, {1})}),
                 "9223372036854775807");
  Tensor none(DataType::kFloat32, {0});
  ExpectTooLarge(Infer("Resize", {Shape{1, 3, 224, 224}, none, F32({4}, {1, 1, 1e9f, 1e9f})}),
                 "224000000000");
  ExpectTooLarge(Infer("Resize", {Shape{1, 3, 224, 224}, none, F32({4}, {1, 1, 1e30f, 1})}),
                 "9223372036854775807");
}

TEST(SizeRules, ConvPadsAndWindowAttributesPastTheLimits) {
  Tensor w(DataType::kFloat32, {8, 3, 3, 3});
  ExpectTooLarge(Infer("Conv", {Shape{1, 3, 32, 32}, w},
                       Attrs({{"pads", std::vector<int64_t>{k2to40, 0, k2to40, 0}}})),
                 "2199023255582");
  // Attributes beyond the per-dim limit, or a dilated kernel past it, are the attribute's error.
  Status s = Infer("Conv", {Shape{1, 3, 32, 32}, w},
                   Attrs({{"pads", std::vector<int64_t>{k2to62, 0, 0, 0}}}));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidAttribute) << s.ToString();
  EXPECT_NE(s.message().find("4611686018427387904"), std::string::npos) << s.message();
  s = Infer("Conv", {Shape{1, 3, 32, 32}, w},
            Attrs({{"dilations", std::vector<int64_t>{k2to40, 1}}}));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidAttribute) << s.ToString();
  s = Infer("MaxPool", {Shape{1, 3, 32, 32}},
            Attrs({{"kernel_shape", std::vector<int64_t>{2, 2}},
                   {"strides", std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 1}}}));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidAttribute) << s.ToString();
}

TEST(SizeRules, ReshapeAndSliceNeverWrap) {
  // [2^32, 2^32] wraps to 0 elements unchecked, which once made a "peak 0 B" plan: an empty
  // input no longer matches it, and a symbolic one gives a shape past the limits.
  const Tensor square = I64({2}, {int64_t{1} << 32, int64_t{1} << 32});
  EXPECT_EQ(Infer("Reshape", {Shape{0}, square}).code(), ErrorCode::kShapeMismatch);
  ExpectTooLarge(Infer("Reshape", {Shape{Dim::Symbol("n")}, square}), "4294967296");
  // A step of INT64_MIN cannot be negated: still a clean, exact result.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {10});
  Value* y = g.AddValue("y");
  const int64_t lo = std::numeric_limits<int64_t>::min();
  g.AddNode("Slice", "n",
            {x, g.AddConstant("s", I64({1}, {9})), g.AddConstant("e", I64({1}, {lo})),
             g.AddConstant("a", I64({1}, {0})), g.AddConstant("st", I64({1}, {lo}))},
            {y});
  ASSERT_TRUE(InferShapes(g).ok());
  EXPECT_EQ(y->shape(), (Shape{1}));
}

// Arithmetic on dims-values and attributes that would trap (INT64_MIN / -1) or divide by a
// wrapped zero (blocksize^2 of 2^32) is a value or an attribute error, never SIGFPE.
TEST(SizeRules, DivisionsThatWouldTrapAreSafe) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  EXPECT_TRUE(Infer("Div", {I64({1}, {lo}), I64({1}, {-1})}).ok());
  Status s = Infer("DepthToSpace", {Shape{1, 16, 2, 2}}, Attrs({{"blocksize", int64_t{1} << 32}}));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidAttribute) << s.ToString();
  s = Infer("SpaceToDepth", {Shape{1, 16, 2, 2}}, Attrs({{"blocksize", int64_t{1} << 32}}));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidAttribute) << s.ToString();
}

}  // namespace
}  // namespace kiln
