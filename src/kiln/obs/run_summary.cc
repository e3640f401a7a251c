// RunSummary formatting. Units are chosen per value for people; JSON keeps base units.
#include "kiln/obs/run_summary.h"

#include <nlohmann/json.hpp>

#include <array>
#include <optional>

namespace kiln::obs {
namespace {

constexpr std::string_view kNotMeasured = "not measured";

std::string Seconds(std::optional<double> s) {
  if (!s) return std::string(kNotMeasured);
  if (*s < 1e-3) return fmt::format("{:.1f} us", *s * 1e6);
  if (*s < 1.0) return fmt::format("{:.3f} ms", *s * 1e3);
  return fmt::format("{:.3f} s", *s);
}

std::string Bytes(std::optional<uint64_t> b) {
  if (!b) return std::string(kNotMeasured);
  double v = static_cast<double>(*b);
  if (v >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  if (v >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
  return fmt::format("{} B", *b);
}

struct Row {
  std::string_view name;
  std::string value;
  std::optional<double> raw;
};

std::array<Row, 4> Rows(const RunFigures& f) {
  auto raw_bytes = f.device_memory_peak_bytes
                       ? std::optional<double>(static_cast<double>(*f.device_memory_peak_bytes))
                       : std::nullopt;
  return {Row{"engine build time", Seconds(f.engine_build_seconds), f.engine_build_seconds},
          Row{"max kernel time", Seconds(f.kernel_max_seconds), f.kernel_max_seconds},
          Row{"NCCL init latency", Seconds(f.nccl_init_seconds), f.nccl_init_seconds},
          Row{"peak GPU memory", Bytes(f.device_memory_peak_bytes), raw_bytes}};
}

template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

RunSummary RunSummary::FromMetrics(const KilnMetrics& metrics) {
  return RunSummary{metrics.Figures()};
}

std::string RunSummary::ToTable() const {
  std::string out = fmt::format("{:<20} {}\n", "metric", "value");
  for (const Row& r : Rows(figures)) out += fmt::format("{:<20} {}\n", r.name, r.value);
  return out;
}

std::string RunSummary::ToJson() const {
  nlohmann::json j;
  j["engine_build_seconds"] = OrNull(figures.engine_build_seconds);
  j["kernel_max_seconds"] = OrNull(figures.kernel_max_seconds);
  j["nccl_init_seconds"] = OrNull(figures.nccl_init_seconds);
  j["device_memory_peak_bytes"] = OrNull(figures.device_memory_peak_bytes);
  return j.dump(2);
}

StatusOr<RunSummary> RunSummary::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, "run summary is not a JSON object");
  }
  RunSummary s;
  auto seconds = [&](const char* key, std::optional<double>* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    if (!j[key].is_number() || j[key].get<double>() < 0) {
      return MakeError(ErrorCode::kInvalidArgument, "run summary field '{}' is not a number >= 0",
                       key);
    }
    *out = j[key].get<double>();
    return OkStatus();
  };
  KILN_RETURN_IF_ERROR(seconds("engine_build_seconds", &s.figures.engine_build_seconds));
  KILN_RETURN_IF_ERROR(seconds("kernel_max_seconds", &s.figures.kernel_max_seconds));
  KILN_RETURN_IF_ERROR(seconds("nccl_init_seconds", &s.figures.nccl_init_seconds));
  if (j.contains("device_memory_peak_bytes") && !j["device_memory_peak_bytes"].is_null()) {
    if (!j["device_memory_peak_bytes"].is_number_unsigned()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "run summary field 'device_memory_peak_bytes' is not a byte count");
    }
    s.figures.device_memory_peak_bytes = j["device_memory_peak_bytes"].get<uint64_t>();
  }
  return s;
}

std::string RunSummary::CompareTable(const RunSummary& before, const RunSummary& after) {
  auto b = Rows(before.figures);
  auto a = Rows(after.figures);
  std::string out =
      fmt::format("{:<20} {:<16} {:<16} {}\n", "metric", "before", "after", "after/before");
  for (size_t i = 0; i < b.size(); ++i) {
    std::string ratio = "-";
    if (b[i].raw && a[i].raw && *b[i].raw > 0)
      ratio = fmt::format("{:.2f}x", *a[i].raw / *b[i].raw);
    out += fmt::format("{:<20} {:<16} {:<16} {}\n", b[i].name, b[i].value, a[i].value, ratio);
  }
  return out;
}

}  // namespace kiln::obs
