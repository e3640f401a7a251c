// The runtime's graph logic without a GPU, on a fake graph-capable backend: capture once per set
// of bound addresses, replay, re-capture after a shape change, the cache bound, eager fallback
// when capture fails, event ordering for Execute(nullptr); and ProfileEngine on the CPU.
#include <gtest/gtest.h>

#include "kiln/app/benchmark.h"
#include "kiln/runtime/runtime.h"
#include "tests/engine/test_engines.h"
#include "tests/runtime/fake_graph_backend.h"

namespace kiln {
namespace {

struct Fixture {
  std::unique_ptr<testing::FakeGraphBackend> backend;
  std::shared_ptr<const Engine> engine;
};

Fixture MakeFixture() {
  Fixture f;
  f.backend = std::make_unique<testing::FakeGraphBackend>(*GetBackend(BackendKind::kCpu));
  auto desc = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  EXPECT_TRUE(desc.ok());
  auto engine =
      Engine::Create(std::shared_ptr<const EngineDesc>(std::move(*desc)), f.backend.get());
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  f.engine = *engine;
  return f;
}

std::vector<float> ChainExpected(const std::vector<float>& x) {
  const float w[4] = {-1.f, 0.5f, 2.f, -3.f};
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::max(0.f, std::max(0.f, x[i]) + w[i % 4]);
  return y;
}

TEST(GraphLogic, CapturesOncePerAddressSetAndReplays) {
  Fixture f = MakeFixture();
  auto ctx = f.engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  ASSERT_NE((*ctx)->stream(), nullptr);
  // Room for 4 rows; the first runs use 2.
  std::vector<float> x = {1, -2, 3, -4, 5, 6, -7, 8, 2, 2, 2, 2, -1, -1, -1, -1}, y(16), y2(16);
  ASSERT_TRUE((*ctx)->SetInputShape("x", {2, 4}).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*ctx)->Execute().ok());
  const std::vector<float> want2 = ChainExpected(std::vector<float>(x.begin(), x.begin() + 8));
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 8),
            want2);  // computed by the capture pass (the fake runs kernels then)
  EXPECT_EQ(f.backend->begins, 1);
  EXPECT_EQ(f.backend->ends, 1);
  EXPECT_EQ(f.backend->launches, 3);
  EXPECT_EQ((*ctx)->graph_captures(), 1);
  EXPECT_EQ((*ctx)->graph_launches(), 3);

  // Another output address: a second graph; the first address again: the first graph, replayed.
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y2.data()).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(f.backend->begins, 2);
  EXPECT_EQ(std::vector<float>(y2.begin(), y2.begin() + 8), want2);
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(f.backend->begins, 2);
  EXPECT_EQ(f.backend->last_graph, 1);

  // New shapes re-prepare the kernels: every graph is dropped, so the same addresses capture
  // again.
  ASSERT_TRUE((*ctx)->SetInputShape("x", {4, 4}).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(f.backend->begins, 3);
  EXPECT_EQ(y, ChainExpected(x));
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(f.backend->begins, 3);
  EXPECT_EQ(f.backend->launches, 7);
}

TEST(GraphLogic, TheCacheKeepsTheNewestGraphs) {
  Fixture f = MakeFixture();
  auto ctx = f.engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  std::vector<float> x(8, 1.f);
  std::vector<std::vector<float>> ys(9, std::vector<float>(8));
  ASSERT_TRUE((*ctx)->SetInputShape("x", {2, 4}).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
  for (auto& y : ys) {  // 9 address sets; the cache holds KILN_CUDA_GRAPH_CACHE = 8
    ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
    ASSERT_TRUE((*ctx)->Execute().ok());
  }
  EXPECT_EQ(f.backend->begins, 9);
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", ys[8].data()).ok());  // newest: replayed
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(f.backend->begins, 9);
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", ys[0].data()).ok());  // oldest: evicted, captured
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(f.backend->begins, 10);
  EXPECT_EQ((*ctx)->graph_captures(), 10);
}

void ExpectEagerAfterFailure(bool fail_begin) {
  Fixture f = MakeFixture();
  f.backend->fail_begin = fail_begin;
  f.backend->fail_end = !fail_begin;
  auto ctx = f.engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  std::vector<float> x = {1, -2, 3, -4}, y(4);
  ASSERT_TRUE((*ctx)->SetInputShape("x", {1, 4}).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
  Status s = (*ctx)->Execute();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE((*ctx)->graphs_disabled());
  EXPECT_EQ(y, ChainExpected(x));
  // Later runs launch layer by layer (new inputs give new outputs) and never try again.
  x = {-5, 6, -7, 8};
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(y, ChainExpected(x));
  EXPECT_EQ(f.backend->begins, 1);
  EXPECT_EQ(f.backend->launches, 0);
  EXPECT_EQ((*ctx)->graph_captures(), 0);
}

TEST(GraphLogic, EagerFallbackWhenCaptureCannotBegin) { ExpectEagerAfterFailure(true); }
TEST(GraphLogic, EagerFallbackWhenCaptureIsInvalidated) { ExpectEagerAfterFailure(false); }

TEST(GraphLogic, GraphsOffAndLayerTimingLaunchLayerByLayer) {
  Fixture f = MakeFixture();
  for (int mode = 0; mode < 2; ++mode) {
    ExecutionOptions o;
    o.cuda_graphs = mode == 1;
    o.layer_timing = mode == 1;  // timing wins over graphs: a graph has no per-layer marks
    auto ctx = f.engine->CreateExecutionContext(o);
    ASSERT_TRUE(ctx.ok());
    std::vector<float> x = {1, -2, 3, -4}, y(4);
    ASSERT_TRUE((*ctx)->SetInputShape("x", {1, 4}).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
    for (int i = 0; i < 2; ++i) {
      x[0] = static_cast<float>(i + 1);
      ASSERT_TRUE((*ctx)->Execute().ok());
      EXPECT_EQ(y, ChainExpected(x));
    }
    if (mode == 1) {
      auto ms = (*ctx)->LayerTimesMs();
      ASSERT_TRUE(ms.ok());
      EXPECT_EQ(ms->size(), 3u);
    }
  }
  EXPECT_EQ(f.backend->begins, 0);
}

TEST(GraphLogic, ExecuteWithoutAStreamKeepsTheLegacyStreamsOrder) {
  Fixture f = MakeFixture();
  auto ctx = f.engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  void* own = (*ctx)->stream();
  std::vector<float> x = {1, -2, 3, -4}, y(4);
  ASSERT_TRUE((*ctx)->SetInputShape("x", {1, 4}).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  // legacy -> own before the work, own -> legacy after it.
  EXPECT_EQ(f.backend->records, (std::vector<void*>{nullptr, own}));
  EXPECT_EQ(f.backend->waits, (std::vector<void*>{own, nullptr}));
  // A caller's stream is used as given: no ordering events.
  int caller = 0;
  f.backend->records.clear();
  f.backend->waits.clear();
  ASSERT_TRUE((*ctx)->Execute(&caller).ok());
  EXPECT_TRUE(f.backend->records.empty());
  EXPECT_TRUE(f.backend->waits.empty());
  EXPECT_EQ(f.backend->begins, 1);  // the graph does not depend on the stream
}

TEST(Faults, OutOfMemoryAtContextCreationLeavesTheEngineUsable) {
  Fixture f = MakeFixture();
  auto first = f.engine->CreateExecutionContext();
  ASSERT_TRUE(first.ok());
  const size_t one_context = *f.backend->in_use;
  ASSERT_GT(one_context, 0u);
  // Room for one context only: the second fails with the device's out-of-memory error...
  f.backend->memory_limit = one_context + one_context / 2;
  auto second = f.engine->CreateExecutionContext();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().Id(), "KILN-E6003");
  EXPECT_NE(second.status().ToString().find("while creating an execution context"),
            std::string::npos)
      << second.status().ToString();
  EXPECT_EQ(*f.backend->in_use, one_context);  // what the failed context got is given back
  // ... and once memory is free again, the same engine makes a context that runs correctly.
  first->reset();
  auto third = f.engine->CreateExecutionContext();
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  std::vector<float> x = {1, -2, 3, -4}, y(4);
  ASSERT_TRUE((*third)->SetInputShape("x", {1, 4}).ok());
  ASSERT_TRUE((*third)->SetTensorAddress("x", x.data()).ok());
  ASSERT_TRUE((*third)->SetTensorAddress("y", y.data()).ok());
  ASSERT_TRUE((*third)->Execute().ok());
  EXPECT_EQ(y, ChainExpected(x));
}

TEST(ProfileEngine, ReportsHostTimesOnTheCpu) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto desc = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  ASSERT_TRUE(desc.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*desc)));
  ASSERT_TRUE(engine.ok());
  auto runner = app::HostRunner::Create(*engine);
  ASSERT_TRUE(runner.ok());
  std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8};
  std::map<std::string, Tensor> feed;
  feed["x"] = Tensor::FromVector<float>(DataType::kFloat32, {2, 4}, x);
  ASSERT_TRUE((*runner)->SetInputs(feed).ok());
  app::ProfileOptions po;
  po.warmup = 1;
  po.min_iterations = 7;
  po.min_seconds = 0;
  po.layer_iterations = 3;
  auto p = app::ProfileEngine(**runner, po);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->device_timing);
  EXPECT_EQ(p->latency.iterations, 7);
  EXPECT_EQ(p->compute.iterations, 7);
  EXPECT_EQ(p->enqueue.iterations, 7);
  // On the CPU the enqueued work is done when Execute returns: compute <= latency.
  EXPECT_LE(p->compute.median_ms, p->latency.median_ms);
  ASSERT_EQ(p->layers.size(), 3u);
  EXPECT_EQ(p->layers[0].name, "relu1");
  EXPECT_EQ(p->layers[1].tactic, "f32-add-cpu-test");
  for (const app::LayerTime& l : p->layers) EXPECT_GE(l.max_ms, l.median_ms);
  EXPECT_FALSE(p->max_kernel_layer.empty());
  EXPECT_EQ(p->graph_captures, 0);
  const Tensor& y = (*runner)->outputs().at("y");
  EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + 8), ChainExpected(x));
}

}  // namespace
}  // namespace kiln
