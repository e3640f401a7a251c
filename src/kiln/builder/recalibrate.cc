// Refit's INT8 recalibration (refit.h RecalibrateInt8): the build's calibration run again on the
// new model, its ranges written into the engine's INT8 layers with the reasons a build writes.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kiln/backends/reference.h"
#include "kiln/builder/builder.h"
#include "kiln/builder/quant_edges.h"
#include "kiln/builder/refit.h"
#include "kiln/core/json_writer.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/calibration_data.h"
#include "kiln/passes/pass.h"
#include "kiln/precision/precision.h"

namespace kiln {
namespace {

// Whether the engine's graph went through stem_space_to_depth: its weight program (how refit
// renews its constants) has a step of the pass's weight op. The build's decision, which the
// environment of a later refit may not repeat.
bool BuiltWithStemSpaceToDepth(const EngineDesc& engine) {
  for (const WeightProgram::Step& step : engine.weight_program.steps) {
    if (step.op_type == passes::kStemSpaceToDepthWeightsOp) return true;
  }
  return false;
}

// An INT8 layer's precision reason split at its amax: Int8LayerReason's method and storage, and
// the note the sensitivity fallback may have added after it.
struct Int8Reason {
  DataType storage = DataType::kUndefined;
  std::string note;
};

StatusOr<Int8Reason> ParseInt8Reason(const std::string& reason, const std::string& input,
                                     const std::string& layer) {
  auto unknown = [&] {
    return MakeError(ErrorCode::kRefitNotRefittable,
                     "INT8 layer '{}' has the precision reason \"{}\", not the one a build gives "
                     "an INT8 layer reading '{}': this engine was not built the way "
                     "recalibration repeats (rebuild it with the new weights)",
                     layer, reason, input);
  };
  const std::string head = fmt::format("i8: input '{}' amax ", input);
  if (reason.rfind(head, 0) != 0) return unknown();
  const size_t open = reason.find(" (", head.size());
  const size_t close = open == std::string::npos ? open : reason.find("), ", open);
  const size_t end = close == std::string::npos ? close : reason.find(" storage", close);
  if (end == std::string::npos) return unknown();
  std::optional<DataType> storage = ParseDataType(reason.substr(close + 3, end - close - 3));
  if (!storage) return unknown();
  return Int8Reason{*storage, reason.substr(end + 8)};
}

// The stored build report with each layer's "precision_reason" string replaced through `renamed`
// (quoted JSON strings), leaving every other byte as the builder's JsonWriter wrote it.
std::string ReplaceReasons(const std::string& json,
                           const std::map<std::string, std::string>& renamed) {
  static constexpr std::string_view kKey = "\"precision_reason\": ";
  std::string out;
  size_t pos = 0;
  for (size_t key = json.find(kKey); key != std::string::npos; key = json.find(kKey, pos)) {
    const size_t begin = key + kKey.size();
    size_t end = begin + 1;  // past the closing quote of the string at `begin`
    while (end < json.size() && json[end] != '"') end += json[end] == '\\' ? 2 : 1;
    end = std::min(end + 1, json.size());
    out.append(json, pos, begin - pos);
    auto it = renamed.find(json.substr(begin, end - begin));
    out += it != renamed.end() ? it->second : json.substr(begin, end - begin);
    pos = end;
  }
  out.append(json, pos, std::string::npos);
  return out;
}

// The note after a recalibrated layer's reason: the sensitivity fallback's figures are the
// build's (not re-taken), the edge notes (quant_edges.h, the note's end) stay as they are.
std::string RecalibratedNote(const std::string& note) {
  const size_t edges = std::min(FindEdgeNote(note, "int8"), note.size());
  return (edges > 0 ? "; int8 sensitivity fallback as built (not re-measured)" : "") +
         note.substr(edges);
}

std::string Quoted(const std::string& text) { return JsonWriter().String(text).Take(); }

}  // namespace

Status RecalibrateInt8(EngineDesc& engine, std::unique_ptr<Graph> model,
                       const RecalibrateOptions& options, RefitReport* report) {
  const std::string amax_attr(precision::kInt8InputAmaxAttr);
  std::vector<Node*> int8;
  bool reduced = false;  // the engine computes in FP16/BF16 somewhere
  for (Node* n : engine.graph->nodes()) {
    if (n->attrs().Has(amax_attr)) int8.push_back(n);
  }
  for (const Value* v : engine.graph->values()) {
    reduced |= v->dtype() == DataType::kFloat16 || v->dtype() == DataType::kBFloat16;
  }
  if (report) report->int8_layers = static_cast<int64_t>(int8.size());
  if (int8.empty()) {
    if (report) report->calibration = "no INT8 layer: nothing to recalibrate";
    return OkStatus();
  }
  if (options.calibration_dir.empty()) {
    return MakeError(ErrorCode::kCalibrationInputInvalid,
                     "recalibrating {} INT8 layer(s) needs calibration data (--calib-dir)",
                     int8.size());
  }
  // The graph the build calibrated: the build's first phase on the new model, with the engine's
  // profile and backend (and, on CUDA, the channels-last convolutions of an FP16 build, and the
  // stem rewrite where the build made it).
  BuilderConfig config;
  config.backend = engine.header.backend;
  config.profile = engine.profile;
  config.fp16 = reduced;
  config.stem_space_to_depth = BuiltWithStemSpaceToDepth(engine);
  KILN_ASSIGN_OR_RETURN(
      std::unique_ptr<Graph> graph,
      CalibrationGraph({std::move(model), engine.header.model_name, Hash128()}, config));
  KILN_ASSIGN_OR_RETURN(auto data,
                        LoadCalibrationData(*graph, engine.profile, options.calibration_dir));
  KILN_ASSIGN_OR_RETURN(
      precision::CalibrationTable table,
      precision::Calibrate(*graph, ReferenceEvaluator(), data, options.method, options.percentile));

  // Every INT8 layer's new scale and reason first; the engine changes only when all have one.
  struct Update {
    Node* node;
    float amax;
    LayerDesc* layer;
    std::string reason;
  };
  std::vector<Update> updates;
  std::map<std::string, std::string> renamed;
  for (Node* n : int8) {
    const Node* calibrated = graph->FindNode(n->name());
    if (!calibrated || calibrated->num_inputs() == 0 || !calibrated->input(0)) {
      return MakeError(ErrorCode::kRefitNotRefittable,
                       "INT8 layer '{}' is not in the graph the build calibrated (was the engine "
                       "built without the graph passes?): rebuild it with the new weights",
                       n->name());
    }
    const std::string& input = calibrated->input(0)->name();
    const precision::TensorRange* range = table.Find(input);
    if (!range || !(range->amax > 0) || !std::isfinite(range->amax)) {
      return MakeError(ErrorCode::kRefitNotRefittable,
                       "with the new weights, the input '{}' of INT8 layer '{}' calibrates to "
                       "amax {}: a build would not make that layer INT8; rebuild the engine",
                       input, n->name(), range ? range->amax : 0.0);
    }
    Update u{n, static_cast<float>(range->amax), nullptr, {}};
    for (LayerDesc& l : engine.layers) {
      if (l.node == n) u.layer = &l;
    }
    if (u.layer) {
      KILN_ASSIGN_OR_RETURN(Int8Reason old,
                            ParseInt8Reason(u.layer->precision_reason, input, n->name()));
      u.reason = precision::Int8LayerReason(input, range->amax, options.method, old.storage) +
                 RecalibratedNote(old.note);
      renamed[Quoted(u.layer->precision_reason)] = Quoted(u.reason);
    }
    updates.push_back(std::move(u));
  }
  for (Update& u : updates) {
    u.node->mutable_attrs().Set(amax_attr, u.amax);
    if (u.layer) u.layer->precision_reason = std::move(u.reason);
  }
  // The int8 between two layers is quantized by its producer with the consumer's scale.
  RescaleInt8Edges(*engine.graph);
  engine.build_report_json = ReplaceReasons(engine.build_report_json, renamed);
  if (report) {
    report->int8_scales = "recalibrated";
    report->calibration = fmt::format("{}, {} data set(s) from '{}'", ToString(table.method),
                                      table.data_sets, options.calibration_dir);
  }
  return OkStatus();
}

}  // namespace kiln
