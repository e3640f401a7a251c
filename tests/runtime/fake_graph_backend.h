// A CPU backend that pretends to have streams and graphs, so CI (no GPU) can check the runtime's
// graph logic: one capture per set of shapes and addresses, replay, the cache bound, fallback to
// eager launches when capture fails, and the event ordering around Execute(nullptr). Its
// "graphs" record nothing: kernels run during the capture pass and a replay runs nothing.
#pragma once

#include <memory>
#include <vector>

#include "kiln/backends/backend.h"

namespace kiln::testing {

class FakeGraphBackend final : public Backend {
 public:
  explicit FakeGraphBackend(Backend* cpu) : cpu_(cpu) {}
  BackendKind kind() const override { return BackendKind::kCpu; }
  StatusOr<DeviceInfo> Info() const override { return cpu_->Info(); }
  bool host_accessible() const override { return true; }
  // Device memory runs out above `memory_limit` bytes in use (0: no limit), as cudaMalloc would.
  StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    if (memory_limit > 0 && *in_use + bytes > memory_limit) {
      return MakeError(ErrorCode::kCudaOutOfMemory,
                       "fake cudaMalloc of {} bytes failed: out of memory ({} of {} in use)", bytes,
                       *in_use, memory_limit);
    }
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, cpu_->Allocate(bytes));
    *in_use += bytes;
    void* data = b.data();
    auto keep = std::make_shared<DeviceBuffer>(std::move(b));
    return DeviceBuffer(data, bytes, [keep, in_use = in_use, bytes](void*) mutable {
      *in_use -= bytes;
      keep.reset();
    });
  }
  Status CopyToDevice(void* dst, const void* src, size_t n, void* s) override {
    return cpu_->CopyToDevice(dst, src, n, s);
  }
  Status CopyToHost(void* dst, const void* src, size_t n, void* s) override {
    return cpu_->CopyToHost(dst, src, n, s);
  }
  Status Synchronize(void* s) override { return cpu_->Synchronize(s); }

  StatusOr<DeviceHandle> CreateStream() override {
    return DeviceHandle(new int(++streams), [](void* p) { delete static_cast<int*>(p); });
  }
  Status RecordEvent(void* event, void* stream) override {
    records.push_back(stream);
    return Backend::RecordEvent(event, stream);
  }
  Status StreamWaitEvent(void* stream, void* event) override {
    waits.push_back(stream);
    return OkStatus();
  }
  bool supports_graphs() const override { return true; }
  Status BeginCapture(void* stream) override {
    ++begins;
    if (fail_begin) return MakeError(ErrorCode::kCudaGraphFailed, "fake: cannot capture");
    return OkStatus();
  }
  StatusOr<DeviceHandle> EndCapture(void* stream) override {
    ++ends;
    if (fail_end) return MakeError(ErrorCode::kCudaGraphFailed, "fake: capture invalidated");
    return DeviceHandle(new int(ends), [](void* p) { delete static_cast<int*>(p); });
  }
  Status LaunchGraph(void* graph, void* stream) override {
    ++launches;
    last_graph = *static_cast<int*>(graph);
    return OkStatus();
  }

  Backend* cpu_;
  int streams = 0, begins = 0, ends = 0, launches = 0, last_graph = 0;
  bool fail_begin = false, fail_end = false;
  size_t memory_limit = 0;
  std::shared_ptr<size_t> in_use = std::make_shared<size_t>(0);
  std::vector<void*> records, waits;  // the streams events were recorded on / made to wait
};

}  // namespace kiln::testing
