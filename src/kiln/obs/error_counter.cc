// The counting sink: count first, then forward, so a failing downstream sink never loses a count.
#include "kiln/obs/error_counter.h"

#include <cstdio>

namespace kiln::obs {

LogSink MakeErrorCountingSink(KilnMetrics* metrics, LogSink next, LogFormat format) {
  return [metrics, next = std::move(next), format](const LogEvent& e) {
    if (e.level >= LogLevel::kWarn && e.level != LogLevel::kOff) {
      for (const auto& [key, value] : e.fields) {
        if (key == "code" && !value.empty()) metrics->CountError(value);
      }
    }
    if (next) {
      next(e);
      return;
    }
    std::string line = FormatLogEvent(e, format);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
  };
}

ScopedErrorCounting::ScopedErrorCounting(KilnMetrics* metrics, LogFormat format) {
  // SetLogSink returns the sink it replaced; the new sink forwards to it.
  LogSink placeholder = SetLogSink(nullptr);
  previous_ = placeholder;
  SetLogSink(MakeErrorCountingSink(metrics, std::move(placeholder), format));
}

ScopedErrorCounting::~ScopedErrorCounting() { SetLogSink(std::move(previous_)); }

}  // namespace kiln::obs
