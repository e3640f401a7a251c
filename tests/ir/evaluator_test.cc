// The graph walker over a NodeEvaluator, with a fake evaluator (no backend): order, what each
// node receives, what comes back, and the errors.
#include "kiln/ir/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

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

// The statistics walk: the same values as EvaluateAllValues, reduced as they are computed and
// dropped after their last reader (a tensor the fake still sees alive would be a leak); kept ones
// come back, and the errors are the walker's.
TEST(Evaluator, ValueStatsReduceEachValueAndKeepOnlyWhatIsAsked) {
  auto g = Chain();
  std::vector<std::weak_ptr<const void>> made;
  NodeEvaluator fake = [&](const Node& node,
                           std::span<const Tensor* const> ins) -> StatusOr<std::vector<Tensor>> {
    float sum = 1;
    for (const Tensor* t : ins) sum += t ? t->ToFloatVector()[0] : 1000;
    Tensor out = Tensor::FromVector<float>(DataType::kFloat32, {2}, {sum, -2 * sum});
    made.push_back(out.storage());
    return std::vector<Tensor>{out};
  };
  ValueStatsRequest request;
  request.absmax = {"x", "s", "y", "c"};
  request.histograms = {{"s", 4000.0}};
  request.bins = 4;
  request.keep = {"y"};
  auto stats = EvaluateValueStats(*g, {{"x", Scalar(-2)}}, fake, request);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  // s = [1 - 2 + 10 + 1000, -2 * that] = [1009, -2018]; the fake reads element 0 of its input,
  // so y = [1 + 1009, -2 * 1010] = [1010, -2020]. The constant c is not a computed value.
  EXPECT_EQ(stats->absmax, (std::map<std::string, double>{{"x", 2}, {"s", 2018}, {"y", 2020}}));
  EXPECT_EQ(stats->histograms.at("s"), (std::vector<double>{0, 1, 1, 0}));  // 1009, 2018 of 4000
  ASSERT_EQ(stats->kept.size(), 1u);
  EXPECT_EQ(stats->kept.at("y").ToFloatVector(), (std::vector<float>{1010, -2020}));
  // s was dropped after its reader ran; y lives on in `kept`.
  ASSERT_EQ(made.size(), 2u);
  EXPECT_TRUE(made[0].expired());
  EXPECT_FALSE(made[1].expired());

  ValueStatsRequest all;
  all.keep_all = true;
  auto everything = EvaluateValueStats(*g, {{"x", Scalar(-2)}}, fake, all);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->kept.size(), 3u);  // x, s, y: what EvaluateAllValues returns
  EXPECT_TRUE(everything->absmax.empty());

  EXPECT_EQ(EvaluateValueStats(*g, {}, fake, request).status().code(),
            ErrorCode::kInputCountMismatch);
  EXPECT_EQ(EvaluateValueStats(*g, {{"x", Scalar(2)}}, NodeEvaluator(), request).status().code(),
            ErrorCode::kInternal);
}

// The shared reductions' rules: NaN skipped by both, infinities in the absmax but not the
// histogram, the last bin at and past the range, and an empty range counting everything in bin 0.
TEST(Evaluator, AbsReductionsFollowTheirRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor t =
      Tensor::FromVector<float>(DataType::kFloat32, {6}, {nan, -0.5f, 1.0f, 2.0f, 7.0f, 1.99f});
  double m = 0;
  AccumulateAbsMax(t, &m);
  EXPECT_EQ(m, 7.0);
  Tensor with_inf = Tensor::FromVector<float>(DataType::kFloat32, {2}, {-inf, 1});
  AccumulateAbsMax(with_inf, &m);
  EXPECT_TRUE(std::isinf(m));
  std::vector<double> counts(4, 0.0);
  AccumulateAbsHistogram(t, 2.0, counts);  // bins of 0.5: 0.5 -> 1, 1 -> 2, 1.99 -> 3, 2 and 7 -> 3
  EXPECT_EQ(counts, (std::vector<double>{0, 1, 1, 3}));
  AccumulateAbsHistogram(with_inf, 2.0, counts);  // -inf skipped, 1 -> bin 2
  EXPECT_EQ(counts, (std::vector<double>{0, 1, 2, 3}));
  std::vector<double> zero_range(3, 0.0);
  AccumulateAbsHistogram(t, 0.0, zero_range);
  EXPECT_EQ(zero_range, (std::vector<double>{6, 0, 0}));
  Tensor half = t.CastTo(DataType::kFloat16);
  std::vector<double> from_half(4, 0.0);
  AccumulateAbsHistogram(half, 2.0, from_half);
  EXPECT_EQ(from_half, (std::vector<double>{0, 1, 1, 3}));
}

}  // namespace
}  // namespace kiln
