// The runtime on a GPU: CUDA graph capture and replay against eager runs, re-capture after shape
// and address changes, the caller's stream, per-layer event timing, no allocation in Execute,
// aliased view layers (no launch, no graph node), and faults (out of memory at context creation,
// another architecture, failed library calls). Test-only CUDA kernels keep this independent of the
// CUDA backend's own kernels. Every test skips where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <numeric>
#include <random>

#include "kiln/app/benchmark.h"
#include "kiln/app/live_refit.h"
#include "kiln/app/pipeline.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/builder/builder_config.h"
#include "kiln/builder/refit.h"
#include "kiln/engine/engine_file.h"
#include "kiln/engine/engine_plan.h"
#include "kiln/plan/memory_plan.h"
#include "kiln/runtime/runtime.h"
#include "tests/engine/test_engines.h"

// ---- Counting operator new (as tests/runtime/execute_noalloc_test.cc) ----
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kiln_test_cuda {
cudaError_t LaunchRelu(const float* x, float* y, int64_t n, cudaStream_t s);
cudaError_t LaunchAdd(const float* a, int64_t na, const float* b, int64_t nb, float* y, int64_t n,
                      cudaStream_t s);
}  // namespace kiln_test_cuda

namespace kiln {
namespace {

// ---- Test-only providers on the CUDA backend ----
class ReluKernel final : public Kernel {
 public:
  Status Run(const KernelRunArgs& a) override {
    cudaError_t err = kiln_test_cuda::LaunchRelu(
        a.inputs[0].as<const float>(), a.outputs[0].as<float>(), a.outputs[0].num_elements(),
        static_cast<cudaStream_t>(a.stream));
    if (err != cudaSuccess) return cuda::CudaStatus(err, "test relu launch");
    return OkStatus();
  }
};
class AddKernel final : public Kernel {
 public:
  Status Run(const KernelRunArgs& a) override {
    cudaError_t err = kiln_test_cuda::LaunchAdd(
        a.inputs[0].as<const float>(), a.inputs[0].num_elements(), a.inputs[1].as<const float>(),
        a.inputs[1].num_elements(), a.outputs[0].as<float>(), a.outputs[0].num_elements(),
        static_cast<cudaStream_t>(a.stream));
    if (err != cudaSuccess) return cuda::CudaStatus(err, "test add launch");
    return OkStatus();
  }
};
template <typename K>
class TestCudaProvider : public KernelProvider {
 public:
  TestCudaProvider(std::string_view id, std::string_view op, std::string_view tactic)
      : id_(id), op_(op), tactic_(tactic) {}
  std::string_view id() const override { return id_; }
  std::string_view op_type() const override { return op_; }
  BackendKind backend() const override { return BackendKind::kCuda; }
  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    for (const OperandDesc& d : r.inputs)
      if (d.dtype != DataType::kFloat32) return {};
    return {{std::string(tactic_), {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest&,
                                           const TacticConfig&) const override {
    return std::unique_ptr<Kernel>(std::make_unique<K>());
  }

 private:
  std::string_view id_, op_, tactic_;
};
struct TestCudaRelu : TestCudaProvider<ReluKernel> {
  TestCudaRelu() : TestCudaProvider("test.cuda.relu", "Relu", "f32-relu-cuda-test") {}
};
struct TestCudaAdd : TestCudaProvider<AddKernel> {
  TestCudaAdd() : TestCudaProvider("test.cuda.add", "Add", "f32-add-cuda-test") {}
};
KILN_REGISTER_KERNEL_PROVIDER(TestCudaRelu);
KILN_REGISTER_KERNEL_PROVIDER(TestCudaAdd);

constexpr int64_t kWidth = 1024;

// x[n,1024] -> a = relu(x); b = a + w; c = relu(b); d = c + x; y = relu(d). Five layers.
std::unique_ptr<Graph> MakeGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("cuda_chain");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), kWidth});
  std::vector<float> w(kWidth);
  for (int64_t i = 0; i < kWidth; ++i) w[i] = 0.25f * static_cast<float>(i % 7) - 0.75f;
  Value* wv = g->AddConstant("w", Tensor::FromVector<float>(DataType::kFloat32, {kWidth}, w));
  Value* a = g->AddValue("a");
  Value* b = g->AddValue("b");
  Value* c = g->AddValue("c");
  Value* d = g->AddValue("d");
  Value* y = g->AddValue("y");
  g->AddNode("Relu", "relu_a", {x}, {a});
  g->AddNode("Add", "add_b", {a, wv}, {b});
  g->AddNode("Relu", "relu_c", {b}, {c});
  g->AddNode("Add", "add_d", {c, x}, {d});
  g->AddNode("Relu", "relu_y", {d}, {y});
  g->MarkOutput(y);
  return g;
}

std::vector<float> Expected(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float w = 0.25f * static_cast<float>(i % kWidth % 7) - 0.75f;
    const float c = std::max(0.f, std::max(0.f, x[i]) + w);
    y[i] = std::max(0.f, c + x[i]);
  }
  return y;
}

struct Gpu {
  std::unique_ptr<Runtime> runtime;
  std::shared_ptr<const Engine> engine;
};

StatusOr<std::shared_ptr<EngineDesc>> MakeDesc(int64_t max_n, const std::string& arch) {
  OptimizationProfile p;
  p.inputs.push_back({"x", {1, kWidth}, {64, kWidth}, {max_n, kWidth}});
  KILN_ASSIGN_OR_RETURN(auto desc, testing::AssembleTestEngine(MakeGraph(), p));
  for (LayerDesc& l : desc->layers) {
    const bool relu = l.node->op_type() == "Relu";
    l.provider_id = relu ? "test.cuda.relu" : "test.cuda.add";
    l.tactic = {relu ? "f32-relu-cuda-test" : "f32-add-cuda-test", {}, 0};
  }
  desc->header.backend = BackendKind::kCuda;
  desc->header.device_arch = arch;
  return std::shared_ptr<EngineDesc>(std::move(desc));
}

// The engine on this GPU, or a skip where there is none.
#define KILN_GPU_OR_SKIP(gpu, max_n)                                       \
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU here"; \
  Gpu gpu;                                                                 \
  {                                                                        \
    auto rt = Runtime::Create(BackendKind::kCuda);                         \
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();                        \
    gpu.runtime = std::move(*rt);                                          \
    auto d = MakeDesc(max_n, gpu.runtime->device().arch);                  \
    ASSERT_TRUE(d.ok()) << d.status().ToString();                          \
    auto e = gpu.runtime->CreateEngine(*d);                                \
    ASSERT_TRUE(e.ok()) << e.status().ToString();                          \
    gpu.engine = *e;                                                       \
  }

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> x(static_cast<size_t>(n * kWidth));
  for (float& v : x) v = u(rng);
  return x;
}

// Device buffers for x and y at n rows, and the host copies.
struct Io {
  DeviceBuffer x, y;
  std::vector<float> hx, hy;
};

Io MakeIo(Backend& b, int64_t n, uint32_t seed) {
  Io io;
  io.hx = RandomX(n, seed);
  io.hy.assign(io.hx.size(), -1.f);
  io.x = std::move(*b.Allocate(io.hx.size() * 4));
  io.y = std::move(*b.Allocate(io.hx.size() * 4));
  EXPECT_TRUE(b.CopyToDevice(io.x.data(), io.hx.data(), io.hx.size() * 4, nullptr).ok());
  return io;
}

Status Bind(ExecutionContext& ctx, Io& io, int64_t n) {
  KILN_RETURN_IF_ERROR(ctx.SetInputShape("x", {n, kWidth}));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("x", io.x.data()));
  return ctx.SetTensorAddress("y", io.y.data());
}

std::vector<float> Fetch(Backend& b, ExecutionContext& ctx, Io& io) {
  EXPECT_TRUE(b.Synchronize(ctx.stream()).ok());
  EXPECT_TRUE(b.CopyToHost(io.hy.data(), io.y.data(), io.hy.size() * 4, nullptr).ok());
  return io.hy;
}

TEST(CudaGraphs, ReplayGivesTheSameOutputsAsEager) {
  KILN_GPU_OR_SKIP(gpu, 4096);
  Backend& b = gpu.engine->backend();
  ASSERT_TRUE(b.supports_graphs());
  ExecutionOptions eager_opts;
  eager_opts.cuda_graphs = false;
  auto graph_ctx = gpu.engine->CreateExecutionContext();
  auto eager_ctx = gpu.engine->CreateExecutionContext(eager_opts);
  ASSERT_TRUE(graph_ctx.ok() && eager_ctx.ok());
  Io gi = MakeIo(b, 256, 1), ei = MakeIo(b, 256, 1);
  ASSERT_TRUE(Bind(**graph_ctx, gi, 256).ok());
  ASSERT_TRUE(Bind(**eager_ctx, ei, 256).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*graph_ctx)->Execute().ok());
    ASSERT_TRUE((*eager_ctx)->Execute().ok());
  }
  const std::vector<float> g = Fetch(b, **graph_ctx, gi), e = Fetch(b, **eager_ctx, ei);
  EXPECT_EQ(g, e);
  EXPECT_EQ(g, Expected(gi.hx));
  EXPECT_EQ((*graph_ctx)->graph_captures(), 1);
  EXPECT_EQ((*graph_ctx)->graph_launches(), 3);
  EXPECT_FALSE((*graph_ctx)->graphs_disabled());
  EXPECT_EQ((*eager_ctx)->graph_captures(), 0);

  // New input data, same addresses: the replayed graph reads it.
  std::vector<float> x2 = RandomX(256, 7);
  ASSERT_TRUE(b.CopyToDevice(gi.x.data(), x2.data(), x2.size() * 4, nullptr).ok());
  ASSERT_TRUE((*graph_ctx)->Execute().ok());
  EXPECT_EQ(Fetch(b, **graph_ctx, gi), Expected(x2));
  EXPECT_EQ((*graph_ctx)->graph_captures(), 1);
}

TEST(CudaGraphs, RecapturesAfterShapeAndAddressChanges) {
  KILN_GPU_OR_SKIP(gpu, 4096);
  Backend& b = gpu.engine->backend();
  auto ctx = gpu.engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  Io small = MakeIo(b, 128, 2), big = MakeIo(b, 512, 3);
  ASSERT_TRUE(Bind(**ctx, small, 128).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(Fetch(b, **ctx, small), Expected(small.hx));
  ASSERT_TRUE(Bind(**ctx, big, 512).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(Fetch(b, **ctx, big), Expected(big.hx));
  EXPECT_EQ((*ctx)->graph_captures(), 2);

  // Same shape, another output buffer: a second graph; back to the first: replayed from cache.
  DeviceBuffer y2 = std::move(*b.Allocate(big.hy.size() * 4));
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y2.data()).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  std::vector<float> out(big.hy.size());
  ASSERT_TRUE(b.Synchronize((*ctx)->stream()).ok());
  ASSERT_TRUE(b.CopyToHost(out.data(), y2.data(), out.size() * 4, nullptr).ok());
  EXPECT_EQ(out, Expected(big.hx));
  EXPECT_EQ((*ctx)->graph_captures(), 3);
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", big.y.data()).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ((*ctx)->graph_captures(), 3);
  EXPECT_EQ((*ctx)->graph_launches(), 4);
  EXPECT_EQ(Fetch(b, **ctx, big), Expected(big.hx));
}

TEST(CudaStreams, TheCallersStreamOrdersTheWork) {
  KILN_GPU_OR_SKIP(gpu, 4096);
  Backend& b = gpu.engine->backend();
  for (bool graphs : {true, false}) {
    ExecutionOptions o;
    o.cuda_graphs = graphs;
    auto ctx = gpu.engine->CreateExecutionContext(o);
    ASSERT_TRUE(ctx.ok());
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    Io io = MakeIo(b, 4096, 4);
    ASSERT_TRUE(Bind(**ctx, io, 4096).ok());
    // Everything on one non-blocking stream, no synchronisation in between: input upload,
    // execute, download. Only the stream's order makes the result right.
    std::vector<float> x2 = RandomX(4096, 5);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(cudaMemcpyAsync(io.x.data(), x2.data(), x2.size() * 4, cudaMemcpyHostToDevice, s),
                cudaSuccess);
      ASSERT_TRUE((*ctx)->Execute(s).ok());
      ASSERT_EQ(
          cudaMemcpyAsync(io.hy.data(), io.y.data(), io.hy.size() * 4, cudaMemcpyDeviceToHost, s),
          cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(io.hy, Expected(x2)) << "graphs " << graphs;
    }
    EXPECT_EQ((*ctx)->graph_captures(), graphs ? 1 : 0);
    cudaStreamDestroy(s);
  }
}

// The legacy default stream (nullptr, torch's default stream): the first run captures on the
// context's stream between two events; later runs replay the graph on the legacy stream itself.
// Only the legacy stream's order makes the results right: the input arrives by a device-to-device
// copy queued on it, the output leaves by a copy queued after the run.
TEST(CudaStreams, TheLegacyStreamOrdersTheWork) {
  KILN_GPU_OR_SKIP(gpu, 4096);
  Backend& b = gpu.engine->backend();
  for (bool graphs : {true, false}) {
    ExecutionOptions o;
    o.cuda_graphs = graphs;
    auto ctx = gpu.engine->CreateExecutionContext(o);
    ASSERT_TRUE(ctx.ok());
    Io io = MakeIo(b, 4096, 4);
    ASSERT_TRUE(Bind(**ctx, io, 4096).ok());
    DeviceBuffer staging = std::move(*b.Allocate(io.hx.size() * 4));
    for (int i = 0; i < 3; ++i) {
      std::vector<float> xi = RandomX(4096, 10 + static_cast<uint32_t>(i));
      ASSERT_TRUE(b.CopyToDevice(staging.data(), xi.data(), xi.size() * 4, nullptr).ok());
      ASSERT_EQ(cudaMemcpyAsync(io.x.data(), staging.data(), xi.size() * 4,
                                cudaMemcpyDeviceToDevice, nullptr),
                cudaSuccess);
      ASSERT_TRUE((*ctx)->Execute(nullptr).ok());
      ASSERT_EQ(cudaMemcpyAsync(io.hy.data(), io.y.data(), io.hy.size() * 4, cudaMemcpyDeviceToHost,
                                nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      EXPECT_EQ(io.hy, Expected(xi)) << "graphs " << graphs << ", run " << i;
    }
    EXPECT_EQ((*ctx)->graph_captures(), graphs ? 1 : 0);
    EXPECT_EQ((*ctx)->graph_launches(), graphs ? 3 : 0);
  }
}

TEST(CudaTiming, PerLayerTimesSumToTheWholeEnqueue) {
  KILN_GPU_OR_SKIP(gpu, 16384);
  Backend& b = gpu.engine->backend();
  ASSERT_TRUE(b.device_timing());
  ExecutionOptions o;
  o.layer_timing = true;
  auto ctx = gpu.engine->CreateExecutionContext(o);
  ASSERT_TRUE(ctx.ok());
  Io io = MakeIo(b, 16384, 6);  // 64 MiB per tensor: each layer takes tens of microseconds
  ASSERT_TRUE(Bind(**ctx, io, 16384).ok());
  auto start = b.CreateEvent(), end = b.CreateEvent();
  ASSERT_TRUE(start.ok() && end.ok());
  void* s = (*ctx)->stream();
  ASSERT_TRUE((*ctx)->Execute().ok());  // warm-up
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(b.RecordEvent(start->get(), s).ok());
    ASSERT_TRUE((*ctx)->Execute().ok());
    ASSERT_TRUE(b.RecordEvent(end->get(), s).ok());
    auto total = b.EventElapsedMs(start->get(), end->get());
    auto layers = (*ctx)->LayerTimesMs();
    ASSERT_TRUE(total.ok() && layers.ok());
    ASSERT_EQ(layers->size(), 5u);
    double sum = 0;
    for (double ms : *layers) {
      EXPECT_GT(ms, 0.0);
      sum += ms;
    }
    EXPECT_NEAR(sum, *total, 0.1 * *total + 0.05) << "sum " << sum << " total " << *total;
  }
  EXPECT_EQ((*ctx)->graph_captures(), 0);  // timing runs eagerly
  EXPECT_EQ(Fetch(b, **ctx, io), Expected(io.hx));
}

TEST(CudaExecute, DoesNotAllocateInSteadyState) {
  KILN_GPU_OR_SKIP(gpu, 4096);
  Backend& b = gpu.engine->backend();
  for (bool graphs : {true, false}) {
    ExecutionOptions o;
    o.cuda_graphs = graphs;
    auto ctx = gpu.engine->CreateExecutionContext(o);
    ASSERT_TRUE(ctx.ok());
    Io io = MakeIo(b, 1024, 8);
    ASSERT_TRUE(Bind(**ctx, io, 1024).ok());
    ASSERT_TRUE((*ctx)->Execute().ok());  // propagation and capture may allocate
    g_allocations = 0;
    g_counting = true;
    bool ok = true;
    for (int i = 0; i < 20; ++i) ok = ok && (*ctx)->Execute().ok();
    g_counting = false;
    EXPECT_TRUE(ok);
    EXPECT_EQ(g_allocations.load(), 0) << "graphs " << graphs;
    EXPECT_EQ(Fetch(b, **ctx, io), Expected(io.hx));
  }
}

// What `kiln run` reports on a GPU: device-timed compute, enqueue, per-layer and max kernel time,
// with graphs replayed in the timed runs and the outputs still right.
TEST(CudaProfile, ProfileEngineUsesDeviceTimersAndGraphs) {
  KILN_GPU_OR_SKIP(gpu, 8192);
  auto runner = app::HostRunner::Create(gpu.engine);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  std::map<std::string, Tensor> feed;
  std::vector<float> x = RandomX(8192, 11);
  feed["x"] = Tensor::FromVector<float>(DataType::kFloat32, {8192, kWidth}, x);
  ASSERT_TRUE((*runner)->SetInputs(feed).ok());
  app::ProfileOptions po;
  po.warmup = 2;
  po.min_iterations = 20;
  po.min_seconds = 0;
  po.layer_iterations = 4;
  auto p = app::ProfileEngine(**runner, po);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->device_timing);
  EXPECT_EQ(p->compute.iterations, 20);
  EXPECT_EQ(p->enqueue.iterations, 20);
  EXPECT_GT(p->compute.median_ms, 0.0);
  // Compute excludes the copies that latency includes (32 MiB each way here).
  EXPECT_LT(p->compute.median_ms, p->latency.median_ms);
  ASSERT_EQ(p->layers.size(), 5u);
  double max_median = 0;
  for (const app::LayerTime& l : p->layers) {
    EXPECT_GT(l.median_ms, 0.0) << l.name;
    EXPECT_GE(l.max_ms, l.median_ms) << l.name;
    max_median = std::max(max_median, l.median_ms);
  }
  EXPECT_GE(p->max_kernel_ms, max_median);
  EXPECT_FALSE(p->max_kernel_layer.empty());
  EXPECT_EQ(p->graph_captures, 1);
  EXPECT_GE(p->graph_launches, 22);
  EXPECT_FALSE(p->graphs_disabled);
  ASSERT_TRUE((*runner)->Run().ok());
  const Tensor& y = (*runner)->outputs().at("y");
  std::vector<float> got(y.data<float>(), y.data<float>() + y.num_elements());
  EXPECT_EQ(got, Expected(x));
}

// x[n,1024] -> a = relu(x); r1 = Reshape(a, [-1]); r2 = Unsqueeze(r1, [0]); b = relu(r2);
// s = Squeeze(b, [0]); r3 = Reshape(s, [-1, 1024]); y = r3 + x. The four views are aliased
// (three launches) or, with the plan's aliasing off, copies on the CUDA backend's own providers.
StatusOr<std::shared_ptr<EngineDesc>> MakeViewDesc(const std::string& arch, bool alias) {
  auto g = std::make_unique<Graph>();
  g->set_name("cuda_views");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), kWidth});
  auto ints = [&](const std::string& name, std::vector<int64_t> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    return g->AddConstant(name, Tensor::FromVector<int64_t>(DataType::kInt64, {n}, v));
  };
  auto node = [&](const std::string& op, const std::string& out, std::vector<Value*> ins) {
    Value* v = g->AddValue(out);
    g->AddNode(op, "n_" + out, std::move(ins), {v});
    return v;
  };
  Value* a = node("Relu", "a", {x});
  Value* r1 = node("Reshape", "r1", {a, ints("flat", {-1})});
  Value* r2 = node("Unsqueeze", "r2", {r1, ints("axes0", {0})});
  Value* b = node("Relu", "b", {r2});
  Value* s = node("Squeeze", "s", {b, ints("axes0b", {0})});
  Value* r3 = node("Reshape", "r3", {s, ints("rows", {-1, kWidth})});
  g->MarkOutput(node("Add", "y", {r3, x}));
  OptimizationProfile p;
  p.inputs.push_back({"x", {1, kWidth}, {64, kWidth}, {4096, kWidth}});
  KILN_ASSIGN_OR_RETURN(auto desc, testing::AssembleTestEngine(std::move(g), p));
  for (LayerDesc& l : desc->layers) {
    const std::string& op = l.node->op_type();
    if (op == "Relu" || op == "Add") {
      const bool relu = op == "Relu";
      l.provider_id = relu ? "test.cuda.relu" : "test.cuda.add";
      l.tactic = {relu ? "f32-relu-cuda-test" : "f32-add-cuda-test", {}, 0};
      continue;
    }
    // The device kernel's provider, not the host fallback's (cuda.host.*), which also serves
    // these ops on a CUDA engine but only with host tactics.
    const KernelProvider* device = nullptr;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, op)) {
      if (!device && p->id().find(".host.") == std::string_view::npos) device = p;
    }
    if (!device) return MakeError(ErrorCode::kNoTactic, "no CUDA provider for {}", op);
    l.provider_id = std::string(device->id());
    std::string lower = op;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](char c) { return std::tolower(c); });
    l.tactic = {"f32-" + lower + "-cuda-copy", {}, 0};
  }
  if (!alias) {
    KILN_ASSIGN_OR_RETURN(desc->plan, PlanMemory(*desc, /*alias_views=*/false));
  }
  desc->header.backend = BackendKind::kCuda;
  desc->header.device_arch = arch;
  return std::shared_ptr<EngineDesc>(std::move(desc));
}

std::vector<float> ViewExpected(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::max(0.f, x[i]) + x[i];
  return y;
}

TEST(CudaViews, AliasedViewsLaunchNothingAndReplayTheSameOutputs) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU here";
  auto rt = Runtime::Create(BackendKind::kCuda);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  std::shared_ptr<const Engine> engines[2];  // [0] copies, [1] aliased views
  for (int alias = 0; alias < 2; ++alias) {
    auto desc = MakeViewDesc((*rt)->device().arch, alias == 1);
    ASSERT_TRUE(desc.ok()) << desc.status().ToString();
    auto e = (*rt)->CreateEngine(*desc);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engines[alias] = *e;
  }
  EXPECT_EQ(engines[0]->view_layers(), 0u);
  EXPECT_EQ(engines[1]->view_layers(), 4u);
  EXPECT_LE(engines[1]->desc().plan.arena_bytes, engines[0]->desc().plan.arena_bytes);
  Backend& b = engines[1]->backend();
  std::vector<float> outputs[2][2];  // [engine][graphs]
  for (int alias = 0; alias < 2; ++alias) {
    for (bool graphs : {false, true}) {
      ExecutionOptions o;
      o.cuda_graphs = graphs;
      auto ctx = engines[alias]->CreateExecutionContext(o);
      ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
      EXPECT_LE((*ctx)->actual_peak_bytes(), engines[alias]->planned_peak_bytes());
      Io io = MakeIo(b, 2048, 21);
      ASSERT_TRUE(Bind(**ctx, io, 2048).ok());
      for (int i = 0; i < 3; ++i) ASSERT_TRUE((*ctx)->Execute().ok());
      outputs[alias][graphs] = Fetch(b, **ctx, io);
      EXPECT_EQ(outputs[alias][graphs], ViewExpected(io.hx)) << alias << graphs;
      // Eager: every run launches; graphs: only the capture does.
      const int64_t per_run = alias ? 3 : 7;
      EXPECT_EQ((*ctx)->kernel_launches(), graphs ? per_run : 3 * per_run) << alias << graphs;
      EXPECT_EQ((*ctx)->graph_captures(), graphs ? 1 : 0);
      EXPECT_FALSE((*ctx)->graphs_disabled());
    }
  }
  EXPECT_EQ(outputs[1][true], outputs[0][false]);
  EXPECT_EQ(outputs[1][false], outputs[0][false]);

  // Per-layer device times: exactly 0 for the views, and the rest still measured.
  ExecutionOptions timed;
  timed.layer_timing = true;
  auto ctx = engines[1]->CreateExecutionContext(timed);
  ASSERT_TRUE(ctx.ok());
  Io io = MakeIo(b, 4096, 22);
  ASSERT_TRUE(Bind(**ctx, io, 4096).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  auto ms = (*ctx)->LayerTimesMs();
  ASSERT_TRUE(ms.ok()) << ms.status().ToString();
  ASSERT_EQ(ms->size(), 7u);
  for (size_t l = 0; l < ms->size(); ++l) {
    if (engines[1]->is_view_layer(l)) {
      EXPECT_EQ((*ms)[l], 0.0) << l;
    } else {
      EXPECT_GT((*ms)[l], 0.0) << l;
    }
  }
  EXPECT_EQ(Fetch(b, **ctx, io), ViewExpected(io.hx));
}

TEST(CudaFaults, OutOfMemoryAtContextCreationLeavesTheEngineUsable) {
  // Contexts of this engine need 4 arena values of 256 MiB each at the max shape.
  KILN_GPU_OR_SKIP(gpu, 65536);
  Backend& b = gpu.engine->backend();
  // Take the GPU's free memory in shrinking chunks until less than one arena value is left.
  std::vector<void*> hog;
  for (size_t chunk : {size_t{1} << 30, size_t{1} << 26, size_t{1} << 22}) {
    void* p = nullptr;
    while (cudaMalloc(&p, chunk) == cudaSuccess) hog.push_back(p);
    cudaGetLastError();
  }
  auto failed = gpu.engine->CreateExecutionContext();
  for (void* p : hog) cudaFree(p);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().Id(), "KILN-E6003") << failed.status().ToString();
  EXPECT_NE(failed.status().message().find("cudaMalloc"), std::string::npos);
  EXPECT_NE(failed.status().remedy().find("free GPU memory"), std::string::npos);

  // The engine is untouched: a context made once memory is back runs correctly.
  auto ctx = gpu.engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  Io io = MakeIo(b, 2048, 9);
  ASSERT_TRUE(Bind(**ctx, io, 2048).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(Fetch(b, **ctx, io), Expected(io.hx));
}

TEST(CudaFaults, AnotherArchitectureIsE4004) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU here";
  auto rt = Runtime::Create(BackendKind::kCuda);
  ASSERT_TRUE(rt.ok());
  auto desc = MakeDesc(64, (*rt)->device().arch == "sm_80" ? "sm_90" : "sm_80");
  ASSERT_TRUE(desc.ok());
  auto engine = (*rt)->CreateEngine(*desc);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().Id(), "KILN-E4004");
  EXPECT_NE(engine.status().message().find((*rt)->device().arch), std::string::npos);
}

Status FailCublas() {
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(nullptr, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  return OkStatus();
}
Status FailCudnn() {
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(nullptr));
  return OkStatus();
}
Status FailCuda() {
  KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy(nullptr, nullptr, 16, cudaMemcpyDeviceToDevice));
  return OkStatus();
}

TEST(CudaFaults, FailedLibraryCallsCarryTheLibrarysMessage) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU here";
  Status blas = FailCublas();
  EXPECT_EQ(blas.Id(), "KILN-E6004");
  EXPECT_NE(blas.message().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos)
      << blas.message();
  Status dnn = FailCudnn();
  EXPECT_EQ(dnn.Id(), "KILN-E6005");
  EXPECT_NE(dnn.message().find("CUDNN_STATUS_BAD_PARAM"), std::string::npos) << dnn.message();
  Status rt = FailCuda();
  EXPECT_EQ(rt.Id(), "KILN-E6002");
  EXPECT_NE(rt.message().find("cudaError"), std::string::npos) << rt.message();
  // A graph launch of nothing: the graph error code with CUDA's name.
  auto& b = **GetBackend(BackendKind::kCuda);
  Status g = b.LaunchGraph(nullptr, nullptr);
  EXPECT_EQ(g.Id(), "KILN-E6050");
  EXPECT_NE(g.message().find("cudaGraphLaunch"), std::string::npos) << g.message();
  // The device is still fine afterwards (none of these errors is sticky).
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  cudaFree(p);
}

// Backend::UploadPieces (the weights' upload at load and refit) through the pinned staging ring:
// pieces of every size, gaps between them, pieces across and larger than a staging chunk, more
// bytes than the whole ring, twice (the ring's buffers are reused); each piece lands at its
// offset, byte for byte.
TEST(CudaUpload, PiecesLandAtTheirOffsetsThroughTheStagingRing) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU here";
  Backend& b = **GetBackend(BackendKind::kCuda);
  std::mt19937_64 rng(20261205);
  const std::vector<size_t> sizes = {1,  255,      4096, (8u << 20) - 3, (17u << 20) + 1,
                                     64, 3u << 20, 7};
  for (int round = 0; round < 2; ++round) {
    std::vector<Backend::HostPiece> pieces;
    std::vector<std::vector<uint8_t>> data;
    size_t offset = 13;
    for (size_t i = 0; offset < (45u << 20); ++i) {
      std::vector<uint8_t> bytes(sizes[(i + round) % sizes.size()]);
      for (uint8_t& x : bytes) x = static_cast<uint8_t>(rng());
      pieces.push_back({offset, nullptr, bytes.size()});
      offset += bytes.size() + rng() % 512;  // a gap, sometimes none
      data.push_back(std::move(bytes));
    }
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i].src = data[i].data();
    std::shuffle(pieces.begin(), pieces.end(), rng);  // any order
    const size_t total = offset;
    auto device = b.Allocate(total);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    ASSERT_TRUE(b.UploadPieces(device->data(), total, pieces).ok());
    std::vector<uint8_t> back(total);
    ASSERT_EQ(cudaMemcpy(back.data(), device->data(), total, cudaMemcpyDeviceToHost), cudaSuccess);
    for (const Backend::HostPiece& p : pieces) {
      ASSERT_EQ(std::memcmp(back.data() + p.offset, p.src, p.bytes), 0)
          << "round " << round << ": the piece of " << p.bytes << " bytes at " << p.offset;
    }
  }
  // Nothing to upload: fine.
  EXPECT_TRUE(b.UploadPieces(nullptr, 0, {}).ok());
}

// Refit of a running CUDA FP16 engine whose convolutions run channels-last on cuDNN: those
// kernels keep a KRSC copy of their weights and re-pack it on the GPU from the new bytes instead of
// being made again (the matrix products read theirs at run time). A context created before the
// refit gives, at its next run (eager and from a CUDA graph), the outputs of an engine made from
// the host-refit engine with the new weights, bit for bit; and back again to A's outputs.
TEST(CudaRefit, ChannelsLastConvolutionsRenewTheirPackedWeightsInPlace) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU here";
  const char* root = std::getenv("KILN_SOURCE_DIR");
  const std::string dir = std::string(root ? root : ".") + "/zoo/resnet_tiny";
  if (!std::filesystem::exists(dir + "/model.onnx")) GTEST_SKIP() << "no zoo at " << dir;
  BuilderConfig config;
  config.backend = BackendKind::kCuda;
  config.fp16 = true;
  config.opt_level = 0;
  ASSERT_TRUE(ParseProfileSpec("input:2x3x64x64,2x3x64x64,2x3x64x64", &config.profile).ok());
  auto built = app::BuildFromOnnxFile(dir + "/model.onnx", config);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  int nhwc_convs = 0;
  for (const LayerDesc& l : built->desc->layers) {
    nhwc_convs += l.provider_id.find("cudnn") != std::string::npos && NodeLayout(*l.node) == "NHWC";
  }
  ASSERT_GT(nhwc_convs, 0) << "the test needs channels-last cuDNN convolutions";
  auto weights = ReadOnnxWeights(dir + "/model.onnx");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  std::map<std::string, Tensor> a = weights->initializers, b = a;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> jitter(0.8f, 1.25f);
  for (auto& [name, t] : b) {
    if (t.dtype() != DataType::kFloat32) continue;
    float* f = t.mutable_data<float>();
    for (int64_t i = 0; i < t.num_elements(); ++i) f[i] *= jitter(rng);
  }
  // The reference: the engine refit on the host with B, loaded afresh (kernels made from B).
  auto bytes = SerializeEngine(*built->desc);
  ASSERT_TRUE(bytes.ok());
  LoadOptions edit;
  edit.check_providers = false;
  auto desc_b = LoadEngineBytesForEdit(*bytes, edit);
  ASSERT_TRUE(desc_b.ok());
  ASSERT_TRUE(RefitEngine(**desc_b, b, HashString("b")).ok());
  auto rt = Runtime::Create(BackendKind::kCuda);
  ASSERT_TRUE(rt.ok());
  std::shared_ptr<const EngineDesc> desc_a = std::move(built->desc);
  auto engine = (*rt)->CreateEngine(desc_a);
  auto fresh_b = (*rt)->CreateEngine(*desc_b);
  ASSERT_TRUE(engine.ok() && fresh_b.ok());
  auto inputs = app::RandomInputs(**engine, {}, 11);
  ASSERT_TRUE(inputs.ok());
  auto run = [&](const std::shared_ptr<const Engine>& e, bool graphs) {
    ExecutionOptions o;
    o.cuda_graphs = graphs;
    auto r = app::HostRunner::Create(e, o);
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE((*r)->SetInputs(*inputs).ok());
    return std::move(*r);
  };
  auto first = [](app::HostRunner& r) {
    Status s = r.Run();
    EXPECT_TRUE(s.ok()) << s.ToString();
    return r.outputs().begin()->second.ToFloatVector();
  };
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    auto live = run(*engine, graphs);
    auto reference = run(*fresh_b, graphs);
    const std::vector<float> out_a = first(*live);
    const std::vector<float> out_b = first(*reference);
    ASSERT_NE(out_a, out_b);
    ASSERT_TRUE(app::RefitLoadedEngine(**engine, b).ok());
    EXPECT_EQ(first(*live), out_b);
    EXPECT_EQ(first(*live), out_b);  // and again (the graph captured after the refit)
    ASSERT_TRUE(app::RefitLoadedEngine(**engine, a).ok());
    EXPECT_EQ(first(*live), out_a);
  }
}

}  // namespace
}  // namespace kiln
