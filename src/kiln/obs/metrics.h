// kiln's metrics registry: the canonical kiln metrics (names and units by Prometheus
// conventions) behind typed helpers, exported as Prometheus text (scrape or textfile).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln::obs {

// The four figures of a run that the report's "Metrics Validation" compares (RunSummary reads
// them). A figure nothing measured in this process stays empty, never 0.
struct RunFigures {
  std::optional<double> engine_build_seconds;        // last engine build
  std::optional<double> kernel_max_seconds;          // longest single kernel launch
  std::optional<double> nccl_init_seconds;           // longest communicator init
  std::optional<uint64_t> device_memory_peak_bytes;  // max over devices
};

// Bucket layouts (seconds). Builds run seconds to an hour; kernels microseconds to seconds.
const std::vector<double>& BuildSecondsBuckets();
const std::vector<double>& KernelSecondsBuckets();
const std::vector<double>& NcclInitSecondsBuckets();
const std::vector<double>& LatencySecondsBuckets();

class KilnMetrics {
 public:
  KilnMetrics();  // a fresh registry (tests); the process-wide one is Metrics()
  KilnMetrics(const KilnMetrics&) = delete;
  KilnMetrics& operator=(const KilnMetrics&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  std::shared_ptr<prometheus::Registry> shared_registry() { return registry_; }

  // --- the canonical kiln metrics; each call is thread-safe and cheap (no allocation once a
  // label set exists).
  void ObserveEngineBuild(double seconds);  // kiln_engine_build_seconds (histogram)
  void AddTacticsTimed(uint64_t n = 1);     // kiln_build_tactics_timed_total
  void ObserveKernel(double seconds);       // kiln_kernel_seconds + kiln_kernel_max_seconds
  void ObserveNcclInit(double seconds);     // kiln_nccl_init_seconds (histogram)
  void ObserveDeviceMemory(int device, uint64_t bytes);  // kiln_device_memory_peak_bytes{device}
  void ObserveInferenceLatency(double seconds);          // kiln_inference_latency_seconds
  void ObservePhase(std::string_view phase, double seconds);  // kiln_phase_seconds{phase}
  void CountError(std::string_view code);                     // kiln_errors_total{code}
  void SetUp(bool up);                                        // kiln_up

  RunFigures Figures() const;

  // Families for metrics defined elsewhere in obs (the GPU sampler); names must be valid.
  prometheus::Family<prometheus::Gauge>& GaugeFamily(const std::string& name,
                                                     const std::string& help);
  prometheus::Family<prometheus::Counter>& CounterFamily(const std::string& name,
                                                         const std::string& help);
  prometheus::Family<prometheus::Histogram>& HistogramFamily(const std::string& name,
                                                             const std::string& help);

  // The Prometheus text exposition format (what a scrape returns).
  std::string Serialize() const;
  // Writes Serialize() for node-exporter's textfile collector: to a temporary file in the
  // same directory, then renamed, so the collector never reads half a file.
  Status WriteTextfile(const std::string& path) const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* up_;
  prometheus::Histogram* build_seconds_;
  prometheus::Counter* tactics_timed_;
  prometheus::Histogram* kernel_seconds_;
  prometheus::Family<prometheus::Gauge>* kernel_max_family_;
  prometheus::Gauge* kernel_max_ = nullptr;  // added on the first measurement: absent != 0
  prometheus::Histogram* nccl_init_;
  prometheus::Histogram* inference_latency_;
  prometheus::Family<prometheus::Gauge>* device_peak_;
  prometheus::Family<prometheus::Histogram>* phase_seconds_;
  prometheus::Family<prometheus::Counter>* errors_;

  mutable std::mutex mu_;  // guards the figures and the family maps below
  RunFigures figures_;
  std::map<int, prometheus::Gauge*, std::less<>> device_gauges_;
  std::map<std::string, prometheus::Histogram*, std::less<>> phase_hist_;
  std::map<std::string, prometheus::Counter*, std::less<>> error_counters_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*, std::less<>> gauge_families_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*, std::less<>> counter_families_;
  std::map<std::string, prometheus::Family<prometheus::Histogram>*, std::less<>> hist_families_;
};

// The process-wide registry that `kiln build`, `kiln run` and `kiln monitor` export.
KilnMetrics& Metrics();

}  // namespace kiln::obs
