// `kiln build`: ONNX model -> .kiln engine, bounded in time and memory, with a build report.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>

#include "kiln/app/pipeline.h"
#include "kiln/app/shared_build.h"
#include "kiln/backends/backend.h"
#include "kiln/core/file_io.h"
#include "kiln/distributed/build_once.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/nccl_factory.h"
#include "kiln/engine/engine_file.h"
#include "kiln/obs/metrics.h"
#include "kiln/obs/metrics_server.h"
#include "kiln/obs/progress.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

struct BuildOptions {
  std::string model;
  std::string output;
  std::string backend = "auto";
  bool fp16 = false, bf16 = false, int8 = false, fp8 = false;
  std::string calib_dir, calib_method = "minmax", calib_cache;
  bool calib_on_cpu = false;
  bool no_fp8_edges = false;
  bool no_int8_edges = false;
  std::string quantized_if_faster = "auto";
  std::string int8_tolerance = fmt::format("{:g}", precision::kDefaultInt8Tolerance);
  std::string fp8_tolerance = fmt::format("{:g}", precision::kDefaultFp8Tolerance);
  double calib_percentile = 99.99;
  CLI::Option* precision_report_opt = nullptr;
  std::string precision_report;  // "" with the flag given: print the table
  std::vector<std::string> profiles;
  std::vector<std::string> shape_values;
  std::vector<std::string> sequence_inputs;  // NAME=LENGTH[:RANK]
  std::vector<std::string> absent_inputs;    // optional inputs built as absent
  int64_t max_loop_trips = ImportOptions().max_loop_trips;
  int64_t shape_arena = 0;
  std::string deadline;
  std::string memory_budget;
  double max_kernel_time_ms = 0;
  int opt_level = kDefaultOptLevel;
  std::string timing_cache;
  std::string report_path;
  bool no_optimize = false;
  std::vector<std::string> disabled_passes;
  bool layers = false;
  bool json = false;
  bool strip_weights = false;  // write the engine without the weights refit can remake
  // Distributed: every rank runs the same command; one builds, the others receive the bytes.
  bool distributed = false;
  std::string transport = "auto";
  std::string build_on = "rank0";
  std::string cache_dir;
  bool weight_free_cache = false;
  bool trust_shared_cache = false;
  double join_timeout_s = 60, wait_timeout_s = 1800, transfer_timeout_s = 300;
  int rank = -1, world_size = -1;
  std::string dist_report;
  MetricsFlags metrics;
};

// Build progress through obs::Progress: a bar with ETA on a terminal, plain lines otherwise, log
// events under --log-format json. One Progress per build phase.
ProgressCallback MakeProgress(bool quiet, bool json_events) {
  if (quiet) return nullptr;
  struct State {
    std::string phase;
    std::unique_ptr<obs::Progress> progress;
  };
  auto state = std::make_shared<State>();
  return [state, json_events](const BuildProgress& p) {
    if (p.phase != state->phase) {
      if (state->progress) state->progress->Finish(true);
      state->progress.reset();
      state->phase = p.phase;
      if (p.phase == "done") return true;
      obs::ProgressOptions o;
      o.phase = "build." + p.phase;
      o.total = p.total;
      o.unit = p.phase == "tactics" ? "layers" : "";
      o.subsystem = Subsystem::kBUILD;
      if (json_events) o.mode = obs::ProgressMode::kEvents;
      state->progress = std::make_unique<obs::Progress>(std::move(o));
    }
    state->progress->SetTotal(p.total);
    state->progress->Set(p.done);
    if (!p.detail.empty()) state->progress->SetBest(p.detail);
    return true;
  };
}

void RecordBuildMetrics(const BuildReport& r) {
  obs::KilnMetrics& m = obs::Metrics();
  m.ObserveEngineBuild(r.build_seconds);
  m.AddTacticsTimed(static_cast<uint64_t>(r.tactics_timed));
  m.ObservePhase("import", r.phase_seconds_import);
  m.ObservePhase("passes", r.phase_seconds_passes);
  m.ObservePhase("tactics", r.phase_seconds_tactics);
  m.ObservePhase("plan", r.phase_seconds_plan);
}

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// `kiln build --distributed`: app::BuildOnceShared (the library's build-once path, shared with the
// C API); every rank writes the same verified bytes to `output`.
int RunDistributed(const BuildOptions& o, BuilderConfig config, const std::string& output) {
  distributed::BuildOnceOptions opts;
  auto transport = distributed::ParseTransport(o.transport);
  if (!transport.ok()) return ReportError(transport.status());
  auto build_on = distributed::ParseBuildOn(o.build_on);
  if (!build_on.ok()) return ReportError(build_on.status());
  opts.transport = *transport;
  opts.build_on = *build_on;
  if (o.rank >= 0) opts.rank_overrides.rank = o.rank;
  if (o.world_size > 0) opts.rank_overrides.world_size = o.world_size;
  if (!o.cache_dir.empty()) {
    distributed::CacheOptions cache;
    cache.dir = o.cache_dir;
    cache.wait_timeout = Ms(o.wait_timeout_s);
    cache.trust_shared = o.trust_shared_cache;
    opts.cache = cache;
  }
  opts.bulk_factory = distributed::NcclFactoryIfBuilt();  // used only with --transport nccl
  opts.join_timeout = Ms(o.join_timeout_s);
  opts.wait_timeout = Ms(o.wait_timeout_s);
  opts.transfer_timeout = Ms(o.transfer_timeout_s);

  // Joins the launcher's MPI job when there is one (held for the rest of the process).
  std::unique_ptr<distributed::MpiSession> mpi;
  if (distributed::MpiAvailable()) {
    auto session = distributed::MpiSession::Start();
    if (!session.ok()) return ReportError(session.status());
    mpi = std::move(*session);
  }
  app::ModelSource model;
  model.path = o.model;
  model.weight_free_key = o.weight_free_cache;
  auto shared = app::BuildOnceShared(model, config, opts);
  if (!shared.ok()) return ReportError(shared.status());
  if (shared->build_report) RecordBuildMetrics(*shared->build_report);
  const std::optional<BuildReport>& build_report = shared->build_report;
  // Atomic: a temporary file beside the output, then rename (ranks may share the path).
  const std::string_view engine_text(reinterpret_cast<const char*>(shared->bytes.data()),
                                     shared->bytes.size());
  if (Status s = WriteFileAtomic(output, "engine", engine_text); !s.ok()) return ReportError(s);
  // NCCL communicator set-up is the report's "NCCL init latency" figure.
  if (shared->dist_report.transport == "nccl")
    obs::Metrics().ObserveNcclInit(shared->dist_report.bulk_setup_s);
  std::string report = shared->dist_report.ToJson();
  if (!o.dist_report.empty()) {
    if (Status s = WriteFileAtomic(o.dist_report, "distributed report", report + "\n"); !s.ok())
      return ReportError(s);
  }
  if (build_report && !o.json) std::cout << build_report->ToText(o.layers);
  std::cout << report << "\n";
  if (shared->refit) std::cout << "the shared engine was refit with this model's weights\n";
  std::cout << fmt::format("engine written to {} ({} bytes, rank {} of {})\n", output,
                           shared->bytes.size(), shared->dist_report.rank,
                           shared->dist_report.world_size);
  return 0;
}

int Run(const BuildOptions& o, const GlobalOptions& global) {
  BuilderConfig config;
  auto backend = ParseBackend(o.backend);
  if (!backend.ok()) return ReportError(backend.status());
  config.backend = *backend;
  config.fp16 = o.fp16;
  config.bf16 = o.bf16;
  config.int8 = o.int8;
  config.fp8 = o.fp8;
  config.calibration_dir = o.calib_dir;
  config.calibration_cache_path = o.calib_cache;
  config.calibrate_on_backend = !o.calib_on_cpu;
  config.fp8_edges = !o.no_fp8_edges;
  config.int8_edges = !o.no_int8_edges;
  if (o.quantized_if_faster != "auto") config.quantized_if_faster = o.quantized_if_faster == "on";
  if (Status s = ParseCalibrationMethodSpec(o.calib_method, o.calib_percentile, &config); !s.ok())
    return ReportError(s);
  auto tolerance = precision::ParseInt8Tolerance(o.int8_tolerance);
  if (!tolerance.ok()) return ReportError(tolerance.status());
  config.int8_tolerance = *tolerance;
  auto fp8_tolerance = precision::ParseFp8Tolerance(o.fp8_tolerance);
  if (!fp8_tolerance.ok()) return ReportError(fp8_tolerance.status());
  config.fp8_tolerance = *fp8_tolerance;
  config.optimize = !o.no_optimize;
  config.disabled_passes = o.disabled_passes;
  for (const std::string& p : o.profiles) {
    if (Status s = ParseProfileSpec(p, &config.profile); !s.ok()) return ReportError(s);
  }
  for (const std::string& v : o.shape_values) {
    if (Status s = ParseShapeValuesSpec(v, &config.profile); !s.ok()) return ReportError(s);
  }
  config.shape_arena_bytes = o.shape_arena;
  ImportOptions import;
  for (const std::string& v : o.sequence_inputs) {
    if (Status s = app::ParseSequenceInputSpec(v, &import); !s.ok()) return ReportError(s);
  }
  import.absent_inputs.insert(o.absent_inputs.begin(), o.absent_inputs.end());
  import.max_loop_trips = o.max_loop_trips;
  if (o.distributed && (!import.sequence_inputs.empty() || !import.absent_inputs.empty() ||
                        import.max_loop_trips != ImportOptions().max_loop_trips)) {
    return ReportError(MakeError(ErrorCode::kInvalidArgument,
                                 "--sequence-input, --absent-input and --max-loop-trips are for "
                                 "single-process builds; a distributed build imports with the "
                                 "defaults yet"));
  }
  if (!o.deadline.empty()) {
    auto d = ParseDuration(o.deadline);
    if (!d.ok()) return ReportError(d.status());
    config.deadline = *d;
  }
  if (!o.memory_budget.empty()) {
    auto b = MemoryBudget::Parse(o.memory_budget);
    if (!b.ok()) return ReportError(b.status());
    config.memory_budget = *b;
  }
  if (o.max_kernel_time_ms > 0) config.max_kernel_time_ms = o.max_kernel_time_ms;
  config.opt_level = o.opt_level;
  config.timing_cache_path = o.timing_cache;
  config.progress = MakeProgress(global.quiet || o.json, global.log_format == "json");

  std::string output = o.output;
  if (output.empty()) {
    output = o.model.substr(0, o.model.rfind('.')) + ".kiln";
  }
  // Every file the build reads and writes, checked before any work: no output may be an input,
  // another output, a link or a special file.
  FileRoles files;
  files.Input(o.model, "model");
  files.InOut(o.timing_cache, "timing cache");
  files.InOut(o.calib_cache, "calibration cache");
  files.Output(output, "engine");
  files.Output(o.report_path, "build report");
  files.Output(o.precision_report, "precision report");
  files.Output(o.dist_report, "distributed report");
  files.Output(o.metrics.file, "metrics file");
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
  if (o.distributed && !o.cache_dir.empty()) {
    // The engine cache writes, locks and removes files in its directory by name; none of this
    // command's files may be one of them.
    const std::pair<const std::string*, const char*> own[] = {
        {&o.model, "model"},
        {&o.timing_cache, "timing cache"},
        {&o.calib_cache, "calibration cache"},
        {&output, "engine"},
        {&o.report_path, "build report"},
        {&o.precision_report, "precision report"},
        {&o.dist_report, "distributed report"},
        {&o.metrics.file, "metrics file"}};
    for (const auto& [path, what] : own) {
      if (Status s = distributed::CheckNotACacheFile(o.cache_dir, *path, what); !s.ok())
        return ReportError(s);
    }
  }
  obs::MetricsExportOptions mo;
  if (o.metrics.port >= 0) mo.port = o.metrics.port;
  mo.file = o.metrics.file;
  auto metrics = obs::MetricsExport::Start(mo);
  if (!metrics.ok()) return ReportError(metrics.status());
  if ((*metrics)->server()) fmt::print(stderr, "metrics at {}\n", (*metrics)->server()->Url());
  if (o.distributed && o.strip_weights) {
    return ReportError(MakeError(
        ErrorCode::kInvalidArgument,
        "--strip-weights is for single-process builds (`kiln build MODEL --strip-weights -o "
        "E.kiln`); a distributed build shares the full engine"));
  }
  if (o.distributed) {
    int rc = RunDistributed(o, config, output);
    if (Status s = (*metrics)->Finish(); !s.ok()) return ReportError(s);
    return rc;
  }
  auto built = app::BuildFromOnnxFile(o.model, config, &import);
  if (!built.ok()) return ReportError(built.status());
  RecordBuildMetrics(built->report);
  if (Status s = (*metrics)->Finish(); !s.ok()) return ReportError(s);
  std::string stripped_line;
  if (o.strip_weights) {
    int64_t bytes = 0;
    for (const WeightProgram::Target& t : built->desc->weight_program.targets) {
      if (const Value* v = built->desc->graph->FindValue(t.constant); v && v->constant()) {
        bytes += static_cast<int64_t>(v->constant()->size_bytes());
      }
    }
    if (Status s = StripWeights(*built->desc); !s.ok()) return ReportError(s);
    stripped_line = fmt::format(
        "weights stripped: {} constant(s), {:.2f} MiB left out (fill with `kiln refit {} "
        "--weights {}`)\n",
        built->desc->weight_program.targets.size(), static_cast<double>(bytes) / (1 << 20), output,
        o.model);
  }
  if (Status s = WriteEngineFile(*built->desc, output); !s.ok()) return ReportError(s);
  if (!o.report_path.empty()) {
    if (Status s = WriteFileAtomic(o.report_path, "build report", built->report.ToJson() + "\n");
        !s.ok())
      return ReportError(s);
  }
  if (o.json) {
    std::cout << built->report.ToJson() << "\n";
  } else {
    std::cout << built->report.ToText(o.layers);
    std::cout << stripped_line << fmt::format("engine written to {}\n", output);
  }
  if (o.precision_report_opt && o.precision_report_opt->count() > 0) {
    if (o.precision_report.empty()) {
      std::cout << built->report.PrecisionTable();
    } else {
      if (Status s = WriteFileAtomic(o.precision_report, "precision report",
                                     built->report.PrecisionJson() + "\n");
          !s.ok())
        return ReportError(s);
    }
  }
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& global) {
  auto o = std::make_shared<BuildOptions>();
  CLI::App* sub = app.add_subcommand(
      "build", "Build an engine from an ONNX model (like trtexec --onnx=... --saveEngine=...)");
  sub->add_option("model", o->model, "ONNX model file")->required()->check(CLI::ExistingFile);
  sub->add_option("-o,--output", o->output, "engine file to write (default: MODEL with .kiln)");
  sub->add_option("--backend", o->backend, "auto (best present), cpu or cuda")
      ->capture_default_str();
  auto* prec = sub->add_option_group(
      "Precision",
      "what layers may use besides FP32 (like trtexec --fp16/--bf16/--int8/--fp8); a layer runs "
      "reduced when its op, its weights' and activations' range and the backend's kernels allow "
      "it, and the report says why");
  prec->add_flag("--fp16", o->fp16,
                 "allow FP16 layers (FP32 accumulation); layers whose values exceed the FP16 "
                 "range stay FP32");
  prec->add_flag("--bf16", o->bf16,
                 "allow BF16 layers (FP32 accumulation; FP32's range, 8-bit mantissa); with "
                 "--fp16, layers refused FP16 try BF16");
  prec->add_flag("--int8", o->int8,
                 "allow INT8 for Conv/Gemm/MatMul with constant weights (post-training "
                 "calibration; implies --fp16 as the fallback)");
  prec->add_flag("--fp8", o->fp8,
                 "allow FP8 E4M3 (per-tensor scales) for Gemm/MatMul with constant weights where "
                 "the backend has a kernel (cuBLASLt on sm_89+; with --int8, for the layers not "
                 "INT8; calibration as --int8; implies --fp16 as the fallback)");
  prec->add_flag("--no-fp8-edges", o->no_fp8_edges,
                 "with --fp8: keep FP16 between two FP8 products (by default a product whose only "
                 "consumer is another FP8 product writes E4M3 for it: half the bytes and no "
                 "quantization pass; docs/precision.md)");
  prec->add_flag("--no-int8-edges", o->no_int8_edges,
                 "with --int8: keep floats between two INT8 products (by default, where both "
                 "kernels can, a product whose only consumer is another INT8 product writes int8 "
                 "for it; docs/precision.md)");
  prec->add_option("--quantized-if-faster", o->quantized_if_faster,
                   "with --int8/--fp8 and a tactic search: on, a quantized layer's tactics race "
                   "its float ones and the layer runs float where a float tactic is faster (the "
                   "report says so); off, quantized layers stay quantized; auto: on for cuda, off "
                   "for cpu (whose INT8 kernels are the reference)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  prec->add_option("--calib-dir", o->calib_dir,
                   "calibration inputs: DIR/test_data_set_N/input_I.pb (ONNX test-data layout, "
                   "one TensorProto per model input), run in FP32 on the build's backend (the "
                   "GPU for --backend cuda) or the CPU reference");
  prec->add_option("--calib-method", o->calib_method,
                   "INT8 calibrator: minmax (IInt8MinMaxCalibrator; the default, best on the "
                   "zoo), entropy (KL divergence, like IInt8EntropyCalibrator2, TensorRT's "
                   "default) or percentile[=P]")
      ->capture_default_str();
  prec->add_option("--int8-tolerance", o->int8_tolerance,
                   "INT8 layers fall back to FP16, most sensitive first, until the estimated "
                   "relative L2 error against FP32 on the calibration data is within this; 'off' "
                   "keeps every INT8 layer (docs/precision.md)")
      ->capture_default_str();
  prec->add_option("--fp8-tolerance", o->fp8_tolerance,
                   "FP8 layers fall back to FP16/BF16 the same way, on their own FP8 sensitivity; "
                   "'off' keeps every FP8 layer (docs/precision.md)")
      ->capture_default_str();
  prec->add_option("--calib-percentile", o->calib_percentile,
                   "share of |x| kept unclipped by the percentile calibrator, in (0, 100]")
      ->capture_default_str()
      ->check(Number(0, 100, /*min_open=*/true));
  prec->add_flag("--calib-on-cpu", o->calib_on_cpu,
                 "run calibration and the INT8 sensitivity on the CPU reference even when the "
                 "backend is a GPU (the default runs them on the build's device)");
  prec->add_option("--calib-cache", o->calib_cache,
                   "calibration cache file (like TensorRT's): reused when it matches the model "
                   "and method, else written after calibrating");
  o->precision_report_opt =
      prec->add_option("--precision-report", o->precision_report,
                       "print every layer's precision and reason, or write them as JSON to FILE")
          ->expected(0, 1);
  auto* shapes = sub->add_option_group("Shapes", "optimization profile for dynamic inputs");
  shapes
      ->add_option(
          "--profile", o->profiles,
          "NAME:MIN,OPT,MAX per dynamic input, e.g. input:1x3x224x224,8x3x224x224,32x3x224x224")
      ->take_all();
  shapes
      ->add_option("--shape-values", o->shape_values,
                   "NAME:V1,V2,... per shape input (a small input feeding a shape operand: "
                   "Reshape's shape, Resize's scales...): the values to build for; other values "
                   "re-specialize the context at run time")
      ->take_all();
  shapes
      ->add_option("--sequence-input", o->sequence_inputs,
                   "NAME=LENGTH[:RANK] per sequence-typed input: kiln builds for that many "
                   "tensors, engine inputs NAME.0 ... NAME.<LENGTH-1> (RANK: the elements' rank "
                   "when the model does not declare it)")
      ->take_all();
  shapes
      ->add_option("--absent-input", o->absent_inputs,
                   "NAME of an optional-typed input to build as absent (None); optional inputs "
                   "not named are present")
      ->take_all();
  shapes
      ->add_option("--max-loop-trips", o->max_loop_trips,
                   "iterations a Loop whose trip count or condition is computed at run time is "
                   "unrolled to; a run that needs more fails with KILN-E5016 (0: refuse such "
                   "Loops at import)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  shapes
      ->add_option("--shape-arena", o->shape_arena,
                   "bytes of activations a context may re-plan in for other shape input values "
                   "(default: the plan's for the built values)")
      ->check(CLI::NonNegativeNumber);
  auto* bounds = sub->add_option_group("Bounds", "time and memory the build may use");
  bounds
      ->add_option(
          "--deadline", o->deadline,
          "bound the build (30s, 5m, 1500ms); at the deadline the best engine so far is written")
      ->check(DurationText());
  bounds->add_option(
      "--memory-budget", o->memory_budget,
      "peak device memory for the engine: bytes (512M, 8G) or a fraction of free memory (0.5)");
  bounds
      ->add_option("--max-kernel-time", o->max_kernel_time_ms,
                   "reject tactics whose single launch exceeds this many milliseconds")
      ->check(Number(0, kMaxSeconds * 1000, /*min_open=*/true));
  sub->add_option("--opt-level", o->opt_level,
                  "how widely tactics are searched, 0..5 (like TensorRT's builder optimization "
                  "level): 0 heuristic tactic only, 1-4 the first 1/2/4/8 tactics of each kernel "
                  "provider with an early stop for clearly slower ones, 5 every tactic timed fully")
      ->check(CLI::Range(kMinOptLevel, kMaxOptLevel));
  sub->add_option("--timing-cache", o->timing_cache, "timing cache file to read and update");
  sub->add_option("--report", o->report_path, "write the build report as JSON to this file");
  sub->add_flag("--no-optimize", o->no_optimize, "skip graph optimizations (debugging)");
  sub->add_option("--disable-pass", o->disabled_passes,
                  "skip one graph pass by name, e.g. transpose_sinking (repeatable; the build "
                  "report's pass lines name them): a way around a rewrite that misbehaves on a "
                  "model");
  sub->add_flag("--layers", o->layers, "print the per-layer table (precision, tactic, time)");
  sub->add_flag("--json", o->json, "print the build report as JSON instead of text");
  sub->add_flag("--strip-weights", o->strip_weights,
                "write the engine without the weights its weight program remakes from the model "
                "(layers, tactics, plan and program only; literals stay): for caches and for "
                "ranks that hold the model. It runs after `kiln refit E.kiln --weights "
                "MODEL.onnx` or with `kiln run E.kiln --weights MODEL.onnx`");
  o->metrics.Add(sub);
  auto* dist =
      sub->add_option_group("Distributed", "every rank of a job runs the same command; one builds");
  dist->add_flag("--distributed", o->distributed,
                 "build once per job (or node/arch) and share the bytes; ranks from "
                 "torchrun/OpenMPI/Slurm env");
  dist->add_option("--transport", o->transport, "auto, local, mpi, nccl or cache")
      ->capture_default_str();
  dist->add_option("--build-on", o->build_on, "rank0, per-node or per-arch")->capture_default_str();
  dist->add_option("--cache-dir", o->cache_dir,
                   "shared engine cache directory (content-addressed)");
  dist->add_flag("--weight-free-cache", o->weight_free_cache,
                 "key the shared engine by the model's architecture and the build config, not its "
                 "weights: an engine built for other weights of the model is refit with these "
                 "(kiln refit) instead of rebuilt");
  dist->add_flag("--trust-shared-cache", o->trust_shared_cache,
                 "use a cache directory or entries that other users can write (refused by "
                 "default: they could plant an engine that this job runs)");
  dist->add_option("--join-timeout", o->join_timeout_s, "seconds for every rank to arrive")
      ->capture_default_str()
      ->check(Seconds());
  dist->add_option("--wait-timeout", o->wait_timeout_s, "seconds to wait for the builder")
      ->capture_default_str()
      ->check(Seconds());
  dist->add_option("--transfer-timeout", o->transfer_timeout_s, "seconds for the bytes to arrive")
      ->capture_default_str()
      ->check(Seconds());
  dist->add_option("--rank", o->rank, "this process's rank (overrides the launcher's environment)")
      ->check(Count(0, kMaxRanks - 1));
  dist->add_option("--world-size", o->world_size,
                   "the job's world size (overrides the environment)")
      ->check(Count(1, kMaxRanks));
  dist->add_option("--dist-report", o->dist_report,
                   "write who built, who waited and for how long (JSON)");
  return [o, &global]() { return Run(*o, global); };
}

}  // namespace
KILN_REGISTER_COMMAND(build, 10, Setup);
}  // namespace kiln::cli
