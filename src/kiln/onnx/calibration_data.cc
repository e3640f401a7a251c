// Calibration data in the ONNX test-data layout: the data sets of a directory, read and checked
// against the model's inputs and the build's profile before anything runs on them.
#include "kiln/onnx/calibration_data.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
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

// The numbered entries of `dir` (directories or regular files) named prefix<N>suffix, by N.
std::vector<std::pair<int64_t, fs::path>> Numbered(const fs::path& dir, std::string_view prefix,
                                                   std::string_view suffix, bool directories) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t idx = IndexAfter(e.path().filename().string(), prefix, suffix);
    if (idx >= 0 && (directories ? e.is_directory() : e.is_regular_file())) {
      out.emplace_back(idx, e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The data sets of `dir`: test_data_set_N directories, by N.
std::vector<std::pair<int64_t, fs::path>> DataSets(const std::string& dir) {
  return Numbered(dir, "test_data_set_", "", true);
}

// A data set's input_I.pb files, by I.
std::vector<std::pair<int64_t, fs::path>> InputFiles(const fs::path& set_dir) {
  return Numbered(set_dir, "input_", ".pb", false);
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
  const std::vector<std::pair<int64_t, fs::path>> sets = DataSets(dir);
  if (sets.empty()) {
    return MakeError(ErrorCode::kCalibrationInputInvalid,
                     "--calib-dir '{}' holds no test_data_set_* directory; write each "
                     "calibration batch as test_data_set_N/input_I.pb (TensorProto per input)",
                     dir);
  }
  const auto& inputs = graph.inputs();
  std::vector<std::map<std::string, Tensor>> out;
  for (const auto& [set_index, set_dir] : sets) {
    const std::vector<std::pair<int64_t, fs::path>> files = InputFiles(set_dir);
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

std::optional<Hash128> CalibrationDataDigest(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  const std::vector<std::pair<int64_t, fs::path>> sets = DataSets(dir);
  if (sets.empty()) return std::nullopt;
  Hasher h;
  h.Field("kiln-calibration-data-v1").Field(static_cast<int64_t>(sets.size()));
  std::vector<char> chunk(1 << 20);
  for (const auto& [set_index, set_dir] : sets) {
    const std::vector<std::pair<int64_t, fs::path>> files = InputFiles(set_dir);
    h.Field(set_index).Field(static_cast<int64_t>(files.size()));
    for (const auto& [input_index, path] : files) {
      std::ifstream f(path, std::ios::binary);
      if (!f) return std::nullopt;
      h.Field(input_index);
      int64_t size = 0;
      while (f) {
        f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        const auto n = static_cast<size_t>(f.gcount());
        h.Update(std::as_bytes(std::span(chunk.data(), n)));
        size += static_cast<int64_t>(n);
      }
      if (f.bad()) return std::nullopt;
      h.Field(size);  // ends the file: ("ab","c") and ("a","bc") differ
    }
  }
  return h.Digest();
}

}  // namespace kiln
