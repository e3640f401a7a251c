// The canonical kiln metrics on a prometheus-cpp registry, and their text exposition.
#include "kiln/obs/metrics.h"

#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "kiln/core/file_io.h"

namespace kiln::obs {

const std::vector<double>& BuildSecondsBuckets() {
  static const std::vector<double> b = {1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600};
  return b;
}
const std::vector<double>& KernelSecondsBuckets() {
  static const std::vector<double> b = {1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01,
                                        0.05, 0.1,  0.5,  1,    2,    5};
  return b;
}
const std::vector<double>& NcclInitSecondsBuckets() {
  static const std::vector<double> b = {0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600};
  return b;
}
const std::vector<double>& LatencySecondsBuckets() {
  static const std::vector<double> b = {1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                                        0.1,  0.25, 0.5,  1,      2.5,  5,    10};
  return b;
}

KilnMetrics::KilnMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  up_ = &prometheus::BuildGauge()
             .Name("kiln_up")
             .Help("1 while this kiln process is running and exporting metrics")
             .Register(r)
             .Add({});
  build_seconds_ = &prometheus::BuildHistogram()
                        .Name("kiln_engine_build_seconds")
                        .Help("Wall time of engine builds, in seconds")
                        .Register(r)
                        .Add({}, BuildSecondsBuckets());
  tactics_timed_ = &prometheus::BuildCounter()
                        .Name("kiln_build_tactics_timed_total")
                        .Help("Tactic candidates timed by the builder")
                        .Register(r)
                        .Add({});
  kernel_seconds_ = &prometheus::BuildHistogram()
                         .Name("kiln_kernel_seconds")
                         .Help("Single kernel launch times measured by kiln, in seconds")
                         .Register(r)
                         .Add({}, KernelSecondsBuckets());
  kernel_max_family_ =
      &prometheus::BuildGauge()
           .Name("kiln_kernel_max_seconds")
           .Help("Longest single kernel launch measured by this process, in seconds")
           .Register(r);
  nccl_init_ = &prometheus::BuildHistogram()
                    .Name("kiln_nccl_init_seconds")
                    .Help("Communicator initialisation latency, in seconds")
                    .Register(r)
                    .Add({}, NcclInitSecondsBuckets());
  inference_latency_ = &prometheus::BuildHistogram()
                            .Name("kiln_inference_latency_seconds")
                            .Help("Engine execution latency per inference, in seconds")
                            .Register(r)
                            .Add({}, LatencySecondsBuckets());
  device_peak_ = &prometheus::BuildGauge()
                      .Name("kiln_device_memory_peak_bytes")
                      .Help("Peak device memory held by kiln on each device, in bytes")
                      .Register(r);
  phase_seconds_ = &prometheus::BuildHistogram()
                        .Name("kiln_phase_seconds")
                        .Help("Duration of kiln work phases (build phases, waits), in seconds")
                        .Register(r);
  errors_ = &prometheus::BuildCounter()
                 .Name("kiln_errors_total")
                 .Help("Events reported with a kiln error-catalog code, by code")
                 .Register(r);
  up_->Set(1);
}

KilnMetrics& Metrics() {
  // Never destroyed: metrics may be touched from other static destructors and detached threads.
  static KilnMetrics* metrics = new KilnMetrics();
  return *metrics;
}

void KilnMetrics::ObserveEngineBuild(double seconds) {
  build_seconds_->Observe(seconds);
  std::lock_guard lock(mu_);
  figures_.engine_build_seconds = seconds;
}

void KilnMetrics::AddTacticsTimed(uint64_t n) { tactics_timed_->Increment(static_cast<double>(n)); }

void KilnMetrics::ObserveKernel(double seconds) {
  kernel_seconds_->Observe(seconds);
  std::lock_guard lock(mu_);
  if (!figures_.kernel_max_seconds || seconds > *figures_.kernel_max_seconds) {
    figures_.kernel_max_seconds = seconds;
    if (kernel_max_ == nullptr) kernel_max_ = &kernel_max_family_->Add({});
    kernel_max_->Set(seconds);
  }
}

void KilnMetrics::ObserveNcclInit(double seconds) {
  nccl_init_->Observe(seconds);
  std::lock_guard lock(mu_);
  if (!figures_.nccl_init_seconds || seconds > *figures_.nccl_init_seconds) {
    figures_.nccl_init_seconds = seconds;
  }
}

void KilnMetrics::ObserveDeviceMemory(int device, uint64_t bytes) {
  std::lock_guard lock(mu_);
  auto it = device_gauges_.find(device);
  if (it == device_gauges_.end()) {
    it = device_gauges_.emplace(device, &device_peak_->Add({{"device", std::to_string(device)}}))
             .first;
  }
  if (static_cast<double>(bytes) > it->second->Value()) it->second->Set(static_cast<double>(bytes));
  if (!figures_.device_memory_peak_bytes || bytes > *figures_.device_memory_peak_bytes) {
    figures_.device_memory_peak_bytes = bytes;
  }
}

void KilnMetrics::ObserveInferenceLatency(double seconds) { inference_latency_->Observe(seconds); }

void KilnMetrics::ObservePhase(std::string_view phase, double seconds) {
  prometheus::Histogram* h;
  {
    std::lock_guard lock(mu_);
    auto it = phase_hist_.find(phase);
    if (it == phase_hist_.end()) {
      it = phase_hist_
               .emplace(std::string(phase), &phase_seconds_->Add({{"phase", std::string(phase)}},
                                                                 BuildSecondsBuckets()))
               .first;
    }
    h = it->second;
  }
  h->Observe(seconds);
}

void KilnMetrics::CountError(std::string_view code) {
  prometheus::Counter* c;
  {
    std::lock_guard lock(mu_);
    auto it = error_counters_.find(code);
    if (it == error_counters_.end()) {
      it = error_counters_.emplace(std::string(code), &errors_->Add({{"code", std::string(code)}}))
               .first;
    }
    c = it->second;
  }
  c->Increment();
}

void KilnMetrics::SetUp(bool up) { up_->Set(up ? 1 : 0); }

RunFigures KilnMetrics::Figures() const {
  std::lock_guard lock(mu_);
  return figures_;
}

prometheus::Family<prometheus::Gauge>& KilnMetrics::GaugeFamily(const std::string& name,
                                                                const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = gauge_families_[name];
  if (!slot) slot = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  return *slot;
}

prometheus::Family<prometheus::Counter>& KilnMetrics::CounterFamily(const std::string& name,
                                                                    const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = counter_families_[name];
  if (!slot) slot = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  return *slot;
}

prometheus::Family<prometheus::Histogram>& KilnMetrics::HistogramFamily(const std::string& name,
                                                                        const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = hist_families_[name];
  if (!slot) slot = &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  return *slot;
}

std::string KilnMetrics::Serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

Status KilnMetrics::WriteTextfile(const std::string& path) const {
  if (path.empty()) {
    return MakeError(ErrorCode::kMetricsFileWriteFailed, "the metrics file path is empty");
  }
  // Atomic (a collector never reads half a file), never over a link, a device or an input.
  Status s = WriteFileAtomic(path, "metrics file", Serialize());
  if (s.ok() || IsWrongFileKind(s)) return s;
  return Status(ErrorCode::kMetricsFileWriteFailed, s.message());
}

}  // namespace kiln::obs
