// BuilderConfig: everything that decides what engine a build produces. Its hash is part of the
// engine's content address (dist) and header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "kiln/backends/kernel.h"
#include "kiln/core/hash.h"
#include "kiln/engine/engine_desc.h"

namespace kiln {

// The memory budget: absolute bytes, or a fraction of the device's free memory shared among the
// ranks on that device.
struct MemoryBudget {
  std::optional<int64_t> bytes;
  std::optional<double> fraction;
  int ranks_per_device = 1;
  bool unlimited() const { return !bytes && !fraction; }
  // Parses "512M", "8G", "1073741824", "0.5" (a fraction when < 1 and has a point).
  static StatusOr<MemoryBudget> Parse(const std::string& text);
  std::string ToString() const;
};

// Progress reported to a callback; returning false cancels the build (like TensorRT's
// IProgressMonitor). Cancelling in the tactic phase still yields the best engine so far.
struct BuildProgress {
  std::string phase;  // "import", "passes", "precision", "tactics", "plan", "serialize"
  int64_t done = 0;
  int64_t total = 0;
  double elapsed_s = 0;
  std::string detail;  // e.g. the layer being timed, best-so-far latency
};
using ProgressCallback = std::function<bool(const BuildProgress&)>;

struct BuilderConfig {
  BackendKind backend = BackendKind::kCpu;
  bool fp16 = false;
  bool bf16 = false;
  bool int8 = false;
  OptimizationProfile profile;
  MemoryBudget memory_budget;
  // Bounded build: at the deadline the best engine so far is kept (never an error).
  std::optional<std::chrono::milliseconds> deadline;
  std::optional<double> max_kernel_time_ms;
  std::string timing_cache_path;
  bool optimize = true;  // graph passes
  // false: every layer keeps its heuristic (first) tactic and nothing is timed; the baseline
  // that bench/build compares the tactic search against.
  bool search_tactics = true;
  ProgressCallback progress;

  // Everything that changes the engine's bytes (not progress or cache paths).
  Hash128 Hash() const;
};

// Parses "input:1x3x224x224,8x3x224x224,32x3x224x224" (min,opt,max) into `profile`.
Status ParseProfileSpec(const std::string& spec, OptimizationProfile* profile);
// Parses "60s", "1500ms", "5m", "1h" (a bare number is seconds).
StatusOr<std::chrono::milliseconds> ParseDuration(const std::string& text);

}  // namespace kiln
