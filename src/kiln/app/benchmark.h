// Latency measurement of an engine, trtexec-style: warm-up, then timed iterations, percentiles.
#pragma once

#include <string>
#include <vector>

#include "kiln/app/pipeline.h"

namespace kiln::app {

struct LatencyStats {
  int64_t iterations = 0;
  double min_ms = 0, mean_ms = 0, median_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
  double total_s = 0;
  double throughput_per_s = 0;     // inferences (engine executions) per second
  std::vector<double> samples_ms;  // every timed run, in order
  static LatencyStats FromSamples(std::vector<double> samples_ms);
};

struct BenchmarkOptions {
  int warmup = 5;
  int min_iterations = 20;
  double min_seconds = 1.0;
  int max_iterations = 100000;
};

// Times `runner.Run()` (host<->device copies included when the backend needs them).
StatusOr<LatencyStats> Benchmark(HostRunner& runner, const BenchmarkOptions& options);

}  // namespace kiln::app
