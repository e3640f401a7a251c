// Refit (refit.h): check the new weights, replay the engine's weight program, swap the constants.
#include "kiln/builder/refit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <type_traits>
#include <variant>

#include "kiln/backends/reference.h"
#include "kiln/core/json_writer.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/precision/precision.h"

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
  std::string text = fmt::format(
      "refit: {} constant(s) replaced ({:.1f} MiB) by {} weight step(s) from {} initializer(s); "
      "{} constant(s) independent of the weights kept\n",
      constants_refit, static_cast<double>(bytes_refit) / (1 << 20), steps, initializers,
      constants_kept);
  if (filled_stripped) {
    text += "  the engine was weight-stripped: it is the full engine now\n";
  }
  if (int8_scales == "stored") {
    text += fmt::format(
        "  int8: {} layer(s) re-quantise the new weights with the stored activation scales (not "
        "recalibrated; --recalibrate does)\n",
        int8_layers);
  } else if (!int8_scales.empty()) {
    text += fmt::format("  int8: {} layer(s) with activation scales {}: {}\n", int8_layers,
                        int8_scales, calibration);
  }
  text += fmt::format("  read {:.3f} s, replay {:.3f} s, write {:.3f} s\n", read_seconds,
                      replay_seconds, write_seconds);
  if (!op_seconds.empty()) {
    std::vector<std::string> ops;
    for (const auto& [op, sec] : op_seconds) ops.push_back(fmt::format("{} {:.3f} s", op, sec));
    text += fmt::format(
        "  replay: checks {:.3f} s, steps {:.3f} s ({} large step(s) split over threads; thread "
        "time by op: {}; longest step {} {:.3f} s)\n",
        check_seconds, steps_seconds, split_steps, fmt::join(ops, ", "), longest_op,
        longest_seconds);
  }
  return text;
}

std::string RefitReport::ToJson() const {
  JsonWriter w;
  w.BeginObject();
  w.Key("initializers").Int(initializers);
  w.Key("steps").Int(steps);
  w.Key("constants_refit").Int(constants_refit);
  w.Key("constants_kept").Int(constants_kept);
  w.Key("bytes_refit").Int(bytes_refit);
  w.Key("filled_stripped").Bool(filled_stripped);
  w.Key("int8_layers").Int(int8_layers);
  w.Key("int8_scales").String(int8_scales);
  w.Key("calibration").String(calibration);
  w.Key("read_seconds").Double(read_seconds);
  w.Key("replay_seconds").Double(replay_seconds);
  w.Key("write_seconds").Double(write_seconds);
  w.Key("check_seconds").Double(check_seconds);
  w.Key("steps_seconds").Double(steps_seconds);
  w.Key("split_steps").Int(split_steps);
  w.Key("op_seconds").BeginObject();
  for (const auto& [op, sec] : op_seconds) w.Key(op).Double(sec);
  w.EndObject();
  w.Key("longest_op").String(longest_op);
  w.Key("longest_seconds").Double(longest_seconds);
  w.EndObject();
  return w.Take();
}

StatusOr<std::map<std::string, Tensor>> ComputeRefit(
    const EngineDesc& engine, const std::map<std::string, Tensor>& initializers,
    RefitReport* report) {
  if (!engine.graph) return MakeError(ErrorCode::kInvalidArgument, "no engine to refit");
  const auto start = Clock::now();
  const WeightProgram& program = engine.weight_program;
  // A QDQ model's INT8 layers carry its scales as attributes, which the program does not make.
  KILN_RETURN_IF_ERROR(CheckModelInt8Sources(*engine.graph, initializers));
  WeightProgramStats stats;
  KILN_ASSIGN_OR_RETURN(auto values,
                        RunWeightProgram(program, initializers, ReferenceEvaluator(), &stats));
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
    report->int8_layers = 0;
    for (const Node* n : engine.graph->nodes()) {
      report->int8_layers += n->attrs().Has(std::string(precision::kInt8InputAmaxAttr)) ? 1 : 0;
    }
    report->int8_scales = report->int8_layers > 0 ? "stored" : "";
    report->calibration.clear();
    report->replay_seconds = Seconds(start);
    report->check_seconds = stats.check_seconds;
    report->steps_seconds = stats.steps_seconds;
    report->op_seconds = std::move(stats.op_seconds);
    report->split_steps = stats.split_steps;
    report->longest_op = stats.longest_op;
    report->longest_seconds = stats.longest_seconds;
  }
  return values;
}

Status RefitEngine(EngineDesc& engine, const std::map<std::string, Tensor>& initializers,
                   const Hash128& model_hash, RefitReport* report) {
  KILN_ASSIGN_OR_RETURN(auto values, ComputeRefit(engine, initializers, report));
  if (report) report->filled_stripped = engine.header.weights_stripped;
  for (auto& [name, t] : values) engine.graph->FindValue(name)->set_constant(std::move(t));
  engine.header.model_hash = model_hash.Hex();
  // Every constant a stripped engine lacks is a target of its program (the loader checks it), so
  // it is full now: the engine a build of these weights writes.
  engine.header.weights_stripped = false;
  return OkStatus();
}

namespace {

void HashTensor(Hasher& h, const Tensor& t, bool values) {
  h.Field(static_cast<int64_t>(t.dtype())).Field(static_cast<int64_t>(t.dims().size()));
  for (int64_t d : t.dims()) h.Field(d);
  if (values) h.Update(t.bytes());
}

void HashAttribute(Hasher& h, const std::string& name, const Attribute& a) {
  h.Field(name).Field(static_cast<int64_t>(KindOf(a)));
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          h.Field(v);
        } else if constexpr (std::is_same_v<T, float>) {
          h.Update(std::as_bytes(std::span(&v, 1)));
        } else if constexpr (std::is_same_v<T, std::string>) {
          h.Field(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                             std::is_same_v<T, std::vector<float>>) {
          h.Field(static_cast<int64_t>(v.size())).Update(std::as_bytes(std::span(v)));
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          h.Field(static_cast<int64_t>(v.size()));
          for (const std::string& x : v) h.Field(x);
        } else {
          HashTensor(h, v, true);
        }
      },
      a);
}

}  // namespace

Hash128 WeightFreeModelHash(const Graph& g) {
  Hasher h;
  h.Field("kiln weight-free model 1").Field(g.opset());
  for (const Value* v : g.inputs()) {
    h.Field(v->name()).Field(static_cast<int64_t>(v->dtype())).Field(ToString(v->shape()));
  }
  for (const Value* v : g.outputs()) h.Field(v->name());
  for (const Value* v : g.values()) {
    if (!v->is_constant()) continue;
    const Tensor& t = *v->constant();
    const WeightExprPtr& e = v->provenance();
    const bool weight = e && e->kind == WeightExpr::Kind::kInitializer && t.num_elements() > 1 &&
                        (t.dtype() == DataType::kFloat32 || t.dtype() == DataType::kFloat16 ||
                         t.dtype() == DataType::kBFloat16);
    h.Field(v->name());
    HashTensor(h, t, !weight);
  }
  for (const Node* n : g.nodes()) {
    h.Field(n->op_type()).Field(n->domain()).Field(static_cast<int64_t>(n->num_inputs()));
    for (const Value* v : n->inputs()) h.Field(v ? v->name() : std::string());
    for (const Value* v : n->outputs()) h.Field(v ? v->name() : std::string());
    for (const auto& [name, a] : n->attrs().all()) HashAttribute(h, name, a);
  }
  return h.Digest();
}

namespace {

// Only the initializers matter: the model may hold another architecture, which the check against
// the engine's program then names, whatever ops it uses.
ImportOptions WeightsImportOptions() {
  ImportOptions options;
  options.hash_file = true;
  options.allow_unsupported_ops = true;
  options.verify = false;
  return options;
}

OnnxWeights WeightsOf(const Graph& graph, const Hash128& file_hash) {
  OnnxWeights out;
  out.file_hash = file_hash;
  for (InitializerInfo& init : CollectInitializers(graph)) {
    out.initializers.emplace(std::move(init.name), std::move(init.value));
  }
  return out;
}

}  // namespace

StatusOr<OnnxWeights> ReadOnnxWeights(const std::string& path) {
  OnnxModelMeta meta;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph,
                        ImportOnnxFile(path, WeightsImportOptions(), &meta));
  return WeightsOf(*graph, meta.file_hash);
}

StatusOr<OnnxWeights> ReadOnnxWeightsFromBytes(std::span<const std::byte> bytes) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph,
                        ImportOnnxBytes(bytes, "", WeightsImportOptions()));
  return WeightsOf(*graph, HashBytes(bytes));
}

Hash128 InitializersHash(const std::map<std::string, Tensor>& initializers) {
  Hasher h;
  h.Field("kiln refit initializers 1").Field(static_cast<int64_t>(initializers.size()));
  for (const auto& [name, t] : initializers) {
    h.Field(name);
    HashTensor(h, t, true);
  }
  return h.Digest();
}

Status RefitEngineFile(const std::string& engine_path, const std::string& onnx_path,
                       const std::string& out_path, RefitReport* report,
                       const RecalibrateOptions* recalibrate) {
  RefitReport local;
  RefitReport& rep = report ? *report : local;
  LoadOptions load;
  load.check_providers = false;  // refit runs on the host: a CUDA engine is refit here too
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> engine,
                        LoadEngineFileForEdit(engine_path, load));
  auto start = Clock::now();
  OnnxWeights weights;
  std::unique_ptr<Graph> model;  // recalibration: the whole model, imported as a build imports it
  if (recalibrate) {
    ImportOptions options;
    options.hash_file = true;
    OnnxModelMeta meta;
    KILN_ASSIGN_OR_RETURN(model, ImportOnnxFile(onnx_path, options, &meta));
    weights = WeightsOf(*model, meta.file_hash);
  } else {
    KILN_ASSIGN_OR_RETURN(weights, ReadOnnxWeights(onnx_path));
  }
  rep.read_seconds = Seconds(start);
  Status refit = RefitEngine(*engine, weights.initializers, weights.file_hash, &rep);
  if (refit.ok() && recalibrate) {
    refit = RecalibrateInt8(*engine, std::move(model), *recalibrate, &rep);
  }
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
