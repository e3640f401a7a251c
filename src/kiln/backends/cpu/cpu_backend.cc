// The CPU backend: host memory, no streams. It is the reference every other backend is tested
// against.
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    // One read of /proc/meminfo ("MemTotal:  24683588 kB" lines); every build asks.
    char text[8192];
    size_t n = 0;
    if (std::FILE* f = std::fopen("/proc/meminfo", "re")) {
      n = std::fread(text, 1, sizeof(text) - 1, f);
      std::fclose(f);
    }
    text[n] = '\0';
    auto kib = [&](const char* key) -> size_t {
      const char* p = std::strstr(text, key);
      return p ? std::strtoull(p + std::strlen(key), nullptr, 10) * 1024 : 0;
    };
    info.total_memory = kib("MemTotal:");
    info.free_memory = kib("MemAvailable:");
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
