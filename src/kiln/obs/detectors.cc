// The detectors' state machines. Each condition is raised once on entry and cleared once on
// exit, so a persistent problem produces one event and one counter increment, not one per poll.
#include "kiln/obs/detectors.h"

#include <string>

namespace kiln::obs {

std::string_view ToString(HealthKind kind) {
  switch (kind) {
    case HealthKind::kUtilizationCollapse:
      return "utilization_collapse";
    case HealthKind::kMemoryPressure:
      return "memory_pressure";
    case HealthKind::kXid:
      return "xid";
    case HealthKind::kThrottling:
      return "throttling";
  }
  return "unknown";
}

ErrorCode CodeOf(HealthKind kind) {
  switch (kind) {
    case HealthKind::kUtilizationCollapse:
      return ErrorCode::kGpuUtilizationCollapse;
    case HealthKind::kMemoryPressure:
      return ErrorCode::kGpuMemoryPressure;
    case HealthKind::kXid:
      return ErrorCode::kGpuXid;
    case HealthKind::kThrottling:
      return ErrorCode::kGpuThrottling;
  }
  return ErrorCode::kInternal;
}

Status Validate(const DetectorConfig& c) {
  auto ratio = [](double r) { return r >= 0.0 && r <= 1.0; };
  if (!ratio(c.busy_ratio) || !ratio(c.idle_ratio) || c.idle_ratio >= c.busy_ratio) {
    return MakeError(ErrorCode::kOutOfRange,
                     "utilization thresholds need 0 <= idle ({}) < busy ({}) <= 1", c.idle_ratio,
                     c.busy_ratio);
  }
  if (!ratio(c.memory_pressure_ratio) || c.memory_pressure_ratio == 0.0) {
    return MakeError(ErrorCode::kOutOfRange, "memory pressure ratio {} is not in (0, 1]",
                     c.memory_pressure_ratio);
  }
  if (c.collapse_window.count() < 0 || c.throttle_window.count() < 0) {
    return MakeError(ErrorCode::kOutOfRange, "detector windows must not be negative");
  }
  return OkStatus();
}

namespace {
std::string ReasonList(uint64_t bits) {
  std::string out;
  for (const auto& r : clock_event::kReasons) {
    if ((bits & r.bit) == 0) continue;
    if (!out.empty()) out += ',';
    out += r.label;
  }
  return out.empty() ? "none" : out;
}
}  // namespace

std::vector<HealthEvent> HealthDetectors::Observe(const GpuSample& s, Clock::time_point now) {
  std::vector<HealthEvent> events;
  DeviceState& st = state_[s.device];
  auto emit = [&](HealthKind kind, bool active, std::string detail) {
    events.push_back(HealthEvent{kind, s.device, active, std::move(detail), 0});
  };

  // Utilization collapse. A missing reading neither starts nor ends an idle stretch.
  if (s.utilization_gpu_ratio) {
    double u = *s.utilization_gpu_ratio;
    if (u >= config_.busy_ratio) st.worked = true;
    if (u <= config_.idle_ratio) {
      if (!st.idle_since) st.idle_since = now;
      if (st.worked && !st.collapse && now - *st.idle_since >= config_.collapse_window) {
        st.collapse = true;
        auto secs = std::chrono::duration<double>(now - *st.idle_since).count();
        emit(HealthKind::kUtilizationCollapse, true,
             fmt::format("GPU {} was busy (>= {:.0f}%) and has been at <= {:.0f}% for {:.0f} s",
                         s.device, config_.busy_ratio * 100, config_.idle_ratio * 100, secs));
      }
    } else {
      st.idle_since.reset();
      if (st.collapse) {
        st.collapse = false;
        emit(HealthKind::kUtilizationCollapse, false,
             fmt::format("GPU {} is working again ({:.0f}%)", s.device, u * 100));
      }
    }
  }

  // Memory pressure.
  if (s.memory_used_bytes && s.memory_total_bytes && *s.memory_total_bytes > 0) {
    double ratio = static_cast<double>(*s.memory_used_bytes) / *s.memory_total_bytes;
    if (!st.pressure && ratio >= config_.memory_pressure_ratio) {
      st.pressure = true;
      emit(HealthKind::kMemoryPressure, true,
           fmt::format("GPU {} memory {} of {} bytes used ({:.1f}% >= {:.1f}%)", s.device,
                       *s.memory_used_bytes, *s.memory_total_bytes, ratio * 100,
                       config_.memory_pressure_ratio * 100));
    } else if (st.pressure && ratio < config_.memory_pressure_ratio - config_.memory_hysteresis) {
      st.pressure = false;
      emit(HealthKind::kMemoryPressure, false,
           fmt::format("GPU {} memory back to {:.1f}% used", s.device, ratio * 100));
    }
  }

  // Throttling.
  if (s.clock_event_reasons) {
    uint64_t bits = *s.clock_event_reasons & config_.throttle_mask;
    if (bits != 0) {
      if (!st.throttled_since) st.throttled_since = now;
      if (!st.throttling && now - *st.throttled_since >= config_.throttle_window) {
        st.throttling = true;
        emit(HealthKind::kThrottling, true,
             fmt::format("GPU {} clocks held back: {}", s.device, ReasonList(bits)));
      }
    } else {
      st.throttled_since.reset();
      if (st.throttling) {
        st.throttling = false;
        emit(HealthKind::kThrottling, false,
             fmt::format("GPU {} clocks no longer throttled", s.device));
      }
    }
  }
  return events;
}

HealthEvent HealthDetectors::OnXid(const XidEvent& x) const {
  return HealthEvent{HealthKind::kXid, x.device, true,
                     fmt::format("GPU {} reported Xid {}: {}", x.device, x.xid, XidMeaning(x.xid)),
                     x.xid};
}

bool HealthDetectors::Active(HealthKind kind, int device) const {
  auto it = state_.find(device);
  if (it == state_.end()) return false;
  switch (kind) {
    case HealthKind::kUtilizationCollapse:
      return it->second.collapse;
    case HealthKind::kMemoryPressure:
      return it->second.pressure;
    case HealthKind::kThrottling:
      return it->second.throttling;
    case HealthKind::kXid:
      return false;
  }
  return false;
}

}  // namespace kiln::obs
