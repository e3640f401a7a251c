// Job health detectors over GPU samples: utilization collapse, memory pressure, Xid, throttling.
// Pure logic with an explicit clock, so tests script hours of samples in microseconds.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/obs/gpu_source.h"

namespace kiln::obs {

enum class HealthKind { kUtilizationCollapse, kMemoryPressure, kXid, kThrottling };
std::string_view ToString(HealthKind kind);  // "utilization_collapse", ... (the metric label)
ErrorCode CodeOf(HealthKind kind);           // its catalog code (8006..8009)

struct DetectorConfig {
  // A GPU "worked" once its utilization reached busy_ratio; it "collapsed" when it then stayed
  // at or below idle_ratio for collapse_window (the report's "drops to near-zero after the 5th
  // epoch").
  double busy_ratio = 0.5;
  double idle_ratio = 0.05;
  std::chrono::milliseconds collapse_window = std::chrono::seconds(60);
  // Memory pressure: used / total at or above this; cleared below it minus the hysteresis.
  double memory_pressure_ratio = 0.95;
  double memory_hysteresis = 0.02;
  // Clock-event bits that count as throttling, and how long they must persist.
  uint64_t throttle_mask = clock_event::kThrottling;
  std::chrono::milliseconds throttle_window = std::chrono::seconds(0);
};
Status Validate(const DetectorConfig& config);

struct HealthEvent {
  HealthKind kind;
  int device = -1;
  bool active = true;  // raised (true) or cleared (false); Xid events are always raised
  std::string detail;  // for people: what was seen, with numbers
  uint64_t xid = 0;    // kXid only
};

class HealthDetectors {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HealthDetectors(DetectorConfig config) : config_(config) {}

  // Feeds one sample taken at `now`; returns the conditions raised or cleared by it.
  std::vector<HealthEvent> Observe(const GpuSample& sample, Clock::time_point now);
  HealthEvent OnXid(const XidEvent& xid) const;
  bool Active(HealthKind kind, int device) const;
  const DetectorConfig& config() const { return config_; }

 private:
  struct DeviceState {
    bool worked = false;
    std::optional<Clock::time_point> idle_since;
    std::optional<Clock::time_point> throttled_since;
    bool collapse = false;
    bool pressure = false;
    bool throttling = false;
  };
  DetectorConfig config_;
  std::map<int, DeviceState> state_;
};

}  // namespace kiln::obs
