// ParseDuration: number + unit, no locale, no exceptions.
#include "kiln/obs/duration.h"

#include <charconv>
#include <cmath>
#include <string>

namespace kiln::obs {

StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  std::string s(text);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end == s.data()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "'{}' is not a duration (use forms like 10s, 1500ms, 5m, 1h)", text);
  }
  std::string_view unit(end, s.data() + s.size() - end);
  double ms_per_unit;
  if (unit.empty() || unit == "s") {
    ms_per_unit = 1000;
  } else if (unit == "ms") {
    ms_per_unit = 1;
  } else if (unit == "m" || unit == "min") {
    ms_per_unit = 60'000;
  } else if (unit == "h") {
    ms_per_unit = 3'600'000;
  } else {
    return MakeError(ErrorCode::kInvalidArgument,
                     "'{}' has an unknown unit '{}' (use ms, s, m or h)", text, unit);
  }
  double ms = value * ms_per_unit;
  if (!std::isfinite(ms) || ms < 0 || ms > 1e15) {
    return MakeError(ErrorCode::kOutOfRange, "duration '{}' is negative or too large", text);
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

}  // namespace kiln::obs
