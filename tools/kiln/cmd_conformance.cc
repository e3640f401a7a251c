// `kiln conformance`: runs ONNX backend-test directories through the whole engine path and
// reports pass/fail per case with the errors; with --expected, fails when a case that passed
// before fails now. Cases run in a worker process, one after another, each with a time bound: a
// crash or a hang is reported as that case's failure and the next case starts in a new worker.
// A worker also ends after any failed case, so a case that leaves the process in a bad state (a
// CUDA context after a fault) cannot fail the cases after it; passing cases share one process,
// so a CUDA run initialises the GPU once per run of passing cases, not once per case.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/app/conformance.h"
#include "kiln/core/file_io.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

struct ConformanceCliOptions {
  std::vector<std::string> roots;
  std::string backend = "cpu";
  std::string expected;
  std::string json_path;
  std::string filter;
  double rel_l2 = 0;
  double timeout_s = 60;
  bool fp16 = false;
  bool bf16 = false;
  bool int8 = false;
  std::string calib_method = "minmax";
  std::string int8_tolerance = fmt::format("{:g}", precision::kDefaultInt8Tolerance);
  bool verbose = false;
  std::vector<std::string> disabled_passes;
};

nlohmann::json ToJson(const app::CaseResult& r) {
  return {{"name", r.name},       {"passed", r.passed},   {"stage", r.stage},
          {"error", r.error},     {"code", r.error_code}, {"data_sets", r.data_sets},
          {"max_abs", r.max_abs}, {"max_rel", r.max_rel}, {"rel_l2", r.rel_l2},
          {"seconds", r.seconds}};
}

app::CaseResult FromJson(const nlohmann::json& j) {
  app::CaseResult r;
  r.name = j.value("name", "");
  r.passed = j.value("passed", false);
  r.stage = j.value("stage", "");
  r.error = j.value("error", "");
  r.error_code = j.value("code", "");
  r.data_sets = j.value("data_sets", 0);
  r.max_abs = j.value("max_abs", 0.0);
  r.max_rel = j.value("max_rel", 0.0);
  r.rel_l2 = j.value("rel_l2", 0.0);
  r.seconds = j.value("seconds", 0.0);
  return r;
}

std::string CaseName(const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  return trimmed.substr(trimmed.find_last_of('/') + 1);
}

app::CaseResult HarnessFailure(const std::string& dir, std::string stage, std::string error,
                               std::string code = "") {
  app::CaseResult r;
  r.name = CaseName(dir);
  r.stage = std::move(stage);
  r.error = std::move(error);
  r.error_code = std::move(code);
  return r;
}

// A child process that runs cases[first], cases[first + 1], ... and writes each result as one
// line of JSON to a pipe, until the last case or the first failed one.
class Worker {
 public:
  ~Worker() { Stop(); }

  bool Start(const std::vector<std::string>& cases, size_t first,
             const app::ConformanceOptions& options) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    pid_ = fork();
    if (pid_ < 0) {
      close(fds[0]);
      close(fds[1]);
      return false;
    }
    if (pid_ == 0) {
      close(fds[0]);
      for (size_t i = first; i < cases.size(); ++i) {
        app::CaseResult r = app::RunConformanceCase(cases[i], options);
        std::string line = ToJson(r).dump() + "\n";  // dump() escapes newlines in strings
        size_t off = 0;
        while (off < line.size()) {
          ssize_t n = write(fds[1], line.data() + off, line.size() - off);
          if (n <= 0) _exit(1);
          off += static_cast<size_t>(n);
        }
        if (!r.passed) break;
      }
      _exit(0);
    }
    close(fds[1]);
    fd_ = fds[0];
    buf_.clear();
    return true;
  }

  enum class Got { kResult, kTimeout, kEnded };
  // The next result line within `timeout_s`, or why there is none.
  Got Next(double timeout_s, std::string* line) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return Got::kResult;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Got::kTimeout;
      pollfd p{fd_, POLLIN, 0};
      int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (ready <= 0) continue;
      char chunk[4096];
      ssize_t n = read(fd_, chunk, sizeof(chunk));
      if (n <= 0) return Got::kEnded;
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Ends the worker (killed when `kill_it`) and gives its wait status. A worker left to end by
  // itself (after a failed case or the last one, it only calls _exit) is killed if it has not
  // within kExitBound.
  int Stop(bool kill_it = true) {
    if (pid_ <= 0) return 0;
    if (kill_it) kill(pid_, SIGKILL);
    int status = 0;
    constexpr auto kExitBound = std::chrono::seconds(10);
    const auto deadline = std::chrono::steady_clock::now() + kExitBound;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);  // SIGKILL cannot be ignored: this returns
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    close(fd_);
    pid_ = -1;
    fd_ = -1;
    return status;
  }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
};

// Runs the cases in workers (above) and calls `done` with each result, in order, until it returns
// false.
void RunCases(const std::vector<std::string>& cases, const app::ConformanceOptions& options,
              double timeout_s, const std::function<bool(app::CaseResult)>& done) {
  Worker worker;
  size_t i = 0;
  while (i < cases.size()) {
    if (!worker.running() && !worker.Start(cases, i, options)) {
      if (!done(HarnessFailure(cases[i], "harness", "pipe() or fork() failed"))) return;
      ++i;
      continue;
    }
    std::string line;
    app::CaseResult r;
    switch (worker.Next(timeout_s, &line)) {
      case Worker::Got::kResult: {
        try {
          r = FromJson(nlohmann::json::parse(line));
        } catch (const std::exception& e) {
          r = HarnessFailure(cases[i], "harness", fmt::format("unreadable result: {}", e.what()));
        }
        if (!r.passed) worker.Stop(/*kill_it=*/false);  // it ends after a failed case
        break;
      }
      case Worker::Got::kTimeout:
        worker.Stop();
        r = HarnessFailure(
            cases[i], "timeout",
            fmt::format("KILN-E1004 case did not finish within {} s (killed)", timeout_s),
            "KILN-E1004");
        break;
      case Worker::Got::kEnded: {
        const int status = worker.Stop(/*kill_it=*/false);
        r = WIFSIGNALED(status)
                ? HarnessFailure(cases[i], "crash",
                                 fmt::format("the case crashed with signal {} ({})",
                                             WTERMSIG(status), strsignal(WTERMSIG(status))))
                : HarnessFailure(cases[i], "harness", "the case's process ended without a result");
        break;
      }
    }
    if (!done(std::move(r))) return;
    ++i;
  }
  worker.Stop(/*kill_it=*/false);
}

int Run(const ConformanceCliOptions& o) {
  app::ConformanceOptions options;
  options.backend = o.backend == "cuda" ? BackendKind::kCuda : BackendKind::kCpu;
  options.fp16 = o.fp16;
  options.bf16 = o.bf16;
  options.int8 = o.int8;
  options.disabled_passes = o.disabled_passes;
  if (o.int8) {
    auto m = precision::ParseCalibrationMethod(o.calib_method);
    if (!m.ok()) return ReportError(m.status());
    options.calibration_method = *m;
    auto tolerance = precision::ParseInt8Tolerance(o.int8_tolerance);
    if (!tolerance.ok()) return ReportError(tolerance.status());
    options.int8_tolerance = *tolerance;
  }
  if (o.rel_l2 > 0) {
    options.max_rel_l2 = o.rel_l2;
  } else if (o.int8) {
    options.max_rel_l2 = 1e-1;  // docs/precision.md: the INT8 bound on the zoo
  } else if (o.fp16 || o.bf16) {
    // Reduced-precision engines are judged by relative L2 against the FP32 reference, at the
    // bounds docs/precision.md documents (elementwise tolerances do not fit FP16 rounding).
    options.max_rel_l2 = o.bf16 && !o.fp16 ? 1e-1 : 2e-2;
  }
  std::vector<std::string> cases;
  for (const std::string& root : o.roots) {
    for (std::string& c : app::FindConformanceCases(root)) cases.push_back(std::move(c));
  }
  if (!o.filter.empty()) {
    std::regex re(o.filter);
    std::erase_if(cases, [&](const std::string& c) { return !std::regex_search(c, re); });
  }
  if (cases.empty()) {
    return ReportError(MakeError(ErrorCode::kNotFound,
                                 "no conformance cases (model.onnx + test_data_set_*) under {}",
                                 fmt::join(o.roots, ", ")));
  }
  // The cases run in child processes, so this process never reads their files itself: declare
  // them, or --json naming a case's model or data would replace it after the run.
  FileRoles files;
  files.Input(o.expected, "expected-pass list");
  files.Output(o.json_path, "conformance report");
  for (const std::string& dir : cases) {
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
      std::error_code ec2;
      if (e.is_regular_file(ec2)) files.Input(e.path().string(), "file of case " + dir);
    }
  }
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
  std::set<std::string> expected;
  if (!o.expected.empty()) {
    auto text = ReadInputFile(o.expected, "expected-pass list", uint64_t{16} << 20);
    if (!text.ok()) return ReportError(text.status());
    std::istringstream f(*text);
    for (std::string line; std::getline(f, line);) {
      if (!line.empty() && line[0] != '#') expected.insert(line);
    }
  }
  std::vector<app::CaseResult> results;
  std::map<std::string, int> failures_by_stage;
  int passed = 0;
  // --json holds the cases run so far, rewritten at most every 2 s while the run goes on: a run
  // killed by an outer timeout (a job's time limit) still leaves what it measured.
  auto write_json = [&]() -> Status {
    if (o.json_path.empty()) return OkStatus();
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : results) j.push_back(ToJson(r));
    return WriteFileAtomic(o.json_path, "conformance report", j.dump(1) + "\n");
  };
  auto last_write = std::chrono::steady_clock::now();
  Status write_error;
  RunCases(cases, options, o.timeout_s, [&](app::CaseResult r) -> bool {
    if (r.passed) {
      ++passed;
    } else {
      ++failures_by_stage[r.stage];
    }
    if (o.verbose || !r.passed || expected.empty()) {
      std::cout << fmt::format(
          "{} {:<56} {:<8} {}\n", r.passed ? "PASS" : "FAIL", r.name, r.stage,
          r.passed ? fmt::format("max_abs {:.2e} rel_l2 {:.2e}", r.max_abs, r.rel_l2)
                   : r.error.substr(0, 160));
    }
    results.push_back(std::move(r));
    if (std::chrono::steady_clock::now() - last_write > std::chrono::seconds(2)) {
      write_error = write_json();
      last_write = std::chrono::steady_clock::now();
    }
    return write_error.ok();
  });
  if (!write_error.ok()) return ReportError(write_error);
  std::vector<std::string> regressions, newly_passing;
  for (const auto& r : results) {
    if (expected.count(r.name) && !r.passed) regressions.push_back(r.name);
    if (!expected.empty() && !expected.count(r.name) && r.passed) newly_passing.push_back(r.name);
  }
  std::cout << fmt::format("conformance: {} passed, {} failed of {} ({:.1f}% pass rate) on {}\n",
                           passed, results.size() - passed, results.size(),
                           100.0 * passed / results.size(), o.backend);
  for (const auto& [stage, n] : failures_by_stage)
    std::cout << fmt::format("  failed at {}: {}\n", stage, n);
  if (!newly_passing.empty()) {
    std::cout << fmt::format(
        "  {} case(s) pass that are not in {}: add them to keep them passing\n",
        newly_passing.size(), o.expected);
  }
  if (Status s = write_json(); !s.ok()) return ReportError(s);
  if (!regressions.empty()) {
    std::cout << fmt::format("REGRESSION: {} case(s) in {} fail now: {}\n", regressions.size(),
                             o.expected, fmt::join(regressions, ", "));
    return 1;
  }
  return o.expected.empty() && passed != static_cast<int>(results.size()) ? 1 : 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<ConformanceCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "conformance",
      "Run ONNX backend-test directories (model.onnx + test_data_set_N) and compare outputs");
  sub->add_option("dirs", o->roots, "case directories, or directories of cases")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  sub->add_option("--expected", o->expected,
                  "file of case names that must pass; with it, exit 1 only on regressions");
  sub->add_option("--json", o->json_path, "write every case's result to this JSON file");
  sub->add_option("--filter", o->filter, "only cases whose path matches this regex");
  sub->add_option("--rel-l2", o->rel_l2,
                  "pass on relative L2 error below this (default: allclose rtol 1e-3 atol 1e-7)")
      ->check(Number(0, 1e6, /*min_open=*/true));
  sub->add_option("--timeout", o->timeout_s, "seconds per case before it is killed")
      ->capture_default_str()
      ->check(Seconds());
  sub->add_flag("--fp16", o->fp16,
                "build FP16 engines (default bound: relative L2 <= 2e-2, docs/precision.md)");
  sub->add_flag("--bf16", o->bf16,
                "build BF16 engines (default bound: relative L2 <= 1e-1, docs/precision.md)");
  sub->add_flag("--int8", o->int8,
                "build INT8 engines (FP16 fallback) calibrated on each case's own data sets "
                "(default bound: relative L2 <= 1e-1, docs/precision.md)");
  sub->add_option("--calib-method", o->calib_method, "with --int8: minmax, entropy or percentile")
      ->capture_default_str();
  sub->add_option("--int8-tolerance", o->int8_tolerance,
                  "with --int8: the INT8 sensitivity fallback's budget (relative L2 on the "
                  "calibration data) or 'off'; as kiln build's")
      ->capture_default_str();
  sub->add_flag("-v,--verbose", o->verbose, "print passing cases too");
  sub->add_option("--disable-pass", o->disabled_passes,
                  "skip one graph pass by name, as kiln build's (repeatable): e.g. qdq_fusion runs "
                  "a QDQ model's Q/DQ ops literally");
  return [o]() { return Run(*o); };
}

}  // namespace
KILN_REGISTER_COMMAND(conformance, 40, Setup);
}  // namespace kiln::cli
