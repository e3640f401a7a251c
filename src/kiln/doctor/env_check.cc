// Environment variable checks (see env_check.h); the facts live in data/doctor/known_problems.json.
#include "kiln/doctor/env_check.h"

#include <charconv>
#include <cmath>

namespace kiln::doctor {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

Finding FromRule(const EnvRule& r, Severity severity, std::string what, std::string why) {
  return Finding{severity, "env." + r.name, std::move(what), std::move(why), r.todo};
}

}  // namespace

double IbTimeoutSeconds(int n) { return 4.096e-6 * std::ldexp(1.0, n); }

std::string FormatDuration(double s) {
  if (s < 1e-3) return fmt::format("{:.0f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.0f} ms", s * 1e3);
  if (s < 10) return fmt::format("{:.1f} s", s);
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.0f} min", s / 60);
  if (s < 172800) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} days", s / 86400);
}

std::vector<std::string> SocketIfnameMatches(std::string_view spec,
                                             const std::vector<std::string>& interfaces) {
  spec = Trim(spec);
  bool exclude = false, exact = false;
  if (!spec.empty() && spec.front() == '^') {
    exclude = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    exact = true;
    spec.remove_prefix(1);
  }
  std::vector<std::string_view> items;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = Trim(spec.substr(0, comma));
    if (!item.empty()) items.push_back(item);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  std::vector<std::string> out;
  for (const std::string& iface : interfaces) {
    bool hit = false;
    for (std::string_view item : items) {
      if (exact ? iface == item : std::string_view(iface).starts_with(item)) hit = true;
    }
    // With an exclude list NCCL still skips loopback unless it is named.
    if (exclude ? (!hit && iface != "lo") : hit) out.push_back(iface);
  }
  return out;
}

std::vector<Finding> CheckEnvVar(const KnownProblems& kp, std::string_view name,
                                 std::string_view raw_value,
                                 const std::vector<std::string>* interfaces,
                                 std::vector<const EnvRule*>* rules) {
  std::string_view value = Trim(raw_value);
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
      value.back() == value.front()) {
    value = value.substr(1, value.size() - 2);
  }
  std::vector<Finding> out;
  auto add = [&](Finding f, const EnvRule& r) {
    out.push_back(std::move(f));
    if (rules) rules->push_back(&r);
  };
  for (const EnvRule& r : kp.environment()) {
    if (r.name != name) continue;
    if (r.kind == "nonexistent") {
      add(FromRule(r, r.severity, fmt::format("{} (set to '{}')", r.what, value), r.why), r);
    } else if (r.kind == "slow_when") {
      if (value == r.value) add(FromRule(r, r.severity, r.what, r.why), r);
    } else if (r.kind == "deprecated") {
      add(FromRule(r, r.severity, r.what, r.why), r);
    } else if (r.kind == "enum") {
      std::string upper;
      for (char c : value) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (std::find(r.allowed.begin(), r.allowed.end(), upper) == r.allowed.end())
        add(FromRule(r, r.severity, fmt::format("{} ('{}')", r.what, value), r.why), r);
    } else if (r.kind == "exponent_ib_timeout") {
      int n = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || p != value.data() + value.size() || n < 1 || n > 31) {
        add(FromRule(r, Severity::kError,
                     fmt::format("{}={} is not a valid exponent (1..31)", r.name, value), r.why),
            r);
        continue;
      }
      double secs = IbTimeoutSeconds(n);
      std::string what =
          fmt::format("{}={} means {} per InfiniBand retry (4.096 us x 2^{}), not {} s", r.name, n,
                      FormatDuration(secs), n, n);
      if (n >= r.warn_at_least) {
        add(FromRule(r, r.severity, std::move(what),
                     fmt::format("{}; with the default 7 retries a dead peer or link is noticed "
                                 "only after about {}",
                                 r.why, FormatDuration(secs * 8))),
            r);
      } else {
        add(FromRule(r, Severity::kInfo, std::move(what), "default 20 is about 4.3 s"), r);
      }
    } else if (r.kind == "socket_ifname") {
      if (!interfaces) continue;
      std::vector<std::string> hit = SocketIfnameMatches(value, *interfaces);
      std::string have;
      for (const auto& i : *interfaces) have += (have.empty() ? "" : ", ") + i;
      if (hit.empty()) {
        add(FromRule(r, r.severity,
                     fmt::format("{}: '{}' (this host has: {})", r.what, value, have), r.why),
            r);
      } else {
        std::string used;
        for (const auto& i : hit) used += (used.empty() ? "" : ", ") + i;
        add(Finding{Severity::kInfo, "env." + r.name,
                    fmt::format("NCCL_SOCKET_IFNAME='{}' selects: {}", value, used), "", ""},
            r);
      }
    }
  }
  return out;
}

std::vector<Finding> CheckEnvironment(const KnownProblems& kp,
                                      const std::map<std::string, std::string>& env,
                                      const std::vector<std::string>* interfaces) {
  std::vector<Finding> out;
  for (const auto& [name, value] : env) {
    for (Finding& f : CheckEnvVar(kp, name, value, interfaces)) out.push_back(std::move(f));
  }
  return out;
}

}  // namespace kiln::doctor
