// Refit inside one process, the training-loop case (issue 20): the engine is loaded and running,
// the new weights are already in host memory, and refit is ComputeRefit (replay of the weight
// program) + Engine::RefitWeights (the new set, uploaded on a device backend), then the first
// Execute after it (the context re-creates its weight-reading kernels). Compared with the same
// process's cold and warm builds (BuildFromOnnxFile, empty vs filled timing cache).
//   kiln_bench_refit MODEL_DIR [--backend cpu|cuda] [--fp16] [--iterations N] [--json FILE]
// MODEL_DIR holds model.onnx and info.json (its "profile"). Weights B are made here: every f32
// initializer of more than one element scaled by U(0.8, 1.2) and moved by U(0, 0.02) (seed 20),
// the rule of tests/builder/refit_test.cc and bench/refit/perturb_weights.py.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "kiln/app/live_refit.h"
#include "kiln/app/pipeline.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/onnx_import.h"
#include "zoo_bench.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using bench::Clock;
using bench::Median;
using bench::Since;

std::map<std::string, Tensor> WeightsB(const std::string& model) {
  auto graph = ImportOnnxFile(model);
  if (!graph.ok()) {
    std::cerr << graph.status().ToString() << "\n";
    std::exit(1);
  }
  std::mt19937 rng(20);
  std::uniform_real_distribution<float> scale(0.8f, 1.2f), shift(0.f, 0.02f);
  std::map<std::string, Tensor> out;
  for (InitializerInfo& i : CollectInitializers(**graph)) {
    Tensor t = std::move(i.value);
    if (t.dtype() == DataType::kFloat32 && t.num_elements() > 1) {
      t = Tensor::FromBytes(t.dtype(), t.dims(), t.bytes());
      float* d = t.mutable_data<float>();
      for (int64_t k = 0; k < t.num_elements(); ++k) d[k] = d[k] * scale(rng) + shift(rng);
    }
    out.emplace(i.name, std::move(t));
  }
  return out;
}

template <typename T>
T Check(StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::cerr << what << ": " << v.status().ToString() << "\n";
    std::exit(1);
  }
  return std::move(*v);
}

int Main(int argc, char** argv) {
  CLI::App app("refit in one process vs cold and warm builds");
  std::string dir, backend = "cpu", json_path;
  bool fp16 = false;
  int iterations = 5, extra_refits = 0;
  app.add_option("model_dir", dir)->required();
  app.add_option("--backend", backend);
  app.add_flag("--fp16", fp16);
  app.add_option("--iterations", iterations);
  app.add_option("--json", json_path);
  app.add_option("--extra-refits", extra_refits,
                 "refits without runs after the measured ones (for a profiler; not in the JSON)");
  CLI11_PARSE(app, argc, argv);
  const std::string model = (fs::path(dir) / "model.onnx").string();
  const fs::path cache = fs::temp_directory_path() / fmt::format("kiln_refit_{}.cache", getpid());
  fs::remove(cache);

  BuilderConfig config;
  config.backend = backend == "cuda" ? BackendKind::kCuda : BackendKind::kCpu;
  config.fp16 = fp16;
  // No profile in info.json: the model's own (static) shapes.
  auto profile = bench::ZooProfile(dir);
  config.profile = profile.ok() ? *profile : OptimizationProfile{};
  config.timing_cache_path = cache.string();
  auto t = Clock::now();
  app::BuiltEngine built = Check(app::BuildFromOnnxFile(model, config), "cold build");
  const double cold = Since(t);
  std::vector<double> warm;
  for (int i = 0; i < 3; ++i) {
    t = Clock::now();
    built = Check(app::BuildFromOnnxFile(model, config), "warm build");
    warm.push_back(Since(t));
  }
  fs::remove(cache);

  t = Clock::now();
  const std::map<std::string, Tensor> b = WeightsB(model);
  const double make_b = Since(t);
  auto runtime = Check(Runtime::Create(config.backend), "runtime");
  std::shared_ptr<const EngineDesc> desc = std::move(built.desc);
  auto engine = Check(runtime->CreateEngine(desc), "engine");
  auto runner = Check(app::HostRunner::Create(engine), "context");
  auto inputs = Check(app::RandomInputs(*engine, {}, 1), "inputs");
  if (Status s = runner->SetInputs(inputs); !s.ok()) return std::cerr << s.ToString() << "\n", 1;
  std::vector<double> refit, replay, publish, first_run, steady;
  RefitReport report;
  for (int i = 0; i < iterations; ++i) {
    t = Clock::now();
    Check(app::RefitLoadedEngine(*engine, b, &report), "refit");
    refit.push_back(Since(t));
    replay.push_back(report.replay_seconds);
    publish.push_back(refit.back() - report.replay_seconds);
    t = Clock::now();
    if (Status s = runner->Run(); !s.ok()) return std::cerr << s.ToString() << "\n", 1;
    first_run.push_back(Since(t));
    t = Clock::now();
    if (Status s = runner->Run(); !s.ok()) return std::cerr << s.ToString() << "\n", 1;
    steady.push_back(Since(t));
  }
  for (int i = 0; i < extra_refits; ++i) Check(app::RefitLoadedEngine(*engine, b), "refit");
  nlohmann::json out = {
      {"model", fs::path(dir).filename().string()},
      {"backend", backend},
      {"fp16", fp16},
      {"weights_bytes", report.bytes_refit},
      {"constants_refit", report.constants_refit},
      {"weight_steps", report.steps},
      {"cold_build_s", cold},
      {"warm_build_s", Median(warm)},
      {"refit_s", Median(refit)},
      {"refit_replay_s", Median(replay)},
      {"refit_publish_s", Median(publish)},
      {"refit_all_s", refit},
      {"refit_replay_all_s", replay},
      {"refit_report", nlohmann::json::parse(report.ToJson())},
      {"first_run_after_refit_s", Median(first_run)},
      {"steady_run_s", Median(steady)},
      {"warm_over_refit", Median(warm) / Median(refit)},
      {"warm_over_refit_plus_first_run_overhead",
       Median(warm) / (Median(refit) + std::max(0.0, Median(first_run) - Median(steady)))},
      {"make_weights_b_s", make_b},
  };
  std::cout << out.dump() << "\n";
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
