// One zoo model through the builder, measured in one process so that every ratio compares runs
// made under the same machine load: build time with a cold then a warm timing cache, and engine
// latency with passes + tactic search against no passes + heuristic tactics. Prints one JSON
// object; bench/build/run_build_bench.py runs it per model and writes the table.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/app/benchmark.h"
#include "kiln/app/pipeline.h"
#include "kiln/engine/engine_file.h"
#include "zoo_bench.h"

namespace {

using namespace kiln;
namespace fs = std::filesystem;
using bench::Clock;
using bench::Median;
using bench::Since;
using bench::ZooProfile;

struct Built {
  double seconds = 0;
  BuildReport report;
  std::vector<std::byte> bytes;
};

StatusOr<Built> Build(const fs::path& model, const BuilderConfig& config) {
  const auto t0 = Clock::now();
  KILN_ASSIGN_OR_RETURN(app::BuiltEngine e, app::BuildFromOnnxFile(model.string(), config));
  Built b;
  KILN_ASSIGN_OR_RETURN(b.bytes, SerializeEngine(*e.desc));
  b.seconds = Since(t0);  // what a user waits for: import + build + serialize
  b.report = std::move(e.report);
  return b;
}

struct Runner {
  std::shared_ptr<const Engine> engine;
  std::unique_ptr<app::HostRunner> runner;
};

StatusOr<Runner> Load(const Runtime& runtime, const Built& b,
                      const std::map<std::string, Tensor>& inputs) {
  Runner r;
  KILN_ASSIGN_OR_RETURN(r.engine, runtime.DeserializeEngine(b.bytes));
  KILN_ASSIGN_OR_RETURN(r.runner, app::HostRunner::Create(r.engine));
  KILN_RETURN_IF_ERROR(r.runner->SetInputs(inputs));
  return r;
}

// --warm-profile N: N warm builds only (no latency), for a profiler (perf record) to see where a
// warm build's fixed costs go; prints the median of each phase.
Status WarmProfile(const fs::path& model, const BuilderConfig& tuned, int builds) {
  KILN_ASSIGN_OR_RETURN(Built cold, Build(model, tuned));
  std::vector<double> total, import, passes, precision, tactics, plan, outside;
  for (int i = 0; i < builds; ++i) {
    KILN_ASSIGN_OR_RETURN(Built warm, Build(model, tuned));
    const BuildReport& r = warm.report;
    total.push_back(warm.seconds);
    import.push_back(r.phase_seconds_import);
    passes.push_back(r.phase_seconds_passes);
    precision.push_back(r.phase_seconds_precision);
    tactics.push_back(r.phase_seconds_tactics);
    plan.push_back(r.phase_seconds_plan);
    outside.push_back(warm.seconds - r.build_seconds);
  }
  nlohmann::json j = {{"model", model.parent_path().filename().string()},
                      {"cold_s", cold.seconds},
                      {"warm_builds", builds},
                      {"warm_median_s",
                       {{"total", Median(total)},
                        {"verify_and_shapes", Median(import)},
                        {"passes", Median(passes)},
                        {"precision", Median(precision)},
                        {"tactics", Median(tactics)},
                        {"plan", Median(plan)},
                        {"onnx_import_and_serialize", Median(outside)}}}};
  std::printf("%s\n", j.dump().c_str());
  return OkStatus();
}

Status Main(const std::string& model_dir, int rounds, double seconds_per_round, int min_iterations,
            const std::string& work_dir, int warm_profile, int cold_runs, int warm_runs) {
  const fs::path dir(model_dir);
  const fs::path model = dir / "model.onnx";
  KILN_ASSIGN_OR_RETURN(OptimizationProfile profile, ZooProfile(dir));
  fs::create_directories(work_dir);
  const fs::path cache = fs::path(work_dir) / (dir.filename().string() + ".timing-cache");
  fs::remove(cache);

  BuilderConfig tuned;
  tuned.profile = profile;
  tuned.timing_cache_path = cache.string();
  if (warm_profile > 0) return WarmProfile(model, tuned, warm_profile);
  // Cold: median of `cold_runs` builds, each from an empty cache; warm: median of `warm_runs`
  // rebuilds against the cache the cold build before them wrote. The two are interleaved (a
  // cold build, then its share of the warm builds, `cold_runs` times) so that both sides of
  // the ratio sample the same stretch of machine load: on a shared machine a small model's
  // build time drifts by 1.5x from one minute to the next, and a single build can lose a
  // scheduler tick (4 ms) to other processes. The first cold build also pays the process's
  // one-time set-up (BLAS loading, thread pool), as a user's `kiln build` does.
  std::vector<double> cold_s, warm_s;
  Built cold, warm;
  bool warm_identical = true;  // determinism: same model, config and cache -> same bytes
  for (int round = 0; round < cold_runs; ++round) {
    fs::remove(cache);
    KILN_ASSIGN_OR_RETURN(cold, Build(model, tuned));
    cold_s.push_back(cold.seconds);
    const int share = warm_runs / cold_runs + (round < warm_runs % cold_runs ? 1 : 0);
    for (int i = 0; i < share; ++i) {
      std::vector<std::byte> previous = std::move(warm.bytes);
      KILN_ASSIGN_OR_RETURN(warm, Build(model, tuned));
      // Each cold build times afresh and may choose differently, so compare within a round.
      if (i > 0 && warm.bytes != previous) warm_identical = false;
      warm_s.push_back(warm.seconds);
    }
  }
  // The warm build must reproduce the cold build's choices from the cache alone.
  bool same_tactics = cold.report.layer_reports.size() == warm.report.layer_reports.size();
  for (size_t i = 0; same_tactics && i < cold.report.layer_reports.size(); ++i) {
    same_tactics = cold.report.layer_reports[i].tactic == warm.report.layer_reports[i].tactic;
  }
  BuilderConfig baseline;
  baseline.profile = profile;
  baseline.optimize = false;
  baseline.search_tactics = false;
  KILN_ASSIGN_OR_RETURN(Built base, Build(model, baseline));

  // Latency at the profile's opt shapes, same random inputs for both engines. Rounds alternate
  // between the engines so that a change in machine load hits both alike.
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> runtime, Runtime::Create(BackendKind::kCpu));
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const Engine> probe,
                        runtime->DeserializeEngine(warm.bytes));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const InputProfile& p : profile.inputs) shapes[p.input] = p.opt;
  using InputMap = std::map<std::string, Tensor>;
  KILN_ASSIGN_OR_RETURN(const InputMap inputs, app::RandomInputs(*probe, shapes, /*seed=*/7));
  KILN_ASSIGN_OR_RETURN(Runner a, Load(*runtime, warm, inputs));
  KILN_ASSIGN_OR_RETURN(Runner b, Load(*runtime, base, inputs));
  app::BenchmarkOptions bo;
  bo.min_iterations = min_iterations;
  bo.warmup = std::min(3, min_iterations);
  bo.min_seconds = seconds_per_round;
  std::vector<double> tuned_ms, base_ms;
  for (int r = 0; r < rounds; ++r) {
    KILN_ASSIGN_OR_RETURN(app::LatencyStats sa, app::Benchmark(*a.runner, bo));
    KILN_ASSIGN_OR_RETURN(app::LatencyStats sb, app::Benchmark(*b.runner, bo));
    tuned_ms.push_back(sa.median_ms);
    base_ms.push_back(sb.median_ms);
  }
  // The two engines must compute the same thing, or the latency comparison means nothing.
  double worst_rel_l2 = 0;
  for (const auto& [name, t] : a.runner->outputs()) {
    worst_rel_l2 = std::max(
        worst_rel_l2, app::CompareTensors(t, b.runner->outputs().at(name), 1e-3, 1e-5).rel_l2);
  }

  const double warm_median = Median(warm_s);
  nlohmann::json j = {
      {"model", dir.filename().string()},
      {"layers", warm.report.layers},
      {"weights_bytes", warm.report.weights_bytes},
      {"peak_bytes_tuned", warm.report.peak_bytes},
      {"opt_shapes", shapes},
      {"build_cold_s", Median(cold_s)},
      {"build_cold_runs_s", cold_s},
      {"build_cold_tactics_reused", cold.report.tactics_reused},
      {"build_cold_tactics_timed", cold.report.tactics_timed},
      {"build_warm_s", warm_median},
      {"build_warm_runs_s", warm_s},
      {"build_warm_cache_hits", warm.report.timing_cache_hits},
      // Where a warm build's time goes: with every tactic from the cache, what is left is fixed
      // work (import, passes, shape inference, planning, serialization).
      {"build_warm_phases_s",
       {{"import", warm.report.phase_seconds_import},
        {"passes", warm.report.phase_seconds_passes},
        {"precision", warm.report.phase_seconds_precision},
        {"tactics", warm.report.phase_seconds_tactics},
        {"plan", warm.report.phase_seconds_plan}}},
      {"build_cold_tactics_phase_s", cold.report.phase_seconds_tactics},
      {"build_warm_tactics_timed", warm.report.tactics_timed},
      {"warm_builds_identical", warm_identical},
      {"warm_same_tactics_as_cold", same_tactics},
      {"cold_over_warm", Median(cold_s) / warm_median},
      {"build_baseline_s", base.seconds},
      {"latency_tuned_ms", Median(tuned_ms)},
      {"latency_tuned_rounds_ms", tuned_ms},
      {"nodes_tuned", warm.report.nodes_after_passes},
      {"latency_baseline_ms", Median(base_ms)},
      {"latency_baseline_rounds_ms", base_ms},
      {"nodes_baseline", base.report.layers},
      {"speedup", Median(base_ms) / Median(tuned_ms)},
      {"outputs_rel_l2_tuned_vs_baseline", worst_rel_l2}};
  std::printf("%s\n", j.dump().c_str());
  return OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, work_dir = "/tmp/kiln_bench_build";
  int rounds = 3;
  double seconds = 0.5;
  int min_iterations = 10;
  int warm_profile = 0, cold_runs = 3, warm_runs = 9;
  CLI::App app{"kiln builder benchmark: one model"};
  app.add_option("--model", model_dir, "zoo model directory (model.onnx + info.json)")->required();
  app.add_option("--rounds", rounds, "latency rounds per engine (alternating)");
  app.add_option("--seconds", seconds, "minimum seconds per latency round");
  app.add_option("--min-iterations", min_iterations, "minimum timed runs per latency round");
  app.add_option("--work-dir", work_dir, "where the timing cache is written");
  app.add_option("--cold-runs", cold_runs,
                 "cold builds (empty cache each), median reported; each is followed by its share "
                 "of the warm builds");
  app.add_option("--warm-runs", warm_runs, "warm builds, median reported");
  app.add_option("--warm-profile", warm_profile,
                 "only N warm builds (no latency), printing each phase's median: for perf record");
  CLI11_PARSE(app, argc, argv);
  kiln::Status s = Main(model_dir, rounds, seconds, min_iterations, work_dir, warm_profile,
                        std::max(1, cold_runs), std::max(1, warm_runs));
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
