// The one graph walker over a NodeEvaluator: inputs, then each node in topological order.
#include "kiln/ir/evaluator.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "kiln/core/minifloat.h"

namespace kiln {

StatusOr<std::map<std::string, Tensor>> EvaluateAllValues(const Graph& graph,
                                                          const std::map<std::string, Tensor>& feed,
                                                          const NodeEvaluator& evaluate) {
  ValueStatsRequest all;
  all.keep_all = true;
  KILN_ASSIGN_OR_RETURN(ValueStats stats, EvaluateValueStats(graph, feed, evaluate, all));
  // The feed as given (entries no graph input names included), then what the nodes computed.
  std::map<std::string, Tensor> values = feed;
  for (auto& [name, t] : stats.kept) values.insert_or_assign(name, std::move(t));
  return values;
}

StatusOr<std::map<std::string, Tensor>> EvaluateGraphOutputs(
    const Graph& graph, const std::map<std::string, Tensor>& inputs,
    const NodeEvaluator& evaluate) {
  KILN_ASSIGN_OR_RETURN(auto values, EvaluateAllValues(graph, inputs, evaluate));
  std::map<std::string, Tensor> result;
  for (const Value* out : graph.outputs()) {
    if (out->constant()) {
      result[out->name()] = *out->constant();
    } else if (auto it = values.find(out->name()); it != values.end()) {
      result[out->name()] = std::move(it->second);
    } else {
      return MakeError(ErrorCode::kUndefinedValue, "graph output '{}' was never computed",
                       out->name());
    }
  }
  return result;
}

StatusOr<ValueStats> EvaluateValueStats(const Graph& graph,
                                        const std::map<std::string, Tensor>& feed,
                                        const NodeEvaluator& evaluate,
                                        const ValueStatsRequest& request) {
  if (!evaluate) return MakeError(ErrorCode::kInternal, "no node evaluator was given");
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  std::unordered_map<const Value*, int64_t> readers;
  for (const Node* node : order) {
    for (const Value* v : node->inputs()) {
      if (v && !v->constant()) ++readers[v];
    }
  }
  ValueStats stats;
  auto observe = [&](const Value& v, const Tensor& t) {
    const std::string& name = v.name();
    if (IsFloat(t.dtype()) && request.absmax.contains(name)) {
      AccumulateAbsMax(t, &stats.absmax[name]);
    }
    if (auto h = request.histograms.find(name);
        h != request.histograms.end() && IsFloat(t.dtype())) {
      std::vector<double>& counts = stats.histograms[name];
      counts.assign(static_cast<size_t>(std::max(request.bins, 1)), 0.0);
      AccumulateAbsHistogram(t, h->second, counts);
    }
    if (request.keep_all || request.keep.contains(name)) stats.kept[name] = t;
  };
  // Values still to be read, dropped after their last reader.
  std::unordered_map<const Value*, Tensor> live;
  for (const Value* in : graph.inputs()) {
    auto it = feed.find(in->name());
    if (it == feed.end()) {
      return MakeError(ErrorCode::kInputCountMismatch, "no value given for graph input '{}'",
                       in->name());
    }
    observe(*in, it->second);
    if (readers[in] > 0) live[in] = it->second;
  }
  std::vector<const Tensor*> ins;
  for (const Node* node : order) {
    ins.clear();
    for (const Value* v : node->inputs()) {
      if (!v) {
        ins.push_back(nullptr);
      } else if (v->constant()) {
        ins.push_back(v->constant());
      } else if (auto it = live.find(v); it != live.end()) {
        ins.push_back(&it->second);
      } else {
        return MakeError(ErrorCode::kUndefinedValue, "value '{}' read by '{}' was never computed",
                         v->name(), node->name());
      }
    }
    Tensor quantized;
    if (auto o = request.overrides.find(node); o != request.overrides.end()) {
      if (o->second.int8_amax > 0 && !ins.empty() && ins[0]) {
        quantized = FakeQuantizeInt8(*ins[0], o->second.int8_amax);
        ins[0] = &quantized;
      } else if (o->second.fp8_amax > 0 && !ins.empty() && ins[0]) {
        quantized = FakeQuantizeE4M3(*ins[0], o->second.fp8_amax);
        ins[0] = &quantized;
      }
      if (o->second.input1 && ins.size() > 1) ins[1] = o->second.input1;
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, evaluate(*node, ins));
    for (size_t i = 0; i < outs.size() && i < node->num_outputs(); ++i) {
      const Value* v = node->output(i);
      if (!v) continue;
      observe(*v, outs[i]);
      if (readers[v] > 0) live[v] = std::move(outs[i]);
    }
    for (const Value* v : node->inputs()) {
      if (v && !v->constant() && --readers[v] == 0) live.erase(v);
    }
  }
  return stats;
}

void AccumulateAbsMax(const Tensor& t, double* absmax) {
  const int64_t n = t.num_elements();
  double m = *absmax;
  if (t.dtype() == DataType::kFloat32) {
    const float* x = t.data<float>();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(x[i])));
  } else {
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(t.GetDouble(i)));
  }
  *absmax = m;
}

void AccumulateAbsHistogram(std::span<const float> values, double range, std::span<double> counts) {
  if (counts.empty()) return;
  if (!(range > 0)) {
    counts[0] += static_cast<double>(values.size());
    return;
  }
  const auto bins = static_cast<size_t>(counts.size());
  const double scale = static_cast<double>(bins) / range;
  for (float v : values) {
    const double a = std::fabs(static_cast<double>(v));
    if (!std::isfinite(a)) continue;
    const double x = a * scale;  // >= 0; compared before the conversion, which could overflow
    counts[x >= static_cast<double>(bins - 1) ? bins - 1 : static_cast<size_t>(x)] += 1;
  }
}

void AccumulateAbsHistogram(const Tensor& t, double range, std::span<double> counts) {
  const Tensor f = t.dtype() == DataType::kFloat32 ? t : t.CastTo(DataType::kFloat32);
  AccumulateAbsHistogram(std::span(f.data<float>(), static_cast<size_t>(f.num_elements())), range,
                         counts);
}

namespace {
// x element by element in float32 (f(value, 1 / scale, scale)), back in x's type.
template <typename F>
Tensor QuantizeDequantize(const Tensor& x, float scale, F f) {
  Tensor out = x.dtype() == DataType::kFloat32 ? x : x.CastTo(DataType::kFloat32);
  float* v = out.mutable_data<float>();
  const float inv = 1.f / scale;
  for (int64_t i = 0, n = out.num_elements(); i < n; ++i) v[i] = f(v[i], inv, scale);
  return x.dtype() == DataType::kFloat32 ? out : out.CastTo(x.dtype());
}
}  // namespace

Tensor FakeQuantizeInt8(const Tensor& x, float amax) {
  return QuantizeDequantize(x, amax / 127.f, [](float v, float inv, float scale) {
    // Saturate before rounding, NaN included, as the kernels do.
    float s = v * inv;
    s = s < 127.f ? s : 127.f;
    s = s > -127.f ? s : -127.f;
    return std::nearbyint(s) * scale;
  });
}

Tensor FakeQuantizeE4M3(const Tensor& x, float amax) {
  return QuantizeDequantize(x, amax / 448.f, [](float v, float inv, float scale) {
    if (std::isnan(v)) return v;
    const uint8_t q = FloatToFloat8Bits(v * inv, Float8Format::kE4M3FN, /*saturate=*/true);
    return Float8BitsToFloat(q, Float8Format::kE4M3FN) * scale;
  });
}

}  // namespace kiln
