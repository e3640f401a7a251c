// Runtime tests: engines built from small graphs run end to end on the CPU and are compared with
// values computed here; bad shapes, dtypes and names get their catalog codes; contexts run
// concurrently; a dynamic batch below the max reuses the one arena.
#include "kiln/runtime/runtime.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "kiln/plan/memory_plan.h"
#include "tests/engine/test_engines.h"

namespace kiln {
namespace {

std::shared_ptr<const EngineDesc> Desc(std::unique_ptr<Graph> g, OptimizationProfile p = {}) {
  auto e = testing::AssembleTestEngine(std::move(g), std::move(p));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::shared_ptr<const EngineDesc>(std::move(*e));
}

std::shared_ptr<const Engine> MakeEngine(std::shared_ptr<const EngineDesc> desc) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok()) << runtime.status().ToString();
  auto engine = (*runtime)->CreateEngine(std::move(desc));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return *engine;
}

std::unique_ptr<ExecutionContext> MakeContext(const Engine& engine) {
  auto ctx = engine.CreateExecutionContext();
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  return std::move(*ctx);
}

// The chain's reference: relu(relu(x) + w).
std::vector<float> ChainReference(const std::vector<float>& x) {
  const float w[4] = {-1.f, 0.5f, 2.f, -3.f};
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float a = std::max(x[i], 0.f) + w[i % 4];
    y[i] = std::max(a, 0.f);
  }
  return y;
}

std::vector<float> Ramp(size_t n, float start) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = start + 0.75f * static_cast<float>(i) - 3.f;
  return x;
}

Status RunChain(ExecutionContext& ctx, int64_t batch, std::vector<float>& x,
                std::vector<float>& y) {
  KILN_RETURN_IF_ERROR(ctx.SetInputShape("x", {batch, 4}));
  y.assign(static_cast<size_t>(batch) * 4, -100.f);
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("x", x.data()));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("y", y.data()));
  return ctx.Execute();
}

TEST(Runtime, ChainComputesReluAddRelu) {
  auto engine = MakeEngine(Desc(testing::MakeChainGraph(), testing::ChainProfile()));
  auto ctx = MakeContext(*engine);
  std::vector<float> x = Ramp(12, 0.f), y;
  ASSERT_TRUE(RunChain(*ctx, 3, x, y).ok());
  EXPECT_EQ(y, ChainReference(x));
  auto shape = ctx->GetTensorShape("y");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(*shape, (std::vector<int64_t>{3, 4}));
}

TEST(Runtime, ChainOnTheCpuBackendsOwnKernels) {
  auto built = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile(),
                                           /*prefer_test_providers=*/false);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_FALSE((*built)->layers[0].provider_id.starts_with("test."))
      << (*built)->layers[0].provider_id;
  auto engine = MakeEngine(std::shared_ptr<const EngineDesc>(std::move(*built)));
  auto ctx = MakeContext(*engine);
  std::vector<float> x = Ramp(20, -1.f), y;
  ASSERT_TRUE(RunChain(*ctx, 5, x, y).ok());
  EXPECT_EQ(y, ChainReference(x));
}

TEST(Runtime, DynamicBatchBelowMaxReusesThePlan) {
  auto desc = Desc(testing::MakeChainGraph(), testing::ChainProfile());
  auto engine = MakeEngine(desc);
  auto ctx = MakeContext(*engine);
  const int64_t allocated = ctx->allocated_bytes();
  EXPECT_EQ(allocated, desc->plan.arena_bytes + desc->plan.workspace_bytes);
  EXPECT_EQ(ctx->actual_peak_bytes(), desc->plan.peak_bytes);
  EXPECT_EQ(engine->weights_bytes(), 64);  // w: 16 bytes, aligned
  for (int64_t batch : {8, 1, 5, 8, 2}) {
    std::vector<float> x = Ramp(static_cast<size_t>(batch) * 4, static_cast<float>(batch)), y;
    ASSERT_TRUE(RunChain(*ctx, batch, x, y).ok()) << "batch " << batch;
    EXPECT_EQ(y, ChainReference(x)) << "batch " << batch;
    EXPECT_EQ(ctx->allocated_bytes(), allocated);  // nothing reallocates
  }
}

TEST(Runtime, ShapeOutsideProfileNamesInputDimAndBounds) {
  auto engine = MakeEngine(Desc(testing::MakeChainGraph(), testing::ChainProfile()));
  auto ctx = MakeContext(*engine);
  Status big = ctx->SetInputShape("x", {9, 4});
  EXPECT_EQ(big.code(), ErrorCode::kShapeOutsideProfile);
  EXPECT_NE(big.message().find("input 'x' dimension 0 ('batch') is 9, outside the profile's "
                               "[1, 8]"),
            std::string::npos)
      << big.message();
  EXPECT_EQ(ctx->SetInputShape("x", {0, 4}).code(), ErrorCode::kShapeOutsideProfile);

  Status rank = ctx->SetInputShape("x", {4});
  EXPECT_EQ(rank.code(), ErrorCode::kInputShapeInvalid);
  EXPECT_NE(rank.message().find("rank 2"), std::string::npos) << rank.message();
  Status fixed = ctx->SetInputShape("x", {2, 5});
  EXPECT_EQ(fixed.code(), ErrorCode::kInputShapeInvalid);
  EXPECT_NE(fixed.message().find("dimension 1 is fixed at 4"), std::string::npos)
      << fixed.message();
  EXPECT_FALSE(ctx->all_input_shapes_set());
  EXPECT_EQ(ctx->Execute().code(), ErrorCode::kInputShapeInvalid);  // no shape yet
}

TEST(Runtime, WrongDtypeUnknownNameAndMissingBinding) {
  auto engine = MakeEngine(Desc(testing::MakeChainGraph(), testing::ChainProfile()));
  auto ctx = MakeContext(*engine);
  std::vector<uint16_t> half(8);
  std::vector<int64_t> dims = {2, 4};
  Status dtype = ctx->BindTensor("x", {DataType::kFloat16, dims, half.data()});
  EXPECT_EQ(dtype.code(), ErrorCode::kInputTypeMismatch);
  EXPECT_NE(dtype.message().find("input 'x' is f32 in the engine; got f16"), std::string::npos)
      << dtype.message();

  int dummy = 0;
  Status unknown = ctx->SetTensorAddress("logits", &dummy);
  EXPECT_EQ(unknown.code(), ErrorCode::kUnknownBinding);
  EXPECT_NE(unknown.message().find("inputs: 'x'; outputs: 'y'"), std::string::npos)
      << unknown.message();
  EXPECT_EQ(ctx->SetInputShape("y", {2, 4}).code(), ErrorCode::kUnknownBinding);

  std::vector<float> x(8, 1.f);
  ASSERT_TRUE(ctx->BindTensor("x", {DataType::kFloat32, dims, x.data()}).ok());
  Status unbound = ctx->Execute();
  EXPECT_EQ(unbound.code(), ErrorCode::kInputCountMismatch);
  EXPECT_NE(unbound.message().find("'y'"), std::string::npos) << unbound.message();
}

TEST(Runtime, StaticDiamondNeedsNoShapesAndFillsBothOutputs) {
  auto engine = MakeEngine(Desc(testing::MakeDiamondGraph()));
  auto ctx = MakeContext(*engine);
  EXPECT_TRUE(ctx->all_input_shapes_set());
  std::vector<float> x = {-2.f, -1.f, 0.f, 1.f, 2.f, 3.f}, d(6), b(6);
  ASSERT_TRUE(ctx->SetTensorAddress("x", x.data()).ok());
  ASSERT_TRUE(ctx->SetTensorAddress("d", d.data()).ok());
  ASSERT_TRUE(ctx->SetTensorAddress("b", b.data()).ok());
  ASSERT_TRUE(ctx->Execute().ok());
  for (size_t i = 0; i < x.size(); ++i) {
    float a = std::max(x[i], 0.f);
    EXPECT_EQ(b[i], a + x[i]);
    EXPECT_EQ(d[i], std::max(a + (a + x[i]), 0.f));
  }
  ASSERT_EQ(engine->outputs().size(), 2u);
  EXPECT_EQ(engine->outputs()[0].name, "d");
  EXPECT_EQ(engine->outputs()[1].name, "b");
}

TEST(Runtime, InputsAndOutputsDescribeTheEngine) {
  auto engine = MakeEngine(Desc(testing::MakeChainGraph(), testing::ChainProfile()));
  ASSERT_EQ(engine->inputs().size(), 1u);
  const TensorDesc& x = engine->inputs()[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.dtype, DataType::kFloat32);
  EXPECT_EQ(ToString(x.shape), "[batch,4]");
  ASSERT_TRUE(x.profile.has_value());
  EXPECT_EQ(x.profile->max, (std::vector<int64_t>{8, 4}));
  ASSERT_EQ(engine->outputs().size(), 1u);
  EXPECT_EQ(engine->outputs()[0].name, "y");
  EXPECT_FALSE(engine->outputs()[0].profile.has_value());
}

TEST(Runtime, WorkspaceIsPlannedAndItsBoundEnforced) {
  auto engine = MakeEngine(Desc(testing::MakeWorkspaceGraph(), testing::WorkspaceProfile()));
  EXPECT_EQ(engine->desc().plan.workspace_bytes, 16 * 8 * 4);
  auto ctx = MakeContext(*engine);
  for (int64_t n : {16, 3}) {
    std::vector<float> x = Ramp(static_cast<size_t>(n) * 8, 1.f), y(x.size());
    ASSERT_TRUE(ctx->SetInputShape("x", {n, 8}).ok());
    ASSERT_TRUE(ctx->SetTensorAddress("x", x.data()).ok());
    ASSERT_TRUE(ctx->SetTensorAddress("y", y.data()).ok());
    ASSERT_TRUE(ctx->Execute().ok());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], std::max(x[i], 0.f));
  }

  // An engine whose plan under-reserves workspace is caught when shapes are set, not mid-run.
  auto lean =
      testing::AssembleTestEngine(testing::MakeWorkspaceGraph(), testing::WorkspaceProfile());
  ASSERT_TRUE(lean.ok());
  (*lean)->plan.workspace_bytes = 64;
  (*lean)->plan.peak_bytes = (*lean)->plan.arena_bytes + 64;
  auto lean_engine = MakeEngine(std::shared_ptr<const EngineDesc>(std::move(*lean)));
  auto lean_ctx = MakeContext(*lean_engine);
  Status s = lean_ctx->SetInputShape("x", {4, 8});
  EXPECT_EQ(s.code(), ErrorCode::kMemoryPlanViolated);
  EXPECT_NE(s.message().find("layer 'copy'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("needs 128 bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(lean_ctx->SetInputShape("x", {2, 8}).ok());  // 64 bytes fit
}

TEST(Runtime, PlanThatCannotHoldTheProfileIsRejected) {
  // Planned for batch <= 8, then the profile widened to 64: the arena cannot hold the values.
  auto e = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  ASSERT_TRUE(e.ok());
  (*e)->profile.inputs[0].max[0] = 64;
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*e)));
  EXPECT_EQ(engine.status().code(), ErrorCode::kEngineMalformed);
  EXPECT_NE(engine.status().message().find("outside the"), std::string::npos)
      << engine.status().message();
}

TEST(Runtime, ContextLargerThanTheDeviceFailsBeforeAllocating) {
  // batch up to 2^33: each activation needs 2^37 bytes and two are live together (2^38).
  OptimizationProfile huge = testing::ChainProfile();
  huge.inputs[0].max[0] = int64_t{1} << 33;
  auto engine = MakeEngine(Desc(testing::MakeChainGraph(), huge));
  auto ctx = engine->CreateExecutionContext();
  EXPECT_EQ(ctx.status().code(), ErrorCode::kMemoryBudgetExceeded);
  EXPECT_NE(ctx.status().message().find("needs 274877906944 bytes"), std::string::npos)
      << ctx.status().message();
}

TEST(Runtime, LoadsEngineFilesForItsTargetOnly) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln_rt_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "chain.kiln").string();
  auto built = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  ASSERT_TRUE(built.ok());
  ASSERT_TRUE(WriteEngineFile(**built, path).ok());
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->LoadEngine(path);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto ctx = MakeContext(**engine);
  std::vector<float> x = Ramp(8, 2.f), y;
  ASSERT_TRUE(RunChain(*ctx, 2, x, y).ok());
  EXPECT_EQ(y, ChainReference(x));

  (*built)->header.device_arch = "sm_90";
  auto foreign = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*built)));
  EXPECT_EQ(foreign.status().code(), ErrorCode::kEngineTargetMismatch);
  EXPECT_NE(foreign.status().message().find("'sm_90'"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Runtime, ConstantAndPassThroughOutputsAndContextsOutliveTheEngineHandle) {
  // Outputs: y (computed), w (a constant: copied after the layers) and x (an input passed
  // through: one tensor, one binding).
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {3});
  Value* w = g->AddConstant("w", Tensor::FromVector<float>(DataType::kFloat32, {2}, {7.f, 8.f}));
  Value* y = g->AddValue("y");
  g->AddNode("Relu", "relu", {x}, {y});
  g->MarkOutput(y);
  g->MarkOutput(w);
  g->MarkOutput(x);
  auto built = testing::AssembleTestEngine(std::move(g), {});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  auto bytes = SerializeEngine(**built);
  ASSERT_TRUE(bytes.ok());
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ((*engine)->outputs().size(), 3u);
  auto ctx = MakeContext(**engine);
  engine->reset();  // the context keeps the engine alive
  std::vector<float> xv = {-1.f, 2.f, -3.f}, yv(3), wv(2);
  ASSERT_TRUE(ctx->SetTensorAddress("x", xv.data()).ok());
  ASSERT_TRUE(ctx->SetTensorAddress("y", yv.data()).ok());
  ASSERT_TRUE(ctx->SetTensorAddress("w", wv.data()).ok());
  ASSERT_TRUE(ctx->Execute().ok());
  EXPECT_EQ(yv, (std::vector<float>{0.f, 2.f, 0.f}));
  EXPECT_EQ(wv, (std::vector<float>{7.f, 8.f}));
  EXPECT_EQ(ctx->engine().desc().layers.size(), 1u);
}

TEST(Runtime, FourContextsRunConcurrentlyOnOneEngine) {
  auto engine = MakeEngine(Desc(testing::MakeChainGraph(), testing::ChainProfile()));
  std::vector<std::unique_ptr<ExecutionContext>> contexts;
  for (int t = 0; t < 4; ++t) contexts.push_back(MakeContext(*engine));
  std::vector<int> mismatches(4, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      int bad = 0;
      for (int iter = 0; iter < 200; ++iter) {
        int64_t batch = 1 + (t + iter) % 8;
        std::vector<float> x = Ramp(static_cast<size_t>(batch) * 4, 10.f * t + iter), y;
        if (!RunChain(*contexts[t], batch, x, y).ok() || y != ChainReference(x)) ++bad;
      }
      mismatches[t] = bad;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace kiln
