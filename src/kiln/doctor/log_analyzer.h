// `kiln doctor logs`: streams any mix of logs through one Hyperscan database built from the
// signature data, puts the events of all files on one timeline, and decides the root cause by
// causal order (a hardware fault before NCCL errors on other ranks is the cause, the NCCL errors
// its consequences).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/doctor/finding.h"
#include "kiln/doctor/knowledge.h"
#include "kiln/doctor/line_parse.h"

namespace kiln::doctor {

inline constexpr int64_t kNoTime = INT64_MIN;

// One signature hit on one line.
struct Event {
  int sig = -1;    // index into the SignatureDb
  std::string id;  // signature id, or a derived id ("env.NCCL_IB_TIMEOUT", "kiln.KILN-E3002")
  Severity severity = Severity::kInfo;
  Role role = Role::kInfo;
  // Filled for events whose text is not the signature's own (environment, kiln catalog, CSV).
  std::string title, meaning, cause, remedy;
  int file = -1;
  uint64_t line = 0;  // 1-based
  std::string text;   // the log line, sanitised (valid UTF-8, no control characters), capped
  LineTime raw_time;
  int64_t time_us = kNoTime;    // resolved on Finish()
  bool time_estimated = false;  // inherited from a neighbouring line of the same file
  std::string host;
  int rank = -1;
  int local_rank = -1;
  int64_t pid = -1;
  std::string gpu;  // PCI bus id ("0000:c6:00") or "cuda:N"
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<std::string> explains;  // consequence kinds a configuration event can explain

  std::string_view Field(std::string_view name) const;
};

// The same signature seen more than once after the root cause, grouped.
struct EventGroup {
  std::string id, title;
  Severity severity = Severity::kInfo;
  Role role = Role::kInfo;
  uint64_t count = 0;
  std::vector<std::string> hosts;
  std::vector<int> ranks;
  std::vector<std::string> gpus;
  int64_t first_time_us = kNoTime;
  bool first_time_estimated = false;
  int first = -1;  // index into Diagnosis::events
};

struct Diagnosis {
  enum class Verdict : uint8_t { kHealthy, kWarnings, kFailure };
  Verdict verdict = Verdict::kHealthy;
  int root = -1;             // index into events, when a failure was found
  std::string root_summary;  // one sentence: what failed where
  std::string root_note;     // how sure: "first failure in time; no underlying fault in these logs"
  std::vector<EventGroup> consequences;  // in time order
  std::vector<EventGroup> warnings;      // myths, misconfigurations, warnings that caused nothing
  std::vector<int> evidence;             // indices into events, root first
  std::vector<std::string> remedies;     // root cause's first
  std::vector<Event> events;             // the kept events (capped per signature)
  std::vector<std::string> files;
  std::vector<std::string> notes;  // analysis remarks (unanchored dmesg, capped events)
  uint64_t bytes = 0, lines = 0, matches = 0;
  double seconds = 0;

  int ExitCode() const {
    return verdict == Verdict::kFailure ? 2 : verdict == Verdict::kWarnings ? 1 : 0;
  }
};

struct AnalyzerOptions {
  size_t chunk_bytes = 8 << 20;  // read and scan this much at a time
  size_t max_events_per_signature = 2000;
  size_t max_line_chars = 400;  // evidence text kept per line
  int default_year = 0;         // for logs without a year and no dated line (0: this year)
  // At most this much of one file is read (a runaway log, /dev/zero); the rest is skipped with a
  // note in the diagnosis. `kiln doctor logs --max-mib` sets it.
  uint64_t max_file_bytes = uint64_t{1} << 30;
  // AddFile refuses FIFOs, devices and sockets (KILN-E9003), which may block or never end,
  // unless this is set; they are then read up to max_file_bytes.
  bool allow_special_files = false;
};

class LogAnalyzer {
 public:
  static StatusOr<std::unique_ptr<LogAnalyzer>> Create(std::shared_ptr<const SignatureDb> db,
                                                       std::shared_ptr<const KnownProblems> kp,
                                                       AnalyzerOptions options = {});
  ~LogAnalyzer();
  LogAnalyzer(const LogAnalyzer&) = delete;
  LogAnalyzer& operator=(const LogAnalyzer&) = delete;

  // Streams one regular file, up to max_file_bytes (invalid UTF-8 and NUL bytes are fine).
  Status AddFile(const std::string& path);
  // Same for text already in memory; `name` stands for the path in evidence.
  void AddBuffer(std::string_view name, std::string_view data);
  // Correlates everything added so far.
  Diagnosis Finish();

 private:
  struct Impl;
  explicit LogAnalyzer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Expands directories (recursively, sorted) into regular files; errors name the missing path.
StatusOr<std::vector<std::string>> ExpandLogPaths(const std::vector<std::string>& paths);

// Convenience: default databases, every path, one diagnosis.
StatusOr<Diagnosis> DiagnoseLogs(const std::vector<std::string>& paths,
                                 AnalyzerOptions options = {});

// Replaces invalid UTF-8 and control characters so evidence prints and serialises safely.
std::string SanitizeText(std::string_view s, size_t max_chars);

}  // namespace kiln::doctor
