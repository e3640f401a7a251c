#include "kiln/backends/cpu/cpu_eval.h"

#include <gtest/gtest.h>

#include "kiln/backends/reference.h"

namespace kiln::cpu {
namespace {

TEST(CpuEval, RunsAGraphNodeByNode) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 3});
  Value* s = g.AddValue("s");
  Value* y = g.AddValue("y");
  g.AddNode("Relu", "relu2", {s}, {y});  // added first: evaluation follows data, not insertion
  g.AddNode("Relu", "relu1", {x}, {s});
  g.MarkOutput(y);
  auto out =
      EvaluateGraph(g, {{"x", Tensor::FromVector<float>(DataType::kFloat32, {2, 3},
                                                        {0.5f, 1.f, -1.f, -3.f, 4.f, 0.25f})}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Tensor& t = out->at("y");
  EXPECT_EQ(t.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.ToFloatVector(), (std::vector<float>{0.5f, 1.f, 0.f, 0.f, 4.f, 0.25f}));
}

TEST(CpuEval, HalfStorageRunsThroughTheF32Wrapper) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat16, {4});
  Value* y = g.AddValue("y");
  g.AddNode("Relu", "relu", {x}, {y});
  g.MarkOutput(y);
  Tensor in = Tensor::FromVector<float>(DataType::kFloat32, {4}, {-1.f, 2.5f, -0.f, 3.f})
                  .CastTo(DataType::kFloat16);
  auto out = EvaluateGraph(g, {{"x", in}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->at("y").dtype(), DataType::kFloat16);
  EXPECT_EQ(out->at("y").ToFloatVector(), (std::vector<float>{0.f, 2.5f, 0.f, 3.f}));
}

TEST(CpuEval, MissingKernelIsACatalogError) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kInt64, {4});
  Value* y = g.AddValue("y");
  g.AddNode("Relu", "relu_i64", {x}, {y});
  g.MarkOutput(y);
  auto out = EvaluateGraph(g, {{"x", Tensor(DataType::kInt64, {4})}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kNoTactic);
}

// Linking the CPU backend registers it as the reference that the builder hands to passes and
// precision: the same results as EvaluateNode.
TEST(CpuEval, IsTheRegisteredReferenceEvaluator) {
  const NodeEvaluator& reference = ReferenceEvaluator();
  ASSERT_TRUE(reference);
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {3});
  Value* y = g.AddValue("y");
  const Node* relu = g.AddNode("Relu", "relu", {x}, {y});
  g.MarkOutput(y);
  Tensor in = Tensor::FromVector<float>(DataType::kFloat32, {3}, {-1.f, 0.5f, 2.f});
  const Tensor* ins[] = {&in};
  auto out = reference(*relu, ins);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].ToFloatVector(), (std::vector<float>{0.f, 0.5f, 2.f}));
}

}  // namespace
}  // namespace kiln::cpu
