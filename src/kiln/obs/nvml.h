// NVML, loaded at run time with dlopen("libnvidia-ml.so.1"): no NVML header or library is needed
// to build kiln, and a machine without the driver gets NvmlUnavailable, never a crash.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/obs/gpu_source.h"

namespace kiln::obs {

class Nvml final : public GpuSource {
 public:
  // Loads and initialises NVML. NvmlUnavailable when the library is absent or nvmlInit fails.
  // `library` is for tests (a stand-in library with the same symbols).
  static StatusOr<std::unique_ptr<Nvml>> Load(const std::string& library = "libnvidia-ml.so.1");
  ~Nvml() override;  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  std::string Name() const override { return "nvml"; }
  int DeviceCount() const override;
  StatusOr<GpuInfo> Info(int device) override;
  StatusOr<GpuSample> Sample(int device) override;
  StatusOr<GpuMemoryHealth> MemoryHealth(int device) override;
  StatusOr<std::vector<XidEvent>> WaitXid(std::chrono::milliseconds timeout) override;

  const std::string& DriverVersion() const { return driver_version_; }

 private:
  struct Api;
  Nvml();
  Status Check(int rc, const char* call) const;

  std::unique_ptr<Api> api_;
  void* lib_ = nullptr;
  std::vector<void*> devices_;  // nvmlDevice_t handles
  std::string driver_version_;
  void* event_set_ = nullptr;  // nvmlEventSet_t, created on first WaitXid
  bool events_tried_ = false;
  bool events_supported_ = false;
};

}  // namespace kiln::obs
