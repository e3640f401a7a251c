#include "kiln/app/pipeline.h"

#include <gtest/gtest.h>

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
    auto inputs = RandomInputs(**engine, {{"a", {batch, 4}}, {"b", {batch, 4}}}, /*seed=*/batch);
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
  Status s = (*runner)->SetInputs(RandomInputs(**engine, {{"a", {5, 4}}, {"b", {5, 4}}}, 7));
  EXPECT_EQ(s.code(), ErrorCode::kShapeOutsideProfile);
  EXPECT_NE(s.message().find("input 'a' dimension 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[1, 4]"), std::string::npos) << s.message();
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
