// One conformance case end to end, with the failure stage recorded so reports group failures.
#include "kiln/app/conformance.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <fmt/ranges.h>

#include "kiln/app/pipeline.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"

namespace kiln::app {

namespace fs = std::filesystem;

namespace {
// Integer inputs of at most this many elements may be shape inputs (a shape, pads, axes).
constexpr int64_t kMaxShapeInputElements = 64;
// The activation arena a case's engine may re-plan in for other shape input values.
constexpr int64_t kConformanceShapeArenaBytes = int64_t{16} << 20;

struct DataSet {
  std::vector<Tensor> inputs, outputs;
};

StatusOr<std::vector<DataSet>> LoadDataSets(const fs::path& dir) {
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().starts_with("test_data_set_")) {
      sets.push_back(e.path());
    }
  }
  std::sort(sets.begin(), sets.end());
  std::vector<DataSet> out;
  for (const fs::path& s : sets) {
    DataSet ds;
    for (int i = 0;; ++i) {
      fs::path p = s / fmt::format("input_{}.pb", i);
      if (!fs::exists(p)) break;
      KILN_ASSIGN_OR_RETURN(Tensor t, LoadTensorProto(p.string()));
      ds.inputs.push_back(std::move(t));
    }
    for (int i = 0;; ++i) {
      fs::path p = s / fmt::format("output_{}.pb", i);
      if (!fs::exists(p)) break;
      KILN_ASSIGN_OR_RETURN(Tensor t, LoadTensorProto(p.string()));
      ds.outputs.push_back(std::move(t));
    }
    out.push_back(std::move(ds));
  }
  if (out.empty())
    return MakeError(ErrorCode::kNotFound, "no test_data_set_* in '{}'", dir.string());
  return out;
}

CaseResult Fail(CaseResult r, std::string stage, const Status& s) {
  r.passed = false;
  r.stage = std::move(stage);
  r.error = s.ToString();
  r.error_code = s.Id();
  return r;
}
}  // namespace

std::vector<std::string> FindConformanceCases(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::exists(fs::path(root) / "model.onnx", ec)) return {root};
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory() && fs::exists(e.path() / "model.onnx")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

CaseResult RunConformanceCase(const std::string& dir, const ConformanceOptions& options) {
  auto start = std::chrono::steady_clock::now();
  CaseResult r;
  r.name = fs::path(dir).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  auto finish = [&](CaseResult res) {
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return res;
  };

  auto sets = LoadDataSets(dir);
  if (!sets.ok()) return finish(Fail(r, "import", sets.status()));
  r.data_sets = static_cast<int>(sets->size());
  auto graph = ImportOnnxFile((fs::path(dir) / "model.onnx").string());
  if (!graph.ok()) return finish(Fail(r, "import", graph.status()));

  // Profile: the envelope of the data sets' shapes for each dynamic input.
  BuilderConfig config;
  config.backend = options.backend;
  config.fp16 = options.fp16;
  config.bf16 = options.bf16;
  config.optimize = options.optimize;
  config.disabled_passes = options.disabled_passes;
  if (options.int8) {
    // INT8 calibrates on the case's own data sets (test_data_set_*): the same inputs it is then
    // judged on, so the figure is the quantization error, not a generalisation estimate.
    config.int8 = true;
    config.calibration_dir = dir;
    config.calibration_method = options.calibration_method;
    config.int8_tolerance = options.int8_tolerance;
  }
  const auto& inputs = (*graph)->inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (IsStatic(inputs[i]->shape())) continue;
    InputProfile p;
    p.input = inputs[i]->name();
    for (const DataSet& ds : *sets) {
      if (i >= ds.inputs.size()) continue;
      const auto& dims = ds.inputs[i].dims();
      if (p.min.empty()) {
        p.min = p.max = dims;
      } else if (dims.size() == p.min.size()) {
        for (size_t k = 0; k < dims.size(); ++k) {
          p.min[k] = std::min(p.min[k], dims[k]);
          p.max[k] = std::max(p.max[k], dims[k]);
        }
      }
    }
    p.opt = p.max;
    if (!p.min.empty()) config.profile.inputs.push_back(std::move(p));
  }
  // Shape inputs: small integer and floating-point inputs are offered with data set 0's values
  // (the builder keeps those a shape rule reads: Reshape's shape, Slice's starts, Resize's
  // scales, Range's bounds...); other data sets' values re-specialize the context, within an
  // arena of kConformanceShapeArenaBytes.
  for (size_t i = 0; i < inputs.size() && i < (*sets)[0].inputs.size(); ++i) {
    const Tensor& t = (*sets)[0].inputs[i];
    const DataType dtype = inputs[i]->dtype();
    if (!(IsInteger(dtype) || IsFloatingPoint(dtype)) || !IsStatic(inputs[i]->shape()) ||
        t.dims().size() > 1 || t.num_elements() < 1 || t.num_elements() > kMaxShapeInputElements) {
      continue;
    }
    ShapeInputValues sv{inputs[i]->name(), {}, {}};
    if (IsInteger(dtype)) {
      sv.values = t.ToInt64Vector();
    } else {
      for (int64_t k = 0; k < t.num_elements(); ++k) sv.float_values.push_back(t.GetDouble(k));
    }
    config.profile.shape_values.push_back(std::move(sv));
  }
  config.shape_arena_bytes = kConformanceShapeArenaBytes;
  std::vector<std::string> input_names, output_names;
  for (const Value* v : inputs) input_names.push_back(v->name());
  for (const Value* v : (*graph)->outputs()) output_names.push_back(v->name());

  BuildReport report;
  auto desc = BuildEngine({std::move(*graph), r.name, HashString(dir)}, config, &report);
  if (!desc.ok()) return finish(Fail(r, "build", desc.status()));
  // Through the file format, as a user's engine would go.
  auto bytes = SerializeEngine(**desc);
  if (!bytes.ok()) return finish(Fail(r, "load", bytes.status()));
  auto runtime = Runtime::Create(options.backend);
  if (!runtime.ok()) return finish(Fail(r, "load", runtime.status()));
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  if (!engine.ok()) return finish(Fail(r, "load", engine.status()));
  auto runner = HostRunner::Create(*engine);
  if (!runner.ok()) return finish(Fail(r, "load", runner.status()));

  r.stage = "ok";
  r.passed = true;
  for (size_t s = 0; s < sets->size(); ++s) {
    const DataSet& ds = (*sets)[s];
    std::map<std::string, Tensor> feed;
    for (size_t i = 0; i < ds.inputs.size() && i < input_names.size(); ++i) {
      feed[input_names[i]] = ds.inputs[i];
    }
    if (Status st = (*runner)->SetInputs(feed); !st.ok()) return finish(Fail(r, "run", st));
    if (Status st = (*runner)->Run(); !st.ok()) return finish(Fail(r, "run", st));
    for (size_t o = 0; o < ds.outputs.size() && o < output_names.size(); ++o) {
      const Tensor& actual = (*runner)->outputs().at(output_names[o]);
      Comparison c = CompareTensors(actual, ds.outputs[o], options.rtol, options.atol);
      r.max_abs = std::max(r.max_abs, c.max_abs);
      r.max_rel = std::max(r.max_rel, c.max_rel);
      r.rel_l2 = std::max(r.rel_l2, c.rel_l2);
      bool ok = c.shape_ok && c.dtype_ok && c.nan_mismatch == 0 &&
                (options.max_rel_l2 ? c.rel_l2 <= *options.max_rel_l2 : c.mismatches == 0);
      if (!ok && r.passed) {
        r.passed = false;
        r.stage = "compare";
        r.error = fmt::format("data set {} output '{}': {}", s, output_names[o], c.ToString());
        if (!c.shape_ok) {
          r.error += fmt::format(" (got {}, want {})", fmt::join(actual.dims(), "x"),
                                 fmt::join(ds.outputs[o].dims(), "x"));
        }
      }
    }
  }
  return finish(r);
}

}  // namespace kiln::app
