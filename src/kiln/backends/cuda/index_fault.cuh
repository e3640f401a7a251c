// Device side of the run-time index checks (index_fault.h): how a kernel records a bad index.
#pragma once

#include <cuda_runtime.h>

#include "kiln/backends/cuda/cuda_launch_more.h"

namespace kiln::cuda {

// Plain stores: any one of several racing threads may win, and each writes a consistent pair
// before the flag (the fence orders them for the host that reads the mapped memory).
__device__ __forceinline__ void RecordIndexFault(IndexFault* fault, int64_t index, int64_t size) {
  if (!fault) return;
  fault->index = index;
  fault->size = size;
  __threadfence_system();
  fault->hit = 1;
}

}  // namespace kiln::cuda
