// The calibration cache: a versioned JSON file keyed on the model, the optimized graph and the
// method. A cache that fails any check is reported (KILN-E3006) and never trusted.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/core/file_io.h"
#include "kiln/precision/calibration.h"

namespace kiln::precision {

using kiln::ToString;

namespace {
constexpr std::string_view kFormat = "kiln-calibration-cache";
// 2: adds the INT8 sensitivity ("int8_sensitivity", "int8_all_rel_l2"); a version 1 cache has
// none, so it is recalibrated rather than giving engines that differ from a fresh build's.
constexpr int64_t kVersion = 2;
// A cache holds two numbers per tensor; far below this bound even for the largest models.
constexpr uint64_t kMaxCacheBytes = uint64_t{64} << 20;

Status Invalid(const std::string& path, const std::string& why) {
  return MakeError(ErrorCode::kCalibrationCacheInvalid,
                   "calibration cache '{}' {}; it is ignored and the model is calibrated again",
                   path, why);
}
}  // namespace

std::string CalibrationCacheKey(const std::string& model_hash, const Graph& graph,
                                CalibrationMethod method, double percentile) {
  Hasher h;
  h.Field("kiln-calibration-key-v1").Field(model_hash).Field(ToString(method));
  h.Field(static_cast<int64_t>(std::llround(percentile * 1e6)));
  // The optimized graph's values (passes may rename or drop them): name, dtype, rank and dims.
  std::vector<std::string> lines;
  for (const Value* v : graph.values()) {
    lines.push_back(fmt::format("{}:{}:{}", v->name(), ToString(v->dtype()), ToString(v->shape())));
  }
  std::sort(lines.begin(), lines.end());
  for (const std::string& l : lines) h.Field(l);
  return h.Digest().Hex();
}

StatusOr<CalibrationTable> LoadCalibrationCache(const std::string& path, const std::string& key) {
  StatusOr<std::string> text = ReadInputFile(path, "calibration cache", kMaxCacheBytes);
  if (!text.ok()) {
    if (IsWrongFileKind(text.status())) return text.status();  // not a stale cache: a wrong path
    return Invalid(path, fmt::format("cannot be read ({})", text.status().message()));
  }
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(path, "is not JSON (corrupt)");
  if (j.value("format", "") != kFormat) return Invalid(path, "is not a kiln calibration cache");
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int64_t>() != kVersion) {
    return Invalid(path, fmt::format("has another format version (this kiln reads {})", kVersion));
  }
  if (j.value("key", "") != key) {
    return Invalid(path, "belongs to another model, graph or calibration method (its key differs)");
  }
  CalibrationTable table;
  table.from_cache = true;
  auto method = ParseCalibrationMethod(j.value("method", ""));
  if (!method.ok()) return Invalid(path, "names no valid method");
  table.method = *method;
  table.percentile = j.value("percentile", 99.99);
  table.data_sets = j.value("data_sets", int64_t{0});
  if (!j.contains("tensors") || !j["tensors"].is_object()) return Invalid(path, "has no tensors");
  for (const auto& [name, entry] : j["tensors"].items()) {
    if (!entry.is_object() || !entry.contains("absmax") || !entry.contains("amax") ||
        !entry["absmax"].is_number() || !entry["amax"].is_number()) {
      return Invalid(path, fmt::format("has a malformed entry for '{}'", name));
    }
    TensorRange r{entry["absmax"].get<double>(), entry["amax"].get<double>()};
    if (!std::isfinite(r.absmax) || !std::isfinite(r.amax) || r.absmax < 0 || r.amax < 0 ||
        r.amax > r.absmax * (1 + 1e-9)) {
      return Invalid(path, fmt::format("has an impossible range for '{}' (absmax {}, amax {})",
                                       name, r.absmax, r.amax));
    }
    table.ranges[name] = r;
  }
  if (!j.contains("int8_sensitivity") || !j["int8_sensitivity"].is_object() ||
      !j.contains("int8_all_rel_l2") || !j["int8_all_rel_l2"].is_number()) {
    return Invalid(path, "has no INT8 sensitivity");
  }
  auto read = [&](const nlohmann::json& from, std::map<std::string, double>& to) -> Status {
    for (const auto& [name, s] : from.items()) {
      // +inf (a layer whose quantized output is not finite) is stored as the string "inf".
      double v = s.is_number() ? s.get<double>() : (s == "inf" ? HUGE_VAL : -1.0);
      if (!(v >= 0))
        return Invalid(path, fmt::format("has an impossible sensitivity for '{}'", name));
      to[name] = v;
    }
    return OkStatus();
  };
  KILN_RETURN_IF_ERROR(read(j["int8_sensitivity"], table.int8_sensitivity));
  table.int8_all_rel_l2 = j["int8_all_rel_l2"].get<double>();
  // The FP8 sensitivity is there when it was measured (its builds' key says so).
  if (j.contains("fp8_sensitivity")) {
    if (!j["fp8_sensitivity"].is_object() || !j.contains("fp8_all_rel_l2") ||
        !j["fp8_all_rel_l2"].is_number()) {
      return Invalid(path, "has an FP8 sensitivity without its figures");
    }
    KILN_RETURN_IF_ERROR(read(j["fp8_sensitivity"], table.fp8_sensitivity));
    table.fp8_all_rel_l2 = j["fp8_all_rel_l2"].get<double>();
  }
  return table;
}

Status SaveCalibrationCache(const std::string& path, const std::string& key,
                            const CalibrationTable& table) {
  nlohmann::json j;
  j["format"] = std::string(kFormat);
  j["version"] = kVersion;
  j["key"] = key;
  j["method"] = std::string(ToString(table.method));
  j["percentile"] = table.percentile;
  j["data_sets"] = table.data_sets;
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, r] : table.ranges)
    tensors[name] = {{"absmax", r.absmax}, {"amax", r.amax}};
  j["tensors"] = std::move(tensors);
  auto write = [](const std::map<std::string, double>& from) {
    nlohmann::json to = nlohmann::json::object();
    for (const auto& [name, v] : from) {
      to[name] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("inf");
    }
    return to;
  };
  j["int8_sensitivity"] = write(table.int8_sensitivity);
  j["int8_all_rel_l2"] = std::isfinite(table.int8_all_rel_l2) ? table.int8_all_rel_l2 : 1e300;
  if (!table.fp8_sensitivity.empty() || table.fp8_all_rel_l2 >= 0) {
    j["fp8_sensitivity"] = write(table.fp8_sensitivity);
    j["fp8_all_rel_l2"] = std::isfinite(table.fp8_all_rel_l2) ? table.fp8_all_rel_l2 : 1e300;
  }
  // Atomic replace: a reader sees the old file or the new one, never half of one. It may replace
  // the stale cache this build read.
  AtomicOutput::Options rewrite;
  rewrite.replaces_input = true;
  return WriteFileAtomic(path, "calibration cache", j.dump(1) + "\n", rewrite);
}

}  // namespace kiln::precision
