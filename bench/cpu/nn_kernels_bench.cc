// Benchmarks of the CPU conv and gemm kernels, every tactic, reported in GFLOP/s:
//   conv at ResNet-50 batch-1 shapes (7x7/2 stem at 224, 3x3 at 56/28/14/7, 1x1), gemm at
//   BERT-base shapes (128x768x768, 128x768x3072, 128x3072x768).
// `kiln_bench_cpu_nn --resnet50` instead times every tactic of every ResNet-50 conv layer the way
// the builder does (best tactic per layer) and prints the per-layer choice and the total.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include "kiln/backends/kernel.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

// One single-node graph with random inputs, kept alive for the benchmark's lifetime.
struct Layer {
  std::string label;
  std::unique_ptr<Graph> graph;
  KernelRequest request;
  std::vector<Tensor> inputs;
  Tensor output;
  double flops = 0;
};

Tensor Random(std::vector<int64_t> dims, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(NumElements(dims)));
  for (auto& x : v) x = d(rng);
  return Tensor::FromVector(DataType::kFloat32, std::move(dims), v);
}

std::unique_ptr<Layer> MakeLayer(std::string label, std::string op, std::vector<Tensor> ins,
                                 std::vector<bool> constant, AttributeMap attrs, double flops) {
  auto l = std::make_unique<Layer>();
  l->label = std::move(label);
  l->graph = std::make_unique<Graph>();
  std::vector<Value*> values;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = fmt::format("i{}", i);
    values.push_back(constant[i]
                         ? l->graph->AddConstant(name, ins[i])
                         : l->graph->AddInput(name, ins[i].dtype(), MakeShape(ins[i].dims())));
  }
  Value* out = l->graph->AddValue("y");
  Node* node = l->graph->AddNode(op, "n", values, {out}, std::move(attrs));
  if (!InferShapes(*l->graph).ok()) return nullptr;
  l->request.node = node;
  for (size_t i = 0; i < ins.size(); ++i) {
    l->request.inputs.push_back(
        {DataType::kFloat32, MakeShape(ins[i].dims()), ins[i].dims(), node->input(i)->constant()});
  }
  auto dims = *StaticDims(out->shape());
  l->request.outputs.push_back({DataType::kFloat32, out->shape(), dims, nullptr});
  l->inputs = std::move(ins);
  l->output = Tensor(DataType::kFloat32, dims);
  l->flops = flops;
  return l;
}

// Conv layer: N=1, C -> M, k x k, stride, "same" padding k/2, at input size hw.
std::unique_ptr<Layer> ConvLayer(int64_t c, int64_t m, int64_t k, int64_t stride, int64_t hw,
                                 std::mt19937& rng, int64_t group = 1) {
  AttributeMap a;
  a.Set("group", group);
  a.Set("strides", std::vector<int64_t>{stride, stride});
  a.Set("pads", std::vector<int64_t>(4, k / 2));
  int64_t out = (hw + 2 * (k / 2) - k) / stride + 1;
  double flops = 2.0 * m * out * out * (c / group) * k * k;
  std::string label = std::to_string(k) + "x" + std::to_string(k) + "/" + std::to_string(stride) +
                      "_" + std::to_string(c) + "->" + std::to_string(m) + "@" + std::to_string(hw);
  return MakeLayer(
      label, "Conv",
      {Random({1, c, hw, hw}, rng), Random({m, c / group, k, k}, rng), Random({m}, rng)},
      {false, true, true}, std::move(a), flops);
}

std::unique_ptr<Layer> GemmLayer(int64_t m, int64_t k, int64_t n, std::mt19937& rng) {
  AttributeMap a;
  a.Set("transB", int64_t{1});  // ONNX exports of Linear layers
  return MakeLayer(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n), "Gemm",
                   {Random({m, k}, rng), Random({n, k}, rng), Random({n}, rng)},
                   {false, true, true}, std::move(a), 2.0 * m * n * k);
}

// A prepared kernel with its workspace.
struct Prepared {
  std::unique_ptr<Kernel> kernel;
  std::vector<TensorView> in, out;
  std::vector<std::byte> ws_storage;
  void* ws = nullptr;
  size_t ws_bytes = 0;
};

std::unique_ptr<Prepared> Prepare(Layer& l, const KernelProvider& p, const TacticConfig& t) {
  auto pr = std::make_unique<Prepared>();
  auto k = p.Create(l.request, t);
  if (!k.ok()) return nullptr;
  pr->kernel = std::move(*k);
  for (auto& in : l.inputs) pr->in.push_back(in.view());
  pr->out.push_back(l.output.view());
  auto ws = pr->kernel->Prepare(pr->in, pr->out);
  if (!ws.ok()) return nullptr;
  pr->ws_bytes = *ws;
  pr->ws_storage.resize(*ws + 64);
  pr->ws = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(pr->ws_storage.data()) + 63) &
                                   ~uintptr_t{63});
  return pr;
}

Status RunOnce(Prepared& pr) {
  KernelRunArgs args{pr.in, pr.out, pr.ws, pr.ws_bytes, nullptr};
  return pr.kernel->Run(args);
}

std::vector<std::unique_ptr<Layer>>& Layers() {
  static std::vector<std::unique_ptr<Layer>> layers;
  return layers;
}

void RegisterAll() {
  std::mt19937 rng(1);
  auto& layers = Layers();
  layers.push_back(ConvLayer(3, 64, 7, 2, 224, rng));
  layers.push_back(ConvLayer(64, 64, 3, 1, 56, rng));
  layers.push_back(ConvLayer(128, 128, 3, 1, 28, rng));
  layers.push_back(ConvLayer(256, 256, 3, 1, 14, rng));
  layers.push_back(ConvLayer(512, 512, 3, 1, 7, rng));
  layers.push_back(ConvLayer(64, 256, 1, 1, 56, rng));
  layers.push_back(ConvLayer(1024, 256, 1, 1, 14, rng));
  layers.push_back(ConvLayer(144, 144, 3, 1, 56, rng, 144));  // MobileNet-style depthwise
  layers.push_back(GemmLayer(128, 768, 768, rng));
  layers.push_back(GemmLayer(128, 768, 3072, rng));
  layers.push_back(GemmLayer(128, 3072, 768, rng));
  for (auto& l : layers) {
    if (!l) continue;
    for (const KernelProvider* p :
         KernelRegistry::Get().Providers(BackendKind::kCpu, l->request.node->op_type())) {
      for (const TacticConfig& t : p->Tactics(l->request)) {
        Layer* layer = l.get();
        std::string name = l->request.node->op_type() + "/" + l->label + "/" + t.name;
        benchmark::RegisterBenchmark(
            name.c_str(),
            [layer, p, t](benchmark::State& state) {
              auto pr = Prepare(*layer, *p, t);
              if (!pr) {
                state.SkipWithError("create/prepare failed");
                return;
              }
              for (auto _ : state) {
                if (!RunOnce(*pr).ok()) state.SkipWithError("run failed");
              }
              state.counters["GFLOP/s"] = benchmark::Counter(
                  layer->flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
              state.counters["ws_MiB"] = static_cast<double>(t.workspace_bytes) / (1 << 20);
            })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
}

// Median of `reps` runs in milliseconds after one warm-up.
double TimeMs(Prepared& pr, int reps) {
  (void)RunOnce(pr);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    (void)RunOnce(pr);
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Every conv of ResNet-50 v1.5 (torchvision) at batch 1, with repeat counts, and the FC gemm.
int ResNet50Sweep() {
  struct L {
    int64_t c, m, k, s, hw, count;
  };
  const std::vector<L> convs = {
      {3, 64, 7, 2, 224, 1},
      // layer1 @56
      {64, 64, 1, 1, 56, 1},
      {64, 64, 3, 1, 56, 3},
      {64, 256, 1, 1, 56, 4},
      {256, 64, 1, 1, 56, 2},
      // layer2
      {256, 128, 1, 1, 56, 1},
      {128, 128, 3, 2, 56, 1},
      {128, 512, 1, 1, 28, 4},
      {256, 512, 1, 2, 56, 1},
      {512, 128, 1, 1, 28, 3},
      {128, 128, 3, 1, 28, 3},
      // layer3
      {512, 256, 1, 1, 28, 1},
      {256, 256, 3, 2, 28, 1},
      {256, 1024, 1, 1, 14, 6},
      {512, 1024, 1, 2, 28, 1},
      {1024, 256, 1, 1, 14, 5},
      {256, 256, 3, 1, 14, 5},
      // layer4
      {1024, 512, 1, 1, 14, 1},
      {512, 512, 3, 2, 14, 1},
      {512, 2048, 1, 1, 7, 3},
      {1024, 2048, 1, 2, 14, 1},
      {2048, 512, 1, 1, 7, 2},
      {512, 512, 3, 1, 7, 2},
  };
  std::mt19937 rng(2);
  double total_best = 0, total_flops = 0;
  std::map<std::string, double> total_by_tactic_family;
  std::printf("%-28s %5s %10s %9s  %s\n", "layer", "count", "best_ms", "GFLOP/s", "best tactic");
  for (const L& c : convs) {
    auto layer = ConvLayer(c.c, c.m, c.k, c.s, c.hw, rng);
    double best = 1e30;
    std::string best_name;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, "Conv")) {
      for (const TacticConfig& t : p->Tactics(layer->request)) {
        auto pr = Prepare(*layer, *p, t);
        if (!pr) continue;
        double ms = TimeMs(*pr, 11);
        // The per-tactic figure for the total of each single tactic family.
        std::string family = t.name.starts_with("f32-conv-cpu-im2col-openblas-rows")
                                 ? "f32-conv-cpu-im2col-openblas-rowsN"
                                 : t.name;
        total_by_tactic_family[family] += ms * static_cast<double>(c.count);
        if (ms < best) {
          best = ms;
          best_name = t.name;
        }
      }
    }
    total_best += best * static_cast<double>(c.count);
    total_flops += layer->flops * static_cast<double>(c.count);
    std::printf("%-28s %5ld %10.3f %9.1f  %s\n", layer->label.c_str(), static_cast<long>(c.count),
                best, layer->flops / best * 1e-6, best_name.c_str());
  }
  auto fc = GemmLayer(1, 2048, 1000, rng);
  double fc_best = 1e30;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, "Gemm")) {
    for (const TacticConfig& t : p->Tactics(fc->request)) {
      if (auto pr = Prepare(*fc, *p, t)) fc_best = std::min(fc_best, TimeMs(*pr, 7));
    }
  }
  std::printf(
      "\nResNet-50 batch 1: %.2f GFLOP in convs; best-tactic-per-layer conv time %.2f ms "
      "(%.1f GFLOP/s); FC gemm %.3f ms\n",
      total_flops * 1e-9, total_best, total_flops / total_best * 1e-6, fc_best);
  std::printf("single-tactic totals (layers where the tactic applies only):\n");
  for (const auto& [name, ms] : total_by_tactic_family) {
    std::printf("  %-40s %9.2f ms\n", name.c_str(), ms);
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--resnet50") == 0) return kiln::ResNet50Sweep();
  }
  kiln::RegisterAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
