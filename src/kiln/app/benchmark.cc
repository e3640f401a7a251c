// Benchmark loop and percentile arithmetic.
#include "kiln/app/benchmark.h"

#include <algorithm>
#include <chrono>
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

StatusOr<LatencyStats> Benchmark(HostRunner& runner, const BenchmarkOptions& options) {
  using Clock = std::chrono::steady_clock;
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

}  // namespace kiln::app
