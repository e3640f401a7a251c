// The GPU sampler: polls a GpuSource at an interval, exports the samples as kiln_gpu_* metrics,
// feeds the health detectors, and turns their findings into log events and counters. A second
// thread waits (bounded) for Xid events. Failed polls are counted and sampling continues.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "kiln/obs/detectors.h"
#include "kiln/obs/gpu_source.h"
#include "kiln/obs/metrics.h"

namespace kiln::obs {

struct SamplerOptions {
  std::chrono::milliseconds interval = std::chrono::seconds(1);
  // Bound of one Xid wait; it also bounds how long Stop() can take.
  std::chrono::milliseconds xid_wait = std::chrono::milliseconds(500);
  DetectorConfig detectors;
};

struct SamplerStats {
  uint64_t rounds = 0;           // polls of all devices
  uint64_t samples = 0;          // device samples that came back (possibly with field errors)
  uint64_t sample_failures = 0;  // device samples that failed as a whole
  uint64_t call_failures = 0;    // failed queries inside samples
  uint64_t xid_events = 0;
  uint64_t health_events = 0;  // raised conditions (cleared ones not counted)
};

class Sampler {
 public:
  using Clock = std::chrono::steady_clock;
  using EventCallback = std::function<void(const HealthEvent&)>;

  // `source` null means no GPU source (NVML absent): kiln_nvml_up is 0 and nothing is sampled.
  // Neither pointer is owned; both must outlive the sampler.
  Sampler(GpuSource* source, KilnMetrics* metrics, SamplerOptions options);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Called for every raised or cleared condition (from the sampler's threads). Set before Start.
  void SetEventCallback(EventCallback callback) { callback_ = std::move(callback); }

  Status Start();  // starts the polling and Xid threads
  void Stop();     // returns within about options.xid_wait

  // One poll of every device at `now` (the polling thread calls this; tests call it directly).
  void SampleOnce(Clock::time_point now);
  // One bounded Xid wait; false once the source cannot report Xids.
  bool PollXidOnce(std::chrono::milliseconds timeout);

  SamplerStats stats() const;

 private:
  struct DeviceMetrics;
  DeviceMetrics& ForDevice(int device);
  void Export(const GpuSample& sample);
  void Handle(const HealthEvent& event);
  void CountCallError(int device, const CallError& error);

  GpuSource* source_;
  KilnMetrics* metrics_;
  SamplerOptions options_;
  EventCallback callback_;

  std::mutex mu_;  // detectors, per-device metric handles, failure streaks
  HealthDetectors detectors_;
  std::map<int, std::unique_ptr<DeviceMetrics>> devices_;
  std::set<std::pair<int, std::string>> failing_calls_;  // (device, call) in a failure streak
  std::set<int> failing_devices_;

  prometheus::Family<prometheus::Counter>* nvml_errors_;
  prometheus::Counter* samples_total_;
  prometheus::Histogram* round_seconds_;

  std::atomic<uint64_t> rounds_{0}, samples_{0}, sample_failures_{0}, call_failures_{0},
      xid_events_{0}, health_events_{0};

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread poll_thread_;
  std::thread xid_thread_;
};

}  // namespace kiln::obs
