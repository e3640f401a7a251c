// Run-time index checks for the CUDA index kernels (see index_fault.h).
//
// Why a wait per eager layer and nothing in graphs: the kernel can only say "bad index" through
// memory, and the host can only read that memory once the kernel has finished. Eagerly, the layer
// waits for its own stream (a few microseconds: the index layers are small and usually come first,
// the embedding lookups). In a graph the layer's Run is not called on replay, so only a hook in the
// runtime after the caller's synchronisation could report it; until then a replayed graph writes
// zeros for out-of-range indices, as before. Constant indices are checked on the host when the
// kernel is prepared, graphs or not. KILN_CUDA_INDEX_CHECK=0 turns the eager wait off.
#include "kiln/backends/cuda/index_fault.h"

#include <chrono>
#include <thread>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/core/params.h"

namespace kiln::cuda {

IndexFaultCheck::~IndexFaultCheck() {
  if (done_) cudaEventDestroy(done_);
  if (host_) cudaFreeHost(host_);
}

StatusOr<IndexFault*> IndexFaultCheck::Begin(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return static_cast<IndexFault*>(nullptr);
  // KILN_CUDA_INDEX_CHECK=0 trades the check for no wait (timing eager runs, say).
  if (param::CudaIndexCheck() == 0) return static_cast<IndexFault*>(nullptr);
  if (!host_) {
    void* host = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, sizeof(IndexFault), cudaHostAllocMapped));
    host_ = static_cast<IndexFault*>(host);
  }
  if (!device_) {
    void* dev = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, host_, 0));
    device_ = static_cast<IndexFault*>(dev);
  }
  if (!done_) KILN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  // No kernel of this layer is in flight: the previous eager Run waited for it, and captured
  // launches were given no record to write.
  volatile IndexFault* h = host_;
  h->hit = 0;
  h->index = 0;
  h->size = 0;
  return device_;
}

Status IndexFaultCheck::End(cudaStream_t stream, std::string_view op, std::string_view effect) {
  KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream));
  // cudaEventSynchronize has no bound (STYLE: every wait has one): poll, briefly spinning first.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::seconds(std::max<int64_t>(1, param::DeviceWaitTimeoutS()));
  for (int spin = 0;; ++spin) {
    cudaError_t err = cudaEventQuery(done_);
    if (err == cudaSuccess) break;
    if (err != cudaErrorNotReady) return CudaStatus(err, "cudaEventQuery");
    if (Clock::now() - start > limit) {
      return MakeError(ErrorCode::kDeviceWaitTimeout,
                       "{}: waiting for the index check did not finish within "
                       "KILN_DEVICE_WAIT_TIMEOUT_S={} s",
                       op, param::DeviceWaitTimeoutS());
    }
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  volatile IndexFault* h = host_;
  if (h->hit != 0) {
    int64_t index = h->index, size = h->size;
    return MakeError(ErrorCode::kKernelFailed,
                     "{}: index {} is out of range for an axis of size {} (valid: {}..{}); {}", op,
                     index, size, -size, size - 1, effect);
  }
  return OkStatus();
}

}  // namespace kiln::cuda
