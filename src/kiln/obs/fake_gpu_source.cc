// FakeGpuSource: scripted samples, failures and Xid events behind one mutex.
#include "kiln/obs/fake_gpu_source.h"

namespace kiln::obs {

StatusOr<GpuInfo> FakeGpuSource::Info(int device) {
  if (device < 0 || device >= devices_) {
    return MakeError(ErrorCode::kOutOfRange, "fake GPU {} does not exist", device);
  }
  return GpuInfo{"Fake GPU", fmt::format("GPU-fake-{}", device),
                 fmt::format("00000000:{:02X}:00.0", device + 1)};
}

StatusOr<GpuSample> FakeGpuSource::Sample(int device) {
  std::lock_guard lock(mu_);
  if (device < 0 || device >= devices_) {
    return MakeError(ErrorCode::kOutOfRange, "fake GPU {} does not exist", device);
  }
  ++samples_taken_;
  if (auto it = fail_samples_.find(device); it != fail_samples_.end() && it->second.first > 0) {
    --it->second.first;
    return it->second.second;
  }
  GpuSample s = current_[device];
  if (auto it = fail_calls_.find(device); it != fail_calls_.end() && it->second.first > 0) {
    --it->second.first;
    s.errors.push_back(it->second.second);
    if (it->second.second.call == "nvmlDeviceGetUtilizationRates") {
      s.utilization_gpu_ratio.reset();
      s.utilization_memory_ratio.reset();
    } else if (it->second.second.call == "nvmlDeviceGetMemoryInfo") {
      s.memory_used_bytes.reset();
      s.memory_total_bytes.reset();
    } else if (it->second.second.call == "nvmlDeviceGetPowerUsage") {
      s.power_watts.reset();
    }
  }
  return s;
}

StatusOr<std::vector<XidEvent>> FakeGpuSource::WaitXid(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!xid_supported_) {
    return MakeError(ErrorCode::kNvmlNotSupported, "fake GPUs report no Xid events");
  }
  cv_.wait_for(lock, timeout, [&] { return !xids_.empty(); });
  std::vector<XidEvent> out(xids_.begin(), xids_.end());
  xids_.clear();
  return out;
}

StatusOr<GpuMemoryHealth> FakeGpuSource::MemoryHealth(int device) {
  std::lock_guard lock(mu_);
  if (device < 0 || device >= devices_) {
    return MakeError(ErrorCode::kOutOfRange, "fake GPU {} does not exist", device);
  }
  if (auto it = fail_samples_.find(device); it != fail_samples_.end() && it->second.first > 0) {
    --it->second.first;
    return it->second.second;
  }
  auto it = health_.find(device);
  GpuMemoryHealth h = it != health_.end() ? it->second : GpuMemoryHealth{};
  h.device = device;
  return h;
}

void FakeGpuSource::SetMemoryHealth(const GpuMemoryHealth& health) {
  std::lock_guard lock(mu_);
  health_[health.device] = health;
}

void FakeGpuSource::Set(const GpuSample& sample) {
  std::lock_guard lock(mu_);
  if (sample.device >= 0 && sample.device < devices_) current_[sample.device] = sample;
}

void FakeGpuSource::FailNextSamples(int device, int count, Status status) {
  std::lock_guard lock(mu_);
  fail_samples_[device] = {count, std::move(status)};
}

void FakeGpuSource::FailNextCalls(int device, int count, CallError error) {
  std::lock_guard lock(mu_);
  fail_calls_[device] = {count, std::move(error)};
}

void FakeGpuSource::PushXid(int device, uint64_t xid) {
  {
    std::lock_guard lock(mu_);
    xids_.push_back({device, xid, std::chrono::system_clock::now()});
  }
  cv_.notify_all();
}

int FakeGpuSource::samples_taken() const {
  std::lock_guard lock(mu_);
  return samples_taken_;
}

}  // namespace kiln::obs
