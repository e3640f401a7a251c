// Tactic selection: the heuristic choice per layer first (a valid engine exists at once), then
// candidates timed in order of expected gain until the deadline, within the memory budget and the
// single-kernel time bound, with a shared timing cache.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string_view>
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
  // Statistical early stop: a candidate is stopped once it is clearly slower than the layer's best
  // so far (its fastest timed run above kEarlyStopRatio x that median, or, with several warm-up
  // runs, its fastest warm-up run after the first above kEarlyStopWarmupRatio x). Its runs can
  // then only have given a larger median. The first run alone never stops a candidate: it may
  // carry one-time costs (lazy module loading).
  bool early_stop = false;
  // Settled runs: a candidate whose first two timed runs are within settle_ratio of each other
  // (slowest / fastest), once min_total_ms of samples are in, is done before min_runs (0: off).
  // For long kernels (a CPU convolution at batch 8 runs for milliseconds) min_runs, not
  // min_total_ms, sets the count, and two agreeing runs decide as well as three.
  double settle_ratio = 0;
  // Candidates set up (created, prepared, workspace allocated) concurrently: the candidates of
  // up to `setup_threads` layer signatures at a time, by at most `setup_threads` threads, while
  // nothing is being timed; timing stays serial.
  int setup_threads = 1;
};

// The early stop's margins (see TacticSearchOptions::early_stop).
inline constexpr double kEarlyStopRatio = 1.25;
inline constexpr double kEarlyStopWarmupRatio = 2.0;
// The builder's settle_ratio below the widest level.
inline constexpr double kSettleRatio = 1.05;

// The tactics a search takes from one provider's offer, in its order: those whose names start
// with `prefix` (every one when it is empty), at most `per_family` of each family (0: no bound).
std::vector<TacticConfig> TakeTactics(std::vector<TacticConfig> offered, std::string_view prefix,
                                      int per_family);

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
  // The candidate is the timing cache's winner for this signature, taken without listing the
  // providers' tactics (a warm build sets up nothing).
  bool from_cache = false;
};

// Times one candidate at the opt shapes. Returns the median and the slowest single run (ms);
// runs == 0 when the deadline passed before the candidate could run.
struct TacticTiming {
  double median_ms = 0;
  double max_ms = 0;
  int runs = 0;
  double setup_seconds = 0;    // kernel creation, Prepare, workspace (inputs: TimingInputs)
  double run_seconds = 0;      // warm-up and timed runs with their synchronisations
  bool stopped_early = false;  // clearly slower than best_ms: median_ms is a lower bound
};

// A layer's operands at the opt shapes, random inputs, on the backend: made once per layer
// signature and shared by all its candidates.
struct TimingInputs {
  std::vector<Tensor> host_inputs, host_outputs;
  std::vector<DeviceBuffer> buffers;
  std::vector<TensorView> ins, outs;
  double seconds = 0;
};
StatusOr<TimingInputs> MakeTimingInputs(Backend& backend, const LayerSearch& layer);

// One candidate ready to run: created, prepared for the opt shapes, workspace allocated.
struct PreparedTactic {
  std::unique_ptr<Kernel> kernel;
  DeviceBuffer workspace;
  size_t workspace_bytes = 0;
  double seconds = 0;
};
StatusOr<PreparedTactic> PrepareTactic(Backend& backend, const LayerSearch& layer,
                                       const TacticCandidate& candidate,
                                       const TimingInputs& inputs);

// Times a prepared candidate. best_ms (< 0: none yet) is the layer's best median so far, for the
// early stop. runs == 0 when the deadline passed before it could run.
StatusOr<TacticTiming> RunTiming(Backend& backend, PreparedTactic& prepared,
                                 const TimingInputs& inputs, const TacticSearchOptions& options,
                                 double best_ms = -1);

// Sets up and times one candidate (MakeTimingInputs + PrepareTactic + RunTiming).
StatusOr<TacticTiming> TimeTactic(Backend& backend, const LayerSearch& layer,
                                  const TacticCandidate& candidate,
                                  const TacticSearchOptions& options);

// Runs task(i) for i in [0, n) on at most `threads` threads (the caller's among them), each
// other thread bound to the backend's device first. Returns the most tasks seen running at once.
int RunBounded(Backend& backend, int threads, size_t n, const std::function<void(size_t)>& task);

// Picks a tactic for every layer (layers[i].chosen) and fills the report's timing counters.
Status SearchTactics(Backend& backend, std::vector<LayerSearch>& layers,
                     const TacticSearchOptions& options, BuildReport* report);

}  // namespace kiln
