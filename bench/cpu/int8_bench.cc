// INT8 vs FP32 on the CPU backend, side by side in one run: for ResNet-50 conv shapes (batch 1)
// and BERT-base gemm shapes (128 tokens), the median time of the fastest FP32 tactic and of the
// INT8 tactic (i8-conv-cpu-onednn / i8-gemm-cpu-onednn; the input quantization is inside the
// timed run), their ratio, and the INT8 result's rel-L2 against FP32.
//   kiln_bench_cpu_int8 [--runs N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "kiln/backends/kernel.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

Tensor Random(std::vector<int64_t> dims, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(NumElements(dims)));
  for (auto& x : v) x = d(rng);
  return Tensor::FromVector(DataType::kFloat32, std::move(dims), v);
}

struct Layer {
  std::string label;
  std::unique_ptr<Graph> graph;
  KernelRequest request;
  std::vector<Tensor> inputs;
  Tensor output;
  double flops = 0;
};

std::unique_ptr<Layer> MakeLayer(std::string label, std::string op, std::vector<Tensor> ins,
                                 std::vector<bool> constant, AttributeMap attrs, double flops) {
  auto l = std::make_unique<Layer>();
  l->label = std::move(label);
  l->graph = std::make_unique<Graph>();
  attrs.Set("kiln_int8_input_amax", 1.f);  // inputs are uniform in [-1, 1]
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

std::unique_ptr<Layer> Conv(int64_t c, int64_t m, int64_t k, int64_t stride, int64_t hw,
                            std::mt19937& rng) {
  AttributeMap a;
  a.Set("strides", std::vector<int64_t>{stride, stride});
  a.Set("pads", std::vector<int64_t>(4, k / 2));
  a.Set("activation", std::string("relu"));
  int64_t out = (hw + 2 * (k / 2) - k) / stride + 1;
  std::string label = fmt::format("conv {}x{}/{} {}->{} @{}", k, k, stride, c, m, hw);
  return MakeLayer(label, "FusedConv",
                   {Random({1, c, hw, hw}, rng), Random({m, c, k, k}, rng), Random({m}, rng)},
                   {false, true, true}, std::move(a), 2.0 * m * out * out * c * k * k);
}

std::unique_ptr<Layer> Gemm(int64_t m, int64_t k, int64_t n, std::mt19937& rng) {
  AttributeMap a;
  a.Set("transB", int64_t{1});
  std::string label = fmt::format("gemm {}x{}x{}", m, k, n);
  return MakeLayer(label, "Gemm", {Random({m, k}, rng), Random({n, k}, rng), Random({n}, rng)},
                   {false, true, true}, std::move(a), 2.0 * m * n * k);
}

struct Timed {
  std::string tactic;
  double ms = INFINITY;
  std::vector<float> y;
};

// Median milliseconds of `runs` runs of every tactic whose name starts with `prefix`; the
// fastest one is returned.
Timed TimeBest(Layer& l, const std::string& prefix, int runs) {
  Timed best;
  for (const KernelProvider* p :
       KernelRegistry::Get().Providers(BackendKind::kCpu, l.request.node->op_type())) {
    for (const TacticConfig& t : p->Tactics(l.request)) {
      if (!t.name.starts_with(prefix)) continue;
      auto kernel = p->Create(l.request, t);
      if (!kernel.ok()) continue;
      std::vector<TensorView> in, out{l.output.view()};
      for (const Tensor& x : l.inputs) in.push_back(x.view());
      auto ws = (*kernel)->Prepare(in, out);
      if (!ws.ok()) continue;
      std::vector<std::byte> workspace(*ws + 64);
      void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(workspace.data()) + 63) &
                                              ~uintptr_t{63});
      KernelRunArgs args{in, out, aligned, *ws, nullptr};
      for (int i = 0; i < 2; ++i) (void)(*kernel)->Run(args);  // warm-up
      std::vector<double> ms;
      for (int i = 0; i < runs; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        if (!(*kernel)->Run(args).ok()) break;
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      if (ms.empty()) continue;
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      double median = ms[ms.size() / 2];
      if (median < best.ms) best = {t.name, median, l.output.ToFloatVector()};
    }
  }
  return best;
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0;
}

int Main(int argc, char** argv) {
  int runs = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0) runs = std::max(1, std::atoi(argv[i + 1]));
  }
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(Conv(64, 64, 3, 1, 56, rng));
  layers.push_back(Conv(128, 128, 3, 1, 28, rng));
  layers.push_back(Conv(256, 256, 3, 1, 14, rng));
  layers.push_back(Conv(512, 512, 3, 1, 7, rng));
  layers.push_back(Conv(256, 64, 1, 1, 56, rng));
  layers.push_back(Conv(1024, 256, 1, 1, 14, rng));
  layers.push_back(Gemm(128, 768, 768, rng));
  layers.push_back(Gemm(128, 768, 3072, rng));
  layers.push_back(Gemm(128, 3072, 768, rng));
  std::printf("%-28s %-32s %9s %-22s %9s %7s %8s\n", "layer", "fp32 tactic (fastest)", "fp32 ms",
              "int8 tactic", "int8 ms", "speedup", "rel-L2");
  double f32_total = 0, i8_total = 0;
  for (auto& l : layers) {
    if (!l) return 1;
    Timed f32 = TimeBest(*l, "f32-", runs);
    Timed i8 = TimeBest(*l, "i8-", runs);
    f32_total += f32.ms;
    i8_total += i8.ms;
    std::printf("%-28s %-32s %9.3f %-22s %9.3f %6.2fx %8.2e\n", l->label.c_str(),
                f32.tactic.c_str(), f32.ms, i8.tactic.c_str(), i8.ms, f32.ms / i8.ms,
                RelL2(i8.y, f32.y));
  }
  std::printf("%-28s %-32s %9.3f %-22s %9.3f %6.2fx\n", "total", "", f32_total, "", i8_total,
              f32_total / i8_total);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
