// Progress: rendering and rate limiting. Output happens only inside calls from the worker (no
// thread of its own), so a finished Progress never writes again.
#include "kiln/obs/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kiln::obs {

Progress::Progress(ProgressOptions options) : options_(std::move(options)) {
  mode_ = options_.mode;
  if (mode_ == ProgressMode::kAuto) {
    mode_ = ::isatty(STDERR_FILENO) ? ProgressMode::kBar : ProgressMode::kLines;
  }
  start_ = Now();
  last_emit_ = start_;
  LogEvent e{std::chrono::system_clock::now(),
             LogLevel::kInfo,
             options_.subsystem,
             fmt::format("{} started", options_.phase),
             {{"event", "phase_start"}, {"phase", options_.phase}}};
  if (options_.total > 0) e.fields.emplace_back("total", std::to_string(options_.total));
  if (LogEnabled(e.level, e.subsystem)) Log(std::move(e));
}

Progress::~Progress() { Finish(true); }

void Progress::Advance(int64_t n) {
  std::lock_guard lock(mu_);
  if (finished_) return;
  done_ += n;
  MaybeEmitLocked(false);
}

void Progress::Set(int64_t done) {
  std::lock_guard lock(mu_);
  if (finished_) return;
  done_ = done;
  MaybeEmitLocked(false);
}

void Progress::SetTotal(int64_t total) {
  std::lock_guard lock(mu_);
  options_.total = total;
}

void Progress::SetBest(std::string text) {
  std::lock_guard lock(mu_);
  best_ = std::move(text);
}

void Progress::Tick() {
  std::lock_guard lock(mu_);
  if (!finished_) MaybeEmitLocked(false);
}

void Progress::Finish(bool ok) {
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  auto now = Now();
  double seconds = std::chrono::duration<double>(now - start_).count();
  if (mode_ == ProgressMode::kBar && bar_drawn_) {
    Write(fmt::format("\r{}\n", RenderLocked(now)));
  } else if (mode_ == ProgressMode::kLines && emitted_) {
    Write(fmt::format("{}\n", RenderLocked(now)));
  }
  KilnMetrics* metrics = options_.metrics ? options_.metrics : &Metrics();
  metrics->ObservePhase(options_.phase, seconds);
  LogEvent e{std::chrono::system_clock::now(),
             ok ? LogLevel::kInfo : LogLevel::kWarn,
             options_.subsystem,
             fmt::format("{} {} after {}", options_.phase, ok ? "finished" : "stopped",
                         FormatDuration(seconds)),
             {{"event", "phase_end"},
              {"phase", options_.phase},
              {"ok", ok ? "true" : "false"},
              {"seconds", fmt::format("{:.3f}", seconds)},
              {"done", std::to_string(done_)}}};
  if (!best_.empty()) e.fields.emplace_back("best", best_);
  if (LogEnabled(e.level, e.subsystem)) Log(std::move(e));
}

std::optional<double> Progress::EtaSeconds() const {
  std::lock_guard lock(mu_);
  return EtaLocked(Now());
}

std::optional<double> Progress::EtaLocked(Clock::time_point now) const {
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (options_.total <= 0 || done_ <= 0 || elapsed <= 0) return std::nullopt;
  double remaining = static_cast<double>(std::max<int64_t>(0, options_.total - done_));
  return remaining * elapsed / static_cast<double>(done_);
}

std::string Progress::FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string Progress::Render() const {
  std::lock_guard lock(mu_);
  return RenderLocked(Now());
}

std::string Progress::RenderLocked(Clock::time_point now) const {
  std::string out = options_.phase;
  int64_t total = options_.total;
  std::string unit = options_.unit.empty() ? "" : " " + options_.unit;
  if (mode_ == ProgressMode::kBar && total > 0) {
    int width = std::max(1, options_.bar_width);
    auto filled = static_cast<int>(std::min<int64_t>(width, done_ * width / total));
    out += fmt::format(" [{}{}]", std::string(filled, '#'), std::string(width - filled, '.'));
  }
  if (total > 0) {
    out += fmt::format(" {}/{}{}", done_, total, unit);
  } else {
    out += fmt::format(" {}{}", done_, unit);
  }
  out += fmt::format(" elapsed {}",
                     FormatDuration(std::chrono::duration<double>(now - start_).count()));
  if (finished_) {
    out += " done";
  } else if (auto eta = EtaLocked(now)) {
    out += fmt::format(" ETA {}", FormatDuration(*eta));
  }
  if (!best_.empty()) out += fmt::format(" best {}", best_);
  return out;
}

void Progress::MaybeEmitLocked(bool force) {
  if (mode_ == ProgressMode::kSilent) return;
  auto now = Now();
  auto interval = mode_ == ProgressMode::kBar ? options_.bar_interval : options_.line_interval;
  // A bar appears at once; plain lines and events only once the first interval has passed, so a
  // short phase prints nothing but its start and end events.
  bool due = mode_ == ProgressMode::kBar && !bar_drawn_ ? true : now - last_emit_ >= interval;
  if (!force && !due) return;
  last_emit_ = now;
  emitted_ = true;
  switch (mode_) {
    case ProgressMode::kBar:
      bar_drawn_ = true;
      Write(fmt::format("\r{}\x1b[K",
                        RenderLocked(now)));  // erase leftovers of a longer previous line
      break;
    case ProgressMode::kLines:
      Write(fmt::format("{}\n", RenderLocked(now)));
      break;
    case ProgressMode::kEvents: {
      LogEvent e{std::chrono::system_clock::now(),
                 LogLevel::kInfo,
                 options_.subsystem,
                 RenderLocked(now),
                 {{"event", "progress"},
                  {"phase", options_.phase},
                  {"done", std::to_string(done_)},
                  {"total", std::to_string(options_.total)}}};
      if (auto eta = EtaLocked(now))
        e.fields.emplace_back("eta_seconds", fmt::format("{:.1f}", *eta));
      if (!best_.empty()) e.fields.emplace_back("best", best_);
      if (LogEnabled(e.level, e.subsystem)) Log(std::move(e));
      break;
    }
    default:
      break;
  }
}

void Progress::Write(std::string_view text) const {
  if (options_.write) {
    options_.write(text);
    return;
  }
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace kiln::obs
