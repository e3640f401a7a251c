// Warnings that carry a catalog code as a structured field, so `kiln doctor` and log consumers
// can match them without parsing text.
#pragma once

#include <string>

#include "kiln/core/logging.h"
#include "kiln/core/status.h"

namespace kiln::distributed {

inline void LogWithCode(LogLevel level, ErrorCode code, std::string message) {
  if (!LogEnabled(level, Subsystem::kDIST)) return;
  const std::string id = LookupError(code).Id();
  LogEvent event{std::chrono::system_clock::now(),
                 level,
                 Subsystem::kDIST,
                 id + " " + std::move(message),
                 {{"code", id}}};
  Log(std::move(event));
}

}  // namespace kiln::distributed
