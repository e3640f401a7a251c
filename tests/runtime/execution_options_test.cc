// Runtime behaviour that CI checks without a GPU: engines for a GPU loaded where there is none,
// engines for another architecture, per-layer timing and graph options on a backend without
// graphs (the CPU keeps the defaults: host-clock events, no capture).
#include <gtest/gtest.h>

#include <numeric>

#include "kiln/runtime/runtime.h"
#include "tests/engine/test_engines.h"

namespace kiln {
namespace {

std::shared_ptr<const EngineDesc> ChainEngine() {
  auto desc = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  EXPECT_TRUE(desc.ok()) << desc.status().ToString();
  return std::shared_ptr<const EngineDesc>(std::move(*desc));
}

TEST(EngineTarget, CudaEngineWithoutGpuNamesTheTargetAndTheRemedy) {
  if (GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "a GPU is present";
  auto desc = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  ASSERT_TRUE(desc.ok());
  (*desc)->header.backend = BackendKind::kCuda;
  (*desc)->header.device_arch = "sm_90";
  (*desc)->header.library_versions = "cuda 13.0, cublasLt 13.1.0, cudnn 9.19.0";
  auto runtime = Runtime::CreateForEngine((*desc)->header);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), ErrorCode::kEngineNeedsGpu);
  EXPECT_EQ(runtime.status().Id(), "KILN-E5006");
  EXPECT_NE(runtime.status().message().find("'cuda' on arch 'sm_90'"), std::string::npos)
      << runtime.status().message();
  // The backend's own reason travels with it.
  EXPECT_NE(runtime.status().message().find("KILN-E6000"), std::string::npos)
      << runtime.status().message();
  EXPECT_NE(runtime.status().remedy().find("--backend cpu"), std::string::npos);

  // The CPU runtime refuses it as another target.
  auto cpu = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(cpu.ok());
  auto engine = (*cpu)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*desc)));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), ErrorCode::kEngineTargetMismatch);
  EXPECT_NE(engine.status().message().find("backend 'cuda' on arch 'sm_90'"), std::string::npos)
      << engine.status().message();
}

TEST(EngineTarget, CpuEngineRunsThroughCreateForEngine) {
  auto desc = ChainEngine();
  auto runtime = Runtime::CreateForEngine(desc->header);
  ASSERT_TRUE(runtime.ok()) << runtime.status().ToString();
  EXPECT_EQ((*runtime)->kind(), BackendKind::kCpu);
}

TEST(EngineTarget, AnotherArchitectureIsE4004) {
  auto desc = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  ASSERT_TRUE(desc.ok());
  (*desc)->header.device_arch = "riscv64-elsewhere";
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*desc)));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().Id(), "KILN-E4004");
  EXPECT_NE(engine.status().message().find("riscv64-elsewhere"), std::string::npos);
}

struct ChainRun {
  std::unique_ptr<ExecutionContext> ctx;
  std::vector<float> x, y;
};

ChainRun MakeChainRun(const std::shared_ptr<const Engine>& engine, const ExecutionOptions& o) {
  ChainRun r;
  auto ctx = engine->CreateExecutionContext(o);
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  r.ctx = std::move(*ctx);
  r.x = {1, -2, 3, -4, -5, 6, -7, 8};
  r.y.assign(8, -100.f);
  EXPECT_TRUE(r.ctx->SetInputShape("x", {2, 4}).ok());
  EXPECT_TRUE(r.ctx->SetTensorAddress("x", r.x.data()).ok());
  EXPECT_TRUE(r.ctx->SetTensorAddress("y", r.y.data()).ok());
  return r;
}

// y = relu(relu(x) + w), w = {-1, 0.5, 2, -3}.
std::vector<float> ChainExpected(const std::vector<float>& x) {
  const float w[4] = {-1.f, 0.5f, 2.f, -3.f};
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::max(0.f, std::max(0.f, x[i]) + w[i % 4]);
  return y;
}

TEST(LayerTiming, HostTimesPerLayerOnTheCpu) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(ChainEngine());
  ASSERT_TRUE(engine.ok());
  EXPECT_FALSE((*engine)->backend().device_timing());
  ExecutionOptions o;
  o.layer_timing = true;
  ChainRun r = MakeChainRun(*engine, o);
  ASSERT_TRUE(r.ctx->Execute().ok());
  EXPECT_EQ(r.y, ChainExpected(r.x));
  auto ms = r.ctx->LayerTimesMs();
  ASSERT_TRUE(ms.ok()) << ms.status().ToString();
  ASSERT_EQ(ms->size(), 3u);
  for (double t : *ms) {
    EXPECT_GE(t, 0.0);
    EXPECT_LT(t, 1000.0);
  }

  // Off: the next Execute records nothing and asking says why.
  ASSERT_TRUE(r.ctx->SetLayerTiming(false).ok());
  ASSERT_TRUE(r.ctx->Execute().ok());
  auto off = r.ctx->LayerTimesMs();
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().Id(), "KILN-E5007");
}

TEST(LayerTiming, NotEnabledIsE5007) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(ChainEngine());
  ASSERT_TRUE(engine.ok());
  ChainRun r = MakeChainRun(*engine, {});
  ASSERT_TRUE(r.ctx->Execute().ok());
  auto ms = r.ctx->LayerTimesMs();
  ASSERT_FALSE(ms.ok());
  EXPECT_EQ(ms.status().code(), ErrorCode::kLayerTimingOff);
}

TEST(Graphs, TheCpuKeepsTheDefaultsAndRunsEagerly) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(ChainEngine());
  ASSERT_TRUE(engine.ok());
  Backend& backend = (*engine)->backend();
  EXPECT_FALSE(backend.supports_graphs());
  EXPECT_FALSE(backend.BeginCapture(nullptr).ok());
  auto stream = backend.CreateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_FALSE(static_cast<bool>(*stream));  // no streams on the CPU

  for (bool graphs : {true, false}) {
    ExecutionOptions o;
    o.cuda_graphs = graphs;
    ChainRun r = MakeChainRun(*engine, o);
    EXPECT_EQ(r.ctx->stream(), nullptr);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.ctx->Execute().ok());
    EXPECT_EQ(r.y, ChainExpected(r.x));
    EXPECT_EQ(r.ctx->graph_captures(), 0);
    EXPECT_EQ(r.ctx->graph_launches(), 0);
  }
}

TEST(HostEvents, MeasureTheHostClock) {
  auto backend = GetBackend(BackendKind::kCpu);
  ASSERT_TRUE(backend.ok());
  auto a = (*backend)->CreateEvent();
  auto b = (*backend)->CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*backend)->RecordEvent(a->get(), nullptr).ok());
  volatile double sink = 0;
  for (int i = 0; i < 200000; ++i) sink = sink + i * 0.5;
  ASSERT_TRUE((*backend)->RecordEvent(b->get(), nullptr).ok());
  auto ms = (*backend)->EventElapsedMs(a->get(), b->get());
  ASSERT_TRUE(ms.ok());
  EXPECT_GT(*ms, 0.0);
  EXPECT_LT(*ms, 10000.0);
}

}  // namespace
}  // namespace kiln
