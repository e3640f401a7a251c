// One conformance case end to end, with the failure stage recorded so reports group failures.
#include "kiln/app/conformance.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

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

// One data set's inputs and expected outputs, as the model declares them: tensors, sequences or
// optionals (a SequenceProto / OptionalProto .pb is never read as a TensorProto).
struct DataSet {
  std::vector<OnnxValue> inputs, outputs;
};

StatusOr<std::vector<DataSet>> LoadDataSets(const fs::path& dir, const OnnxSignature& sig) {
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().starts_with("test_data_set_")) {
      sets.push_back(e.path());
    }
  }
  std::sort(sets.begin(), sets.end());
  auto kind_of = [](const std::vector<std::pair<std::string, OnnxValueKind>>& list, size_t i) {
    return i < list.size() ? list[i].second : OnnxValueKind::kTensor;
  };
  std::vector<DataSet> out;
  for (const fs::path& s : sets) {
    DataSet ds;
    for (size_t i = 0;; ++i) {
      fs::path p = s / fmt::format("input_{}.pb", i);
      if (!fs::exists(p)) break;
      KILN_ASSIGN_OR_RETURN(OnnxValue v, LoadOnnxValue(p.string(), kind_of(sig.inputs, i)));
      ds.inputs.push_back(std::move(v));
    }
    for (size_t i = 0;; ++i) {
      fs::path p = s / fmt::format("output_{}.pb", i);
      if (!fs::exists(p)) break;
      KILN_ASSIGN_OR_RETURN(OnnxValue v, LoadOnnxValue(p.string(), kind_of(sig.outputs, i)));
      ds.outputs.push_back(std::move(v));
    }
    out.push_back(std::move(ds));
  }
  if (out.empty())
    return MakeError(ErrorCode::kNotFound, "no test_data_set_* in '{}'", dir.string());
  return out;
}

// Sequence and optional inputs are specialised at build time (kiln's engines take tensors):
// each sequence input to the length its data has, each optional input to present or absent.
// The data sets must agree (one engine serves them all).
Status SpecializeFromData(const OnnxSignature& sig, const std::vector<DataSet>& sets,
                          ImportOptions* options) {
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    const std::string& name = sig.inputs[i].first;
    std::optional<std::pair<bool, int64_t>> first;  // present, length
    for (const DataSet& ds : sets) {
      if (i >= ds.inputs.size()) continue;
      const OnnxValue& v = ds.inputs[i];
      if (v.kind == OnnxValueKind::kTensor) continue;
      const bool seq =
          v.kind == OnnxValueKind::kSequence || v.kind == OnnxValueKind::kOptionalSequence;
      std::pair<bool, int64_t> here{v.present, seq ? static_cast<int64_t>(v.elements.size()) : 0};
      if (first && *first != here) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "input '{}' is a sequence or optional whose length or presence differs "
                         "between data sets; kiln specialises it at build time, so one engine "
                         "serves one length",
                         name);
      }
      first = here;
      if (!v.present) {
        options->absent_inputs.insert(name);
      } else if (seq) {
        SequenceInputSpec spec;
        spec.length = static_cast<int64_t>(v.elements.size());
        if (!v.elements.empty()) spec.element_rank = static_cast<int>(v.elements[0].dims().size());
        options->sequence_inputs[name] = spec;
      }
    }
  }
  return OkStatus();
}

// The tensors that stand for a data set's value of one ONNX input or output.
std::vector<const Tensor*> TensorsOf(const OnnxValue& v) {
  std::vector<const Tensor*> out;
  if (!v.present) return out;
  if (v.kind == OnnxValueKind::kSequence || v.kind == OnnxValueKind::kOptionalSequence) {
    for (const Tensor& t : v.elements) out.push_back(&t);
  } else {
    out.push_back(&v.tensor);
  }
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

  const std::string model_path = (fs::path(dir) / "model.onnx").string();
  auto sig = ReadOnnxSignature(model_path);
  if (!sig.ok()) return finish(Fail(r, "import", sig.status()));
  auto sets = LoadDataSets(dir, *sig);
  if (!sets.ok()) return finish(Fail(r, "import", sets.status()));
  r.data_sets = static_cast<int>(sets->size());
  ImportOptions import_options;
  if (Status st = SpecializeFromData(*sig, *sets, &import_options); !st.ok()) {
    return finish(Fail(r, "import", st));
  }
  OnnxModelMeta meta;
  auto graph = ImportOnnxFile(model_path, import_options, &meta);
  if (!graph.ok()) return finish(Fail(r, "import", graph.status()));
  // Each data set's inputs by engine tensor name: an ONNX input is its binding's tensors.
  std::vector<std::map<std::string, Tensor>> feeds(sets->size());
  for (size_t s = 0; s < sets->size(); ++s) {
    const DataSet& ds = (*sets)[s];
    for (size_t i = 0; i < ds.inputs.size() && i < meta.inputs.size(); ++i) {
      std::vector<const Tensor*> ts = TensorsOf(ds.inputs[i]);
      const auto& names = meta.inputs[i].tensors;
      for (size_t k = 0; k < ts.size() && k < names.size(); ++k) feeds[s][names[k]] = *ts[k];
    }
  }

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
    for (const auto& feed : feeds) {
      auto it = feed.find(p.input);
      if (it == feed.end()) continue;
      const auto& dims = it->second.dims();
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
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto it = feeds[0].find(inputs[i]->name());
    if (it == feeds[0].end()) continue;
    const Tensor& t = it->second;
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
    if (Status st = (*runner)->SetInputs(feeds[s]); !st.ok()) return finish(Fail(r, "run", st));
    if (Status st = (*runner)->Run(); !st.ok()) return finish(Fail(r, "run", st));
    auto fail_compare = [&](std::string error) {
      if (!r.passed) return;
      r.passed = false;
      r.stage = "compare";
      r.error = std::move(error);
    };
    for (size_t o = 0; o < ds.outputs.size() && o < meta.outputs.size(); ++o) {
      const OnnxValueBinding& b = meta.outputs[o];
      const OnnxValue& want = ds.outputs[o];
      // Sequences and optionals element by element: presence and length first.
      std::vector<const Tensor*> expected = TensorsOf(want);
      if (want.present != b.present) {
        fail_compare(fmt::format("data set {} output '{}': the optional is {}, want {}", s, b.name,
                                 b.present ? "present" : "absent",
                                 want.present ? "present" : "absent"));
        continue;
      }
      if (expected.size() != b.tensors.size()) {
        fail_compare(fmt::format("data set {} output '{}': a {} of {} tensor(s), want {}", s,
                                 b.name, ToString(b.kind), b.tensors.size(), expected.size()));
        continue;
      }
      for (size_t k = 0; k < expected.size(); ++k) {
        const std::string& name = b.tensors[k];
        const Tensor& actual = (*runner)->outputs().at(name);
        Comparison c = CompareTensors(actual, *expected[k], options.rtol, options.atol);
        r.max_abs = std::max(r.max_abs, c.max_abs);
        r.max_rel = std::max(r.max_rel, c.max_rel);
        r.rel_l2 = std::max(r.rel_l2, c.rel_l2);
        bool ok = c.shape_ok && c.dtype_ok && c.nan_mismatch == 0 &&
                  (options.max_rel_l2 ? c.rel_l2 <= *options.max_rel_l2 : c.mismatches == 0);
        if (!ok) {
          std::string error = fmt::format("data set {} output '{}': {}", s, name, c.ToString());
          if (!c.shape_ok) {
            error += fmt::format(" (got {}, want {})", fmt::join(actual.dims(), "x"),
                                 fmt::join(expected[k]->dims(), "x"));
          }
          fail_compare(std::move(error));
        }
      }
    }
  }
  return finish(r);
}

}  // namespace kiln::app
