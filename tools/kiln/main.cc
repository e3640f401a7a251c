// kiln: the command-line shell over the kiln library. Each subcommand is one file in this folder.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#if KILN_HAVE_MIMALLOC
#include <mimalloc.h>
#endif

#include "kiln/core/file_io.h"
#include "kiln/core/logging.h"
#include "kiln/core/status.h"
#include "kiln/obs/error_counter.h"
#include "kiln/obs/metrics.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {

std::vector<CommandRegistration>& CommandRegistry() {
  static std::vector<CommandRegistration> registry;
  return registry;
}

int ReportError(const Status& status) {
  std::fputs(status.Explain().c_str(), stderr);
  obs::Metrics().CountError(status.Id());
  return 1;
}

void MetricsFlags::Add(CLI::App* sub) {
  auto* g = sub->add_option_group("Metrics", "Prometheus metrics of this command");
  g->add_option("--metrics-port", port,
                "serve /metrics on this port while the command runs (0: any free port)")
      ->check(Port());
  g->add_option("--metrics-file", file,
                "write the metrics to this file at the end (node-exporter textfile)");
}

// Which allocator serves malloc in this process: mimalloc when it was linked and actually
// overrides malloc (a block from calloc lies in its heap), else the C library's.
std::string AllocatorName() {
#if KILN_HAVE_MIMALLOC
  void* probe = std::calloc(1, 64);  // calloc: GCC warns on passing unwritten memory
  const bool ours = probe && mi_is_in_heap_region(probe);
  std::free(probe);
  if (ours) {
    const int v = mi_version();  // 209 = 2.0.9
    return "mimalloc " + std::to_string(v / 100) + "." + std::to_string(v / 10 % 10) + "." +
           std::to_string(v % 10);
  }
  return "libc malloc (mimalloc is linked but does not override malloc)";
#else
  return "libc malloc";
#endif
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  using namespace kiln::cli;
  // One command per process: no output of it may replace a file it read (core/file_io.h).
  kiln::GuardInputsOfThisProcess(true);
  CLI::App app{
      "kiln: builds mixed-precision inference engines from ONNX models, bounded in time and\n"
      "memory, and runs them inside distributed GPU jobs.\n"};
  app.set_version_flag(
      "--version", std::string("kiln ") + KILN_VERSION + " (allocator: " + AllocatorName() + ")");
  app.require_subcommand(0, 1);
  app.fallthrough();
  GlobalOptions global;
  app.add_option("--log-level", global.log_level, "TRACE, DEBUG, INFO, WARN, ERROR or OFF")
      ->envname("KILN_LOG_LEVEL");
  app.add_option("--log-format", global.log_format,
                 "text (default) or json: one JSON object per event")
      ->check(CLI::IsMember({"text", "json"}));

  auto& registry = CommandRegistry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> runs;
  for (auto& reg : registry) {
    size_t before = app.get_subcommands({}).size();
    auto run = reg.setup(app, global);
    auto subs = app.get_subcommands({});
    if (subs.size() > before) runs.emplace_back(subs.back(), std::move(run));
  }

  RequireFiniteNumbers(app);
  app.footer(fmt::format("Exit code {}: the command line was refused (KILN-E1015, KILN-E1016).",
                         kUsageExitCode));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    ReportError(ParseErrorStatus(e));
    return kUsageExitCode;
  }
  if (!global.log_level.empty()) {
    kiln::LogLevel level;
    if (kiln::ParseLogLevel(global.log_level, &level)) kiln::SetLogLevel(level);
  }
  if (global.log_format == "json") kiln::SetLogFormat(kiln::LogFormat::kJson);
  // Every warning or error with a catalog code counts into kiln_errors_total{code}.
  kiln::obs::ScopedErrorCounting count_errors(&kiln::obs::Metrics(), global.log_format == "json"
                                                                         ? kiln::LogFormat::kJson
                                                                         : kiln::LogFormat::kText);

  for (auto& [sub, run] : runs) {
    if (sub->parsed()) return run();
  }
  std::cout << app.help();
  return 0;
}
