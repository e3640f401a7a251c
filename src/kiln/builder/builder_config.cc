// Parsing of build options and the config hash.
#include "kiln/builder/builder_config.h"

#include <algorithm>

#include <charconv>
#include <cmath>
#include <limits>

#include "kiln/ir/sizes.h"

namespace kiln {

namespace {
bool ParseInt(std::string_view s, int64_t* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

StatusOr<std::vector<int64_t>> ParseDims(std::string_view s, const std::string& whole) {
  std::vector<int64_t> dims;
  // A shape ends with a dimension: "1x8x" would otherwise pass for "1x8".
  if (!s.empty() && s.back() == 'x') {
    return MakeError(ErrorCode::kInvalidProfile,
                     "'{}' is not a valid shape in --profile '{}' (write dims as 8x3x224x224)",
                     std::string(s), whole);
  }
  while (!s.empty()) {
    size_t x = s.find('x');
    int64_t d;
    if (!ParseInt(s.substr(0, x), &d) || d < 0) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "'{}' is not a valid shape in --profile '{}' (write dims as 8x3x224x224)",
                       std::string(s), whole);
    }
    dims.push_back(d);
    s = x == std::string_view::npos ? std::string_view() : s.substr(x + 1);
  }
  return dims;
}
}  // namespace

StatusOr<MemoryBudget> MemoryBudget::Parse(const std::string& text) {
  MemoryBudget b;
  if (text.empty()) return b;
  if (text.find('.') != std::string::npos) {
    double f = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), f);
    if (ec != std::errc() || p != text.data() + text.size() || !(f > 0 && f <= 1)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "--memory-budget '{}': a fraction must be in (0, 1], e.g. 0.5", text);
    }
    b.fraction = f;
    return b;
  }
  int64_t scale = 1;
  std::string num = text;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    scale = last == 'K' ? 1LL << 10 : last == 'M' ? 1LL << 20 : last == 'G' ? 1LL << 30 : 1LL << 40;
    num.pop_back();
  }
  int64_t v;
  if (!ParseInt(num, &v) || v <= 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--memory-budget '{}' is not a size (512M, 8G, bytes) or a fraction (0.5)",
                     text);
  }
  auto bytes = CheckedMul(v, scale);
  if (!bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--memory-budget '{}' does not fit in 64 bits; give at most {}T", text,
                     std::numeric_limits<int64_t>::max() >> 40);
  }
  b.bytes = *bytes;
  return b;
}

std::string MemoryBudget::ToString() const {
  if (bytes) return fmt::format("{} bytes", *bytes);
  if (fraction) return fmt::format("{} of free memory / {} rank(s)", *fraction, ranks_per_device);
  return "unlimited";
}

Status ParseShapeValuesSpec(const std::string& spec, OptimizationProfile* profile) {
  const size_t colon = spec.rfind(':');
  auto bad = [&] {
    return MakeError(
        ErrorCode::kInvalidProfile,
        "--shape-values '{}' needs the form NAME:V1,V2,... (numbers, e.g. shape:2,-1 or "
        "scales:1,1,0.5,0.5)",
        spec);
  };
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size()) return bad();
  ShapeInputValues v;
  v.input = spec.substr(0, colon);
  bool is_float = false;
  std::string_view rest(spec);
  rest.remove_prefix(colon + 1);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (item.empty()) return bad();
    int64_t x = 0;
    double f = 0;
    const char* last = item.data() + item.size();
    if (auto [end, ec] = std::from_chars(item.data(), last, x); ec == std::errc() && end == last) {
      v.values.push_back(x);
      v.float_values.push_back(static_cast<double>(x));
    } else if (auto [fend, fec] = std::from_chars(item.data(), last, f);
               fec == std::errc() && fend == last && std::isfinite(f)) {
      is_float = true;
      v.float_values.push_back(f);
    } else {
      return bad();
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  // All integers: `values` (ApplyShapeValues moves them for a floating-point input); any other
  // number: `float_values`.
  if (is_float) {
    v.values.clear();
  } else {
    v.float_values.clear();
  }
  if (profile->FindShapeValues(v.input)) {
    return MakeError(ErrorCode::kInvalidProfile, "--shape-values gives '{}' twice", v.input);
  }
  profile->shape_values.push_back(std::move(v));
  return OkStatus();
}

Status ParseProfileSpec(const std::string& spec, OptimizationProfile* profile) {
  size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return MakeError(ErrorCode::kInvalidProfile,
                     "--profile '{}' needs the form NAME:MIN,OPT,MAX (e.g. "
                     "input:1x3x224x224,8x3x224x224,32x3x224x224)",
                     spec);
  }
  InputProfile p;
  p.input = spec.substr(0, colon);
  std::string_view rest(spec);
  rest.remove_prefix(colon + 1);
  std::vector<std::vector<int64_t>> shapes;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    KILN_ASSIGN_OR_RETURN(auto dims, ParseDims(rest.substr(0, comma), spec));
    shapes.push_back(std::move(dims));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  if (shapes.size() == 1) shapes = {shapes[0], shapes[0], shapes[0]};
  if (shapes.size() != 3) {
    return MakeError(ErrorCode::kInvalidProfile,
                     "--profile '{}' needs three shapes MIN,OPT,MAX (or one)", spec);
  }
  p.min = shapes[0];
  p.opt = shapes[1];
  p.max = shapes[2];
  for (auto& existing : profile->inputs) {
    if (existing.input == p.input) {
      existing = p;
      return OkStatus();
    }
  }
  profile->inputs.push_back(std::move(p));
  return OkStatus();
}

Status ParseCalibrationMethodSpec(const std::string& text, double percentile,
                                  BuilderConfig* config) {
  std::string name = text;
  if (size_t eq = text.find('='); eq != std::string::npos) {
    name = text.substr(0, eq);
    std::string num = text.substr(eq + 1);
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), percentile);
    if (name != "percentile" || ec != std::errc() || p != num.data() + num.size()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "--calib-method '{}': only the percentile method takes a value, written "
                       "percentile=99.99",
                       text);
    }
  }
  KILN_ASSIGN_OR_RETURN(config->calibration_method, precision::ParseCalibrationMethod(name));
  if (!(percentile > 0 && percentile <= 100)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "calibration percentile {} must be in (0, 100] (e.g. 99.99)", percentile);
  }
  config->calibration_percentile = percentile;
  return OkStatus();
}

StatusOr<std::chrono::milliseconds> ParseDuration(const std::string& text) {
  std::string num = text;
  double scale_ms = 1000;
  if (text.ends_with("ms")) {
    scale_ms = 1;
    num = text.substr(0, text.size() - 2);
  } else if (!text.empty() && std::isalpha(static_cast<unsigned char>(text.back()))) {
    char u = text.back();
    scale_ms = u == 's' ? 1000 : u == 'm' ? 60000 : u == 'h' ? 3600000 : -1;
    num = text.substr(0, text.size() - 1);
  }
  double v = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (scale_ms < 0 || num.empty() || ec != std::errc() || p != num.data() + num.size()) {
    return MakeError(ErrorCode::kInvalidDeadline, "'{}' is not a duration (use 30s, 1500ms, 5m)",
                     text);
  }
  if (!(v > 0) || !std::isfinite(v) || v * scale_ms > 1e15) {
    return MakeError(ErrorCode::kInvalidDeadline, "duration '{}' must be positive and finite",
                     text);
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(v * scale_ms)));
}

int TacticsPerProvider(int opt_level) {
  switch (opt_level) {
    case 0:
    case 1:
      return 1;
    case 2:
      return 2;
    case 3:
      return 4;
    case 4:
      return 8;
    default:
      return 0;
  }
}

Hash128 BuilderConfig::Hash() const {
  Hasher h;
  h.Field("kiln-build-config-v1");
  h.Field(static_cast<int64_t>(backend)).Field(fp16).Field(bf16).Field(int8).Field(optimize);
  // Only hashed when off, so that every existing config keeps its hash (and cached engines).
  if (!search_tactics) h.Field("heuristic-tactics-only");
  if (opt_level != kDefaultOptLevel) h.Field("opt-level").Field(static_cast<int64_t>(opt_level));
  // Only hashed when some are, so that every existing config keeps its hash.
  if (!disabled_passes.empty()) {
    std::vector<std::string> sorted = disabled_passes;
    std::sort(sorted.begin(), sorted.end());
    h.Field("disabled-passes").Field(static_cast<int64_t>(sorted.size()));
    for (const std::string& n : sorted) h.Field(n);
  }
  if (stem_space_to_depth) h.Field("stem-space-to-depth").Field(*stem_space_to_depth);
  for (const auto& p : profile.inputs) {
    h.Field(p.input);
    for (const auto* v : {&p.min, &p.opt, &p.max}) {
      h.Field(static_cast<int64_t>(v->size()));
      for (int64_t d : *v) h.Field(d);
    }
  }
  // Only when given, so that other configs keep their hashes.
  for (const auto& v : profile.shape_values) {
    h.Field("shape-values").Field(v.input).Field(static_cast<int64_t>(v.values.size()));
    for (int64_t x : v.values) h.Field(x);
    if (!v.float_values.empty()) {  // only then: integer shape values keep their hashes
      h.Field("float").Field(static_cast<int64_t>(v.float_values.size()));
      for (double x : v.float_values) h.Field(fmt::format("{:.17g}", x));
    }
  }
  if (shape_arena_bytes > 0) h.Field("shape-arena").Field(shape_arena_bytes);
  h.Field(memory_budget.ToString());
  h.Field(max_kernel_time_ms ? static_cast<int64_t>(*max_kernel_time_ms * 1e6) : -1);
  h.Field("calibration").Field(calibration_dir).Field(precision::ToString(calibration_method));
  h.Field(static_cast<int64_t>(std::llround(calibration_percentile * 1e6)));
  h.Field(calibration_cache_path);
  // Only the non-default: builds that calibrate where they always did keep their hashes.
  if (!calibrate_on_backend) h.Field("calib-on-cpu");
  // Only INT8 builds read it, so other configs keep their hashes.
  if (int8) h.Field("int8-tolerance").Field(fmt::format("{:.9g}", int8_tolerance));
  if (fp8) h.Field("fp8");  // only when on: other configs keep their hashes
  if (fp8) h.Field("fp8-tolerance").Field(fmt::format("{:.9g}", fp8_tolerance));
  if (fp8 && !fp8_edges) h.Field("no-fp8-edges");
  if (int8 && !int8_edges) h.Field("no-int8-edges");
  // Only when set: configs that leave it to the backend keep their hashes.
  if (quantized_if_faster)
    h.Field("quantized-if-faster").Field(int64_t{*quantized_if_faster ? 1 : 0});
  return h.Digest();
}

}  // namespace kiln
