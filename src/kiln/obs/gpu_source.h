// Where GPU health samples come from: NVML on a GPU node (nvml.h), a scripted fake in tests
// (fake_gpu_source.h). The sampler and the detectors only see this interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::obs {

// Clock-event (throttle) reason bits, as NVML defines them (nvmlClocksEventReason*).
namespace clock_event {
inline constexpr uint64_t kGpuIdle = 0x1;
inline constexpr uint64_t kApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kSwPowerCap = 0x4;
inline constexpr uint64_t kHwSlowdown = 0x8;
inline constexpr uint64_t kSyncBoost = 0x10;
inline constexpr uint64_t kSwThermalSlowdown = 0x20;
inline constexpr uint64_t kHwThermalSlowdown = 0x40;
inline constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kDisplayClockSetting = 0x100;
// Reasons that mean the hardware is being held back against the job's wishes; power capping
// (kSwPowerCap) is normal under full load and is exported but not treated as throttling.
inline constexpr uint64_t kThrottling =
    kHwSlowdown | kSwThermalSlowdown | kHwThermalSlowdown | kHwPowerBrakeSlowdown;
// {bit, label} for the metric label "reason".
struct Reason {
  uint64_t bit;
  const char* label;
};
inline constexpr Reason kReasons[] = {
    {kGpuIdle, "gpu_idle"},
    {kApplicationsClocksSetting, "applications_clocks_setting"},
    {kSwPowerCap, "sw_power_cap"},
    {kHwSlowdown, "hw_slowdown"},
    {kSyncBoost, "sync_boost"},
    {kSwThermalSlowdown, "sw_thermal_slowdown"},
    {kHwThermalSlowdown, "hw_thermal_slowdown"},
    {kHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
    {kDisplayClockSetting, "display_clock_setting"},
};
}  // namespace clock_event

// One failed query inside an otherwise usable sample.
struct CallError {
  std::string call;  // "nvmlDeviceGetPowerUsage"
  int code = 0;      // the library's own return code
  std::string message;
};

// One poll of one GPU. Every value is optional: a query the GPU or driver does not support, or
// that failed this time, is absent (failures are listed in `errors`).
struct GpuSample {
  int device = 0;
  std::optional<uint64_t> memory_used_bytes;
  std::optional<uint64_t> memory_total_bytes;
  std::optional<double> utilization_gpu_ratio;     // 0..1, share of time a kernel ran
  std::optional<double> utilization_memory_ratio;  // 0..1, share of time memory was read/written
  std::optional<double> temperature_celsius;
  std::optional<double> power_watts;
  std::optional<uint64_t> clock_event_reasons;  // clock_event bits
  std::optional<uint64_t> ecc_corrected_total;  // aggregate (lifetime) counts
  std::optional<uint64_t> ecc_uncorrected_total;
  std::optional<uint32_t> remapped_rows_correctable;
  std::optional<uint32_t> remapped_rows_uncorrectable;
  std::optional<bool> remap_pending;
  std::optional<bool> remap_failed;
  std::vector<CallError> errors;
};

// Memory health of one GPU, read on demand (`kiln doctor`), not on every sample. Every value is
// optional: ECC counters need ECC on, row remapping exists from Ampere on, page retirement before
// it; "not supported" leaves the field absent, other failures are listed in `errors`.
struct GpuMemoryHealth {
  int device = 0;
  std::optional<bool> ecc_enabled;          // current ECC mode (nvmlDeviceGetEccMode)
  std::optional<bool> ecc_enabled_pending;  // mode after the next reboot
  // nvmlDeviceGetTotalEccErrors: volatile = since the last driver load / GPU reset, aggregate =
  // the GPU's lifetime.
  std::optional<uint64_t> ecc_uncorrected_volatile, ecc_uncorrected_aggregate;
  std::optional<uint64_t> ecc_corrected_volatile, ecc_corrected_aggregate;
  // nvmlDeviceGetRemappedRows
  std::optional<uint32_t> remapped_rows_correctable, remapped_rows_uncorrectable;
  std::optional<bool> remap_pending, remap_failed;
  // nvmlDeviceGetRetiredPages (single-bit and double-bit causes) and ...PendingStatus
  std::optional<uint32_t> retired_pages_sbe, retired_pages_dbe;
  std::optional<bool> retired_pages_pending;
  std::vector<CallError> errors;
};

struct GpuInfo {
  std::string name;        // "NVIDIA H200"
  std::string uuid;        // "GPU-..."
  std::string pci_bus_id;  // "00000000:C6:00.0"
};

struct XidEvent {
  int device = -1;  // -1 when the device could not be matched
  uint64_t xid = 0;
  std::chrono::system_clock::time_point time;
};

class GpuSource {
 public:
  virtual ~GpuSource() = default;
  virtual std::string Name() const = 0;  // "nvml", "fake"
  virtual int DeviceCount() const = 0;
  virtual StatusOr<GpuInfo> Info(int device) = 0;
  // A whole-sample failure (device handle gone) is an error; a failed field is in errors.
  virtual StatusOr<GpuSample> Sample(int device) = 0;
  // ECC mode and counters, row remapping and retired pages of one GPU.
  virtual StatusOr<GpuMemoryHealth> MemoryHealth(int device) = 0;
  // Waits at most `timeout` for Xid events; an empty vector when none came. NvmlNotSupported
  // when no device can report Xids (callers stop asking).
  virtual StatusOr<std::vector<XidEvent>> WaitXid(std::chrono::milliseconds timeout) = 0;
};

// What an Xid number means (DESIGN.md's table), for event text and `kiln doctor`.
std::string_view XidMeaning(uint64_t xid);

}  // namespace kiln::obs
