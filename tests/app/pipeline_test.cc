#include "kiln/app/pipeline.h"

#include <gtest/gtest.h>

#include <limits>

#include "kiln/engine/engine_file.h"

namespace kiln::app {
namespace {

// a + b with a shared dynamic batch: built, serialized, loaded and run at two batch sizes.
StatusOr<std::shared_ptr<const Engine>> AddEngine() {
  auto g = std::make_unique<Graph>();
  Dim n = Dim::Symbol("n");
  Value* a = g->AddInput("a", DataType::kFloat32, {n, 4});
  Value* b = g->AddInput("b", DataType::kFloat32, {n, 4});
  Value* y = g->AddValue("y");
  g->AddNode("Add", "add", {a, b}, {y});
  g->MarkOutput(y);
  BuilderConfig config;
  KILN_RETURN_IF_ERROR(ParseProfileSpec("a:1x4,2x4,4x4", &config.profile));
  KILN_RETURN_IF_ERROR(ParseProfileSpec("b:1x4,2x4,4x4", &config.profile));
  KILN_ASSIGN_OR_RETURN(auto desc,
                        BuildEngine({std::move(g), "add", HashString("add")}, config, nullptr));
  KILN_ASSIGN_OR_RETURN(auto bytes, SerializeEngine(*desc));
  KILN_ASSIGN_OR_RETURN(auto runtime, Runtime::Create(BackendKind::kCpu));
  return runtime->DeserializeEngine(bytes);
}

TEST(HostRunner, InputsSharingASymbolChangeOneAtATime) {
  auto engine = AddEngine();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto runner = HostRunner::Create(*engine);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  for (int64_t batch : {2, 3, 1}) {
    auto random = RandomInputs(**engine, {{"a", {batch, 4}}, {"b", {batch, 4}}}, /*seed=*/batch);
    ASSERT_TRUE(random.ok()) << random.status().ToString();
    std::map<std::string, Tensor>& inputs = *random;
    ASSERT_TRUE((*runner)->SetInputs(inputs).ok());
    ASSERT_TRUE((*runner)->Run().ok());
    const Tensor& y = (*runner)->outputs().at("y");
    ASSERT_EQ(y.dims(), (std::vector<int64_t>{batch, 4}));
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      EXPECT_FLOAT_EQ(static_cast<float>(y.GetDouble(i)),
                      static_cast<float>(inputs["a"].GetDouble(i) + inputs["b"].GetDouble(i)));
    }
  }
}

TEST(HostRunner, DisagreeingSharedSymbolIsAnErrorBeforeAnyLayerRuns) {
  auto engine = AddEngine();
  ASSERT_TRUE(engine.ok());
  auto ctx = (*engine)->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  ASSERT_TRUE((*ctx)->SetInputShape("a", {2, 4}).ok());
  ASSERT_TRUE((*ctx)->SetInputShape("b", {3, 4}).ok());
  Status s = (*ctx)->InferShapes();
  EXPECT_EQ(s.code(), ErrorCode::kInputShapeInvalid);
  EXPECT_NE(s.message().find("'n'"), std::string::npos) << s.message();
}

TEST(HostRunner, ShapeOutsideProfileNamesInputDimensionAndBounds) {
  auto engine = AddEngine();
  ASSERT_TRUE(engine.ok());
  auto runner = HostRunner::Create(*engine);
  ASSERT_TRUE(runner.ok());
  std::map<std::string, Tensor> feed = {{"a", Tensor(DataType::kFloat32, {5, 4})},
                                        {"b", Tensor(DataType::kFloat32, {5, 4})}};
  Status s = (*runner)->SetInputs(feed);
  EXPECT_EQ(s.code(), ErrorCode::kShapeOutsideProfile);
  EXPECT_NE(s.message().find("input 'a' dimension 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[1, 4]"), std::string::npos) << s.message();
}

// Shapes are checked before a tensor is allocated for them: a dimension of 2^63-1 (`kiln run
// --shapes`) is refused with the profile's bounds, never allocated.
TEST(RandomInputs, RefusesShapesOutsideTheEngineBeforeAllocating) {
  auto engine = AddEngine();
  ASSERT_TRUE(engine.ok());
  const int64_t huge = std::numeric_limits<int64_t>::max();
  auto outside = RandomInputs(**engine, {{"a", {huge, 4}}}, 7);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), ErrorCode::kShapeOutsideProfile);
  EXPECT_NE(outside.status().message().find(std::to_string(huge)), std::string::npos)
      << outside.status().message();
  auto fixed = RandomInputs(**engine, {{"a", {2, huge}}}, 7);
  ASSERT_FALSE(fixed.ok());
  EXPECT_EQ(fixed.status().code(), ErrorCode::kInputShapeInvalid);
  auto unknown = RandomInputs(**engine, {{"nope", {2, 4}}}, 7);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kUnknownBinding);
}

TEST(Compare, CountsMismatchesAndRelativeL2) {
  Tensor e = Tensor::FromVector<float>(DataType::kFloat32, {4}, {1.f, 2.f, 3.f, 4.f});
  Tensor a = Tensor::FromVector<float>(DataType::kFloat32, {4}, {1.f, 2.f, 3.f, 4.5f});
  Comparison c = CompareTensors(a, e, 1e-3, 1e-7);
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_DOUBLE_EQ(c.max_abs, 0.5);
  EXPECT_NEAR(c.rel_l2, 0.5 / std::sqrt(30.0), 1e-12);
  Tensor wrong_shape = Tensor::FromVector<float>(DataType::kFloat32, {2, 2}, {1.f, 2.f, 3.f, 4.f});
  EXPECT_FALSE(CompareTensors(wrong_shape, e, 1e-3, 1e-7).shape_ok);
}

}  // namespace
}  // namespace kiln::app
