// INT8 sensitivity analysis on the FP32 reference: fake quantization that mirrors the INT8
// kernels, partial re-evaluation downstream of the quantized layers, and the fallback plan.
#include "kiln/precision/sensitivity.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <tuple>
#include <unordered_map>

#include "kiln/precision/precision.h"

namespace kiln::precision {

namespace {

// Per-channel symmetric quantize-dequantize of a `channels` x `inner` matrix whose element (c, i)
// is at c * channel_stride + i * inner_stride; the arithmetic is the kernels' (float scale
// absmax/127, a zero channel keeps scale 1).
void FakeQuantizePerChannel(float* w, int64_t channels, int64_t inner, int64_t channel_stride,
                            int64_t inner_stride) {
  for (int64_t c = 0; c < channels; ++c) {
    float absmax = 0.f;
    for (int64_t i = 0; i < inner; ++i) {
      absmax = std::max(absmax, std::fabs(w[c * channel_stride + i * inner_stride]));
    }
    const float scale = absmax > 0.f ? absmax / 127.f : 1.f;
    const float inv = 1.f / scale;
    for (int64_t i = 0; i < inner; ++i) {
      float& x = w[c * channel_stride + i * inner_stride];
      x = std::clamp(std::nearbyint(x * inv), -127.f, 127.f) * scale;
    }
  }
}

const Tensor* Lookup(const std::map<std::string, Tensor>& values, const std::string& name) {
  auto it = values.find(name);
  return it == values.end() ? nullptr : &it->second;
}

// One layer set evaluated INT8 on every data set: the maximum rel-L2 of the float graph outputs.
class Simulator {
 public:
  Simulator(const Graph& graph, const NodeEvaluator& evaluate, std::vector<const Node*> order,
            std::span<const std::map<std::string, Tensor>> activations)
      : graph_(graph), evaluate_(evaluate), order_(std::move(order)), activations_(activations) {
    for (size_t i = 0; i < order_.size(); ++i) position_[order_[i]] = i;
  }

  // `int8`: the quantized layers with their amax (one per data set) and fake-quantized weights.
  struct Layer {
    std::vector<float> amax;
    const Tensor* weights = nullptr;
    bool e4m3 = false;  // FP8 E4M3 per tensor, else INT8
  };
  StatusOr<double> Evaluate(const std::unordered_map<const Node*, Layer>& int8) const {
    size_t first = order_.size();
    for (const auto& [node, layer] : int8) first = std::min(first, position_.at(node));
    double worst = 0;
    for (size_t set = 0; set < activations_.size(); ++set) {
      const auto& base = activations_[set];
      std::unordered_map<const Value*, Tensor> changed;
      for (size_t p = first; p < order_.size(); ++p) {
        const Node* node = order_[p];
        auto q = int8.find(node);
        bool dirty = q != int8.end();
        for (const Value* v : node->inputs()) dirty |= v && changed.count(v);
        if (!dirty) continue;  // nothing it reads was changed: its FP32 outputs stand
        std::vector<const Tensor*> ins;
        for (const Value* v : node->inputs()) {
          if (!v) {
            ins.push_back(nullptr);
          } else if (auto c = changed.find(v); c != changed.end()) {
            ins.push_back(&c->second);
          } else if (v->constant()) {
            ins.push_back(v->constant());
          } else if (const Tensor* t = Lookup(base, v->name())) {
            ins.push_back(t);
          } else {
            return MakeError(ErrorCode::kInternal,
                             "int8 sensitivity: '{}' read by '{}' was not computed in calibration",
                             v->name(), node->name());
          }
        }
        Tensor quantized_input;
        if (q != int8.end()) {
          quantized_input = q->second.e4m3 ? FakeQuantizeE4M3(*ins[0], q->second.amax[set])
                                           : FakeQuantizeActivations(*ins[0], q->second.amax[set]);
          ins[0] = &quantized_input;
          ins[1] = q->second.weights;
        }
        auto results = evaluate_(*node, ins);
        if (!results.ok()) {
          return std::move(results).status().AddContext(fmt::format(
              "while measuring the quantization sensitivity at layer '{}'", node->name()));
        }
        for (size_t i = 0; i < results->size() && i < node->num_outputs(); ++i) {
          if (const Value* v = node->output(i)) changed[v] = std::move((*results)[i]);
        }
      }
      for (const Value* out : graph_.outputs()) {
        auto c = changed.find(out);
        if (c == changed.end() || !IsFloat(out->dtype())) continue;
        const Tensor* ref = Lookup(base, out->name());
        if (!ref) continue;
        worst = std::max(worst, RelativeL2(c->second, *ref));
      }
    }
    return worst;
  }

 private:
  const Graph& graph_;
  const NodeEvaluator& evaluate_;
  std::vector<const Node*> order_;
  std::unordered_map<const Node*, size_t> position_;
  std::span<const std::map<std::string, Tensor>> activations_;
};

}  // namespace

namespace {
StatusOr<double> ParseTolerance(std::string_view text, std::string_view flag,
                                std::string_view layers) {
  if (text == "off" || text == "none") return HUGE_VAL;
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v > 0) || !std::isfinite(v)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "{} '{}': give the relative L2 error against FP32 that the {} layers may "
                     "cause, a number > 0 (e.g. 0.05), or 'off' to keep every {} layer",
                     flag, std::string(text), layers, layers);
  }
  return v;
}
}  // namespace

StatusOr<double> ParseInt8Tolerance(std::string_view text) {
  return ParseTolerance(text, "--int8-tolerance", "INT8");
}

StatusOr<double> ParseFp8Tolerance(std::string_view text) {
  return ParseTolerance(text, "--fp8-tolerance", "FP8");
}

Tensor FakeQuantizeActivations(const Tensor& x, float amax) { return FakeQuantizeInt8(x, amax); }

std::optional<Tensor> FakeQuantizeWeights(const Node& node, const Tensor& w) {
  if (w.dtype() != DataType::kFloat32 || w.dims().empty()) return std::nullopt;
  Tensor out = w;
  float* d = out.mutable_data<float>();
  const std::string& op = node.op_type();
  const auto& dims = w.dims();
  if (op == "Conv" || op == "FusedConv") {
    const int64_t channels = dims[0];
    if (channels <= 0) return std::nullopt;
    const int64_t inner = w.num_elements() / channels;
    FakeQuantizePerChannel(d, channels, inner, inner, 1);
    return out;
  }
  if (dims.size() != 2) return std::nullopt;
  // MatMul has no transB; Gemm and the fused forms may.
  const bool trans_b = op != "MatMul" && node.attrs().GetInt("transB", 0) != 0;
  if (trans_b) {
    FakeQuantizePerChannel(d, dims[0], dims[1], dims[1], 1);  // B is [N, K]
  } else {
    FakeQuantizePerChannel(d, dims[1], dims[0], 1, dims[1]);  // B is [K, N]
  }
  return out;
}

std::optional<Tensor> FakeQuantizeFp8Weights(const Tensor& w) {
  if (w.dtype() != DataType::kFloat32 || w.dims().size() != 2) return std::nullopt;
  float absmax = 0.f;
  const float* d = w.data<float>();
  for (int64_t i = 0, n = w.num_elements(); i < n; ++i) absmax = std::max(absmax, std::fabs(d[i]));
  if (!(absmax > 0.f) || !std::isfinite(absmax)) return w;  // all zero: E4M3 keeps it
  return FakeQuantizeE4M3(w, absmax);
}

double RelativeL2(const Tensor& actual, const Tensor& reference) {
  const int64_t n = std::min(actual.num_elements(), reference.num_elements());
  if (actual.num_elements() != reference.num_elements()) return HUGE_VAL;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = actual.GetDouble(i), r = reference.GetDouble(i);
    diff += (a - r) * (a - r);
    ref += r * r;
  }
  if (!std::isfinite(diff)) return HUGE_VAL;
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

namespace {
// The analysed layers, in topological order (deterministic): INT8 candidates with a calibrated
// amax (per data set: held out where given) and weights the INT8 kernels take, quantized.
struct AnalysedLayers {
  std::vector<std::pair<const Node*, Simulator::Layer>> layers;
  std::vector<std::unique_ptr<Tensor>> weights;  // what the layers point at
};
AnalysedLayers Analyse(std::span<const Node* const> order, const CalibrationTable& table,
                       size_t sets, std::span<const std::map<std::string, double>> held_out_amax,
                       QuantScheme scheme) {
  AnalysedLayers a;
  const bool e4m3 = scheme == QuantScheme::kFp8;
  for (const Node* node : order) {
    if (!(e4m3 ? IsFp8Candidate(*node) : IsInt8Candidate(*node))) continue;
    const TensorRange* r = table.Find(node->input(0)->name());
    // INT8 clips at the method's amax; FP8 scales to the absmax (assign.cc's TryFp8).
    const double table_amax = !r ? 0.0 : e4m3 ? r->absmax : r->amax;
    if (!(table_amax > 0) || !std::isfinite(table_amax)) continue;
    std::optional<Tensor> w = e4m3 ? FakeQuantizeFp8Weights(*node->input(1)->constant())
                                   : FakeQuantizeWeights(*node, *node->input(1)->constant());
    if (!w) continue;
    a.weights.push_back(std::make_unique<Tensor>(std::move(*w)));
    Simulator::Layer layer;
    layer.weights = a.weights.back().get();
    layer.e4m3 = e4m3;
    for (size_t set = 0; set < sets; ++set) {
      double amax = table_amax;
      if (set < held_out_amax.size()) {
        auto h = held_out_amax[set].find(node->input(0)->name());
        // A tensor that is all zero in the other sets has no held-out scale: the table's then.
        if (h != held_out_amax[set].end() && h->second > 0 && std::isfinite(h->second)) {
          amax = h->second;
        }
      }
      layer.amax.push_back(static_cast<float>(amax));
    }
    a.layers.emplace_back(node, std::move(layer));
  }
  return a;
}

// Each layer alone, then all together, with `evaluate_set` giving one set's rel-L2.
template <typename EvaluateSet>
StatusOr<SensitivityResult> MeasureEach(const AnalysedLayers& a, EvaluateSet&& evaluate_set) {
  SensitivityResult result;
  std::unordered_map<const Node*, Simulator::Layer> all;
  for (const auto& [node, layer] : a.layers) {
    KILN_ASSIGN_OR_RETURN(double e, evaluate_set({{node, layer}}));
    result.layers[node->name()] = e;
    ++result.evaluations;
    all.emplace(node, layer);
  }
  KILN_ASSIGN_OR_RETURN(result.all_int8, evaluate_set(all));
  ++result.evaluations;
  return result;
}
}  // namespace

StatusOr<SensitivityResult> MeasureInt8Sensitivity(
    const Graph& graph, const NodeEvaluator& evaluate,
    std::span<const std::map<std::string, Tensor>> activations, const CalibrationTable& table,
    std::span<const std::map<std::string, double>> held_out_amax, QuantScheme scheme) {
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  std::vector<const Node*> const_order(order.begin(), order.end());
  const AnalysedLayers a = Analyse(const_order, table, activations.size(), held_out_amax, scheme);
  if (a.layers.empty() || activations.empty()) return SensitivityResult{};
  if (!evaluate) return MakeError(ErrorCode::kInternal, "int8 sensitivity: no reference evaluator");
  Simulator sim(graph, evaluate, const_order, activations);
  return MeasureEach(a, [&](const std::unordered_map<const Node*, Simulator::Layer>& int8) {
    return sim.Evaluate(int8);
  });
}

StatusOr<SensitivityResult> MeasureInt8SensitivityByRerun(
    const Graph& graph, const GraphStatsEvaluator& graph_stats,
    std::span<const std::map<std::string, Tensor>> data,
    std::span<const std::map<std::string, Tensor>> reference_outputs, const CalibrationTable& table,
    std::span<const std::map<std::string, double>> held_out_amax, QuantScheme scheme) {
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  std::vector<const Node*> const_order(order.begin(), order.end());
  const AnalysedLayers a = Analyse(const_order, table, data.size(), held_out_amax, scheme);
  if (a.layers.empty() || data.empty()) return SensitivityResult{};
  if (!graph_stats || reference_outputs.size() != data.size()) {
    return MakeError(ErrorCode::kInternal, "int8 sensitivity: no graph walk or reference outputs");
  }
  ValueStatsRequest request;
  for (const Value* out : graph.outputs()) {
    if (IsFloat(out->dtype()) && !out->constant()) request.keep.insert(out->name());
  }
  return MeasureEach(
      a, [&](const std::unordered_map<const Node*, Simulator::Layer>& int8) -> StatusOr<double> {
        double worst = 0;
        for (size_t set = 0; set < data.size(); ++set) {
          request.overrides.clear();
          for (const auto& [node, layer] : int8) {
            ValueStatsRequest::Override& o = request.overrides[node];
            (layer.e4m3 ? o.fp8_amax : o.int8_amax) = layer.amax[set];
            o.input1 = layer.weights;
          }
          auto stats = graph_stats(graph, data[set], request);
          if (!stats.ok()) {
            return std::move(stats).status().AddContext(
                "while measuring the quantization sensitivity");
          }
          for (const auto& [name, got] : stats->kept) {
            auto ref = reference_outputs[set].find(name);
            if (ref != reference_outputs[set].end()) {
              worst = std::max(worst, RelativeL2(got, ref->second));
            }
          }
        }
        return worst;
      });
}

Int8FallbackPlan PlanInt8Fallback(const CalibrationTable& table,
                                  const std::vector<std::string>& int8_layers, double tolerance) {
  return PlanFallback(table.int8_sensitivity, table.int8_all_rel_l2, int8_layers, tolerance);
}

Int8FallbackPlan PlanFallback(const std::map<std::string, double>& sensitivities, double all_rel_l2,
                              const std::vector<std::string>& layers, double tolerance,
                              const std::map<std::string, double>& benefit) {
  Int8FallbackPlan plan;
  auto sensitivity = [&](const std::string& name) {
    auto it = sensitivities.find(name);
    return it == sensitivities.end() ? 0.0 : it->second;
  };
  double all_sq = 0;
  for (const auto& [name, s] : sensitivities) all_sq += s * s;
  if (all_sq > 0 && all_rel_l2 > 0) {
    plan.scale = std::max(1.0, all_rel_l2 / std::sqrt(all_sq));
  }
  // Most sensitive first, or with benefits the most error per unit of benefit (s^2 / benefit: the
  // share of the squared estimate a layer removes for what it gives up); the name breaks ties so
  // the plan never depends on map or hash order.
  auto key = [&](const std::string& name) {
    const double s = sensitivity(name);
    auto b = benefit.find(name);
    if (benefit.empty()) return s;
    return b != benefit.end() && b->second > 0 ? s * s / b->second : HUGE_VAL;
  };
  std::vector<std::tuple<double, std::string, double>> ranked;  // key, name, sensitivity
  for (const std::string& name : layers) ranked.emplace_back(key(name), name, sensitivity(name));
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b)
                                            : std::get<1>(a) < std::get<1>(b);
  });
  // suffix[k]: the squared sum of the layers from rank k on (those still INT8 after k fall back).
  std::vector<double> suffix(ranked.size() + 1, 0.0);
  for (size_t k = ranked.size(); k-- > 0;)
    suffix[k] = suffix[k + 1] + std::get<2>(ranked[k]) * std::get<2>(ranked[k]);
  size_t k = 0;
  for (; k < ranked.size(); ++k) {
    const double estimate = plan.scale * std::sqrt(suffix[k]);
    if (estimate <= tolerance) break;
    plan.fall_back[std::get<1>(ranked[k])] = {std::get<2>(ranked[k]), estimate};
  }
  plan.estimate = plan.scale * std::sqrt(suffix[k]);
  return plan;
}

}  // namespace kiln::precision
