// Calibration data in the ONNX test-data layout: the data sets of a directory, read and checked
// against the model's inputs and the build's profile before anything runs on them.
#include "kiln/onnx/calibration_data.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <string_view>
#include <utility>

#include "kiln/onnx/onnx_import.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {
// The number after `prefix` in a file or directory name ("input_12.pb" -> 12), or -1.
int64_t IndexAfter(const std::string& name, std::string_view prefix, std::string_view suffix) {
  if (!name.starts_with(prefix) || !name.ends_with(suffix)) return -1;
  std::string_view digits(name);
  digits = digits.substr(prefix.size(), digits.size() - prefix.size() - suffix.size());
  int64_t v = -1;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || p != digits.data() + digits.size()) return -1;
  return v;
}

std::string DimsString(std::span<const int64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ","));
}
}  // namespace

StatusOr<std::vector<std::map<std::string, Tensor>>> LoadCalibrationData(
    const Graph& graph, const OptimizationProfile& profile, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return MakeError(ErrorCode::kCalibrationInputInvalid,
                     "--calib-dir '{}' is not a directory; give a directory holding "
                     "test_data_set_*/input_*.pb (the ONNX test-data layout)",
                     dir);
  }
  std::vector<std::pair<int64_t, fs::path>> sets;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t idx = IndexAfter(e.path().filename().string(), "test_data_set_", "");
    if (e.is_directory() && idx >= 0) sets.emplace_back(idx, e.path());
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) {
    return MakeError(ErrorCode::kCalibrationInputInvalid,
                     "--calib-dir '{}' holds no test_data_set_* directory; write each "
                     "calibration batch as test_data_set_N/input_I.pb (TensorProto per input)",
                     dir);
  }
  const auto& inputs = graph.inputs();
  std::vector<std::map<std::string, Tensor>> out;
  for (const auto& [set_index, set_dir] : sets) {
    std::vector<std::pair<int64_t, fs::path>> files;
    for (const auto& e : fs::directory_iterator(set_dir, ec)) {
      int64_t idx = IndexAfter(e.path().filename().string(), "input_", ".pb");
      if (e.is_regular_file() && idx >= 0) files.emplace_back(idx, e.path());
    }
    std::sort(files.begin(), files.end());
    if (files.size() != inputs.size()) {
      std::vector<std::string> names;
      for (const Value* v : inputs) names.push_back(v->name());
      return MakeError(ErrorCode::kCalibrationInputInvalid,
                       "calibration data set '{}' has {} input file(s); the model has {} "
                       "input(s) ({}), expected input_0.pb .. input_{}.pb",
                       set_dir.string(), files.size(), inputs.size(), fmt::join(names, ", "),
                       static_cast<int64_t>(inputs.size()) - 1);
    }
    std::map<std::string, Tensor> feed;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Value* in = inputs[i];
      const std::string path = files[i].second.string();
      KILN_ASSIGN_OR_RETURN(Tensor t, LoadTensorProto(path));
      if (t.dtype() != in->dtype()) {
        return MakeError(ErrorCode::kCalibrationInputInvalid,
                         "calibration input '{}' for model input '{}': expected dtype {}, got {}",
                         path, in->name(), ToString(in->dtype()), ToString(t.dtype()));
      }
      const Shape& shape = in->shape();
      const InputProfile* p = profile.Find(in->name());
      bool ok = t.dims().size() == shape.size();
      for (size_t d = 0; ok && d < shape.size(); ++d) {
        if (shape[d].is_static()) {
          ok = t.dims()[d] == shape[d].value();
        } else if (p && d < p->min.size()) {
          ok = t.dims()[d] >= p->min[d] && t.dims()[d] <= p->max[d];
        }
      }
      if (!ok) {
        std::string expected = ToString(shape);
        if (p) {
          expected +=
              fmt::format(" within the profile {}..{}", DimsString(p->min), DimsString(p->max));
        }
        return MakeError(ErrorCode::kCalibrationInputInvalid,
                         "calibration input '{}' for model input '{}': expected shape {}, got {}",
                         path, in->name(), expected, DimsString(t.dims()));
      }
      feed[in->name()] = std::move(t);
    }
    out.push_back(std::move(feed));
  }
  return out;
}

}  // namespace kiln
