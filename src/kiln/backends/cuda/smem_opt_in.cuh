// Opting a kernel in to more than 48 KiB of dynamic shared memory, for the kernels that need it
// (attention.cu, attention_mma.cu, conv_grouped.cu, int8_mma_gemm.cu, int8_wgmma_gemm.cu).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>

namespace kiln::cuda {

// Lets `kernel` use `bytes` of dynamic shared memory. A GPU with less per block (sm_86/89 give
// 99 KiB) refuses: the error is returned, and cleared from the runtime's last-error state so that
// the next launch elsewhere (whose launcher returns cudaGetLastError()) does not report it as
// its own. Host-side and capture-safe; callers keep the result per device (SharedMemoryOptIn).
template <typename Kernel>
cudaError_t OptInSharedMemory(Kernel* kernel, int bytes) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

// One kernel's opt-in, made once on each device it runs on: a function's attributes belong to
// the current device's context, so a process that drives several GPUs (an engine per device, one
// thread each) must opt in on every one. A launcher keeps one in a static:
//   static SharedMemoryOptIn opt_in;
//   if (cudaError_t e = opt_in.For(kernel, bytes); e != cudaSuccess) return e;
// Two threads on one device may both opt in the first time; the call is idempotent.
class SharedMemoryOptIn {
 public:
  template <typename Kernel>
  cudaError_t For(Kernel* kernel, int bytes) {
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    if (device < 0 || device >= kMaxDevices) return OptInSharedMemory(kernel, bytes);
    int known = state_[device].load(std::memory_order_acquire);  // 0 unknown, else error + 1
    if (known == 0) {
      known = static_cast<int>(OptInSharedMemory(kernel, bytes)) + 1;
      state_[device].store(known, std::memory_order_release);
    }
    return static_cast<cudaError_t>(known - 1);
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::array<std::atomic<int>, kMaxDevices> state_{};
};

}  // namespace kiln::cuda
