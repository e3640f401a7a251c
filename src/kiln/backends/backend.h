// A Backend: device memory, copies, streams and timing for one device. The CPU backend is always
// present; the CUDA backend registers itself when built and a device is found.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"

namespace kiln {

// Device memory owned by a backend; freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, std::function<void(void*)> free_fn)
      : data_(data), bytes_(bytes), free_(std::move(free_fn)) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    Reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    free_ = std::move(o.free_);
    o.data_ = nullptr;
    o.bytes_ = 0;
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void Reset() {
    if (data_ && free_) free_(data_);
    data_ = nullptr;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> free_;
};

struct DeviceInfo {
  std::string name;  // "x86_64 CPU (16 threads)" / "NVIDIA H200"
  std::string arch;  // "x86_64" / "sm_90": engines are specific to it
  size_t total_memory = 0;
  size_t free_memory = 0;
  std::string library_versions;  // "openblas 0.3.21" / "cuda 13.0, cublasLt 13.1, cudnn 9.19"
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual StatusOr<DeviceInfo> Info() const = 0;
  // Host-accessible backends (the CPU) let the runtime skip copies.
  virtual bool host_accessible() const = 0;
  virtual StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual Status CopyToHost(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual Status Synchronize(void* stream) = 0;
};

// The backend of a kind, or KILN-E6000 when it is not built or has no device here.
StatusOr<Backend*> GetBackend(BackendKind kind);
// Registration for backends (the CUDA backend registers a factory at static-init time).
void RegisterBackendFactory(BackendKind kind,
                            std::function<StatusOr<std::unique_ptr<Backend>>()> factory);
// The fastest backend present: CUDA when a device is usable, else the CPU.
BackendKind BestAvailableBackend();

}  // namespace kiln
