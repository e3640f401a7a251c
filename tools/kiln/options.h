// The one place where kiln's command-line values are checked: every numeric option of every
// subcommand takes one of these validators (finite, within its range; KILN-E1016), and CLI11's
// parse errors become catalog errors with an exit code below 128.
#pragma once

#include <CLI/CLI.hpp>

#include <limits>
#include <string>

#include "kiln/backends/backend.h"
#include "kiln/core/status.h"

namespace kiln::cli {

// Exit code of a refused command line (sysexits' EX_USAGE): below 128, and apart from the
// codes the commands give their own results.
constexpr int kUsageExitCode = 64;

// Bounds that keep every conversion to milliseconds, counts and sizes far from overflow.
constexpr double kMaxSeconds = 7 * 24 * 3600.0;  // one week: longer than any job's wait
constexpr double kMaxCount = 1e9;
constexpr double kMaxRanks = 1 << 20;                  // ranks of one job
constexpr double kMaxUint64 = 18446744073709551615.0;  // for uint64 options (CLI11 checks the rest)

// A finite number in [min, max] (min excluded when `min_open`); `integer` also refuses
// fractions. The option's text is checked before CLI11 converts it, so NaN, "inf" and "1e999"
// never reach a command.
CLI::Validator Number(double min, double max, bool min_open = false, bool integer = false);
inline CLI::Validator Count(double min, double max = kMaxCount) {
  return Number(min, max, false, true);
}
// Seconds: a finite number above 0 (or from 0 when zero_ok) and at most kMaxSeconds.
CLI::Validator Seconds(bool zero_ok = false);
// A TCP port, 0..65535 (0: a free one).
CLI::Validator Port();
// A dotted-quad IPv4 address such as 127.0.0.1 or 0.0.0.0.
CLI::Validator Ipv4Address();
// A duration written as 10s, 1500ms, 5m or 1h (a bare number is seconds), finite, at most a week;
// above zero unless zero_ok.
CLI::Validator DurationText(bool zero_ok = false);

// Gives every numeric option (integer or floating point) that has none of the validators above a
// finite-number check, so that no option anywhere takes NaN or an infinity by omission.
void RequireFiniteNumbers(CLI::App& app);

// The catalog error for a CLI11 parse error: a missing file KILN-E1003, a refused value
// KILN-E1016, anything else (unknown option, missing or extra argument) KILN-E1015.
Status ParseErrorStatus(const CLI::ParseError& e);

// `--backend`'s value: auto (the best backend present), cpu or cuda; anything else is
// KILN-E1001 naming the three.
StatusOr<BackendKind> ParseBackend(const std::string& text);

}  // namespace kiln::cli
