// Tactic selection: the heuristic choice per layer first (a valid engine exists at once), then
// candidates timed in order of expected gain until the deadline, within the memory budget and the
// single-kernel time bound, with a shared timing cache.
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/builder/builder.h"
#include "kiln/builder/timing_cache.h"

namespace kiln {

struct TacticSearchOptions {
  std::optional<std::chrono::steady_clock::time_point> deadline;
  std::optional<double> max_kernel_time_ms;
  // Largest workspace a tactic may take (from the memory budget); nullopt: unlimited.
  std::optional<int64_t> max_workspace_bytes;
  TimingCache* cache = nullptr;  // may be null
  ProgressCallback progress;
  std::chrono::steady_clock::time_point start;
  // A candidate runs at least min_runs times and until min_total_ms of samples, at most max_runs
  // times; the median is its time. A 10 us kernel gets 3 ms of samples (not 15 runs = 0.15 ms,
  // under one 4 ms scheduler tick), so one preemption cannot decide between close candidates.
  int warmup_runs = 1;
  int min_runs = 3;
  int max_runs = 300;
  double min_total_ms = 3.0;
};

struct TacticCandidate {
  const KernelProvider* provider = nullptr;
  TacticConfig tactic;
};

struct LayerSearch {
  const Node* node = nullptr;
  KernelRequest request;
  std::vector<std::vector<int64_t>> opt_in,
      opt_out;                              // operand dims at the profile's opt (empty: unknown)
  std::vector<TacticCandidate> candidates;  // every provider's tactics, heuristic order
  size_t chosen = 0;
  double time_ms = -1;
  std::string signature;
  double generate_seconds = 0;  // listing `candidates` (for the report's breakdown)
};

// Times one candidate at the opt shapes. Returns the median and the slowest single run (ms);
// runs == 0 when the deadline passed before the candidate could run.
struct TacticTiming {
  double median_ms = 0;
  double max_ms = 0;
  int runs = 0;
  double setup_seconds = 0;  // kernel creation, inputs, Prepare
  double run_seconds = 0;    // warm-up and timed runs with their synchronisations
};
StatusOr<TacticTiming> TimeTactic(Backend& backend, const LayerSearch& layer,
                                  const TacticCandidate& candidate,
                                  const TacticSearchOptions& options);

// Picks a tactic for every layer (layers[i].chosen) and fills the report's timing counters.
Status SearchTactics(Backend& backend, std::vector<LayerSearch>& layers,
                     const TacticSearchOptions& options, BuildReport* report);

}  // namespace kiln
