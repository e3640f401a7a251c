// `kiln run`: loads an engine, runs it on random or given inputs, prints a trtexec-style summary.
#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>

#include "kiln/app/benchmark.h"
#include "kiln/builder/builder_config.h"
#include "kiln/builder/refit.h"
#include "kiln/core/file_io.h"
#include "kiln/obs/metrics.h"
#include "kiln/obs/metrics_server.h"
#include "kiln/obs/run_summary.h"
#include "kiln/onnx/onnx_import.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

// A benchmark is bounded: at most this many runs of each kind (app::BenchmarkOptions'
// max_iterations stops the timed loop there) and this many seconds.
constexpr double kMaxRunIterations = 100000;
constexpr double kMaxRunSeconds = 24 * 3600.0;

struct RunOptions {
  std::string engine;
  std::string weights;  // ONNX model whose initializers fill (refit) the engine in memory
  std::vector<std::string> shapes;
  std::vector<std::string> inputs;
  int warmup = 5;
  int iterations = 20;
  double duration_s = 1.0;
  uint64_t seed = 1;
  bool json = false;
  bool verify = false;
  bool no_cuda_graph = false;
  int layer_iterations = 10;
  int top_layers = 5;
  std::string save_outputs;
  MetricsFlags metrics;
};

nlohmann::json StatsJson(const app::LatencyStats& s) {
  return {{"min", s.min_ms}, {"mean", s.mean_ms}, {"median", s.median_ms},
          {"p90", s.p90_ms}, {"p99", s.p99_ms},   {"max", s.max_ms}};
}

std::string StatsLine(const app::LatencyStats& s) {
  return fmt::format(
      "min {:.3f} ms  median {:.3f} ms  mean {:.3f} ms  p90 {:.3f} ms  p99 {:.3f} ms  "
      "max {:.3f} ms",
      s.min_ms, s.median_ms, s.mean_ms, s.p90_ms, s.p99_ms, s.max_ms);
}

// Writes a tensor as NumPy's .npy (format 1.0), so scripts can compare outputs without kiln's
// Python bindings. bf16 has no NumPy type: it is written as its raw uint16 bits.
Status WriteNpy(const std::string& path, const Tensor& t) {
  std::string descr;
  switch (t.dtype()) {
    case DataType::kFloat32:
      descr = "<f4";
      break;
    case DataType::kFloat16:
      descr = "<f2";
      break;
    case DataType::kBFloat16:
      descr = "<u2";
      break;
    case DataType::kInt64:
      descr = "<i8";
      break;
    case DataType::kInt32:
      descr = "<i4";
      break;
    case DataType::kInt8:
      descr = "|i1";
      break;
    case DataType::kUInt8:
      descr = "|u1";
      break;
    case DataType::kBool:
      descr = "|b1";
      break;
    default:
      return MakeError(ErrorCode::kInvalidArgument, "cannot write {} as .npy", ToString(t.dtype()));
  }
  std::string shape;
  for (int64_t d : t.dims()) shape += std::to_string(d) + ", ";
  if (t.dims().size() > 1) shape.resize(shape.size() - 1);  // "(1, 1000)" / "(5,)"
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   descr, t.dims().empty() ? "" : shape);
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  KILN_ASSIGN_OR_RETURN(AtomicOutput f, AtomicOutput::Create(path, "saved output"));
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char prefix[10] = {'\x93',
                           'N',
                           'U',
                           'M',
                           'P',
                           'Y',
                           '\x01',
                           '\x00',
                           static_cast<char>(len & 0xff),
                           static_cast<char>(len >> 8)};
  KILN_RETURN_IF_ERROR(f.Write(std::string_view(prefix, sizeof(prefix))));
  KILN_RETURN_IF_ERROR(f.Write(header));
  KILN_RETURN_IF_ERROR(f.Write(std::span(static_cast<const std::byte*>(t.raw()), t.size_bytes())));
  return f.Commit();
}

// --shapes and --input must name inputs of the engine: a misspelt name would otherwise be
// ignored and the run measured on other shapes or random data than the user asked for.
Status CheckInputName(const Engine& engine, const std::string& name, const char* flag) {
  std::vector<std::string> names;
  for (const TensorDesc& d : engine.inputs()) {
    if (d.name == name) return OkStatus();
    names.push_back(d.name);
  }
  return MakeError(ErrorCode::kNotFound,
                   "{} names '{}', which is not an input of the engine (its "
                   "inputs: {})",
                   flag, name, fmt::join(names, ", "));
}

std::string Bytes(int64_t b) {
  return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
}

// `--weights`: the engine (a weight-stripped one, or any) refit in memory with the model's
// initializers before it is loaded for the runtime; the file is not changed.
StatusOr<std::shared_ptr<const Engine>> LoadWithWeights(const Runtime& runtime,
                                                        const std::string& engine_path,
                                                        const std::string& onnx_path) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> desc, LoadEngineFileForEdit(engine_path));
  KILN_ASSIGN_OR_RETURN(OnnxWeights weights, ReadOnnxWeights(onnx_path));
  if (Status s = RefitEngine(*desc, weights.initializers, weights.file_hash); !s.ok()) {
    return std::move(s).AddContext(
        fmt::format("filling '{}' with the weights of '{}'", engine_path, onnx_path));
  }
  return runtime.CreateEngine(std::move(desc));
}

int Run(const RunOptions& o) {
  FileRoles files;
  files.Input(o.engine, "engine");
  files.Input(o.weights, "weights");
  for (const std::string& spec : o.inputs) {
    if (size_t eq = spec.find('='); eq != std::string::npos)
      files.Input(spec.substr(eq + 1), "input");
  }
  files.Output(o.metrics.file, "metrics file");
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
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
  auto runtime = Runtime::CreateForEngine((*header)->header);
  if (!runtime.ok()) return ReportError(runtime.status());
  auto engine = o.weights.empty() ? (*runtime)->LoadEngine(o.engine)
                                  : LoadWithWeights(**runtime, o.engine, o.weights);
  if (!engine.ok()) return ReportError(engine.status());

  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& spec : o.shapes) {
    OptimizationProfile p;  // reuse the NAME:DIMS parser (one shape = min=opt=max)
    if (Status s = ParseProfileSpec(spec, &p); !s.ok()) return ReportError(s);
    if (Status s = CheckInputName(**engine, p.inputs[0].input, "--shapes"); !s.ok())
      return ReportError(s);
    shapes[p.inputs[0].input] = p.inputs[0].opt;
  }
  auto random = app::RandomInputs(**engine, shapes, o.seed);
  if (!random.ok()) return ReportError(random.status());
  std::map<std::string, Tensor> feed = std::move(*random);
  for (const std::string& spec : o.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return ReportError(
          MakeError(ErrorCode::kInvalidArgument, "--input '{}': use NAME=FILE.pb", spec));
    }
    if (Status s = CheckInputName(**engine, spec.substr(0, eq), "--input"); !s.ok())
      return ReportError(s);
    auto t = LoadTensorProto(spec.substr(eq + 1));
    if (!t.ok()) return ReportError(t.status());
    feed[spec.substr(0, eq)] = std::move(*t);
  }
  ExecutionOptions eo;
  eo.cuda_graphs = !o.no_cuda_graph;
  auto runner = app::HostRunner::Create(*engine, eo);
  if (!runner.ok()) return ReportError(runner.status());
  if (Status s = (*runner)->SetInputs(feed); !s.ok()) return ReportError(s);
  app::ProfileOptions bo;
  bo.warmup = o.warmup;
  bo.min_iterations = o.iterations;
  bo.min_seconds = o.duration_s;
  bo.layer_iterations = std::max(0, o.layer_iterations);
  auto profile = app::ProfileEngine(**runner, bo);
  if (!profile.ok()) return ReportError(profile.status());
  const app::LatencyStats* stats = &profile->latency;
  if (!o.save_outputs.empty()) {
    // One more run in the timed mode (graph replay where on): those are the outputs saved.
    if (Status s = (*runner)->Run(); !s.ok()) return ReportError(s);
    std::error_code ec;
    std::filesystem::create_directories(o.save_outputs, ec);
    for (const auto& [name, t] : (*runner)->outputs()) {
      std::string file = name;
      for (char& c : file)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
      if (Status s = WriteNpy(o.save_outputs + "/" + file + ".npy", t); !s.ok())
        return ReportError(s);
    }
  }
  // What the compute and kernel figures are: device timers, or the host clock on the CPU.
  const std::string timer = profile->device_timing ? "device" : "host";
  const std::string what = profile->device_timing ? "GPU" : "host";

  int64_t planned = (*engine)->planned_peak_bytes();
  int64_t actual = (*runner)->context().actual_peak_bytes();
  obs::KilnMetrics& m = obs::Metrics();
  for (double ms : stats->samples_ms) m.ObserveInferenceLatency(ms / 1000.0);
  if (!profile->layers.empty()) m.ObserveKernel(profile->max_kernel_ms / 1000.0);
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
    j["timer"] = timer;
    j["compute_ms"] = StatsJson(profile->compute);
    j["enqueue_ms"] = StatsJson(profile->enqueue);
    if (!profile->layers.empty()) {
      j["max_kernel_ms"] = profile->max_kernel_ms;
      j["max_kernel_layer"] = profile->max_kernel_layer;
      nlohmann::json layers = nlohmann::json::array();
      for (const app::LayerTime& l : profile->layers) {
        layers.push_back({{"name", l.name},
                          {"tactic", l.tactic},
                          {"median_ms", l.median_ms},
                          {"max_ms", l.max_ms}});
      }
      j["layers"] = layers;
    } else {
      j["max_kernel_ms"] = nullptr;
    }
    j["cuda_graph"] = {{"enabled", !o.no_cuda_graph},
                       {"captures", profile->graph_captures},
                       {"launches", profile->graph_launches},
                       {"disabled_after_failure", profile->graphs_disabled}};
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
  std::cout << fmt::format("latency:    {} (host wall: copy in + execute + copy out)\n",
                           StatsLine(*stats));
  std::cout << fmt::format("{} compute: {} ({} time of the enqueued work)\n", what,
                           StatsLine(profile->compute), timer);
  std::cout << fmt::format("enqueue:    {} (host time to launch)\n", StatsLine(profile->enqueue));
  if (!profile->layers.empty()) {
    std::cout << fmt::format("max kernel: {:.3f} ms ({} time, layer '{}', {} per-layer runs)\n",
                             profile->max_kernel_ms, timer, profile->max_kernel_layer,
                             bo.layer_iterations);
    std::vector<const app::LayerTime*> top;
    for (const app::LayerTime& l : profile->layers) top.push_back(&l);
    std::sort(top.begin(), top.end(), [](const app::LayerTime* a, const app::LayerTime* b) {
      return a->median_ms > b->median_ms;
    });
    for (size_t i = 0; i < top.size() && static_cast<int>(i) < o.top_layers; ++i) {
      std::cout << fmt::format("  {:>9.3f} ms  {}  ({})\n", top[i]->median_ms, top[i]->name,
                               top[i]->tactic);
    }
  }
  if ((*engine)->backend().supports_graphs()) {
    std::cout << fmt::format("cuda graph: {} ({} captures, {} launches{})\n",
                             o.no_cuda_graph ? "off" : "on", profile->graph_captures,
                             profile->graph_launches,
                             profile->graphs_disabled ? "; capture failed, ran eagerly" : "");
  }
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
  sub->add_option("--weights", o->weights,
                  "ONNX model whose initializers fill the engine in memory before it runs (a "
                  "weight-stripped engine needs them; the file is not changed)")
      ->check(CLI::ExistingFile);
  sub->add_option(
         "--shapes", o->shapes,
         "NAME:DIMS per dynamic input, e.g. input:8x3x224x224 (default: the profile's opt)")
      ->take_all();
  sub->add_option("--input", o->inputs, "NAME=FILE.pb: feed a TensorProto instead of random data")
      ->take_all();
  sub->add_option("--warmup", o->warmup, "untimed runs first")
      ->capture_default_str()
      ->check(Count(0, kMaxRunIterations));
  sub->add_option("--iterations", o->iterations, "at least this many timed runs")
      ->capture_default_str()
      ->check(Count(1, kMaxRunIterations));
  sub->add_option("--duration", o->duration_s, "and at least this many seconds")
      ->capture_default_str()
      ->check(Number(0, kMaxRunSeconds));
  sub->add_option("--seed", o->seed, "random input seed")
      ->capture_default_str()
      ->check(Count(0, kMaxUint64));
  sub->add_flag("--json", o->json, "print the summary as JSON");
  sub->add_flag("--no-cuda-graph", o->no_cuda_graph,
                "launch layer by layer instead of capturing and replaying a CUDA graph");
  sub->add_option("--layer-iterations", o->layer_iterations,
                  "eager runs with an event around each layer, for per-layer and max kernel time "
                  "(0: skip)")
      ->capture_default_str()
      ->check(Count(0, kMaxRunIterations));
  sub->add_option("--save-outputs", o->save_outputs,
                  "write each output of a final run as DIR/NAME.npy (NumPy format)");
  sub->add_option("--top-layers", o->top_layers, "slowest layers listed in the table")
      ->capture_default_str()
      ->check(Count(0, kMaxCount));
  sub->add_flag("--verify", o->verify,
                "also print the four figures of a fix's verification: build time, max kernel time, "
                "NCCL init, peak memory");
  o->metrics.Add(sub);
  return [o]() { return Run(*o); };
}

}  // namespace
KILN_REGISTER_COMMAND(run, 20, Setup);
}  // namespace kiln::cli
