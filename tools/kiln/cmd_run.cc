// `kiln run`: loads an engine, runs it on random or given inputs, prints a trtexec-style summary.
#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <iostream>

#include "kiln/app/benchmark.h"
#include "kiln/build/builder_config.h"
#include "kiln/obs/metrics.h"
#include "kiln/obs/metrics_server.h"
#include "kiln/obs/run_summary.h"
#include "kiln/onnx/onnx_import.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct RunOptions {
  std::string engine;
  std::vector<std::string> shapes;
  std::vector<std::string> inputs;
  int warmup = 5;
  int iterations = 20;
  double duration_s = 1.0;
  uint64_t seed = 1;
  bool json = false;
  bool verify = false;
  MetricsFlags metrics;
};

std::string Bytes(int64_t b) {
  return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
}

int Run(const RunOptions& o) {
  obs::MetricsExportOptions mo;
  if (o.metrics.port >= 0) mo.port = o.metrics.port;
  mo.file = o.metrics.file;
  auto metrics = obs::MetricsExport::Start(mo);
  if (!metrics.ok()) return ReportError(metrics.status());
  if ((*metrics)->server()) fmt::print(stderr, "metrics at {}\n", (*metrics)->server()->Url());
  LoadOptions peek;
  peek.check_providers = false;
  auto header = LoadEngineFile(o.engine, peek);
  if (!header.ok()) return ReportError(header.status());
  auto runtime = Runtime::Create((*header)->header.backend);
  if (!runtime.ok()) return ReportError(runtime.status());
  auto engine = (*runtime)->LoadEngine(o.engine);
  if (!engine.ok()) return ReportError(engine.status());

  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& spec : o.shapes) {
    OptimizationProfile p;  // reuse the NAME:DIMS parser (one shape = min=opt=max)
    if (Status s = ParseProfileSpec(spec, &p); !s.ok()) return ReportError(s);
    shapes[p.inputs[0].input] = p.inputs[0].opt;
  }
  std::map<std::string, Tensor> feed = app::RandomInputs(**engine, shapes, o.seed);
  for (const std::string& spec : o.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return ReportError(
          MakeError(ErrorCode::kInvalidArgument, "--input '{}': use NAME=FILE.pb", spec));
    }
    auto t = LoadTensorProto(spec.substr(eq + 1));
    if (!t.ok()) return ReportError(t.status());
    feed[spec.substr(0, eq)] = std::move(*t);
  }
  auto runner = app::HostRunner::Create(*engine);
  if (!runner.ok()) return ReportError(runner.status());
  if (Status s = (*runner)->SetInputs(feed); !s.ok()) return ReportError(s);
  app::BenchmarkOptions bo;
  bo.warmup = o.warmup;
  bo.min_iterations = o.iterations;
  bo.min_seconds = o.duration_s;
  auto stats = app::Benchmark(**runner, bo);
  if (!stats.ok()) return ReportError(stats.status());

  int64_t planned = (*engine)->planned_peak_bytes();
  int64_t actual = (*runner)->context().actual_peak_bytes();
  obs::KilnMetrics& m = obs::Metrics();
  for (double ms : stats->samples_ms) m.ObserveInferenceLatency(ms / 1000.0);
  m.ObserveDeviceMemory(0, static_cast<uint64_t>(actual));
  if (Status s = (*metrics)->Finish(); !s.ok()) return ReportError(s);
  // The report's four figures for this process; what this run did not measure says so.
  const obs::RunSummary summary = obs::RunSummary::FromMetrics(m);
  std::vector<std::string> shape_text;
  for (const auto& [name, t] : feed)
    shape_text.push_back(fmt::format("{}:{}", name, fmt::join(t.dims(), "x")));
  if (o.json) {
    nlohmann::json j;
    j["engine"] = o.engine;
    j["backend"] = ToString((*engine)->desc().header.backend);
    j["shapes"] = shape_text;
    j["latency_ms"] = {{"min", stats->min_ms},       {"mean", stats->mean_ms},
                       {"median", stats->median_ms}, {"p90", stats->p90_ms},
                       {"p99", stats->p99_ms},       {"max", stats->max_ms}};
    j["iterations"] = stats->iterations;
    j["throughput_per_s"] = stats->throughput_per_s;
    j["memory"] = {{"planned_peak_bytes", planned}, {"actual_peak_bytes", actual}};
    if (o.verify) j["verify"] = nlohmann::json::parse(summary.ToJson());
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("=== kiln run: {} on {} ({}) ===\n", o.engine,
                           ToString((*engine)->desc().header.backend), fmt::join(shape_text, " "));
  std::cout << fmt::format("throughput: {:.1f} inferences/s ({} iterations in {:.2f} s)\n",
                           stats->throughput_per_s, stats->iterations, stats->total_s);
  std::cout << fmt::format(
      "latency:    min {:.3f} ms  median {:.3f} ms  mean {:.3f} ms  p90 {:.3f} ms  p99 {:.3f} ms  "
      "max {:.3f} ms\n",
      stats->min_ms, stats->median_ms, stats->mean_ms, stats->p90_ms, stats->p99_ms, stats->max_ms);
  std::cout << fmt::format("memory:     peak {} planned, {} allocated\n", Bytes(planned),
                           Bytes(actual));
  if (o.verify) std::cout << "\n" << summary.ToTable();
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand(
      "run", "Run an engine and report latency and throughput (like trtexec --loadEngine)");
  sub->add_option("engine", o->engine, ".kiln engine file")->required()->check(CLI::ExistingFile);
  sub->add_option(
         "--shapes", o->shapes,
         "NAME:DIMS per dynamic input, e.g. input:8x3x224x224 (default: the profile's opt)")
      ->take_all();
  sub->add_option("--input", o->inputs, "NAME=FILE.pb: feed a TensorProto instead of random data")
      ->take_all();
  sub->add_option("--warmup", o->warmup, "untimed runs first")->capture_default_str();
  sub->add_option("--iterations", o->iterations, "at least this many timed runs")
      ->capture_default_str();
  sub->add_option("--duration", o->duration_s, "and at least this many seconds")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "random input seed")->capture_default_str();
  sub->add_flag("--json", o->json, "print the summary as JSON");
  sub->add_flag("--verify", o->verify,
                "also print the four figures of a fix's verification: build time, max kernel time, "
                "NCCL init, peak memory");
  o->metrics.Add(sub);
  return [o]() { return Run(*o); };
}

}  // namespace
KILN_REGISTER_COMMAND(run, 20, Setup);
}  // namespace kiln::cli
