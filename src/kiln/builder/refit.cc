// Refit (refit.h): check the new weights, replay the engine's weight program, swap the constants.
#include "kiln/builder/refit.h"

#include <fmt/format.h>

#include <chrono>

#include "kiln/backends/reference.h"
#include "kiln/core/json_writer.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/onnx_import.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string TypeText(DataType dtype, const std::vector<int64_t>& dims) {
  return fmt::format("{}[{}]", ToString(dtype), fmt::join(dims, ","));
}

}  // namespace

std::string RefitReport::ToText() const {
  return fmt::format(
      "refit: {} constant(s) replaced ({:.1f} MiB) by {} weight step(s) from {} initializer(s); "
      "{} constant(s) independent of the weights kept\n"
      "  read {:.3f} s, replay {:.3f} s, write {:.3f} s\n",
      constants_refit, static_cast<double>(bytes_refit) / (1 << 20), steps, initializers,
      constants_kept, read_seconds, replay_seconds, write_seconds);
}

std::string RefitReport::ToJson() const {
  return fmt::format(
      "{{\"initializers\": {}, \"steps\": {}, \"constants_refit\": {}, \"constants_kept\": {}, "
      "\"bytes_refit\": {}, \"read_seconds\": {:.6f}, \"replay_seconds\": {:.6f}, "
      "\"write_seconds\": {:.6f}}}",
      initializers, steps, constants_refit, constants_kept, bytes_refit, read_seconds,
      replay_seconds, write_seconds);
}

StatusOr<std::map<std::string, Tensor>> ComputeRefit(
    const EngineDesc& engine, const std::map<std::string, Tensor>& initializers,
    RefitReport* report) {
  if (!engine.graph) return MakeError(ErrorCode::kInvalidArgument, "no engine to refit");
  const auto start = Clock::now();
  const WeightProgram& program = engine.weight_program;
  KILN_ASSIGN_OR_RETURN(auto values, RunWeightProgram(program, initializers, ReferenceEvaluator()));
  int64_t bytes = 0;
  for (const auto& [name, t] : values) {
    const Value* v = engine.graph->FindValue(name);
    if (!v || !v->is_constant()) {
      return MakeError(ErrorCode::kEngineMalformed,
                       "the weight program makes '{}', which is not a constant of the engine",
                       name);
    }
    const Tensor& old = *v->constant();
    if (old.dtype() != t.dtype() || old.dims() != t.dims()) {
      // Only a structural initializer could do this, and those are checked unchanged: a bug.
      return MakeError(ErrorCode::kInternal, "refit made constant '{}' as {}; the engine holds {}",
                       name, TypeText(t.dtype(), t.dims()), TypeText(old.dtype(), old.dims()));
    }
    bytes += static_cast<int64_t>(t.size_bytes());
  }
  if (report) {
    report->initializers = static_cast<int64_t>(initializers.size());
    report->steps = static_cast<int64_t>(program.steps.size());
    report->constants_refit = static_cast<int64_t>(values.size());
    int64_t constants = 0;
    for (const Value* v : engine.graph->values()) constants += v->is_constant() ? 1 : 0;
    report->constants_kept = constants - report->constants_refit;
    report->bytes_refit = bytes;
    report->replay_seconds = Seconds(start);
  }
  return values;
}

Status RefitEngine(EngineDesc& engine, const std::map<std::string, Tensor>& initializers,
                   const Hash128& model_hash, RefitReport* report) {
  KILN_ASSIGN_OR_RETURN(auto values, ComputeRefit(engine, initializers, report));
  for (auto& [name, t] : values) engine.graph->FindValue(name)->set_constant(std::move(t));
  engine.header.model_hash = model_hash.Hex();
  return OkStatus();
}

StatusOr<OnnxWeights> ReadOnnxWeights(const std::string& path) {
  // Only the initializers matter: the file may hold another architecture, which the check
  // against the engine's program then names, whatever ops it uses.
  ImportOptions options;
  options.hash_file = true;
  options.allow_unsupported_ops = true;
  options.verify = false;
  OnnxModelMeta meta;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, ImportOnnxFile(path, options, &meta));
  OnnxWeights out;
  out.file_hash = meta.file_hash;
  for (InitializerInfo& init : CollectInitializers(*graph)) {
    out.initializers.emplace(std::move(init.name), std::move(init.value));
  }
  return out;
}

Status RefitEngineFile(const std::string& engine_path, const std::string& onnx_path,
                       const std::string& out_path, RefitReport* report) {
  RefitReport local;
  RefitReport& rep = report ? *report : local;
  LoadOptions load;
  load.check_providers = false;  // refit runs on the host: a CUDA engine is refit here too
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> engine,
                        LoadEngineFileForEdit(engine_path, load));
  auto start = Clock::now();
  KILN_ASSIGN_OR_RETURN(OnnxWeights weights, ReadOnnxWeights(onnx_path));
  rep.read_seconds = Seconds(start);
  Status refit = RefitEngine(*engine, weights.initializers, weights.file_hash, &rep);
  if (!refit.ok()) {
    return std::move(refit).AddContext(
        fmt::format("refitting '{}' with the weights of '{}'", engine_path, onnx_path));
  }
  start = Clock::now();
  KILN_RETURN_IF_ERROR(WriteEngineFile(*engine, out_path, /*replaces_input=*/true));
  rep.write_seconds = Seconds(start);
  return OkStatus();
}

}  // namespace kiln
