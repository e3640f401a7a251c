// Opting a kernel in to more than 48 KiB of dynamic shared memory, for the kernels that need it
// (attention.cu, attention_mma.cu, conv_grouped.cu).
#pragma once

#include <cuda_runtime.h>

namespace kiln::cuda {

// Lets `kernel` use `bytes` of dynamic shared memory. A GPU with less per block (sm_86/89 give
// 99 KiB) refuses: the error is returned, and cleared from the runtime's last-error state so that
// the next launch elsewhere (whose launcher returns cudaGetLastError()) does not report it as
// its own. Host-side and capture-safe; callers keep the result in a static.
template <typename Kernel>
cudaError_t OptInSharedMemory(Kernel* kernel, int bytes) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

}  // namespace kiln::cuda
