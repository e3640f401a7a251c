// Durations on the command line ("10s", "1500ms", "5m", "1h", "2.5s"), for obs options.
#pragma once

#include <chrono>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln::obs {

// A bare number is seconds. InvalidArgument names the text when it does not parse.
StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text);

}  // namespace kiln::obs
