// A Backend: device memory, copies, streams and timing for one device. The CPU backend is always
// present; the CUDA backend registers itself when built and a device is found.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"

namespace kiln {

// The largest head dim (Q/K and V rows of one head) the CUDA backend's fused attention kernels
// take; a larger one runs on the host fallback. The builder keeps attention with larger heads
// unfused on CUDA (its products and softmax stay on the GPU).
inline constexpr int64_t kCudaAttentionMaxHeadDim = 128;

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

// A backend object other than memory (a stream, an event, an executable graph): an opaque handle
// and the function that destroys it. Move-only.
class DeviceHandle {
 public:
  DeviceHandle() = default;
  DeviceHandle(void* handle, std::function<void(void*)> destroy)
      : handle_(handle), destroy_(std::move(destroy)) {}
  DeviceHandle(DeviceHandle&& o) noexcept { *this = std::move(o); }
  DeviceHandle& operator=(DeviceHandle&& o) noexcept {
    Reset();
    handle_ = o.handle_;
    destroy_ = std::move(o.destroy_);
    o.handle_ = nullptr;
    return *this;
  }
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  ~DeviceHandle() { Reset(); }
  void* get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  void Reset() {
    if (handle_ && destroy_) destroy_(handle_);
    handle_ = nullptr;
  }
  void* handle_ = nullptr;
  std::function<void(void*)> destroy_;
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
  // Fills the device buffer [dst, dst + total) from host memory, each piece's bytes at its offset
  // (pieces do not overlap; the bytes between them are left unspecified), and returns when they
  // are on the device. The runtime uploads an engine's weights (at load and at every refit) this
  // way. Device backends stage through pinned memory; this default copies piece by piece.
  struct HostPiece {
    size_t offset = 0;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  virtual Status UploadPieces(void* dst, size_t total, std::span<const HostPiece> pieces) {
    KILN_RETURN_IF_ERROR(CheckPieces(total, pieces));
    for (const HostPiece& p : pieces) {
      KILN_RETURN_IF_ERROR(
          CopyToDevice(static_cast<std::byte*>(dst) + p.offset, p.src, p.bytes, nullptr));
    }
    return Synchronize(nullptr);
  }
  // An internal error for a piece outside [0, total), checked without overflow.
  static Status CheckPieces(size_t total, std::span<const HostPiece> pieces) {
    for (const HostPiece& p : pieces) {
      if (p.offset > total || p.bytes > total - p.offset) {
        return MakeError(ErrorCode::kInternal,
                         "upload piece of {} bytes at offset {} lies outside the {} bytes", p.bytes,
                         p.offset, total);
      }
    }
    return OkStatus();
  }
  // Calibration statistics reduced on the device (backends/device_eval.h), enqueued on `stream`
  // without synchronising: `n` elements of float type `dtype` at device address x. absmax (device
  // memory, null: skipped): one uint32 holding a non-negative float's bits, raised to max |x|.
  // hist (device memory, null: skipped): `bins` uint64 counters over [0, range), range > 0. The
  // arithmetic is ir/evaluator.h's AccumulateAbsMax/AccumulateAbsHistogram. false: not offered
  // here (the caller downloads the values and reduces them on the host).
  virtual StatusOr<bool> AccumulateAbsStats(DataType dtype, const void* x, int64_t n,
                                            uint32_t* absmax, uint64_t* hist, int bins,
                                            double range, void* stream) {
    return false;
  }
  // y = ir/evaluator.h's FakeQuantizeInt8(x, amax), or FakeQuantizeE4M3 when `e4m3`, for `n`
  // elements of float type `dtype`, device memory, enqueued on `stream` (the sensitivity run on
  // the device). false: not offered.
  virtual StatusOr<bool> FakeQuantize(bool e4m3, DataType dtype, const void* x, void* y, int64_t n,
                                      float amax, void* stream) {
    return false;
  }
  // Makes the calling thread work on this backend's device: the builder's set-up threads call it
  // before they create kernels (CUDA: the current device is per thread).
  virtual Status BindThread() { return OkStatus(); }

  // ---- Streams, events and graphs. The defaults suit a backend that runs synchronously on the
  // host (the CPU): no streams, events that read the host clock, no graphs.

  // A stream for an execution context that is given none. A null handle: the backend has no
  // streams (work runs on the calling thread).
  virtual StatusOr<DeviceHandle> CreateStream() { return DeviceHandle(); }
  // Events mark a point in a stream's work; EventElapsedMs waits for `end` and returns the time
  // between the two marks. Device time where device_timing(), else host time at the Record call.
  virtual bool device_timing() const { return false; }
  virtual StatusOr<DeviceHandle> CreateEvent() {
    return DeviceHandle(new std::chrono::steady_clock::time_point(), [](void* p) {
      delete static_cast<std::chrono::steady_clock::time_point*>(p);
    });
  }
  virtual Status RecordEvent(void* event, void* stream) {
    *static_cast<std::chrono::steady_clock::time_point*>(event) = std::chrono::steady_clock::now();
    return OkStatus();
  }
  // Makes later work on `stream` wait for `event` (nullptr: CUDA's legacy default stream).
  virtual Status StreamWaitEvent(void* stream, void* event) { return OkStatus(); }
  virtual StatusOr<double> EventElapsedMs(void* start, void* end) {
    using T = std::chrono::steady_clock::time_point;
    return std::chrono::duration<double, std::milli>(*static_cast<T*>(end) -
                                                     *static_cast<T*>(start))
        .count();
  }
  // Graphs: the work issued on `stream` between BeginCapture and EndCapture is recorded, not run,
  // and EndCapture returns it as an executable graph that LaunchGraph replays on any stream.
  // EndCapture must follow every BeginCapture, also when the captured work failed (it then
  // discards the capture and returns the failure).
  virtual bool supports_graphs() const { return false; }
  virtual Status BeginCapture(void* stream) {
    return MakeError(ErrorCode::kInvalidArgument, "this backend has no graph capture");
  }
  virtual StatusOr<DeviceHandle> EndCapture(void* stream) {
    return MakeError(ErrorCode::kInvalidArgument, "this backend has no graph capture");
  }
  virtual Status LaunchGraph(void* graph, void* stream) {
    return MakeError(ErrorCode::kInvalidArgument, "this backend has no graph capture");
  }
};

// The backend of a kind, or KILN-E6000 when it is not built or has no device here.
StatusOr<Backend*> GetBackend(BackendKind kind);
// Registration for backends (the CUDA backend registers a factory at static-init time).
void RegisterBackendFactory(BackendKind kind,
                            std::function<StatusOr<std::unique_ptr<Backend>>()> factory);
// The fastest backend present: CUDA when a device is usable, else the CPU.
BackendKind BestAvailableBackend();

}  // namespace kiln
