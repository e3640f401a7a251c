// The CPU backend: host memory, no streams. It is the reference every other backend is tested
// against.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "kiln/backends/backend.h"

namespace kiln {
namespace {

class CpuBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCpu; }
  bool host_accessible() const override { return true; }

  StatusOr<DeviceInfo> Info() const override {
    DeviceInfo info;
    info.name = fmt::format("x86_64 CPU ({} threads)", std::thread::hardware_concurrency());
    info.arch = "x86_64";
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    std::string unit;
    while (meminfo >> key >> kb >> unit) {
      if (key == "MemTotal:") info.total_memory = kb * 1024;
      if (key == "MemAvailable:") info.free_memory = kb * 1024;
    }
    info.library_versions = "cpu";
    return info;
  }

  StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) {
      return MakeError(ErrorCode::kMemoryBudgetExceeded, "host allocation of {} bytes failed",
                       bytes);
    }
    return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
  }
  Status CopyToDevice(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);  // empty tensors may have null data
    return OkStatus();
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return OkStatus();
  }
  Status Synchronize(void*) override { return OkStatus(); }
};

struct Registrar {
  Registrar() {
    RegisterBackendFactory(BackendKind::kCpu, []() -> StatusOr<std::unique_ptr<Backend>> {
      return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
    });
  }
} registrar;

}  // namespace
}  // namespace kiln
