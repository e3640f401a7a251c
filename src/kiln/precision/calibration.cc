// Calibration statistics: the two reference passes over the data (onnx/calibration_data.h loads
// it) and the three ways of turning a histogram of |x| into a clipping threshold.
#include "kiln/precision/calibration.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "kiln/precision/precision.h"
#include "kiln/precision/sensitivity.h"

namespace kiln::precision {

using kiln::ToString;

namespace {
std::atomic<int64_t> g_batches_run{0};

// Smooths a distribution so that KL divergence stays finite where q has zeros (MXNet/TensorRT
// practice): moves `eps` of mass onto every empty bin, taken evenly from the others.
bool Smooth(std::vector<double>& p) {
  constexpr double kEps = 1e-4;
  size_t zeros = std::count(p.begin(), p.end(), 0.0);
  size_t nonzeros = p.size() - zeros;
  if (nonzeros == 0) return false;
  double eps1 = kEps * static_cast<double>(zeros) / static_cast<double>(nonzeros);
  for (double& x : p) x += x == 0.0 ? kEps : -eps1;
  return true;
}

double EntropyAmax(const AbsHistogram& hist) {
  constexpr int kLevels = 128;  // |q| in 0..127 plus the zero bin's share, as TensorRT does
  const std::vector<double>& h = hist.counts;
  const int n = static_cast<int>(h.size());
  double best_kl = std::numeric_limits<double>::infinity();
  int best_i = n;
  std::vector<double> p, q;
  for (int i = kLevels; i <= n; ++i) {
    // Reference: the first i bins, with everything beyond folded into the last one (clipped).
    p.assign(h.begin(), h.begin() + i);
    double outliers = 0;
    for (int k = i; k < n; ++k) outliers += h[k];
    p[i - 1] += outliers;
    // Candidate: the first i bins quantized to kLevels levels, then spread back over the bins
    // that were non-empty.
    q.assign(i, 0.0);
    const double merged = static_cast<double>(i) / kLevels;
    for (int j = 0; j < kLevels; ++j) {
      int start = static_cast<int>(std::floor(j * merged));
      int stop = j == kLevels - 1 ? i : static_cast<int>(std::floor((j + 1) * merged));
      double sum = 0;
      int nonzero = 0;
      for (int k = start; k < stop; ++k) {
        sum += h[k];
        nonzero += h[k] != 0.0;
      }
      if (nonzero == 0) continue;
      for (int k = start; k < stop; ++k) q[k] = h[k] != 0.0 ? sum / nonzero : 0.0;
    }
    double psum = 0, qsum = 0;
    for (int k = 0; k < i; ++k) {
      psum += p[k];
      qsum += q[k];
    }
    if (psum <= 0 || qsum <= 0) continue;
    for (int k = 0; k < i; ++k) {
      p[k] /= psum;
      q[k] /= qsum;
    }
    if (!Smooth(p) || !Smooth(q)) continue;
    double kl = 0;
    for (int k = 0; k < i; ++k) {
      if (p[k] > 0 && q[k] > 0) kl += p[k] * std::log(p[k] / q[k]);
    }
    if (kl < best_kl) {
      best_kl = kl;
      best_i = i;
    }
  }
  return std::min(hist.range, best_i * hist.bin_width());
}

double PercentileAmax(const AbsHistogram& hist, double percentile) {
  double total = 0;
  for (double c : hist.counts) total += c;
  if (total <= 0) return 0;
  const double target = total * std::clamp(percentile, 0.0, 100.0) / 100.0;
  double cum = 0;
  for (size_t b = 0; b < hist.counts.size(); ++b) {
    double c = hist.counts[b];
    if (c > 0 && cum + c >= target) {
      // Linear within the bin: values are taken as spread evenly over it.
      double frac = std::clamp((target - cum) / c, 0.0, 1.0);
      return std::min(hist.range, (static_cast<double>(b) + frac) * hist.bin_width());
    }
    cum += c;
  }
  return hist.range;
}

}  // namespace

std::string_view ToString(CalibrationMethod method) {
  switch (method) {
    case CalibrationMethod::kMinMax:
      return "minmax";
    case CalibrationMethod::kEntropy:
      return "entropy";
    case CalibrationMethod::kPercentile:
      return "percentile";
  }
  return "?";
}

StatusOr<CalibrationMethod> ParseCalibrationMethod(std::string_view text) {
  if (text == "minmax" || text == "min-max") return CalibrationMethod::kMinMax;
  if (text == "entropy") return CalibrationMethod::kEntropy;
  if (text == "percentile") return CalibrationMethod::kPercentile;
  return MakeError(ErrorCode::kInvalidArgument,
                   "--calib-method '{}': use minmax, entropy or percentile[=P] (e.g. "
                   "percentile=99.99)",
                   std::string(text));
}

void AbsHistogram::Add(std::span<const float> values) {
  AccumulateAbsHistogram(values, range, counts);
}

double AmaxFromHistogram(const AbsHistogram& hist, CalibrationMethod method, double percentile) {
  switch (method) {
    case CalibrationMethod::kMinMax:
      return hist.range;
    case CalibrationMethod::kEntropy:
      return EntropyAmax(hist);
    case CalibrationMethod::kPercentile:
      return PercentileAmax(hist, percentile);
  }
  return hist.range;
}

double ComputeAmax(std::span<const float> values, CalibrationMethod method, double percentile) {
  AbsHistogram hist;
  for (float v : values) {
    if (std::isfinite(v)) hist.range = std::max(hist.range, static_cast<double>(std::fabs(v)));
  }
  hist.Add(values);
  return AmaxFromHistogram(hist, method, percentile);
}

int64_t CalibrationBatchesRun() { return g_batches_run.load(); }

namespace {
Status CheckFeed(const Graph& graph, const std::map<std::string, Tensor>& feed) {
  for (const Value* in : graph.inputs()) {
    if (!feed.count(in->name())) {
      return MakeError(ErrorCode::kCalibrationInputInvalid,
                       "calibration data has no value for model input '{}'", in->name());
    }
  }
  return OkStatus();
}

NodeEvaluator InCalibrationContext(const NodeEvaluator& evaluate) {
  return [&evaluate](const Node& node,
                     std::span<const Tensor* const> ins) -> StatusOr<std::vector<Tensor>> {
    auto results = evaluate(node, ins);
    if (!results.ok()) {
      return std::move(results).status().AddContext(
          fmt::format("while calibrating layer '{}'", node.name()));
    }
    return results;
  };
}
}  // namespace

StatusOr<std::map<std::string, Tensor>> EvaluateCalibrationBatch(
    const Graph& graph, const std::map<std::string, Tensor>& feed, const NodeEvaluator& evaluate) {
  KILN_RETURN_IF_ERROR(CheckFeed(graph, feed));
  return EvaluateAllValues(graph, feed, InCalibrationContext(evaluate));
}

StatusOr<CalibrationTable> Calibrate(const Graph& graph, const NodeEvaluator& evaluate,
                                     std::span<const std::map<std::string, Tensor>> data,
                                     CalibrationMethod method, double percentile,
                                     bool int8_sensitivity, const GraphStatsEvaluator& graph_stats,
                                     bool fp8_sensitivity) {
  // Every float value a node computes is watched; only INT8 candidates' activations need a
  // clipping threshold (histogram), the rest need the absmax (FP16 guard).
  std::set<std::string> watched;
  std::set<std::string> needs_histogram;
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  for (const Node* node : order) {
    for (const Value* v : node->outputs()) {
      if (v && IsFloat(v->dtype())) watched.insert(v->name());
    }
    if (IsInt8Candidate(*node) && node->input(0)) needs_histogram.insert(node->input(0)->name());
  }
  for (const Value* v : graph.inputs()) {
    if (IsFloat(v->dtype())) watched.insert(v->name());
  }

  CalibrationTable table;
  table.method = method;
  table.percentile = percentile;
  table.data_sets = static_cast<int64_t>(data.size());
  const NodeEvaluator in_context = InCalibrationContext(evaluate);
  // One data set through the graph: its statistics, reduced where it ran (graph_stats: on the
  // device), each value dropped after its last reader unless kept.
  auto run = [&](const std::map<std::string, Tensor>& feed,
                 const ValueStatsRequest& request) -> StatusOr<ValueStats> {
    KILN_RETURN_IF_ERROR(CheckFeed(graph, feed));
    g_batches_run.fetch_add(1);
    if (!graph_stats) return EvaluateValueStats(graph, feed, in_context, request);
    auto stats = graph_stats(graph, feed, request);
    if (!stats.ok()) return std::move(stats).status().AddContext("while calibrating");
    return stats;
  };
  // The first pass finds each value's absmax. Its activations are kept when the INT8 sensitivity
  // is measured: that analysis re-evaluates only what lies downstream of a quantized layer.
  ValueStatsRequest first;
  first.absmax = watched;
  first.absmax.insert(needs_histogram.begin(), needs_histogram.end());
  // With a graph walk (a device), the sensitivity runs whole graphs again instead, and needs only
  // the graph outputs to compare with.
  bool has_fp8_candidates = false;
  for (const Node* node : order) has_fp8_candidates |= IsFp8Candidate(*node);
  const bool sensitivity =
      (int8_sensitivity && !needs_histogram.empty()) || (fp8_sensitivity && has_fp8_candidates);
  first.keep_all = sensitivity && !graph_stats;
  if (sensitivity && graph_stats) {
    for (const Value* out : graph.outputs()) {
      if (IsFloat(out->dtype()) && !out->constant()) first.keep.insert(out->name());
    }
  }
  std::map<std::string, double> absmax;
  std::vector<std::map<std::string, Tensor>> activations;  // or the graph outputs
  // Per data set statistics of the candidates' inputs, for the leave-one-out scales below.
  std::vector<std::map<std::string, double>> set_absmax;
  for (const auto& feed : data) {
    KILN_ASSIGN_OR_RETURN(ValueStats stats, run(feed, first));
    for (const auto& [name, m] : stats.absmax) {
      if (watched.contains(name)) absmax[name] = std::max(absmax[name], m);
    }
    auto& mine = set_absmax.emplace_back();
    for (const std::string& name : needs_histogram) {
      if (auto it = stats.absmax.find(name); it != stats.absmax.end()) mine[name] = it->second;
    }
    if (sensitivity) activations.push_back(std::move(stats.kept));
  }
  // The second fills the candidates' histograms over [0, absmax of every set).
  std::map<std::string, AbsHistogram> hists;
  std::vector<std::map<std::string, AbsHistogram>> set_hists(data.size());
  if (method != CalibrationMethod::kMinMax && !needs_histogram.empty()) {
    ValueStatsRequest second;
    second.bins = AbsHistogram::kBins;
    for (const std::string& name : needs_histogram) {
      hists[name].range = absmax[name];
      second.histograms[name] = absmax[name];  // one binning for all sets, so that they add up
    }
    for (size_t set = 0; set < data.size(); ++set) {
      KILN_ASSIGN_OR_RETURN(ValueStats stats, run(data[set], second));
      for (auto& [name, hist] : hists) {
        auto it = stats.histograms.find(name);
        if (it == stats.histograms.end() || it->second.size() != hist.counts.size()) continue;
        AbsHistogram& h = set_hists[set][name];
        h.range = hist.range;
        h.counts = std::move(it->second);
        for (int b = 0; b < AbsHistogram::kBins; ++b) hist.counts[b] += h.counts[b];
      }
    }
  }
  for (const auto& [name, m] : absmax) {
    TensorRange r;
    r.absmax = m;
    auto h = hists.find(name);
    r.amax = h == hists.end() ? m : AmaxFromHistogram(h->second, method, percentile);
    table.ranges[name] = r;
  }
  // Leave-one-out: data set d is quantized with the method's amax from every other data set, so
  // the sensitivity is measured on inputs the scales were not fitted to (a layer whose range
  // differs from batch to batch shows up). One data set: in-sample.
  std::vector<std::map<std::string, double>> held_out(data.size() > 1 ? data.size() : 0);
  for (size_t d = 0; d < held_out.size(); ++d) {
    for (const std::string& name : needs_histogram) {
      double amax = 0;
      if (method == CalibrationMethod::kMinMax) {
        for (size_t o = 0; o < data.size(); ++o) {
          if (o == d) continue;
          auto it = set_absmax[o].find(name);
          if (it != set_absmax[o].end()) amax = std::max(amax, it->second);
        }
      } else if (hists.count(name)) {
        AbsHistogram others;
        others.range = hists[name].range;
        for (size_t o = 0; o < data.size(); ++o) {
          auto it = set_hists[o].find(name);
          if (o == d || it == set_hists[o].end()) continue;
          for (int b = 0; b < AbsHistogram::kBins; ++b) others.counts[b] += it->second.counts[b];
        }
        amax = AmaxFromHistogram(others, method, percentile);
      }
      held_out[d][name] = amax;
    }
  }
  if (!activations.empty()) {
    auto counted = [&](const Graph& g, const std::map<std::string, Tensor>& feed,
                       const ValueStatsRequest& request) {
      g_batches_run.fetch_add(1);
      return graph_stats(g, feed, request);
    };
    auto measure =
        [&](QuantScheme scheme,
            std::span<const std::map<std::string, double>> held) -> StatusOr<SensitivityResult> {
      if (graph_stats) {
        return MeasureInt8SensitivityByRerun(graph, counted, data, activations, table, held,
                                             scheme);
      }
      return MeasureInt8Sensitivity(graph, evaluate, activations, table, held, scheme);
    };
    if (int8_sensitivity && !needs_histogram.empty()) {
      KILN_ASSIGN_OR_RETURN(SensitivityResult sens, measure(QuantScheme::kInt8, held_out));
      table.int8_sensitivity = std::move(sens.layers);
      table.int8_all_rel_l2 = sens.evaluations > 0 ? sens.all_int8 : -1;
    }
    if (fp8_sensitivity && has_fp8_candidates) {
      // FP8 scales by the absmax: held out, the largest of the other data sets'.
      std::vector<std::map<std::string, double>> held_absmax(data.size() > 1 ? data.size() : 0);
      for (size_t d = 0; d < held_absmax.size(); ++d) {
        for (size_t o = 0; o < data.size(); ++o) {
          if (o == d) continue;
          for (const auto& [name, m] : set_absmax[o]) {
            held_absmax[d][name] = std::max(held_absmax[d][name], m);
          }
        }
      }
      KILN_ASSIGN_OR_RETURN(SensitivityResult sens, measure(QuantScheme::kFp8, held_absmax));
      table.fp8_sensitivity = std::move(sens.layers);
      table.fp8_all_rel_l2 = sens.evaluations > 0 ? sens.all_int8 : -1;
    }
  }
  return table;
}

}  // namespace kiln::precision
