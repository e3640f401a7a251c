// Benchmark loop and percentile arithmetic.
#include "kiln/app/benchmark.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace kiln::app {

LatencyStats LatencyStats::FromSamples(std::vector<double> s) {
  LatencyStats st;
  if (s.empty()) return st;
  st.samples_ms = s;
  std::sort(s.begin(), s.end());
  auto pct = [&](double p) {
    double idx = p * static_cast<double>(s.size() - 1);
    size_t lo = static_cast<size_t>(idx);
    size_t hi = std::min(lo + 1, s.size() - 1);
    return s[lo] + (s[hi] - s[lo]) * (idx - static_cast<double>(lo));
  };
  st.iterations = static_cast<int64_t>(s.size());
  st.min_ms = s.front();
  st.max_ms = s.back();
  st.total_s = std::accumulate(s.begin(), s.end(), 0.0) / 1000.0;
  st.mean_ms = st.total_s * 1000.0 / static_cast<double>(s.size());
  st.median_ms = pct(0.5);
  st.p90_ms = pct(0.9);
  st.p99_ms = pct(0.99);
  st.throughput_per_s = st.median_ms > 0 ? 1000.0 / st.median_ms : 0;
  return st;
}

namespace {
// The timed loop ends on `elapsed >= min_seconds`: NaN would never compare true.
Status CheckBounds(const BenchmarkOptions& o) {
  if (o.warmup < 0 || o.min_iterations < 0 || o.max_iterations < 1 ||
      !std::isfinite(o.min_seconds) || o.min_seconds < 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "benchmark bounds must be finite and not negative (warmup {}, iterations "
                     "{}..{}, {} s)",
                     o.warmup, o.min_iterations, o.max_iterations, o.min_seconds);
  }
  return OkStatus();
}
}  // namespace

StatusOr<LatencyStats> Benchmark(HostRunner& runner, const BenchmarkOptions& options) {
  using Clock = std::chrono::steady_clock;
  KILN_RETURN_IF_ERROR(CheckBounds(options));
  for (int i = 0; i < options.warmup; ++i) KILN_RETURN_IF_ERROR(runner.Run());
  std::vector<double> samples;
  auto start = Clock::now();
  while (static_cast<int>(samples.size()) < options.max_iterations) {
    auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(runner.Run());
    samples.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (static_cast<int>(samples.size()) >= options.min_iterations &&
        elapsed >= options.min_seconds)
      break;
  }
  return LatencyStats::FromSamples(std::move(samples));
}

namespace {
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

StatusOr<EngineProfile> ProfileEngine(HostRunner& runner, const ProfileOptions& options) {
  using Clock = std::chrono::steady_clock;
  ExecutionContext& ctx = runner.context();
  Backend& backend = ctx.engine().backend();
  KILN_RETURN_IF_ERROR(CheckBounds(options));
  EngineProfile out;
  out.device_timing = backend.device_timing();
  // Events made once, before timing (Execute and the timed loop do not allocate).
  KILN_ASSIGN_OR_RETURN(DeviceHandle start, backend.CreateEvent());
  KILN_ASSIGN_OR_RETURN(DeviceHandle end, backend.CreateEvent());
  void* stream = ctx.stream();
  for (int i = 0; i < options.warmup; ++i) KILN_RETURN_IF_ERROR(runner.Run());

  std::vector<double> latency, compute, enqueue;
  const size_t reserve = static_cast<size_t>(std::min(options.max_iterations, 1 << 16));
  latency.reserve(reserve);
  compute.reserve(reserve);
  enqueue.reserve(reserve);
  const auto begin = Clock::now();
  while (static_cast<int>(latency.size()) < options.max_iterations) {
    const auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(runner.CopyInputs());
    KILN_RETURN_IF_ERROR(backend.RecordEvent(start.get(), stream));
    const auto e0 = Clock::now();
    KILN_RETURN_IF_ERROR(ctx.Execute(stream));
    const auto e1 = Clock::now();
    KILN_RETURN_IF_ERROR(backend.RecordEvent(end.get(), stream));
    KILN_RETURN_IF_ERROR(runner.CopyOutputs());
    const auto t1 = Clock::now();
    KILN_ASSIGN_OR_RETURN(double ms, backend.EventElapsedMs(start.get(), end.get()));
    compute.push_back(ms);
    enqueue.push_back(std::chrono::duration<double, std::milli>(e1 - e0).count());
    latency.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
    if (static_cast<int>(latency.size()) >= options.min_iterations &&
        elapsed >= options.min_seconds) {
      break;
    }
  }
  out.latency = LatencyStats::FromSamples(std::move(latency));
  out.compute = LatencyStats::FromSamples(std::move(compute));
  out.enqueue = LatencyStats::FromSamples(std::move(enqueue));
  out.graph_captures = ctx.graph_captures();
  out.graph_launches = ctx.graph_launches();
  out.graphs_disabled = ctx.graphs_disabled();

  if (options.layer_iterations > 0) {
    const bool was_on = ctx.options().layer_timing;
    KILN_RETURN_IF_ERROR(ctx.SetLayerTiming(true));
    const auto& layers = ctx.engine().desc().layers;
    std::vector<std::vector<double>> per_layer(layers.size());
    for (int i = 0; i < options.layer_iterations; ++i) {
      KILN_RETURN_IF_ERROR(runner.Run());
      KILN_ASSIGN_OR_RETURN(std::vector<double> ms, ctx.LayerTimesMs());
      for (size_t l = 0; l < ms.size() && l < per_layer.size(); ++l) per_layer[l].push_back(ms[l]);
    }
    KILN_RETURN_IF_ERROR(ctx.SetLayerTiming(was_on));
    for (size_t l = 0; l < layers.size(); ++l) {
      LayerTime t;
      t.name = layers[l].node ? layers[l].node->name() : std::string();
      t.tactic = layers[l].tactic.name;
      t.median_ms = Median(per_layer[l]);
      t.max_ms =
          per_layer[l].empty() ? 0 : *std::max_element(per_layer[l].begin(), per_layer[l].end());
      if (t.max_ms > out.max_kernel_ms) {
        out.max_kernel_ms = t.max_ms;
        out.max_kernel_layer = t.name;
      }
      out.layers.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace kiln::app
