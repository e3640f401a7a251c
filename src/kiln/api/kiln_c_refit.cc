// The C API's refit entry points (kiln_c.h, "refit"): new weights from an ONNX file, ONNX bytes or
// named host tensors, replayed by the engine's LiveEngine (app/live_refit.h); and the loading of
// weight-stripped engines with their weights ("weight-stripped engines").
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/api/kiln_c.h"
#include "kiln/api/kiln_c_internal.h"
#include "kiln/builder/refit.h"
#include "kiln/engine/engine_file.h"

using kiln::ErrorCode;
using kiln::MakeError;
using kiln::Status;
using kiln::StatusOr;

namespace kiln::api {
namespace {

// The host bytes of a named weight, copied (the engine keeps its weights past the call).
StatusOr<Tensor> WeightFromC(const std::string& name, const kiln_tensor& t) {
  std::optional<DataType> dtype = FromCDtype(t.dtype);
  if (!dtype) {
    return MakeError(ErrorCode::kRefitWeightsMismatch,
                     "weight '{}' has dtype code {}, which kiln does not know", name, t.dtype);
  }
  if (t.ndim < 0 || t.ndim > KILN_MAX_DIMS || (t.ndim > 0 && !t.dims)) {
    return MakeError(ErrorCode::kRefitWeightsMismatch, "weight '{}' has rank {} (at most {})", name,
                     t.ndim, KILN_MAX_DIMS);
  }
  if (t.device_type != KILN_DEVICE_CPU) {
    return MakeError(ErrorCode::kTensorDeviceMismatch,
                     "weight '{}' is on device type {}; refit reads new weights from host memory "
                     "(KILN_DEVICE_CPU)",
                     name, t.device_type);
  }
  std::vector<int64_t> dims(t.dims, t.dims + t.ndim);
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (dims[i] < 0) {
      return MakeError(ErrorCode::kRefitWeightsMismatch, "weight '{}' has a negative dim in [{}]",
                       name, fmt::join(dims, ","));
    }
    if (t.strides && dims[i] != 1 && t.strides[i] != expected) {
      return MakeError(ErrorCode::kTensorNotContiguous,
                       "weight '{}' has strides [{}] for dims [{}]; refit takes dense row-major "
                       "weights",
                       name, fmt::join(std::span(t.strides, t.ndim), ","), fmt::join(dims, ","));
    }
    expected *= dims[i];
  }
  const size_t bytes = static_cast<size_t>(expected) * SizeOf(*dtype);
  if (!t.data && bytes != 0) {
    return MakeError(ErrorCode::kInvalidArgument, "weight '{}' has no data", name);
  }
  return Tensor::FromBytes(*dtype, std::move(dims),
                           std::span(static_cast<const std::byte*>(t.data), bytes));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `read_seconds`: reading the weights (an ONNX model's; 0 for named tensors), for the report.
kiln_status* Refit(kiln_engine& e, const std::map<std::string, Tensor>& initializers,
                   const Hash128& model_hash, double read_seconds, kiln_buffer** report_json) {
  RefitReport report;
  report.read_seconds = read_seconds;
  StatusOr<uint64_t> generation = e.live->Refit(initializers, model_hash, &report);
  if (!generation.ok()) return ToC(generation.status());
  if (report_json) {
    std::string json = report.ToJson();
    json.insert(json.size() - 1, fmt::format(", \"generation\": {}", *generation));
    *report_json = MakeBuffer(std::string_view(json));
  }
  return nullptr;
}

}  // namespace

StatusOr<std::map<std::string, Tensor>> WeightsFromC(const kiln_named_tensor* weights,
                                                     size_t count) {
  if (!weights && count > 0) return MakeError(ErrorCode::kInvalidArgument, "weights is NULL");
  std::map<std::string, Tensor> initializers;
  for (size_t i = 0; i < count; ++i) {
    if (!weights[i].name) {
      return MakeError(ErrorCode::kInvalidArgument, "weights[{}].name is NULL", i);
    }
    std::string name = weights[i].name;
    KILN_ASSIGN_OR_RETURN(Tensor t, WeightFromC(name, weights[i].tensor));
    if (!initializers.emplace(name, std::move(t)).second) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "weight '{}' is given twice (weights[{}] again)", name, i);
    }
  }
  return initializers;
}

namespace {

kiln_status* NullArgument(const char* what) {
  return ToC(MakeError(ErrorCode::kInvalidArgument, "{} is NULL", what));
}

// The weights of kiln_engine_load_with_weights: an ONNX file, or ONNX bytes or named tensors.
StatusOr<OnnxWeights> ReadWeights(const char* onnx_path, const kiln_refit_weights* weights) {
  if ((onnx_path != nullptr) == (weights != nullptr)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "give the weights as onnx_path or as weights, exactly one of them");
  }
  if (onnx_path) return ReadOnnxWeights(onnx_path);
  if ((weights->onnx != nullptr) == (weights->tensors != nullptr && weights->count > 0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "kiln_refit_weights needs ONNX bytes or named tensors: give one");
  }
  if (weights->onnx) {
    return ReadOnnxWeightsFromBytes(
        {static_cast<const std::byte*>(weights->onnx), weights->onnx_size});
  }
  OnnxWeights out;
  KILN_ASSIGN_OR_RETURN(out.initializers, WeightsFromC(weights->tensors, weights->count));
  out.file_hash = InitializersHash(out.initializers);
  return out;
}

// Fills a loaded engine (stripped or not) with the weights, then loads it for its backend.
kiln_status* LoadFilled(StatusOr<std::shared_ptr<EngineDesc>> desc, const char* onnx_path,
                        const kiln_refit_weights* weights, kiln_engine** out,
                        kiln_buffer** report_json) {
  if (!desc.ok()) return ToC(desc.status());
  const auto start = std::chrono::steady_clock::now();
  auto read = ReadWeights(onnx_path, weights);
  if (!read.ok()) return ToC(read.status());
  RefitReport report;
  report.read_seconds = SecondsSince(start);
  if (Status s = RefitEngine(**desc, read->initializers, read->file_hash, &report); !s.ok()) {
    return ToC(s);
  }
  auto engine = EngineFromDesc(std::shared_ptr<const EngineDesc>(std::move(*desc)));
  if (!engine.ok()) return ToC(engine.status());
  (*engine)->report_json = (*engine)->desc->build_report_json;
  if ((*engine)->report_json.empty()) (*engine)->report_json = "{}";
  if (report_json) {
    std::string json = report.ToJson();
    json.insert(json.size() - 1, ", \"generation\": 0");
    *report_json = MakeBuffer(std::string_view(json));
  }
  *out = engine->release();
  return nullptr;
}

}  // namespace
}  // namespace kiln::api

using namespace kiln::api;  // NOLINT: the C entry points below are thin

extern "C" {

kiln_status* kiln_engine_refit_from_file(kiln_engine* e, const char* onnx_path,
                                         kiln_buffer** report_json) {
  if (!e) return NullArgument("engine");
  if (!onnx_path) return NullArgument("onnx_path");
  const auto start = std::chrono::steady_clock::now();
  auto weights = kiln::ReadOnnxWeights(onnx_path);
  if (!weights.ok()) return ToC(weights.status());
  return Refit(*e, weights->initializers, weights->file_hash, SecondsSince(start), report_json);
}

kiln_status* kiln_engine_refit_from_bytes(kiln_engine* e, const void* onnx, size_t size,
                                          kiln_buffer** report_json) {
  if (!e) return NullArgument("engine");
  if (!onnx) return NullArgument("onnx");
  const auto start = std::chrono::steady_clock::now();
  auto weights =
      kiln::ReadOnnxWeightsFromBytes(std::span(static_cast<const std::byte*>(onnx), size));
  if (!weights.ok()) return ToC(weights.status());
  return Refit(*e, weights->initializers, weights->file_hash, SecondsSince(start), report_json);
}

kiln_status* kiln_engine_refit(kiln_engine* e, const kiln_named_tensor* weights, size_t count,
                               kiln_buffer** report_json) {
  if (!e) return NullArgument("engine");
  auto initializers = WeightsFromC(weights, count);
  if (!initializers.ok()) return ToC(initializers.status());
  return Refit(*e, *initializers, kiln::InitializersHash(*initializers), 0, report_json);
}

kiln_status* kiln_engine_load_with_weights(const char* path, const char* onnx_path,
                                           const kiln_refit_weights* weights, kiln_engine** out,
                                           kiln_buffer** report_json) {
  if (!path) return NullArgument("path");
  if (!out) return NullArgument("out");
  kiln::LoadOptions options;
  options.check_providers = false;  // checked for its backend when it is loaded (EngineFromDesc)
  return LoadFilled(kiln::LoadEngineFileForEdit(path, options), onnx_path, weights, out,
                    report_json);
}

kiln_status* kiln_engine_deserialize_with_weights(const void* data, size_t size,
                                                  const char* onnx_path,
                                                  const kiln_refit_weights* weights,
                                                  kiln_engine** out, kiln_buffer** report_json) {
  if (!data) return NullArgument("data");
  if (!out) return NullArgument("out");
  kiln::LoadOptions options;
  options.check_providers = false;
  return LoadFilled(
      kiln::LoadEngineBytesForEdit({static_cast<const std::byte*>(data), size}, options), onnx_path,
      weights, out, report_json);
}

uint64_t kiln_engine_weights_generation(const kiln_engine* e) {
  return e ? e->engine->weights_generation() : 0;
}

}  // extern "C"
