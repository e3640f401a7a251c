// `kiln doctor`: checks the live machine before a job; `kiln doctor logs FILE...|DIR` explains a
// failed job from its logs. Exit codes: 0 healthy, 1 warnings, 2 errors/failure, 3 could not run.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "kiln/core/file_io.h"
#include "kiln/doctor/log_analyzer.h"
#include "kiln/doctor/preflight.h"
#include "kiln/doctor/report.h"
#include "kiln/engine/engine_file.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

constexpr int kCannotRun = 3;

struct DoctorOptions {
  bool json = false;
  std::string color = "auto";
  std::string memory_budget;
  std::string engine;
  int ranks_per_gpu = 1;
  std::string known_problems;
  // logs
  std::vector<std::string> paths;
  std::string signatures;
  int year = 0;
  size_t chunk_mib = 8;
  uint64_t max_mib = 1024;
  bool allow_special = false;
};

// The known-problems and signature databases are small JSON files: a regular file, bounded.
StatusOr<std::string> ReadWholeFile(const std::string& path) {
  return ReadInputFile(path, "doctor database", uint64_t{64} << 20);
}

bool UseColor(const std::string& mode) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  return isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr;
}

int Fail(const Status& s) {
  ReportError(s);
  return kCannotRun;
}

int RunPreflight(const DoctorOptions& o) {
  auto kp = o.known_problems.empty()
                ? doctor::KnownProblems::Default()
                : [&]() -> StatusOr<std::shared_ptr<const doctor::KnownProblems>> {
    KILN_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(o.known_problems));
    return doctor::KnownProblems::Load(text, o.known_problems);
  }();
  if (!kp.ok()) return Fail(kp.status());
  doctor::MemoryPlan plan;
  if (!o.memory_budget.empty()) {
    auto budget = doctor::ParseMemoryBudget(o.memory_budget);
    if (!budget.ok()) return Fail(budget.status());
    plan.set = true;
    plan.budget = *budget;
  }
  if (!o.engine.empty()) {
    // The engine's planned peak (weights + activations + workspace) is what each rank needs.
    LoadOptions peek;
    peek.check_providers = false;
    auto engine = LoadEngineFile(o.engine, peek);
    if (!engine.ok()) return Fail(engine.status());
    plan.set = true;
    plan.budget = static_cast<double>(std::max<int64_t>((*engine)->plan.peak_bytes, 2));
  }
  if (o.ranks_per_gpu < 1)
    return Fail(MakeError(ErrorCode::kInvalidArgument, "--ranks-per-gpu must be at least 1"));
  plan.ranks_per_gpu = o.ranks_per_gpu;
  doctor::PreflightReport r = doctor::RunPreflight(**kp, plan, doctor::CurrentEnvironment());
  if (o.json) {
    std::cout << doctor::PreflightToJson(r).dump(2, ' ', false,
                                                 nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    std::cout << doctor::RenderPreflightText(r, {UseColor(o.color)});
  }
  return r.ExitCode();
}

int RunLogs(const DoctorOptions& o) {
  auto db = o.signatures.empty() ? doctor::SignatureDb::Default()
                                 : [&]() -> StatusOr<std::shared_ptr<const doctor::SignatureDb>> {
    KILN_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(o.signatures));
    return doctor::SignatureDb::Load(text, o.signatures);
  }();
  if (!db.ok()) return Fail(db.status());
  auto kp = doctor::KnownProblems::Default();
  if (!kp.ok()) return Fail(kp.status());
  doctor::AnalyzerOptions opts;
  opts.default_year = o.year;
  opts.chunk_bytes = o.chunk_mib << 20;
  opts.max_file_bytes = o.max_mib << 20;
  opts.allow_special_files = o.allow_special;
  auto analyzer = doctor::LogAnalyzer::Create(*db, *kp, opts);
  if (!analyzer.ok()) return Fail(analyzer.status());
  auto files = doctor::ExpandLogPaths(o.paths);
  if (!files.ok()) return Fail(files.status());
  for (const std::string& f : *files) {
    if (Status s = (*analyzer)->AddFile(f); !s.ok()) return Fail(s);
  }
  doctor::Diagnosis d = (*analyzer)->Finish();
  if (o.json) {
    std::cout << doctor::DiagnosisToJson(d, **db).dump(2, ' ', false,
                                                       nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    std::cout << doctor::RenderDiagnosisText(d, **db, {UseColor(o.color)});
  }
  return d.ExitCode();
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<DoctorOptions>();
  CLI::App* sub = app.add_subcommand(
      "doctor",
      "Check this machine before a job (driver, CUDA, libraries, GPUs, memory plan, environment).\n"
      "Exit: 0 healthy, 1 warnings, 2 errors, 3 the doctor could not run.");
  sub->add_flag("--json", o->json, "print JSON");
  sub->add_option("--color", o->color, "auto (on a TTY), always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  sub->add_option("--memory-budget", o->memory_budget,
                  "the job's memory per rank: bytes (8GiB) or a share of free memory (0.5)");
  sub->add_option("--engine", o->engine,
                  "a .kiln engine: its planned peak memory per rank is checked against free memory")
      ->check(CLI::ExistingFile);
  sub->add_option("--ranks-per-gpu", o->ranks_per_gpu, "ranks sharing each GPU (default 1)")
      ->check(Count(1, 1024));
  sub->add_option("--known-problems", o->known_problems,
                  "a known-problems table to use instead of the built-in one (JSON)");
  CLI::App* logs =
      sub->add_subcommand("logs",
                          "Explain a failed job from its logs: kernel (dmesg, syslog), NCCL, "
                          "PyTorch/torchrun, TensorRT,\n"
                          "kiln, nvidia-smi CSV, environment dumps. Root cause first.\n"
                          "Exit: 0 no failure, 1 warnings only, 2 failure with root cause, 3 the "
                          "doctor could not run.");
  logs->add_option("paths", o->paths, "log files or directories (read recursively)")->required();
  logs->add_flag("--json", o->json, "print JSON");
  logs->add_option("--color", o->color, "auto (on a TTY), always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  logs->add_option("--signatures", o->signatures,
                   "a signature database to use instead of the built-in one (JSON)");
  logs->add_option("--year", o->year,
                   "year for timestamps without one (syslog, glog) when no log line has a date")
      ->check(Count(1970, 9999));
  logs->add_option("--chunk-mib", o->chunk_mib, "read and scan this many MiB at a time (default 8)")
      ->check(Count(1, 1024));
  logs->add_option("--max-mib", o->max_mib,
                   "read at most this many MiB of each file; the diagnosis notes a file that was "
                   "cut (default 1024)")
      ->check(Count(1, 1 << 20));
  logs->add_flag("--allow-special", o->allow_special,
                 "also read FIFOs, devices and sockets (refused by default: they may block or "
                 "never end), up to --max-mib");
  return [o, logs]() -> int { return logs->parsed() ? RunLogs(*o) : RunPreflight(*o); };
}

}  // namespace
KILN_REGISTER_COMMAND(doctor, 50, Setup);
}  // namespace kiln::cli
