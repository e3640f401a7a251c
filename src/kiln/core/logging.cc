// Logging implementation: one global configuration read from params, one mutex around output.
#include "kiln/core/logging.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "kiln/core/params.h"

namespace kiln {

namespace {

constexpr std::string_view kSubsystemNames[] = {
#define KILN_SUBSYS_NAME(s) #s,
    KILN_SUBSYSTEMS(KILN_SUBSYS_NAME)
#undef KILN_SUBSYS_NAME
};
constexpr size_t kNumSubsystems = std::size(kSubsystemNames);

struct LogConfig {
  std::atomic<LogLevel> level{LogLevel::kInfo};
  std::atomic<uint32_t> subsystem_mask{~0u};
  std::atomic<LogFormat> format{LogFormat::kText};
  std::mutex mu;
  LogSink sink;
};

uint32_t ParseSubsystemMask(std::string_view spec) {
  if (spec.empty() || spec == "ALL") return ~0u;
  bool exclude = spec.front() == '^';
  if (exclude) spec.remove_prefix(1);
  uint32_t mask = 0;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    for (size_t i = 0; i < kNumSubsystems; ++i) {
      if (item == kSubsystemNames[i]) mask |= 1u << i;
    }
    if (item == "ALL") mask = ~0u;
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
  }
  return exclude ? ~mask : mask;
}

LogConfig& Config() {
  static LogConfig* config = [] {
    auto* c = new LogConfig();  // never destroyed: logging works during static destruction
    LogLevel level;
    if (ParseLogLevel(param::LogLevel(), &level)) c->level = level;
    c->subsystem_mask = ParseSubsystemMask(param::LogSubsystems());
    if (param::LogFormat() == "json") c->format = LogFormat::kJson;
    return c;
  }();
  return *config;
}

}  // namespace

std::string_view ToString(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kOff:
      return "OFF";
  }
  return "?";
}

std::string_view ToString(Subsystem subsystem) {
  auto i = static_cast<size_t>(subsystem);
  return i < kNumSubsystems ? kSubsystemNames[i] : "?";
}

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  for (LogLevel l : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn,
                     LogLevel::kError, LogLevel::kOff}) {
    if (text == ToString(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

bool LogEnabled(LogLevel level, Subsystem subsystem) {
  LogConfig& c = Config();
  return level >= c.level.load(std::memory_order_relaxed) && level != LogLevel::kOff &&
         (c.subsystem_mask.load(std::memory_order_relaxed) >> static_cast<uint32_t>(subsystem) &
          1u);
}

std::string FormatLogEvent(const LogEvent& e, LogFormat format) {
  auto since_epoch = e.time.time_since_epoch();
  double seconds = std::chrono::duration<double>(since_epoch).count();
  if (format == LogFormat::kJson) {
    nlohmann::json j;
    j["ts"] = seconds;
    j["level"] = ToString(e.level);
    j["subsystem"] = ToString(e.subsystem);
    j["msg"] = e.message;
    for (const auto& [k, v] : e.fields) j[k] = v;
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line =
      fmt::format("[kiln {} {}] {}", ToString(e.level), ToString(e.subsystem), e.message);
  for (const auto& [k, v] : e.fields) line += fmt::format(" {}={}", k, v);
  return line;
}

void Log(LogEvent event) {
  LogConfig& c = Config();
  std::lock_guard lock(c.mu);
  if (c.sink) {
    c.sink(event);
    return;
  }
  std::string line = FormatLogEvent(event, c.format.load());
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void Log(LogLevel level, Subsystem subsystem, std::string message) {
  Log(LogEvent{std::chrono::system_clock::now(), level, subsystem, std::move(message), {}});
}

void SetLogLevel(LogLevel level) { Config().level = level; }
void SetLogFormat(LogFormat format) { Config().format = format; }

LogSink SetLogSink(LogSink sink) {
  LogConfig& c = Config();
  std::lock_guard lock(c.mu);
  std::swap(c.sink, sink);
  return sink;
}

}  // namespace kiln
