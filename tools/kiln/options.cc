// Option validators and the CLI11-error-to-catalog mapping (options.h).
#include "tools/kiln/options.h"

#include <arpa/inet.h>

#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>

#include "kiln/obs/duration.h"

namespace kiln::cli {
namespace {

// Every validator of this file carries this name, so RequireFiniteNumbers can tell which
// options already have one.
constexpr const char* kValidatorName = "kiln-bounded";

// The whole text as a number; nullopt when it is not one (trailing text, empty, ...).
std::optional<double> ParseNumber(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || end != text.data() + text.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) return std::numeric_limits<double>::infinity();
  if (ec != std::errc()) return std::nullopt;
  return v;
}

std::string Range(double min, double max, bool min_open) {
  return fmt::format("{}{:g}, {:g}]", min_open ? "(" : "[", min, max);
}

}  // namespace

CLI::Validator Number(double min, double max, bool min_open, bool integer) {
  const std::string desc = Range(min, max, min_open);  // help shows "INT:[0, 65535]"
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        std::optional<double> v = ParseNumber(text);
        if (!v) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(*v)) return fmt::format("'{}' is not a finite number", text);
        if (integer && std::trunc(*v) != *v) return fmt::format("'{}' is not a whole number", text);
        if (*v < min || (min_open && *v == min) || *v > max) {
          return fmt::format("{} is outside the allowed range {}", text, Range(min, max, min_open));
        }
        return std::string();
      },
      desc, kValidatorName);
}

CLI::Validator Seconds(bool zero_ok) {
  return Number(0, kMaxSeconds, /*min_open=*/!zero_ok)
      .description(fmt::format("{} s", Range(0, kMaxSeconds, !zero_ok)));
}

CLI::Validator Port() { return Number(0, 65535, false, true); }

CLI::Validator Ipv4Address() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        in_addr addr{};
        if (inet_pton(AF_INET, text.c_str(), &addr) != 1) {
          return fmt::format("'{}' is not an IPv4 address (four numbers 0..255, e.g. 127.0.0.1)",
                             text);
        }
        return std::string();
      },
      "IPV4", kValidatorName);
}

CLI::Validator DurationText(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& text) -> std::string {
        StatusOr<std::chrono::milliseconds> d = obs::ParseDuration(text);
        if (!d.ok()) return std::string(d.status().message());
        if (d->count() > static_cast<int64_t>(kMaxSeconds * 1000)) {
          return fmt::format("'{}' is longer than the allowed {:g} s (one week)", text,
                             kMaxSeconds);
        }
        if (!zero_ok && d->count() <= 0) return fmt::format("'{}' must be above zero", text);
        return std::string();
      },
      zero_ok ? "DURATION (10s, 1500ms, 5m; 0 allowed)" : "DURATION (10s, 1500ms, 5m)",
      kValidatorName);
}

void RequireFiniteNumbers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    std::string type = opt->get_type_name();  // "FLOAT", or "FLOAT:" and validators' texts
    type = type.substr(0, type.find(':'));
    if (type != "INT" && type != "UINT" && type != "FLOAT" && type != "NUMBER") continue;
    try {
      opt->get_validator(kValidatorName);
    } catch (const CLI::OptionNotFound&) {
      opt->check(CLI::Validator(
          [](std::string& text) -> std::string {
            std::optional<double> v = ParseNumber(text);
            if (v && !std::isfinite(*v)) return fmt::format("'{}' is not a finite number", text);
            return std::string();  // not a number at all: CLI11's conversion says so
          },
          "", kValidatorName));
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) RequireFiniteNumbers(*sub);
}

Status ParseErrorStatus(const CLI::ParseError& e) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    // CLI::ExistingFile / ExistingPath name a path that is not there.
    if (what.find("does not exist") != std::string::npos)
      return MakeError(ErrorCode::kNotFound, "{}", what);
    return MakeError(ErrorCode::kOptionOutOfRange, "{}", what);
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr)
    return MakeError(ErrorCode::kOptionOutOfRange, "{}", what);
  return MakeError(ErrorCode::kCommandLineInvalid, "{} (`--help` lists the options)", what);
}

StatusOr<BackendKind> ParseBackend(const std::string& text) {
  if (text == "auto") return BestAvailableBackend();
  if (text == "cpu") return BackendKind::kCpu;
  if (text == "cuda") return BackendKind::kCuda;
  return MakeError(ErrorCode::kInvalidArgument, "--backend '{}': use auto, cpu or cuda", text);
}

}  // namespace kiln::cli
