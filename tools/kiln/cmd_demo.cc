// `kiln demo`: the main job on the embedded default model (a ResNet-style CNN from the zoo):
// build its engine for the best backend present, run it, check it against the FP32 reference
// outputs exported from PyTorch, print the build report and the run summary.
#include <filesystem>
#include <iostream>

#include "kiln/app/benchmark.h"
#include "kiln/backends/backend.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

extern const unsigned char kiln_default_model[];
extern const std::size_t kiln_default_model_size;
extern const unsigned char kiln_default_input[];
extern const std::size_t kiln_default_input_size;
extern const unsigned char kiln_default_output[];
extern const std::size_t kiln_default_output_size;

namespace kiln::cli {
namespace {

struct DemoOptions {
  std::string backend = "auto";
  std::string output;
  bool fp16 = false;
};

std::span<const std::byte> Bytes(const unsigned char* p, size_t n) {
  return {reinterpret_cast<const std::byte*>(p), n};
}

int Run(const DemoOptions& o) {
  BuilderConfig config;
  auto backend = ParseBackend(o.backend);
  if (!backend.ok()) return ReportError(backend.status());
  config.backend = *backend;
  config.fp16 = o.fp16;
  if (Status s = ParseProfileSpec("input:1x3x64x64,4x3x64x64,16x3x64x64", &config.profile);
      !s.ok()) {
    return ReportError(s);
  }
  std::cout << fmt::format(
      "kiln demo: embedded model resnet_tiny (ResNet-18 layout, 64x64 input), backend {}\n\n",
      ToString(config.backend));
  auto built = app::BuildFromOnnxBytes(Bytes(kiln_default_model, kiln_default_model_size),
                                       "resnet_tiny", config);
  if (!built.ok()) return ReportError(built.status());
  std::cout << built->report.ToText(/*per_layer=*/true) << "\n";

  std::string path = o.output.empty()
                         ? (std::filesystem::temp_directory_path() / "kiln-demo.kiln").string()
                         : o.output;
  if (Status s = WriteEngineFile(*built->desc, path); !s.ok()) return ReportError(s);
  auto runtime = Runtime::Create(config.backend);
  if (!runtime.ok()) return ReportError(runtime.status());
  auto engine = (*runtime)->LoadEngine(path);
  if (!engine.ok()) return ReportError(engine.status());

  auto input = LoadTensorProtoBytes(Bytes(kiln_default_input, kiln_default_input_size));
  auto expected = LoadTensorProtoBytes(Bytes(kiln_default_output, kiln_default_output_size));
  if (!input.ok()) return ReportError(input.status());
  if (!expected.ok()) return ReportError(expected.status());
  auto runner = app::HostRunner::Create(*engine);
  if (!runner.ok()) return ReportError(runner.status());
  if (Status s = (*runner)->SetInputs({{"input", *input}}); !s.ok()) return ReportError(s);
  if (Status s = (*runner)->Run(); !s.ok()) return ReportError(s);
  const double tolerance = o.fp16 ? 1e-2 : 1e-4;
  app::Comparison c = app::CompareTensors((*runner)->outputs().at("output"), *expected, 0, 0);
  bool ok = c.shape_ok && c.nan_mismatch == 0 && c.rel_l2 <= tolerance;
  std::cout << fmt::format(
      "check against the PyTorch FP32 reference (batch {}): relative L2 error {:.2e} (limit "
      "{:.0e}): {}\n",
      input->dims()[0], c.rel_l2, tolerance, ok ? "PASS" : "FAIL");

  auto stats = app::Benchmark(**runner, {});
  if (!stats.ok()) return ReportError(stats.status());
  std::cout << fmt::format("run summary: engine {} ({} layers), batch {}\n", path,
                           (*engine)->desc().layers.size(), input->dims()[0]);
  std::cout << fmt::format(
      "  latency   min {:.3f} ms  median {:.3f} ms  p90 {:.3f} ms  p99 {:.3f} ms  max {:.3f} ms\n",
      stats->min_ms, stats->median_ms, stats->p90_ms, stats->p99_ms, stats->max_ms);
  std::cout << fmt::format("  throughput {:.1f} inferences/s ({:.1f} images/s)\n",
                           stats->throughput_per_s,
                           stats->throughput_per_s * static_cast<double>(input->dims()[0]));
  std::cout << fmt::format("  memory    planned peak {:.2f} MiB, allocated {:.2f} MiB\n",
                           (*engine)->planned_peak_bytes() / double(1 << 20),
                           (*runner)->context().actual_peak_bytes() / double(1 << 20));
  return ok ? 0 : 1;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* sub = app.add_subcommand(
      "demo", "The main job on the embedded default model: build, run, check, report");
  sub->add_option("--backend", o->backend, "auto (best present), cpu or cuda")
      ->capture_default_str();
  sub->add_option("-o,--output", o->output,
                  "where to write the engine (default: a temporary file)");
  return [o]() { return Run(*o); };
}

}  // namespace
KILN_REGISTER_COMMAND(demo, 1, Setup);
}  // namespace kiln::cli
