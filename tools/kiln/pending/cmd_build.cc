// `kiln build`: ONNX model -> .kiln engine, bounded in time and memory, with a build report.
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "kiln/app/pipeline.h"
#include "kiln/backends/backend.h"
#include "kiln/engine/engine_file.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct BuildOptions {
  std::string model;
  std::string output;
  std::string backend = "auto";
  bool fp16 = false, bf16 = false, int8 = false;
  std::vector<std::string> profiles;
  std::string deadline;
  std::string memory_budget;
  double max_kernel_time_ms = 0;
  std::string timing_cache;
  std::string report_path;
  bool no_optimize = false;
  bool layers = false;
  bool json = false;
};

StatusOr<BackendKind> ParseBackend(const std::string& s) {
  if (s == "auto") return BestAvailableBackend();
  if (s == "cpu") return BackendKind::kCpu;
  if (s == "cuda") return BackendKind::kCuda;
  return MakeError(ErrorCode::kInvalidArgument, "--backend '{}': use auto, cpu or cuda", s);
}

// A progress line on a terminal, plain lines otherwise.
ProgressCallback MakeProgress(bool quiet) {
  if (quiet) return nullptr;
  bool tty = isatty(STDERR_FILENO);
  auto last = std::make_shared<std::string>();
  return [tty, last](const BuildProgress& p) {
    std::string line = fmt::format("[kiln build] {:>8} {:>4}/{:<4} {:6.2f}s {}", p.phase, p.done, p.total,
                                   p.elapsed_s, p.detail.substr(0, 48));
    if (tty) {
      fmt::print(stderr, "\r{:<100}", line);
      if (p.phase == "done") fmt::print(stderr, "\r{:<100}\r", "");
    } else if (p.phase != *last) {
      fmt::print(stderr, "{}\n", line);
      *last = p.phase;
    }
    return true;
  };
}

int Run(const BuildOptions& o, const GlobalOptions& global) {
  BuilderConfig config;
  auto backend = ParseBackend(o.backend);
  if (!backend.ok()) return ReportError(backend.status());
  config.backend = *backend;
  config.fp16 = o.fp16;
  config.bf16 = o.bf16;
  config.int8 = o.int8;
  config.optimize = !o.no_optimize;
  for (const std::string& p : o.profiles) {
    if (Status s = ParseProfileSpec(p, &config.profile); !s.ok()) return ReportError(s);
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
  config.timing_cache_path = o.timing_cache;
  config.progress = MakeProgress(global.quiet || o.json);

  auto built = app::BuildFromOnnxFile(o.model, config);
  if (!built.ok()) return ReportError(built.status());
  std::string output = o.output;
  if (output.empty()) {
    output = o.model.substr(0, o.model.rfind('.')) + ".kiln";
  }
  if (Status s = WriteEngineFile(*built->desc, output); !s.ok()) return ReportError(s);
  if (!o.report_path.empty()) {
    std::ofstream f(o.report_path);
    f << built->report.ToJson() << "\n";
    if (!f) return ReportError(MakeError(ErrorCode::kIoError, "cannot write the report to '{}'", o.report_path));
  }
  if (o.json) {
    std::cout << built->report.ToJson() << "\n";
  } else {
    std::cout << built->report.ToText(o.layers);
    std::cout << fmt::format("engine written to {}\n", output);
  }
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& global) {
  auto o = std::make_shared<BuildOptions>();
  CLI::App* sub = app.add_subcommand(
      "build", "Build an engine from an ONNX model (like trtexec --onnx=... --saveEngine=...)");
  sub->add_option("model", o->model, "ONNX model file")->required()->check(CLI::ExistingFile);
  sub->add_option("-o,--output", o->output, "engine file to write (default: MODEL with .kiln)");
  sub->add_option("--backend", o->backend, "auto (best present), cpu or cuda")->capture_default_str();
  auto* prec = sub->add_option_group("Precision", "what layers may use (FP32 is always allowed)");
  prec->add_flag("--fp16", o->fp16, "allow FP16 layers (FP32 accumulation)");
  prec->add_flag("--bf16", o->bf16, "allow BF16 layers (FP32 accumulation)");
  prec->add_flag("--int8", o->int8, "allow INT8 layers with FP16 fallback (needs calibration)");
  auto* shapes = sub->add_option_group("Shapes", "optimization profile for dynamic inputs");
  shapes->add_option("--profile", o->profiles,
                     "NAME:MIN,OPT,MAX per dynamic input, e.g. input:1x3x224x224,8x3x224x224,32x3x224x224")
      ->take_all();
  auto* bounds = sub->add_option_group("Bounds", "time and memory the build may use");
  bounds->add_option("--deadline", o->deadline,
                     "bound the build (30s, 5m, 1500ms); at the deadline the best engine so far is written");
  bounds->add_option("--memory-budget", o->memory_budget,
                     "peak device memory for the engine: bytes (512M, 8G) or a fraction of free memory (0.5)");
  bounds->add_option("--max-kernel-time", o->max_kernel_time_ms,
                     "reject tactics whose single launch exceeds this many milliseconds");
  sub->add_option("--timing-cache", o->timing_cache, "timing cache file to read and update");
  sub->add_option("--report", o->report_path, "write the build report as JSON to this file");
  sub->add_flag("--no-optimize", o->no_optimize, "skip graph optimizations (debugging)");
  sub->add_flag("--layers", o->layers, "print the per-layer table (precision, tactic, time)");
  sub->add_flag("--json", o->json, "print the build report as JSON instead of text");
  return [o, &global]() { return Run(*o, global); };
}

}  // namespace
KILN_REGISTER_COMMAND(build, 10, Setup);
}  // namespace kiln::cli
