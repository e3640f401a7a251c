// Logging filtered by level and subsystem (like NCCL_DEBUG / NCCL_DEBUG_SUBSYS), as text lines or
// one JSON object per event. A sink can be installed to capture events (tests, metrics, CLI).
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kOff };

#define KILN_SUBSYSTEMS(X) \
  X(CORE) X(ONNX) X(IR) X(BUILD) X(RUNTIME) X(BACKEND) X(DIST) X(OBS) X(DOCTOR) X(CLI)

enum class Subsystem : uint8_t {
#define KILN_SUBSYS_ENUM(s) k##s,
  KILN_SUBSYSTEMS(KILN_SUBSYS_ENUM)
#undef KILN_SUBSYS_ENUM
};

std::string_view ToString(LogLevel level);
std::string_view ToString(Subsystem subsystem);

struct LogEvent {
  std::chrono::system_clock::time_point time;
  LogLevel level;
  Subsystem subsystem;
  std::string message;
  // Structured fields for machine consumers ("code" -> "KILN-E3002", "phase" -> "tactics").
  std::vector<std::pair<std::string, std::string>> fields;
};

enum class LogFormat : uint8_t { kText, kJson };

using LogSink = std::function<void(const LogEvent&)>;

bool LogEnabled(LogLevel level, Subsystem subsystem);
void Log(LogEvent event);
void Log(LogLevel level, Subsystem subsystem, std::string message);

// Overrides of the environment (KILN_LOG_LEVEL, KILN_LOG_SUBSYS, KILN_LOG_FORMAT).
void SetLogLevel(LogLevel level);
void SetLogFormat(LogFormat format);
// Installs a sink that replaces stderr output; an empty sink restores stderr. Returns the old one.
LogSink SetLogSink(LogSink sink);
// Formats an event as one line (text) or one JSON object.
std::string FormatLogEvent(const LogEvent& event, LogFormat format);
bool ParseLogLevel(std::string_view text, LogLevel* out);

}  // namespace kiln

#define KILN_LOG(level, subsys, ...)                                                    \
  do {                                                                                  \
    if (::kiln::LogEnabled(::kiln::LogLevel::k##level, ::kiln::Subsystem::k##subsys)) { \
      ::kiln::Log(::kiln::LogLevel::k##level, ::kiln::Subsystem::k##subsys,             \
                  fmt::format(__VA_ARGS__));                                            \
    }                                                                                   \
  } while (0)

#define KILN_WARN(subsys, ...) KILN_LOG(Warn, subsys, __VA_ARGS__)
