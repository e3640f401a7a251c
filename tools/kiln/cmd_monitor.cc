// `kiln monitor`: a node-level GPU health exporter. Samples NVML, runs the health detectors and
// serves /metrics (and/or writes a textfile) until --duration passes or SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "kiln/core/file_io.h"
#include "kiln/core/logging.h"
#include "kiln/obs/duration.h"
#include "kiln/obs/error_counter.h"
#include "kiln/obs/metrics.h"
#include "kiln/obs/metrics_server.h"
#include "kiln/obs/nvml.h"
#include "kiln/obs/sampler.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void OnStopSignal(int sig) { g_stop_signal = sig; }

struct Options {
  int port = 9478;
  std::string bind = "0.0.0.0";
  bool no_server = false;
  std::string metrics_file;
  std::string duration = "0";
  std::string interval = "1s";
  std::string collapse_window = "60s";
  std::string throttle_window = "0s";
  double busy_ratio = 0.5;
  double idle_ratio = 0.05;
  double memory_pressure = 0.95;
  std::string nvml_library = "libnvidia-ml.so.1";
};

int Run(const Options& o, const GlobalOptions& global) {
  using namespace kiln::obs;
  // The NVML library named by a path is read (loaded); the metrics file must not replace it.
  FileRoles files;
  if (o.nvml_library.find('/') != std::string::npos) files.Input(o.nvml_library, "NVML library");
  files.Output(o.metrics_file, "metrics file");
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
  SamplerOptions so;
  auto interval = ParseDuration(o.interval);
  if (!interval.ok()) return ReportError(Status(interval.status()).AddContext("in --interval"));
  auto duration = ParseDuration(o.duration);
  if (!duration.ok()) return ReportError(Status(duration.status()).AddContext("in --duration"));
  auto collapse = ParseDuration(o.collapse_window);
  if (!collapse.ok())
    return ReportError(Status(collapse.status()).AddContext("in --collapse-window"));
  auto throttle = ParseDuration(o.throttle_window);
  if (!throttle.ok())
    return ReportError(Status(throttle.status()).AddContext("in --throttle-window"));
  if (interval->count() <= 0) {
    return ReportError(MakeError(ErrorCode::kInvalidArgument, "--interval must be positive"));
  }
  so.interval = *interval;
  so.detectors.collapse_window = *collapse;
  so.detectors.throttle_window = *throttle;
  so.detectors.busy_ratio = o.busy_ratio;
  so.detectors.idle_ratio = o.idle_ratio;
  so.detectors.memory_pressure_ratio = o.memory_pressure;
  if (Status s = Validate(so.detectors); !s.ok()) return ReportError(s);

  // NVML absent (a CPU machine) is reported and the exporter still serves kiln's own metrics.
  std::unique_ptr<Nvml> nvml;
  if (auto loaded = Nvml::Load(o.nvml_library); loaded.ok()) {
    nvml = std::move(loaded).value();
    KILN_LOG(Info, OBS, "NVML loaded: {} GPU(s), driver {}", nvml->DeviceCount(),
             nvml->DriverVersion().empty() ? "?" : nvml->DriverVersion());
  } else {
    LogEvent e{std::chrono::system_clock::now(),
               LogLevel::kInfo,
               Subsystem::kOBS,
               fmt::format("GPU metrics not available: {}; serving kiln's own metrics "
                           "(kiln_nvml_up 0)",
                           loaded.status().message()),
               {{"event", "nvml_unavailable"}}};
    if (LogEnabled(e.level, e.subsystem)) Log(std::move(e));
  }
  Sampler sampler(nvml.get(), &Metrics(), so);

  std::unique_ptr<MetricsServer> server;
  if (!o.no_server) {
    auto started = MetricsServer::Start({o.bind, o.port});
    if (!started.ok()) return ReportError(started.status());
    server = std::move(started).value();
    std::printf("kiln monitor: serving %s\n", server->Url().c_str());
    std::fflush(stdout);
  } else if (o.metrics_file.empty()) {
    return ReportError(
        MakeError(ErrorCode::kInvalidArgument,
                  "--no-server needs --metrics-file (otherwise nothing is exported)"));
  }

  if (Status s = sampler.Start(); !s.ok()) return ReportError(s);
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);

  auto start = std::chrono::steady_clock::now();
  auto next_file = start;
  int exit_code = 0;
  // Bounded sleeps so a signal or the end of --duration is noticed within 100 ms.
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    if (!o.metrics_file.empty() && now >= next_file) {
      if (Status s = Metrics().WriteTextfile(o.metrics_file); !s.ok()) {
        ReportError(s);
        exit_code = 1;
        break;
      }
      next_file = now + *interval;
    }
    if (g_stop_signal != 0) break;
    if (duration->count() > 0 && now - start >= *duration) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  sampler.Stop();
  Metrics().SetUp(false);
  if (!o.metrics_file.empty() && exit_code == 0) {
    if (Status s = Metrics().WriteTextfile(o.metrics_file); !s.ok()) exit_code = ReportError(s);
  }
  SamplerStats st = sampler.stats();
  KILN_LOG(Info, OBS,
           "monitor stopped: {} polls, {} samples, {} failed samples, {} failed calls, "
           "{} Xid events, {} health events",
           st.rounds, st.samples, st.sample_failures, st.call_failures, st.xid_events,
           st.health_events);
  return exit_code;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& global) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "monitor",
      "Export GPU health (NVML) and kiln metrics for Prometheus; detect stalled, "
      "throttled or failing GPUs");
  sub->add_option("--metrics-port", o->port,
                  "TCP port for /metrics (0: pick a free port and print it)")
      ->capture_default_str()
      ->check(Port());
  sub->add_option("--metrics-bind", o->bind, "IPv4 address to listen on")
      ->capture_default_str()
      ->check(Ipv4Address());
  sub->add_flag("--no-server", o->no_server, "serve nothing; only write --metrics-file");
  sub->add_option(
      "--metrics-file", o->metrics_file,
      "also write the metrics here every interval (node-exporter textfile; name it *.prom)");
  sub->add_option("--duration", o->duration,
                  "stop after this long, e.g. 10s or 2h (0: until SIGINT/SIGTERM)")
      ->capture_default_str()
      ->check(DurationText(/*zero_ok=*/true));
  sub->add_option("--interval", o->interval, "sampling interval")
      ->capture_default_str()
      ->check(DurationText());
  sub->add_option("--collapse-window", o->collapse_window,
                  "how long a GPU that worked must stay near zero to raise utilization collapse")
      ->capture_default_str()
      ->check(DurationText(/*zero_ok=*/true));
  sub->add_option("--busy-ratio", o->busy_ratio, "utilization (0..1) that counts as working")
      ->capture_default_str()
      ->check(Number(0, 1));
  sub->add_option("--idle-ratio", o->idle_ratio, "utilization (0..1) that counts as near zero")
      ->capture_default_str()
      ->check(Number(0, 1));
  sub->add_option("--memory-pressure", o->memory_pressure,
                  "used/total memory (0..1) that raises memory pressure")
      ->capture_default_str()
      ->check(Number(0, 1, /*min_open=*/true));
  sub->add_option("--throttle-window", o->throttle_window,
                  "how long thermal/power-brake/hardware slowdown must last to raise throttling")
      ->capture_default_str()
      ->check(DurationText(/*zero_ok=*/true));
  sub->add_option("--nvml-library", o->nvml_library, "NVML library to load")->capture_default_str();
  return [o, &global]() { return Run(*o, global); };
}

}  // namespace
KILN_REGISTER_COMMAND(monitor, 70, Setup);
}  // namespace kiln::cli
