// `kiln conformance`: runs ONNX backend-test directories through the whole engine path and
// reports pass/fail per case with the errors; with --expected, fails when a case that passed
// before fails now. Each case runs in its own process with a time bound, so a crash or a hang in
// one case is reported as that case's failure and the run goes on.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

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

// Runs one case in a child process; a crash, a signal or the time bound becomes a failure.
app::CaseResult RunIsolated(const std::string& dir, const app::ConformanceOptions& options,
                            double timeout_s) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  std::string name = trimmed.substr(trimmed.find_last_of('/') + 1);
  int fds[2];
  if (pipe(fds) != 0) {
    app::CaseResult r;
    r.name = name;
    r.stage = "harness";
    r.error = "pipe() failed";
    return r;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string out = ToJson(app::RunConformanceCase(dir, options)).dump();
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = write(fds[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string buf;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready <= 0) continue;
    char chunk[4096];
    ssize_t n = read(fds[0], chunk, sizeof(chunk));
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  app::CaseResult r;
  r.name = name;
  if (timed_out) {
    r.stage = "timeout";
    r.error = fmt::format("KILN-E1004 case did not finish within {} s (killed)", timeout_s);
    r.error_code = "KILN-E1004";
    return r;
  }
  if (WIFSIGNALED(status)) {
    r.stage = "crash";
    r.error = fmt::format("the case crashed with signal {} ({})", WTERMSIG(status),
                          strsignal(WTERMSIG(status)));
    return r;
  }
  try {
    return FromJson(nlohmann::json::parse(buf));
  } catch (const std::exception& e) {
    r.stage = "harness";
    r.error = fmt::format("unreadable result: {}", e.what());
    return r;
  }
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
  for (const std::string& dir : cases) {
    app::CaseResult r = RunIsolated(dir, options, o.timeout_s);
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
      if (Status s = write_json(); !s.ok()) return ReportError(s);
      last_write = std::chrono::steady_clock::now();
    }
  }
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
