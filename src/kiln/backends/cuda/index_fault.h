// Run-time index checks for the CUDA index kernels (Gather, GatherElements, ScatterND). The CPU
// reference fails on an out-of-range index; on the GPU the indices are device data, so the kernel
// writes zeros there and records the index in mapped host memory, which the layer reads after a
// bounded wait for its stream. That wait is only possible when the layer runs eagerly: inside a
// CUDA graph capture the launch records nothing and the check is skipped (a replay would need
// the runtime to look after the graph; see the note in index_fault.cc).
#pragma once

#include <string>
#include <string_view>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/core/status.h"

namespace kiln::cuda {

class IndexFaultCheck {
 public:
  IndexFaultCheck() = default;
  ~IndexFaultCheck();
  IndexFaultCheck(const IndexFaultCheck&) = delete;
  IndexFaultCheck& operator=(const IndexFaultCheck&) = delete;

  // Before the launch: the device pointer the kernel should record into, or null when `stream`
  // is being captured into a graph (nothing can be waited for then) or KILN_CUDA_INDEX_CHECK=0.
  // Clears the record. The first
  // eager call creates the pinned record and an event (not at kernel creation: builders create
  // kernels on machines without a GPU); KILN-E6002/E6003 when CUDA cannot provide them.
  StatusOr<IndexFault*> Begin(cudaStream_t stream);
  // After the launch, when Begin gave a pointer: waits for the stream (bounded by
  // KILN_DEVICE_WAIT_TIMEOUT_S) and returns KILN-E6001 naming the index when one was out of range
  // and what the kernel did instead (`effect`).
  Status End(cudaStream_t stream, std::string_view op, std::string_view effect);

 private:
  IndexFault* host_ = nullptr;
  IndexFault* device_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace kiln::cuda
