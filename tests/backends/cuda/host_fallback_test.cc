// The CUDA backend's host fallback (backends/cuda/host_fallback.cc): a CUDA build of a graph with
// layers CUDA has no kernel for (CumProd; NonZero, whose output dims depend on the data) runs
// them on the host inside the CUDA engine, between CUDA layers, and gives the CPU engine's
// results on fresh random inputs, eager and replayed from a CUDA graph; the build report and
// FindKernelGaps (`kiln inspect`) name those layers. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "kiln/app/pipeline.h"
#include "kiln/backends/backend.h"
#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/runtime.h"

namespace kiln {
namespace {

Tensor Int64Scalar(int64_t v) { return Tensor::FromVector<int64_t>(DataType::kInt64, {}, {v}); }

// y = CumProd(Relu(x) + 0.5, axis 1) * x: CUDA, host, CUDA.
std::unique_ptr<Graph> CumProdGraph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {3, 40});
  Value* r = g->AddValue("r");
  Value* a = g->AddValue("a");
  Value* c = g->AddValue("c");
  Value* y = g->AddValue("y");
  g->AddNode("Relu", "relu", {x}, {r});
  g->AddNode("Add", "add",
             {r, g->AddConstant("half", Tensor::FromVector<float>(DataType::kFloat32, {}, {0.5f}))},
             {a});
  g->AddNode("CumProd", "cumprod", {a, g->AddConstant("axis", Int64Scalar(1))}, {c});
  g->AddNode("Mul", "mul", {c, x}, {y});
  g->MarkOutput(y);
  return g;
}

// i = NonZero(Relu(x)), s = Sigmoid(x): a data-dependent output next to a CUDA one.
std::unique_ptr<Graph> NonZeroGraph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {6, 9});
  Value* r = g->AddValue("r");
  Value* i = g->AddValue("i");
  Value* s = g->AddValue("s");
  g->AddNode("Relu", "relu", {x}, {r});
  g->AddNode("NonZero", "nonzero", {r}, {i});
  g->AddNode("Sigmoid", "sigmoid", {x}, {s});
  g->MarkOutput(i);
  g->MarkOutput(s);
  return g;
}

// y = Cast(Cast(Cast(x, f16), float8 E4M3), f32): the model's own FP16 meets a type CUDA's Cast
// does not take.
std::unique_ptr<Graph> Float8CastGraph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {4, 33});
  Value* h = g->AddValue("h");
  Value* e = g->AddValue("e");
  Value* y = g->AddValue("y");
  auto to = [](int64_t onnx_type) {
    AttributeMap a;
    a.Set("to", onnx_type);
    return a;
  };
  g->AddNode("Cast", "to_f16", {x}, {h}, to(10));  // FLOAT16
  g->AddNode("Cast", "to_f8", {h}, {e}, to(17));   // FLOAT8E4M3FN
  g->AddNode("Cast", "to_f32", {e}, {y}, to(1));   // FLOAT
  g->MarkOutput(y);
  return g;
}

StatusOr<std::unique_ptr<EngineDesc>> Build(std::unique_ptr<Graph> g, BackendKind backend,
                                            BuildReport* report) {
  BuilderConfig config;
  config.backend = backend;
  return BuildEngine(BuildInput{std::move(g), "host_fallback_test", Hash128()}, config, report);
}

// Runs the engine on each feed in turn with one runner (CUDA graphs on: the later runs replay).
std::vector<std::map<std::string, Tensor>> RunAll(const EngineDesc& desc, BackendKind backend,
                                                  const std::vector<Tensor>& feeds) {
  std::vector<std::map<std::string, Tensor>> out;
  auto bytes = SerializeEngine(desc);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto runtime = Runtime::Create(backend);
  EXPECT_TRUE(runtime.ok()) << runtime.status().ToString();
  if (!bytes.ok() || !runtime.ok()) return out;
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return out;
  auto runner = app::HostRunner::Create(*engine);
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  if (!runner.ok()) return out;
  for (const Tensor& x : feeds) {
    Status s = (*runner)->SetInputs({{"x", x}});
    if (s.ok()) s = (*runner)->Run();
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return out;
    out.push_back((*runner)->outputs());
  }
  return out;
}

std::vector<Tensor> RandomFeeds(std::vector<int64_t> dims, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
  std::vector<Tensor> feeds;
  for (int k = 0; k < n; ++k) {
    Tensor t(DataType::kFloat32, dims);
    for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<float>()[i] = dist(rng);
    feeds.push_back(std::move(t));
  }
  return feeds;
}

class HostFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = GetBackend(BackendKind::kCuda);
    if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status().ToString();
  }
};

void ExpectHostLayers(const BuildReport& report, const std::vector<std::string>& host) {
  for (const LayerReport& l : report.layer_reports) {
    const bool on_host = std::find(host.begin(), host.end(), l.name) != host.end();
    EXPECT_EQ(l.tactic.starts_with("host-"), on_host) << l.name << ": " << l.tactic;
  }
  bool warned = false;
  for (const std::string& w : report.warnings) {
    warned |= w.find("run the CPU's kernel on the host") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

// Builds make() for CUDA and for the CPU, expects layer `host_layer` on the host in the CUDA
// build, runs both on `feeds` and gives output "y" of each run: {CUDA, CPU} per feed.
std::vector<std::pair<std::vector<float>, std::vector<float>>> RunOnBoth(
    const std::function<std::unique_ptr<Graph>()>& make, const std::string& host_layer,
    const std::vector<Tensor>& feeds) {
  std::vector<std::pair<std::vector<float>, std::vector<float>>> result;
  BuildReport gpu_report, cpu_report;
  auto gpu = Build(make(), BackendKind::kCuda, &gpu_report);
  EXPECT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = Build(make(), BackendKind::kCpu, &cpu_report);
  EXPECT_TRUE(cpu.ok()) << cpu.status().ToString();
  if (!gpu.ok() || !cpu.ok()) return result;
  bool found = false;
  for (const LayerReport& l : gpu_report.layer_reports) {
    if (l.name != host_layer) continue;
    found = true;
    EXPECT_TRUE(l.tactic.starts_with("host-")) << l.tactic;
  }
  EXPECT_TRUE(found) << "no layer " << host_layer;
  auto on_gpu = RunAll(**gpu, BackendKind::kCuda, feeds);
  auto on_cpu = RunAll(**cpu, BackendKind::kCpu, feeds);
  EXPECT_EQ(on_gpu.size(), feeds.size());
  EXPECT_EQ(on_cpu.size(), feeds.size());
  for (size_t k = 0; k < on_gpu.size() && k < on_cpu.size(); ++k) {
    result.emplace_back(on_gpu[k].at("y").ToFloatVector(), on_cpu[k].at("y").ToFloatVector());
  }
  return result;
}

TEST_F(HostFallbackTest, CpuOnlyLayerRunsBetweenCudaLayers) {
  BuildReport gpu_report, cpu_report;
  auto gpu = Build(CumProdGraph(), BackendKind::kCuda, &gpu_report);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = Build(CumProdGraph(), BackendKind::kCpu, &cpu_report);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ExpectHostLayers(gpu_report, {"cumprod"});
  const std::vector<Tensor> feeds = RandomFeeds({3, 40}, 4, 7);
  auto on_gpu = RunAll(**gpu, BackendKind::kCuda, feeds);
  auto on_cpu = RunAll(**cpu, BackendKind::kCpu, feeds);
  ASSERT_EQ(on_gpu.size(), feeds.size());
  ASSERT_EQ(on_cpu.size(), feeds.size());
  for (size_t k = 0; k < feeds.size(); ++k) {
    SCOPED_TRACE(k);
    std::vector<float> got = on_gpu[k].at("y").ToFloatVector();
    std::vector<float> want = on_cpu[k].at("y").ToFloatVector();
    ASSERT_EQ(got.size(), want.size());
    int64_t nonzero = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5f * std::max(1.f, std::fabs(want[i]))) << i;
      nonzero += want[i] != 0.f;
    }
    EXPECT_GT(nonzero, 0);
    // Fresh inputs give fresh outputs: the replayed graph re-reads x.
    if (k > 0) {
      EXPECT_NE(on_gpu[k].at("y").ToFloatVector(), on_gpu[k - 1].at("y").ToFloatVector());
    }
  }
}

TEST_F(HostFallbackTest, DataDependentLayerReportsItsDims) {
  BuildReport gpu_report, cpu_report;
  auto gpu = Build(NonZeroGraph(), BackendKind::kCuda, &gpu_report);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = Build(NonZeroGraph(), BackendKind::kCpu, &cpu_report);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ExpectHostLayers(gpu_report, {"nonzero"});
  std::vector<Tensor> feeds = RandomFeeds({6, 9}, 3, 11);
  feeds.push_back(Tensor(DataType::kFloat32, {6, 9}));  // all zero: no index at all
  auto on_gpu = RunAll(**gpu, BackendKind::kCuda, feeds);
  auto on_cpu = RunAll(**cpu, BackendKind::kCpu, feeds);
  ASSERT_EQ(on_gpu.size(), feeds.size());
  ASSERT_EQ(on_cpu.size(), feeds.size());
  for (size_t k = 0; k < feeds.size(); ++k) {
    SCOPED_TRACE(k);
    const Tensor& got = on_gpu[k].at("i");
    const Tensor& want = on_cpu[k].at("i");
    ASSERT_EQ(got.dims(), want.dims());
    int64_t positive = 0;
    for (int64_t i = 0; i < feeds[k].num_elements(); ++i) positive += feeds[k].data<float>()[i] > 0;
    EXPECT_EQ(got.dims(), (std::vector<int64_t>{2, positive}));
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      EXPECT_EQ(got.data<int64_t>()[i], want.data<int64_t>()[i]) << i;
    }
    std::vector<float> s = on_gpu[k].at("s").ToFloatVector();
    std::vector<float> ws = on_cpu[k].at("s").ToFloatVector();
    ASSERT_EQ(s.size(), ws.size());
    for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(s[i], ws[i], 1e-6f) << i;
  }
}

// y = DequantizeLinear(q, scale [2, 3], axis 1, block_size 2) over q int8 [2, 6]: blockwise
// scales, which the CUDA kernel does not take (it read them as per-axis and failed the build).
TEST_F(HostFallbackTest, BlockwiseDequantizeRunsOnTheHost) {
  auto make = [] {
    auto g = std::make_unique<Graph>();
    Value* x = g->AddInput("x", DataType::kFloat32, {2, 6});
    Value* q = g->AddValue("q");
    Value* y = g->AddValue("y");
    AttributeMap to_int8;
    to_int8.Set("to", int64_t{3});  // INT8
    g->AddNode("Cast", "to_int8", {x}, {q}, to_int8);
    AttributeMap blocked;
    blocked.Set("axis", int64_t{1});
    blocked.Set("block_size", int64_t{2});
    Value* scale =
        g->AddConstant("scale", Tensor::FromVector<float>(DataType::kFloat32, {2, 3},
                                                          {0.5f, 0.25f, 2.0f, 1.5f, 0.125f, 4.0f}));
    g->AddNode("DequantizeLinear", "dq", {q, scale}, {y}, blocked);
    g->MarkOutput(y);
    return g;
  };
  std::vector<Tensor> feeds = RandomFeeds({2, 6}, 2, 9);
  for (Tensor& f : feeds) {
    for (int64_t i = 0; i < f.num_elements(); ++i) f.mutable_data<float>()[i] *= 40.f;
  }
  auto runs = RunOnBoth(make, "dq", feeds);
  ASSERT_EQ(runs.size(), feeds.size());
  const std::vector<float> scale = {0.5f, 0.25f, 2.0f, 1.5f, 0.125f, 4.0f};
  for (size_t k = 0; k < feeds.size(); ++k) {
    const auto& [got, want] = runs[k];
    EXPECT_EQ(got, want);
    // Element (r, c) is trunc(x) times scale[r][c / 2].
    for (int64_t i = 0; i < 12; ++i) {
      const float x = std::trunc(feeds[k].data<float>()[i]);
      EXPECT_FLOAT_EQ(want[static_cast<size_t>(i)],
                      x * scale[static_cast<size_t>((i / 6) * 3 + (i % 6) / 2)])
          << i;
    }
  }
}

// The FP16 here is the model's, not the precision pass's: the layer runs on the host rather than
// failing the build with KILN-E3003.
TEST_F(HostFallbackTest, CastFromTheModelsFp16ToFloat8RunsOnTheHost) {
  const std::vector<Tensor> feeds = RandomFeeds({4, 33}, 2, 5);
  auto runs = RunOnBoth(Float8CastGraph, "to_f8", feeds);
  ASSERT_EQ(runs.size(), feeds.size());
  for (size_t k = 0; k < feeds.size(); ++k) {
    const auto& [got, want] = runs[k];
    EXPECT_EQ(got, want);
    // Float8 E4M3 keeps 3 mantissa bits: the round trip changes most values.
    int changed = 0;
    for (size_t i = 0; i < want.size(); ++i) changed += want[i] != feeds[k].data<float>()[i];
    EXPECT_GT(changed, 0);
  }
}

TEST_F(HostFallbackTest, KernelGapsSayWhichLayersRunOnTheHost) {
  BuilderConfig config;
  config.backend = BackendKind::kCuda;
  auto gaps = FindKernelGaps(BuildInput{CumProdGraph(), "gaps", Hash128()}, config);
  ASSERT_TRUE(gaps.ok()) << gaps.status().ToString();
  ASSERT_EQ(gaps->size(), 1u);
  EXPECT_EQ((*gaps)[0].op_type, "CumProd");
  EXPECT_TRUE((*gaps)[0].on_host);
}

}  // namespace
}  // namespace kiln
