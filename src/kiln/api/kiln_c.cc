// The C API over the library: converts handles, tensors and option strings, then calls the same
// functions the CLI calls (app::BuildFromOnnx*, the CLI's option parsers, Runtime, contexts).
#include "kiln/api/kiln_c.h"

#include <fmt/ranges.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/api/kiln_c_internal.h"
#include "kiln/app/pipeline.h"
#include "kiln/backends/backend.h"
#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/dim.h"
#include "kiln/precision/sensitivity.h"
#include "kiln/runtime/runtime.h"

using kiln::ErrorCode;
using kiln::MakeError;
using kiln::Status;
using kiln::StatusOr;

struct kiln_status {
  int code = 0;
  std::string id, name, message, remedy;
};

struct kiln_buffer {
  std::vector<std::byte> bytes;
};

struct kiln_context {
  std::unique_ptr<kiln::ExecutionContext> context;
  std::string backend;  // the engine's
  // The thread between its first bind and its execute (a default id when none): a context is
  // one thread's at a time, and a second thread is refused instead of racing.
  std::atomic<std::thread::id> owner{};
  // Host copies of shape inputs bound in device memory (the runtime reads shape inputs on the
  // host, as TensorRT's shape tensors), by input name.
  std::map<std::string, std::vector<std::byte>> shape_host;
};

namespace kiln::api {

kiln_status* ToC(const Status& s) {
  if (s.ok()) return nullptr;
  auto* out = new kiln_status();
  const ErrorInfo& info = LookupError(s.code());
  out->code = info.number;
  out->id = s.Id();
  out->name = std::string(info.name);
  out->message = s.message();
  for (const std::string& line : s.context()) out->message += "; " + line;
  out->remedy = std::string(s.remedy());
  return out;
}

kiln_buffer* MakeBuffer(std::vector<std::byte> bytes) {
  auto* b = new kiln_buffer();
  b->bytes = std::move(bytes);
  return b;
}

kiln_buffer* MakeBuffer(std::string_view text) {
  auto* b = new kiln_buffer();
  b->bytes.resize(text.size());
  std::memcpy(b->bytes.data(), text.data(), text.size());
  return b;
}

StatusOr<std::unique_ptr<kiln_engine>> EngineFromDesc(std::shared_ptr<const EngineDesc> desc) {
  KILN_ASSIGN_OR_RETURN(auto runtime, Runtime::CreateForEngine(desc->header));
  auto e = std::make_unique<kiln_engine>();
  e->desc = desc;
  KILN_ASSIGN_OR_RETURN(e->engine, runtime->CreateEngine(desc));
  e->live = std::make_unique<app::LiveEngine>(std::move(desc), e->engine);
  e->backend = std::string(ToString(e->desc->header.backend));
  return e;
}

StatusOr<BuilderConfig> ResolveConfig(const kiln_build_config& c) {
  BuilderConfig config = c.config;
  if (c.backend == "auto") {
    config.backend = BestAvailableBackend();
  } else if (c.backend == "cpu") {
    config.backend = BackendKind::kCpu;
  } else if (c.backend == "cuda") {
    config.backend = BackendKind::kCuda;
  } else {
    return MakeError(ErrorCode::kInvalidArgument, "backend '{}': use auto, cpu or cuda", c.backend);
  }
  if (c.progress) {
    kiln_progress_fn fn = c.progress;
    void* user = c.progress_user;
    config.progress = [fn, user](const BuildProgress& p) {
      return fn(user, p.phase.c_str(), p.done, p.total, p.elapsed_s, p.detail.c_str()) != 0;
    };
  }
  return config;
}

std::optional<DataType> FromCDtype(int32_t d) {
  switch (d) {
    case KILN_DTYPE_FLOAT32:
      return DataType::kFloat32;
    case KILN_DTYPE_FLOAT16:
      return DataType::kFloat16;
    case KILN_DTYPE_BFLOAT16:
      return DataType::kBFloat16;
    case KILN_DTYPE_INT8:
      return DataType::kInt8;
    case KILN_DTYPE_UINT8:
      return DataType::kUInt8;
    case KILN_DTYPE_INT32:
      return DataType::kInt32;
    case KILN_DTYPE_INT64:
      return DataType::kInt64;
    case KILN_DTYPE_BOOL:
      return DataType::kBool;
    case KILN_DTYPE_FLOAT64:
      return DataType::kFloat64;
    case KILN_DTYPE_INT16:
      return DataType::kInt16;
    case KILN_DTYPE_UINT16:
      return DataType::kUInt16;
    case KILN_DTYPE_UINT32:
      return DataType::kUInt32;
    case KILN_DTYPE_UINT64:
      return DataType::kUInt64;
    default:
      return std::nullopt;
  }
}

namespace {

kiln_status* Error(ErrorCode code, std::string message) { return ToC(Status(code, message)); }

#define KILN_C_REQUIRE(cond, what)                                                          \
  do {                                                                                      \
    if (!(cond)) return Error(ErrorCode::kInvalidArgument, std::string(what) + " is NULL"); \
  } while (0)

StatusOr<bool> ParseBool(const std::string& key, const std::string& value) {
  if (value == "1" || value == "true") return true;
  if (value == "0" || value == "false") return false;
  return MakeError(ErrorCode::kInvalidArgument, "option '{}' takes 0 or 1, not '{}'", key, value);
}

StatusOr<double> ParseNumber(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  return MakeError(ErrorCode::kInvalidArgument, "option '{}' takes a number, not '{}'", key, value);
}

Status SetOption(kiln_build_config& c, const std::string& key, const std::string& value) {
  BuilderConfig& config = c.config;
  if (key == "backend") {
    c.backend = value;
    return ResolveConfig(c).status();
  }
  if (key == "fp16" || key == "bf16" || key == "int8" || key == "fp8" || key == "optimize") {
    KILN_ASSIGN_OR_RETURN(bool on, ParseBool(key, value));
    (key == "fp16"   ? config.fp16
     : key == "bf16" ? config.bf16
     : key == "int8" ? config.int8
     : key == "fp8"  ? config.fp8
                     : config.optimize) = on;
    return OkStatus();
  }
  if (key == "profile") return ParseProfileSpec(value, &config.profile);
  if (key == "deadline") {
    KILN_ASSIGN_OR_RETURN(config.deadline, ParseDuration(value));
    return OkStatus();
  }
  if (key == "memory_budget") {
    KILN_ASSIGN_OR_RETURN(config.memory_budget, MemoryBudget::Parse(value));
    return OkStatus();
  }
  if (key == "max_kernel_time") {
    KILN_ASSIGN_OR_RETURN(double ms, ParseNumber(key, value));
    if (!(ms > 0)) {
      return MakeError(ErrorCode::kInvalidArgument, "max_kernel_time {} is not positive", value);
    }
    config.max_kernel_time_ms = ms;
    return OkStatus();
  }
  if (key == "timing_cache") {
    config.timing_cache_path = value;
    return OkStatus();
  }
  if (key == "calib_dir") {
    config.calibration_dir = value;
    return OkStatus();
  }
  if (key == "calib_on_cpu") {
    KILN_ASSIGN_OR_RETURN(bool on, ParseBool(key, value));
    config.calibrate_on_backend = !on;
    return OkStatus();
  }
  if (key == "calib_cache") {
    config.calibration_cache_path = value;
    return OkStatus();
  }
  if (key == "calib_percentile") {
    // The CLI's --calib-percentile: checked, and used by the percentile method.
    KILN_ASSIGN_OR_RETURN(double p, ParseNumber(key, value));
    return ParseCalibrationMethodSpec(std::string(precision::ToString(config.calibration_method)),
                                      p, &config);
  }
  if (key == "calib_method") {
    return ParseCalibrationMethodSpec(value, config.calibration_percentile, &config);
  }
  if (key == "int8_tolerance") {
    KILN_ASSIGN_OR_RETURN(config.int8_tolerance, precision::ParseInt8Tolerance(value));
    return OkStatus();
  }
  if (key == "fp8_tolerance") {
    KILN_ASSIGN_OR_RETURN(config.fp8_tolerance, precision::ParseFp8Tolerance(value));
    return OkStatus();
  }
  if (key == "fp8_edges" || key == "int8_edges") {
    KILN_ASSIGN_OR_RETURN(bool on, ParseBool(key, value));
    (key == "fp8_edges" ? config.fp8_edges : config.int8_edges) = on;
    return OkStatus();
  }
  if (key == "quantized_if_faster") {
    if (value == "auto") {
      config.quantized_if_faster.reset();
    } else {
      KILN_ASSIGN_OR_RETURN(bool on, ParseBool(key, value));
      config.quantized_if_faster = on;
    }
    return OkStatus();
  }
  return MakeError(
      ErrorCode::kInvalidArgument,
      "unknown build option '{}': use backend, fp16, bf16, int8, fp8, profile, deadline, "
      "memory_budget, max_kernel_time, timing_cache, calib_dir, calib_method, "
      "calib_percentile, calib_cache, calib_on_cpu, int8_tolerance, fp8_tolerance, fp8_edges, "
      "int8_edges, quantized_if_faster or optimize",
      key);
}

int32_t ToCDtype(DataType d) {
  switch (d) {
    case DataType::kFloat32:
      return KILN_DTYPE_FLOAT32;
    case DataType::kFloat16:
      return KILN_DTYPE_FLOAT16;
    case DataType::kBFloat16:
      return KILN_DTYPE_BFLOAT16;
    case DataType::kInt8:
      return KILN_DTYPE_INT8;
    case DataType::kUInt8:
      return KILN_DTYPE_UINT8;
    case DataType::kInt32:
      return KILN_DTYPE_INT32;
    case DataType::kInt64:
      return KILN_DTYPE_INT64;
    case DataType::kBool:
      return KILN_DTYPE_BOOL;
    case DataType::kFloat64:
      return KILN_DTYPE_FLOAT64;
    case DataType::kInt16:
      return KILN_DTYPE_INT16;
    case DataType::kUInt16:
      return KILN_DTYPE_UINT16;
    case DataType::kUInt32:
      return KILN_DTYPE_UINT32;
    case DataType::kUInt64:
      return KILN_DTYPE_UINT64;
    default:
      return 0;
  }
}

std::string DimsText(std::span<const int64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ","));
}

bool IsShapeInput(const kiln_context& c, const std::string& name) {
  for (const TensorDesc& d : c.context->engine().inputs()) {
    if (d.name == name) return d.shape_values.has_value();
  }
  return false;
}

// The checks the runtime cannot make on a bare pointer: dtype code, rank, device and layout.
Status CheckTensor(const kiln_context& c, const std::string& name, const kiln_tensor& t) {
  if (!FromCDtype(t.dtype)) {
    return MakeError(ErrorCode::kInputTypeMismatch,
                     "tensor '{}' has dtype code {}, which kiln "
                     "does not know",
                     name, t.dtype);
  }
  if (t.ndim < 0 || t.ndim > KILN_MAX_DIMS || (t.ndim > 0 && !t.dims)) {
    return MakeError(ErrorCode::kInputShapeInvalid, "tensor '{}' has rank {} (at most {})", name,
                     t.ndim, KILN_MAX_DIMS);
  }
  const EngineHeader& header = c.context->engine().desc().header;
  bool cuda_engine = header.backend == BackendKind::kCuda;
  int32_t want = cuda_engine ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU;
  // A shape input's values are read on the host: host memory is taken on every backend, and
  // device memory is copied at bind (BindChecked).
  bool host_ok = cuda_engine && IsShapeInput(c, name) && t.device_type == KILN_DEVICE_CPU;
  if (t.device_type != want && !host_ok) {
    return MakeError(ErrorCode::kTensorDeviceMismatch,
                     "tensor '{}' is on {} device type {}; engine '{}' runs on backend '{}' and "
                     "takes {} tensors",
                     name,
                     t.device_type == KILN_DEVICE_CUDA  ? "the CUDA"
                     : t.device_type == KILN_DEVICE_CPU ? "the CPU"
                                                        : "an unknown",
                     t.device_type, header.model_name, c.backend, cuda_engine ? "CUDA" : "CPU");
  }
  if (t.strides) {
    int64_t expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      // Size-1 dimensions may carry any stride; they do not move through memory.
      if (t.dims[i] != 1 && t.strides[i] != expected) {
        return MakeError(ErrorCode::kTensorNotContiguous,
                         "tensor '{}' has strides {} for dims {}; dense row-major would be "
                         "stride {} in dimension {}",
                         name, DimsText({t.strides, static_cast<size_t>(t.ndim)}),
                         DimsText({t.dims, static_cast<size_t>(t.ndim)}), expected, i);
      }
      expected *= t.dims[i];
    }
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.dims[i] < 0) {
      return MakeError(ErrorCode::kInputShapeInvalid, "tensor '{}' has a negative dim in {}", name,
                       DimsText({t.dims, static_cast<size_t>(t.ndim)}));
    }
  }
  if (!t.data) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) n *= t.dims[i];
    if (n != 0) return MakeError(ErrorCode::kInvalidArgument, "tensor '{}' has no data", name);
  }
  return OkStatus();
}

// Binds after the checks a bare pointer needs; an output's dims must be the ones the bound inputs
// imply.
Status BindChecked(kiln_context& c, const std::string& name, const kiln_tensor& t) {
  KILN_RETURN_IF_ERROR(CheckTensor(c, name, t));
  std::span<const int64_t> dims(t.dims, static_cast<size_t>(t.ndim));
  bool is_input = false;
  for (const TensorDesc& d : c.context->engine().inputs()) is_input |= d.name == name;
  if (!is_input) {
    // A data-dependent dim is bound at its bound (kiln_context_shape gives the run's value).
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> want, c.context->GetMaxTensorShape(name));
    if (!std::equal(want.begin(), want.end(), dims.begin(), dims.end())) {
      return MakeError(ErrorCode::kOutputShapeMismatch,
                       "output '{}' was given as {}; the bound inputs make it {}", name,
                       DimsText(dims), DimsText(want));
    }
  }
  TensorView view;
  view.dtype = *FromCDtype(t.dtype);
  view.dims = dims;
  view.data = t.data;
  if (is_input && t.device_type == KILN_DEVICE_CUDA && IsShapeInput(c, name)) {
    // A shape input in device memory: its few values are copied to the host now (a synchronous
    // copy; the runtime compares them with the values shapes were made for at execute).
    std::vector<std::byte>& host = c.shape_host[name];
    host.resize(view.size_bytes());
    if (!host.empty()) {
      Backend& backend = c.context->engine().backend();
      KILN_RETURN_IF_ERROR(backend.CopyToHost(host.data(), t.data, host.size(), nullptr));
      KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
    }
    view.data = host.data();
  }
  return c.context->BindTensor(name, view);
}

// Claims the context for this thread (KILN-E5011 when another thread holds it).
Status Claim(kiln_context& c) {
  std::thread::id none{};
  std::thread::id me = std::this_thread::get_id();
  if (c.owner.compare_exchange_strong(none, me) || none == me) return OkStatus();
  return MakeError(ErrorCode::kContextInUse,
                   "this execution context is between bind and execute on another thread; a "
                   "context serves one thread at a time");
}

void Release(kiln_context& c) { c.owner.store(std::thread::id{}); }

// kiln_context_shape and kiln_context_max_shape. Within a bind...execute sequence the context
// stays claimed; a query outside one (an output's dims after an execute) claims it only for the
// call, so that another thread may use the context afterwards.
kiln_status* ContextShape(kiln_context* c, const char* name, int32_t* ndim, int64_t* dims_out,
                          bool max) {
  KILN_C_REQUIRE(c, "context");
  KILN_C_REQUIRE(name, "name");
  KILN_C_REQUIRE(ndim && dims_out, "an output pointer");
  const bool held = c->owner.load() == std::this_thread::get_id();
  if (Status s = Claim(*c); !s.ok()) return ToC(s);
  auto dims = max ? c->context->GetMaxTensorShape(name) : c->context->GetTensorShape(name);
  if (!dims.ok()) {
    Release(*c);
    return ToC(dims.status());
  }
  if (dims->size() > KILN_MAX_DIMS) {
    Release(*c);
    return Error(ErrorCode::kOutOfRange, fmt::format("'{}' has rank {}", name, dims->size()));
  }
  *ndim = static_cast<int32_t>(dims->size());
  std::copy(dims->begin(), dims->end(), dims_out);
  if (!held) Release(*c);
  return nullptr;
}

}  // namespace
}  // namespace kiln::api

using namespace kiln::api;  // NOLINT: the C entry points below are thin

extern "C" {

int kiln_status_code(const kiln_status* s) { return s ? s->code : 0; }
const char* kiln_status_id(const kiln_status* s) { return s ? s->id.c_str() : ""; }
const char* kiln_status_name(const kiln_status* s) { return s ? s->name.c_str() : ""; }
const char* kiln_status_message(const kiln_status* s) { return s ? s->message.c_str() : ""; }
const char* kiln_status_remedy(const kiln_status* s) { return s ? s->remedy.c_str() : ""; }
void kiln_status_free(kiln_status* s) { delete s; }

kiln_status* kiln_status_make(int code, const char* message) {
  const kiln::ErrorInfo* info = kiln::FindError(std::to_string(code));
  std::string text = message ? message : "";
  if (!info || code == 0) {
    return Error(ErrorCode::kInternal,
                 fmt::format("kiln_status_make: no catalog code {} ({})", code, text));
  }
  return ToC(Status(info->code, text));
}

const uint8_t* kiln_buffer_data(const kiln_buffer* b) {
  return b ? reinterpret_cast<const uint8_t*>(b->bytes.data()) : nullptr;
}
size_t kiln_buffer_size(const kiln_buffer* b) { return b ? b->bytes.size() : 0; }
void kiln_buffer_free(kiln_buffer* b) { delete b; }

int kiln_api_version(void) { return KILN_C_API_VERSION; }
const char* kiln_version(void) {
  static const std::string v(kiln::KilnVersion());
  return v.c_str();
}

kiln_status* kiln_build_config_create(kiln_build_config** out) {
  KILN_C_REQUIRE(out, "out");
  *out = new kiln_build_config();
  return nullptr;
}
void kiln_build_config_free(kiln_build_config* c) { delete c; }

kiln_status* kiln_build_config_set(kiln_build_config* c, const char* key, const char* value) {
  KILN_C_REQUIRE(c, "config");
  KILN_C_REQUIRE(key, "key");
  KILN_C_REQUIRE(value, "value");
  Status s = SetOption(*c, key, value);
  if (!s.ok()) s.AddContext(fmt::format("while setting build option {}='{}'", key, value));
  return ToC(s);
}

void kiln_build_config_set_progress(kiln_build_config* c, kiln_progress_fn fn, void* user) {
  if (!c) return;
  c->progress = fn;
  c->progress_user = user;
}

static kiln_status* FinishBuild(StatusOr<kiln::app::BuiltEngine> built, kiln_engine** out) {
  if (!built.ok()) return ToC(built.status());
  auto engine = EngineFromDesc(std::shared_ptr<const kiln::EngineDesc>(std::move(built->desc)));
  if (!engine.ok()) return ToC(engine.status());
  (*engine)->report_json = built->report.ToJson();
  *out = engine->release();
  return nullptr;
}

kiln_status* kiln_build_from_file(const kiln_build_config* c, const char* onnx_path,
                                  kiln_engine** out) {
  KILN_C_REQUIRE(c, "config");
  KILN_C_REQUIRE(onnx_path, "onnx_path");
  KILN_C_REQUIRE(out, "out");
  auto config = ResolveConfig(*c);
  if (!config.ok()) return ToC(config.status());
  return FinishBuild(kiln::app::BuildFromOnnxFile(onnx_path, *config), out);
}

kiln_status* kiln_build_from_bytes(const kiln_build_config* c, const void* onnx, size_t size,
                                   const char* model_name, kiln_engine** out) {
  KILN_C_REQUIRE(c, "config");
  KILN_C_REQUIRE(onnx, "onnx");
  KILN_C_REQUIRE(out, "out");
  auto config = ResolveConfig(*c);
  if (!config.ok()) return ToC(config.status());
  std::span<const std::byte> bytes(static_cast<const std::byte*>(onnx), size);
  return FinishBuild(
      kiln::app::BuildFromOnnxBytes(bytes, model_name ? model_name : "model", *config), out);
}

static kiln_status* FinishLoad(StatusOr<std::shared_ptr<const kiln::EngineDesc>> desc,
                               kiln_engine** out) {
  if (!desc.ok()) return ToC(desc.status());
  auto engine = EngineFromDesc(std::move(*desc));
  if (!engine.ok()) return ToC(engine.status());
  (*engine)->report_json = (*engine)->desc->build_report_json;
  if ((*engine)->report_json.empty()) (*engine)->report_json = "{}";
  *out = engine->release();
  return nullptr;
}

// Providers are checked when the engine is created for its backend (Engine::Create), after the
// backend check, so that a CUDA engine on a CPU-only kiln says E5006 and not "no provider".
kiln_status* kiln_engine_load(const char* path, kiln_engine** out) {
  KILN_C_REQUIRE(path, "path");
  KILN_C_REQUIRE(out, "out");
  kiln::LoadOptions options;
  options.check_providers = false;
  return FinishLoad(kiln::LoadEngineFile(path, options), out);
}

kiln_status* kiln_engine_deserialize(const void* data, size_t size, kiln_engine** out) {
  KILN_C_REQUIRE(data, "data");
  KILN_C_REQUIRE(out, "out");
  kiln::LoadOptions options;
  options.check_providers = false;
  return FinishLoad(kiln::LoadEngineBytes({static_cast<const std::byte*>(data), size}, options),
                    out);
}

void kiln_engine_free(kiln_engine* e) { delete e; }

kiln_status* kiln_engine_serialize(const kiln_engine* e, kiln_buffer** out) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(out, "out");
  auto current = e->live->Current();
  if (!current.ok()) return ToC(current.status());
  auto bytes = kiln::SerializeEngine(**current);
  if (!bytes.ok()) return ToC(bytes.status());
  *out = MakeBuffer(std::move(*bytes));
  return nullptr;
}

kiln_status* kiln_engine_save(const kiln_engine* e, const char* path) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(path, "path");
  auto current = e->live->Current();
  if (!current.ok()) return ToC(current.status());
  return ToC(kiln::WriteEngineFile(**current, path));
}

kiln_status* kiln_engine_serialize_stripped(const kiln_engine* e, kiln_buffer** out) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(out, "out");
  auto current = e->live->Current();
  if (!current.ok()) return ToC(current.status());
  auto bytes = kiln::SerializeEngine(**current, {.strip_weights = true});
  if (!bytes.ok()) return ToC(bytes.status());
  *out = MakeBuffer(std::move(*bytes));
  return nullptr;
}

kiln_status* kiln_engine_save_stripped(const kiln_engine* e, const char* path) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(path, "path");
  auto current = e->live->Current();
  if (!current.ok()) return ToC(current.status());
  return ToC(kiln::WriteEngineFile(**current, path, false, {.strip_weights = true}));
}

kiln_status* kiln_engine_report_json(const kiln_engine* e, kiln_buffer** out) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(out, "out");
  *out = MakeBuffer(std::string_view(e->report_json));
  return nullptr;
}

const char* kiln_engine_backend(const kiln_engine* e) { return e ? e->backend.c_str() : ""; }
const char* kiln_engine_arch(const kiln_engine* e) {
  return e ? e->desc->header.device_arch.c_str() : "";
}

int kiln_engine_num_bindings(const kiln_engine* e) {
  if (!e) return 0;
  return static_cast<int>(e->engine->inputs().size() + e->engine->outputs().size());
}

kiln_status* kiln_engine_binding(const kiln_engine* e, int i, const char** name, int* is_input,
                                 int32_t* dtype, int32_t* ndim, int64_t* dims_out) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(name && is_input && dtype && ndim && dims_out, "an output pointer");
  const auto& ins = e->engine->inputs();
  const auto& outs = e->engine->outputs();
  if (i < 0 || static_cast<size_t>(i) >= ins.size() + outs.size()) {
    return Error(ErrorCode::kOutOfRange, fmt::format("binding {} does not exist; the engine has {}",
                                                     i, ins.size() + outs.size()));
  }
  bool input = static_cast<size_t>(i) < ins.size();
  const kiln::TensorDesc& d = input ? ins[i] : outs[i - ins.size()];
  if (d.shape.size() > KILN_MAX_DIMS) {
    return Error(ErrorCode::kOutOfRange, fmt::format("binding '{}' has rank {} (at most {})",
                                                     d.name, d.shape.size(), KILN_MAX_DIMS));
  }
  *name = d.name.c_str();
  *is_input = input ? 1 : 0;
  *dtype = ToCDtype(d.dtype);
  *ndim = static_cast<int32_t>(d.shape.size());
  for (size_t k = 0; k < d.shape.size(); ++k) dims_out[k] = d.shape[k].value();
  return nullptr;
}

kiln_status* kiln_engine_binding_data_dependent(const kiln_engine* e, int i, uint32_t* mask) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(mask, "mask");
  const auto& ins = e->engine->inputs();
  const auto& outs = e->engine->outputs();
  if (i < 0 || static_cast<size_t>(i) >= ins.size() + outs.size()) {
    return Error(ErrorCode::kOutOfRange, fmt::format("binding {} does not exist; the engine has {}",
                                                     i, ins.size() + outs.size()));
  }
  *mask = 0;
  if (static_cast<size_t>(i) < ins.size()) return nullptr;
  const kiln::TensorDesc& d = outs[i - ins.size()];
  for (size_t k = 0; k < d.shape.size() && k < KILN_MAX_DIMS; ++k) {
    for (const std::string& symbol : d.shape[k].Symbols()) {
      if (kiln::IsDataDependentSymbol(symbol)) *mask |= uint32_t{1} << k;
    }
  }
  return nullptr;
}

kiln_status* kiln_engine_profile(const kiln_engine* e, const char* input, int* has_profile,
                                 int32_t* ndim, int64_t* min, int64_t* opt, int64_t* max) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(input, "input");
  KILN_C_REQUIRE(has_profile && ndim && min && opt && max, "an output pointer");
  *has_profile = 0;
  *ndim = 0;
  const kiln::InputProfile* p = e->desc->profile.Find(input);
  if (!p) return nullptr;
  if (p->min.size() > KILN_MAX_DIMS) {
    return Error(ErrorCode::kOutOfRange,
                 fmt::format("input '{}' has rank {}", input, p->min.size()));
  }
  *has_profile = 1;
  *ndim = static_cast<int32_t>(p->min.size());
  std::copy(p->min.begin(), p->min.end(), min);
  std::copy(p->opt.begin(), p->opt.end(), opt);
  std::copy(p->max.begin(), p->max.end(), max);
  return nullptr;
}

kiln_status* kiln_context_create(const kiln_engine* e, int cuda_graphs, kiln_context** out) {
  KILN_C_REQUIRE(e, "engine");
  KILN_C_REQUIRE(out, "out");
  kiln::ExecutionOptions options;
  options.cuda_graphs = cuda_graphs != 0;
  auto context = e->engine->CreateExecutionContext(options);
  if (!context.ok()) return ToC(context.status());
  auto c = std::make_unique<kiln_context>();
  c->context = std::move(*context);
  c->backend = e->backend;
  *out = c.release();
  return nullptr;
}

void kiln_context_free(kiln_context* c) { delete c; }

kiln_status* kiln_context_bind(kiln_context* c, const char* name, const kiln_tensor* t) {
  KILN_C_REQUIRE(c, "context");
  KILN_C_REQUIRE(name, "name");
  KILN_C_REQUIRE(t, "tensor");
  if (Status s = Claim(*c); !s.ok()) return ToC(s);
  Status s = BindChecked(*c, name, *t);
  if (!s.ok()) Release(*c);
  return ToC(s);
}

kiln_status* kiln_context_shape(kiln_context* c, const char* name, int32_t* ndim,
                                int64_t* dims_out) {
  return ContextShape(c, name, ndim, dims_out, /*max=*/false);
}

kiln_status* kiln_context_max_shape(kiln_context* c, const char* name, int32_t* ndim,
                                    int64_t* dims_out) {
  return ContextShape(c, name, ndim, dims_out, /*max=*/true);
}

kiln_status* kiln_context_execute(kiln_context* c, void* stream) {
  KILN_C_REQUIRE(c, "context");
  if (Status s = Claim(*c); !s.ok()) return ToC(s);
  Status s = c->context->Execute(stream);
  Release(*c);
  return ToC(s);
}

void kiln_context_release(kiln_context* c) {
  if (!c) return;
  std::thread::id me = std::this_thread::get_id();
  c->owner.compare_exchange_strong(me, std::thread::id{});
}

int64_t kiln_context_graph_captures(const kiln_context* c) {
  return c ? c->context->graph_captures() : 0;
}
int64_t kiln_context_graph_launches(const kiln_context* c) {
  return c ? c->context->graph_launches() : 0;
}

}  // extern "C"
