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

// One layer's time with per-layer timing on (eager launches, an event around each layer).
struct LayerTime {
  std::string name;    // the layer's node
  std::string tactic;  // its tactic, e.g. "f16-conv-nhwc-cudnn-engine12"
  double median_ms = 0;
  double max_ms = 0;
};

// trtexec's split of one run. `device_timing`: compute and layer times come from the backend's
// device timers (CUDA events); otherwise from the host clock (the CPU backend runs synchronously).
struct EngineProfile {
  bool device_timing = false;
  LatencyStats latency;  // host wall time of copy in + execute + copy out
  LatencyStats compute;  // events around the whole enqueue: "GPU compute time"
  LatencyStats enqueue;  // host time for Execute() to return (launch cost; ~0 with a graph)
  std::vector<LayerTime> layers;  // empty when layer_iterations == 0
  double max_kernel_ms = 0;       // the longest single layer seen in the per-layer runs
  std::string max_kernel_layer;
  int64_t graph_captures = 0, graph_launches = 0;
  bool graphs_disabled = false;  // capture failed: ran layer by layer
};

struct ProfileOptions : BenchmarkOptions {
  int layer_iterations = 10;  // eager runs with per-layer events after the timed runs
};

// Warm-up, then timed runs (latency, compute, enqueue), then per-layer timing runs.
StatusOr<EngineProfile> ProfileEngine(HostRunner& runner, const ProfileOptions& options);

}  // namespace kiln::app
