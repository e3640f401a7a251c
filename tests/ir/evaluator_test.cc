// The graph walker over a NodeEvaluator, with a fake evaluator (no backend): order, what each
// node receives, what comes back, and the errors.
#include "kiln/ir/evaluator.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

Tensor Scalar(float v) { return Tensor::FromVector<float>(DataType::kFloat32, {1}, {v}); }

// x -> "add_one"(x, c=10) -> s -> "add_one"(s) -> y; the fake adds its inputs and one.
std::unique_ptr<Graph> Chain() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {1});
  Value* c = g->AddConstant("c", Scalar(10));
  Value* s = g->AddValue("s");
  Value* y = g->AddValue("y");
  g->AddNode("Fake", "second", {s}, {y});  // added first: the walk follows data
  g->AddNode("Fake", "first", {x, c, nullptr}, {s});
  g->MarkOutput(y);
  return g;
}

TEST(Evaluator, WalksInTopologicalOrderAndKeepsEveryValue) {
  auto g = Chain();
  std::vector<std::string> calls;
  NodeEvaluator fake = [&](const Node& node,
                           std::span<const Tensor* const> ins) -> StatusOr<std::vector<Tensor>> {
    calls.push_back(node.name());
    float sum = 1;
    for (const Tensor* t : ins) sum += t ? t->ToFloatVector()[0] : 1000;  // omitted: nullptr
    return std::vector<Tensor>{Scalar(sum)};
  };
  auto all = EvaluateAllValues(*g, {{"x", Scalar(2)}}, fake);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(calls, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(all->at("x").ToFloatVector()[0], 2.f);
  EXPECT_EQ(all->at("s").ToFloatVector()[0], 1013.f);  // 1 + 2 + 10 + 1000 (omitted input)
  EXPECT_EQ(all->at("y").ToFloatVector()[0], 1014.f);
  auto outs = EvaluateGraphOutputs(*g, {{"x", Scalar(2)}}, fake);
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_EQ(outs->at("y").ToFloatVector()[0], 1014.f);
}

TEST(Evaluator, MissingInputNodeErrorAndNoEvaluatorAreErrors) {
  auto g = Chain();
  NodeEvaluator fails = [](const Node& node,
                           std::span<const Tensor* const>) -> StatusOr<std::vector<Tensor>> {
    return MakeError(ErrorCode::kNoTactic, "no kernel for '{}'", node.name());
  };
  EXPECT_EQ(EvaluateAllValues(*g, {}, fails).status().code(), ErrorCode::kInputCountMismatch);
  auto failed = EvaluateAllValues(*g, {{"x", Scalar(2)}}, fails);
  EXPECT_EQ(failed.status().code(), ErrorCode::kNoTactic);
  EXPECT_NE(failed.status().message().find("'first'"), std::string::npos);
  EXPECT_EQ(EvaluateAllValues(*g, {{"x", Scalar(2)}}, NodeEvaluator()).status().code(),
            ErrorCode::kInternal);
}

}  // namespace
}  // namespace kiln
