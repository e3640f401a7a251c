// Progress of long CLI work (a build phase, a wait for another rank): a redrawn bar with ETA on
// a terminal, a plain line every few seconds otherwise, or log events for JSON pipelines.
// Phase start and end are always log events (fields event=phase_start|phase_end, phase=...).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/logging.h"
#include "kiln/obs/metrics.h"

namespace kiln::obs {

enum class ProgressMode {
  kAuto,    // kBar when stderr is a terminal, else kLines
  kBar,     // one line redrawn in place (\r), at most every bar_interval
  kLines,   // a plain line every line_interval
  kEvents,  // a log event (event=progress) every line_interval: for --log-format json
  kSilent,  // phase events only
};

struct ProgressOptions {
  using Clock = std::chrono::steady_clock;
  std::string phase;  // "tactics", "wait-for-builder"
  int64_t total = 0;  // units of work; 0 when unknown (no ETA)
  std::string unit;   // "layers", shown after the counts
  Subsystem subsystem = Subsystem::kCLI;
  ProgressMode mode = ProgressMode::kAuto;
  std::chrono::milliseconds bar_interval = std::chrono::milliseconds(100);
  std::chrono::milliseconds line_interval = std::chrono::seconds(5);
  int bar_width = 24;
  std::function<Clock::time_point()> clock;     // default steady_clock::now (tests inject)
  std::function<void(std::string_view)> write;  // default: stderr
  KilnMetrics* metrics = nullptr;  // kiln_phase_seconds{phase} on Finish; default Metrics()
};

class Progress {
 public:
  using Clock = ProgressOptions::Clock;
  explicit Progress(ProgressOptions options);  // emits phase_start
  ~Progress();                                 // Finish(true) if not finished
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // All of these are thread-safe (builder threads report concurrently).
  void Advance(int64_t n = 1);
  void Set(int64_t done);
  void SetTotal(int64_t total);
  void SetBest(std::string text);  // "best so far" text shown after the ETA
  void Tick();                     // redraws if due; call it from waits with no progress
  void Finish(bool ok = true);     // emits phase_end; further calls do nothing

  // Seconds left at the average rate since the phase started; empty without total or rate.
  std::optional<double> EtaSeconds() const;
  // The current status text (one line, no \r or newline).
  std::string Render() const;

  static std::string FormatDuration(double seconds);  // "45s", "3m07s", "1h02m"

 private:
  std::optional<double> EtaLocked(Clock::time_point now) const;
  std::string RenderLocked(Clock::time_point now) const;
  void MaybeEmitLocked(bool force);
  Clock::time_point Now() const { return options_.clock ? options_.clock() : Clock::now(); }
  void Write(std::string_view text) const;

  ProgressOptions options_;
  ProgressMode mode_;
  mutable std::mutex mu_;
  Clock::time_point start_;
  Clock::time_point last_emit_;
  bool emitted_ = false;
  bool bar_drawn_ = false;
  bool finished_ = false;
  int64_t done_ = 0;
  std::string best_;
};

}  // namespace kiln::obs
