// What every doctor check produces: a finding with severity, what, why and what to do, plus the
// exit-code rule shared by `kiln doctor` and `kiln doctor logs` (0 healthy, 1 warnings, 2 errors).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kiln::doctor {

enum class Severity : uint8_t { kInfo, kWarning, kError, kCritical };

std::string_view ToString(Severity s);
// Accepts "info", "warning", "error", "critical"; false when unknown.
bool ParseSeverity(std::string_view text, Severity* out);

struct Finding {
  Severity severity = Severity::kInfo;
  std::string check;  // short id: "env.NCCL_IB_TIMEOUT", "gpu0.watchdog", "version.nccl"
  std::string what;
  std::string why;
  std::string todo;
};

// 0 when every finding is info, 1 when the worst is a warning, 2 for an error or worse.
int ExitCodeFor(std::span<const Finding> findings);

}  // namespace kiln::doctor
