// The CUDA backend: device memory, async copies on the caller's stream, device facts for engine
// targets. Registered at static-init time; GetBackend(kCuda) fails with KILN-E6000 (and CUDA's
// own reason) where no usable GPU is present, so a CUDA-enabled kiln still runs on the CPU.
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "kiln/backends/backend.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/core/logging.h"
#include "kiln/core/params.h"
#include "kiln/core/thread_pool.h"

namespace kiln::cuda {

Status CudaStatus(cudaError_t err, const char* what) {
  cudaGetLastError();  // clear a sticky non-fatal error so later calls are not blamed for it
  const ErrorCode code =
      err == cudaErrorMemoryAllocation ? ErrorCode::kCudaOutOfMemory : ErrorCode::kCudaError;
  return MakeError(code, "{} failed: {} ({})", what, cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

namespace {
// cuBLASLt alone does not export cublasGetStatusName (libcublas does); the names are the enum's.
const char* CublasStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED (out of GPU memory)";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}
}  // namespace

Status CublasStatus(cublasStatus_t st, const char* what) {
  const char* load_error = kiln_cublaslt_load_error();
  if (load_error[0] != 0) {  // the library itself is missing: say so rather than its status
    return MakeError(ErrorCode::kCublasError, "{} failed: cuBLASLt could not be loaded: {}", what,
                     load_error);
  }
  return MakeError(ErrorCode::kCublasError, "{} failed: {} (status {})", what, CublasStatusName(st),
                   static_cast<int>(st));
}

Status CudnnStatus(cudnnStatus_t st, const char* what) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return MakeError(ErrorCode::kCudnnError, "{} failed: {}{}{}", what, cudnnGetErrorString(st),
                   last[0] ? ": " : "", last);
}

std::string ArchName(int major, int minor) { return fmt::format("sm_{}{}", major, minor); }

namespace {

// One handle per thread and device; destroyed at thread exit.
template <typename H, typename CreateFn, typename DestroyFn>
struct ThreadHandle {
  H handle{};
  int device = -1;
  DestroyFn destroy;
  ~ThreadHandle() {
    if (device >= 0) destroy(handle);
  }
};

}  // namespace

StatusOr<cublasLtHandle_t> CublasLtHandle() {
  thread_local ThreadHandle<cublasLtHandle_t, void*, decltype(&cublasLtDestroy)> h{
      {}, -1, &cublasLtDestroy};
  int dev = 0;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (h.device != dev) {
    if (h.device >= 0) cublasLtDestroy(h.handle);
    h.device = -1;
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h.handle));
    h.device = dev;
  }
  return h.handle;
}

StatusOr<cudnnHandle_t> CudnnHandle() {
  thread_local ThreadHandle<cudnnHandle_t, void*, decltype(&cudnnDestroy)> h{{}, -1, &cudnnDestroy};
  int dev = 0;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (h.device != dev) {
    if (h.device >= 0) cudnnDestroy(h.handle);
    h.device = -1;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&h.handle));
    h.device = dev;
  }
  return h.handle;
}

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  bool host_accessible() const override { return false; }

  StatusOr<DeviceInfo> Info() const override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    KILN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
    DeviceInfo info;
    info.name = prop.name;
    info.arch = ArchName(prop.major, prop.minor);
    size_t free_b = 0, total_b = 0;
    KILN_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
    info.total_memory = total_b;
    info.free_memory = free_b;
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    const size_t lt = cublasLtGetVersion();
    const size_t dnn = cudnnGetVersion();
    // Engines and timing caches are keyed on these: a different library may pick other
    // algorithms, so its timings do not carry over.
    info.library_versions =
        fmt::format("cuda {}.{}, cublasLt {}.{}.{}, cudnn {}.{}.{}", rt / 1000, rt % 1000 / 10,
                    lt / 10000, lt / 100 % 100, lt % 100, dnn / 10000, dnn / 100 % 100, dnn % 100);
    return info;
  }

  StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return MakeError(
          err == cudaErrorMemoryAllocation ? ErrorCode::kCudaOutOfMemory : ErrorCode::kCudaError,
          "cudaMalloc of {} bytes on GPU {} failed: {} ({} of {} bytes free)", bytes, device_,
          cudaGetErrorString(err), free_b, total_b);
    }
    return DeviceBuffer(p, bytes, [](void* q) { cudaFree(q); });
  }

  Status CopyToDevice(void* dst, const void* src, size_t bytes, void* stream) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes, void* stream) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
  }
  StatusOr<bool> AccumulateAbsStats(DataType dtype, const void* x, int64_t n, uint32_t* absmax,
                                    uint64_t* hist, int bins, double range, void* stream) override {
    if (dtype != DataType::kFloat32 && dtype != DataType::kFloat16 &&
        dtype != DataType::kBFloat16) {
      return false;
    }
    // The host's rule for an empty range (every element in bin 0), and counters past the kernel's
    // shared memory (calib_stats.cu), stay with the caller's host path.
    if (hist && (!(range > 0) || bins < 1 || bins > 12 * 1024)) return false;
    KILN_CUDA_RETURN_IF_ERROR(cuda::LaunchAbsStats(*cuda::ToElem(dtype), x, n, absmax,
                                                   reinterpret_cast<unsigned long long*>(hist),
                                                   bins, range, static_cast<cudaStream_t>(stream)));
    return true;
  }
  StatusOr<bool> FakeQuantize(bool e4m3, DataType dtype, const void* x, void* y, int64_t n,
                              float amax, void* stream) override {
    if (dtype != DataType::kFloat32 && dtype != DataType::kFloat16 &&
        dtype != DataType::kBFloat16) {
      return false;
    }
    KILN_CUDA_RETURN_IF_ERROR(cuda::LaunchFakeQuantize(e4m3, *cuda::ToElem(dtype), x, y, n, amax,
                                                       static_cast<cudaStream_t>(stream)));
    return true;
  }
  Status BindThread() override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return OkStatus();
  }

  // Through a ring of pinned buffers: the host's threads copy one chunk of the device range into
  // a free buffer (pieces sorted by offset, each thread an equal share of the chunk's bytes) while
  // the copy engine moves the chunks before it. A pageable cudaMemcpy runs near a third of the
  // pinned rate on Hopper hosts, one piece after another.
  Status UploadPieces(void* dst, size_t total, std::span<const HostPiece> pieces) override {
    KILN_RETURN_IF_ERROR(CheckPieces(total, pieces));
    std::lock_guard lock(staging_mutex_);
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (!staging_ && !staging_failed_) {
      Status made = MakeStaging();
      if (!made.ok()) {
        staging_failed_ = true;  // pinned memory refused (a container's locked-memory limit)
        KILN_LOG(Warn, BACKEND, "weights are uploaded from pageable memory: {}", made.ToString());
      }
    }
    if (!staging_) return Backend::UploadPieces(dst, total, pieces);
    std::vector<HostPiece> sorted(pieces.begin(), pieces.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const HostPiece& a, const HostPiece& b) { return a.offset < b.offset; });
    ThreadPool& pool = ThreadPool::Default();
    auto* device = static_cast<std::byte*>(dst);
    size_t first = 0;  // the first piece that ends past the chunk's start
    for (size_t lo = 0, chunk = 0; lo < total; lo += kStagingChunk, ++chunk) {
      const size_t hi = std::min(total, lo + kStagingChunk);
      std::byte* buffer = staging_ + (chunk % kStagingRing) * kStagingChunk;
      cudaEvent_t done = staging_events_[chunk % kStagingRing];
      if (chunk >= kStagingRing) KILN_RETURN_IF_ERROR(WaitForEvent(done));  // buffer free again
      while (first < sorted.size() && sorted[first].offset + sorted[first].bytes <= lo) ++first;
      const int64_t shares = std::max<int64_t>(
          1, std::min<int64_t>(pool.size(), static_cast<int64_t>((hi - lo) >> 18)));
      pool.ParallelFor(shares, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          const size_t a = lo + (hi - lo) * k / shares, z = lo + (hi - lo) * (k + 1) / shares;
          for (size_t i = first; i < sorted.size() && sorted[i].offset < z; ++i) {
            const HostPiece& p = sorted[i];
            const size_t from = std::max(a, p.offset), to = std::min(z, p.offset + p.bytes);
            if (from < to) {
              std::memcpy(buffer + (from - lo),
                          static_cast<const std::byte*>(p.src) + (from - p.offset), to - from);
            }
          }
        }
      });
      KILN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(device + lo, buffer, hi - lo, cudaMemcpyHostToDevice, staging_stream_));
      KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, staging_stream_));
    }
    for (cudaEvent_t e : staging_events_) KILN_RETURN_IF_ERROR(WaitForEvent(e));
    return OkStatus();
  }

  Status Synchronize(void* stream) override {
    if (stream) {
      KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    } else {
      KILN_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    }
    return OkStatus();
  }

  // Non-blocking: work on the legacy default stream (by any thread) must not be able to break a
  // graph capture on it. The runtime orders it with the legacy stream through events instead.
  StatusOr<DeviceHandle> CreateStream() override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaStream_t s = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return DeviceHandle(s, [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  }

  bool device_timing() const override { return true; }
  StatusOr<DeviceHandle> CreateEvent() override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaEvent_t e = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    return DeviceHandle(e, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  }
  Status RecordEvent(void* event, void* stream) override {
    KILN_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
    return OkStatus();
  }
  Status StreamWaitEvent(void* stream, void* event) override {
    KILN_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
    return OkStatus();
  }
  StatusOr<double> EventElapsedMs(void* start, void* end) override {
    KILN_RETURN_IF_ERROR(WaitForEvent(static_cast<cudaEvent_t>(end)));
    float ms = 0;
    KILN_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return static_cast<double>(ms);
  }

  bool supports_graphs() const override { return true; }
  Status BeginCapture(void* stream) override {
    if (!stream) {
      return MakeError(ErrorCode::kCudaGraphFailed,
                       "CUDA graphs cannot capture the legacy default stream; pass a stream");
    }
    // Thread-local mode: another thread's unrelated CUDA calls do not invalidate this capture.
    cudaError_t err =
        cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) return GraphError(err, "cudaStreamBeginCapture");
    return OkStatus();
  }
  StatusOr<DeviceHandle> EndCapture(void* stream) override {
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
    if (err != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      return GraphError(err, "cudaStreamEndCapture");
    }
    cudaGraphExec_t exec = nullptr;
    err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    if (err != cudaSuccess) return GraphError(err, "cudaGraphInstantiate");
    return DeviceHandle(exec,
                        [](void* p) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(p)); });
  }
  Status LaunchGraph(void* graph, void* stream) override {
    if (!graph) return MakeError(ErrorCode::kCudaGraphFailed, "cudaGraphLaunch: no graph given");
    cudaError_t err =
        cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) return GraphError(err, "cudaGraphLaunch");
    return OkStatus();
  }

 private:
  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, void* stream) {
    if (bytes == 0) return OkStatus();
    // cudaMemcpyDefault: the pointer kinds are inferred (UVA), so a host pointer bound to a
    // device binding, or device memory passed to CopyToHost by the runtime, both work.
    (void)kind;
    auto s = static_cast<cudaStream_t>(stream);
    KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    if (!stream) KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
    return OkStatus();
  }
  static Status GraphError(cudaError_t err, const char* what) {
    cudaGetLastError();
    return MakeError(ErrorCode::kCudaGraphFailed, "{} failed: {} ({})", what, cudaGetErrorName(err),
                     cudaGetErrorString(err));
  }

  // cudaEventSynchronize has no bound; poll instead (STYLE: every wait has a bound). Spin briefly
  // first: most waits are for work that ends within microseconds.
  static Status WaitForEvent(cudaEvent_t e) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto limit = std::chrono::seconds(std::max<int64_t>(1, param::DeviceWaitTimeoutS()));
    for (int spin = 0;; ++spin) {
      cudaError_t err = cudaEventQuery(e);
      if (err == cudaSuccess) return OkStatus();
      if (err != cudaErrorNotReady) return CudaStatus(err, "cudaEventQuery");
      if (Clock::now() - start > limit) {
        return MakeError(ErrorCode::kDeviceWaitTimeout,
                         "the GPU's work did not finish within KILN_DEVICE_WAIT_TIMEOUT_S={} s",
                         param::DeviceWaitTimeoutS());
      }
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // All or nothing: on an error what was made is freed and staging_ stays null.
  Status MakeStaging() {
    void* host = nullptr;
    cudaStream_t stream = nullptr;
    std::array<cudaEvent_t, kStagingRing> events{};
    auto made = [&]() -> Status {
      KILN_CUDA_RETURN_IF_ERROR(
          cudaHostAlloc(&host, kStagingChunk * kStagingRing, cudaHostAllocPortable));
      KILN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      for (cudaEvent_t& e : events) {
        KILN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        // Recorded once so that every buffer starts out free.
        KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, stream));
      }
      return OkStatus();
    }();
    if (!made.ok()) {
      for (cudaEvent_t e : events) {
        if (e) cudaEventDestroy(e);
      }
      if (stream) cudaStreamDestroy(stream);
      if (host) cudaFreeHost(host);
      return made;
    }
    staging_ = static_cast<std::byte*>(host);
    staging_stream_ = stream;
    staging_events_ = events;
    return OkStatus();
  }

  int device_;
  // UploadPieces' staging: kStagingRing pinned buffers of kStagingChunk bytes, made on the first
  // upload and kept for the process (pinned allocations cost milliseconds each).
  static constexpr size_t kStagingChunk = 8 << 20;
  static constexpr int kStagingRing = 4;
  std::mutex staging_mutex_;
  std::byte* staging_ = nullptr;
  bool staging_failed_ = false;
  cudaStream_t staging_stream_ = nullptr;
  std::array<cudaEvent_t, kStagingRing> staging_events_{};
};

// One process per GPU is how distributed jobs run: the device follows the launcher's local rank
// (torchrun, OpenMPI, Slurm) unless KILN_CUDA_DEVICE names one. A launcher that narrows
// CUDA_VISIBLE_DEVICES to one GPU per process leaves count == 1, hence device 0.
StatusOr<int> ChooseDevice(int count) {
  const int64_t forced = param::CudaDevice();
  if (forced >= 0) {
    if (forced >= count) {
      return MakeError(ErrorCode::kBadEnvironment,
                       "KILN_CUDA_DEVICE={} but only {} GPU(s) are visible (0..{})", forced, count,
                       count - 1);
    }
    return static_cast<int>(forced);
  }
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      char* end = nullptr;
      long r = std::strtol(v, &end, 10);
      if (*end == 0 && r >= 0) return static_cast<int>(r % count);
    }
  }
  return 0;
}

struct Registrar {
  Registrar() {
    RegisterBackendFactory(BackendKind::kCuda, []() -> StatusOr<std::unique_ptr<Backend>> {
      int count = 0;
      cudaError_t err = cudaGetDeviceCount(&count);
      if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        return MakeError(ErrorCode::kBackendUnavailable, "no usable CUDA GPU: {}",
                         err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
      }
      KILN_ASSIGN_OR_RETURN(int device, ChooseDevice(count));
      KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
      return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device));
    });
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
