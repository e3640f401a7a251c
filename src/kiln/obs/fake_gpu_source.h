// A scripted GpuSource: tests (and CPU-only demos) drive the sampler and detectors with chosen
// samples, failures and Xid events instead of a real GPU.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "kiln/obs/gpu_source.h"

namespace kiln::obs {

class FakeGpuSource final : public GpuSource {
 public:
  explicit FakeGpuSource(int devices) : devices_(devices), current_(devices) {
    for (int i = 0; i < devices; ++i) current_[i].device = i;
  }

  std::string Name() const override { return "fake"; }
  int DeviceCount() const override { return devices_; }
  StatusOr<GpuInfo> Info(int device) override;
  StatusOr<GpuSample> Sample(int device) override;
  StatusOr<GpuMemoryHealth> MemoryHealth(int device) override;
  StatusOr<std::vector<XidEvent>> WaitXid(std::chrono::milliseconds timeout) override;

  // The sample returned from now on for `sample.device` (until the next Set).
  void Set(const GpuSample& sample);
  // The next `count` Sample() calls for `device` fail as a whole with `status`.
  void FailNextSamples(int device, int count, Status status);
  // The next `count` samples of `device` report `call` as failed (the field goes absent).
  void FailNextCalls(int device, int count, CallError error);
  void PushXid(int device, uint64_t xid);
  // What MemoryHealth returns for `health.device` (default: every field absent).
  void SetMemoryHealth(const GpuMemoryHealth& health);
  // WaitXid returns NvmlNotSupported (a driver that cannot register events).
  void DisableXid() { xid_supported_ = false; }
  int samples_taken() const;

 private:
  const int devices_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GpuSample> current_;
  std::map<int, GpuMemoryHealth> health_;
  std::map<int, std::pair<int, Status>> fail_samples_;
  std::map<int, std::pair<int, CallError>> fail_calls_;
  std::deque<XidEvent> xids_;
  bool xid_supported_ = true;
  int samples_taken_ = 0;
};

}  // namespace kiln::obs
