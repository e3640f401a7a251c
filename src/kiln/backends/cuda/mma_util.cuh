// The warp-level tensor-core building blocks the mma.sync kernels share (attention_mma.cu's
// flash attention, int8_mma_gemm.cu's INT8 product): shared-memory addresses, ldmatrix, and
// cp.async copies with their commit/wait. sm_80 and newer.
#pragma once

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements (rows of 16 bytes): lanes 8i..8i+7 give the row addresses
// of matrix i, which lands in r[i].
__device__ __forceinline__ void LdMatrixX4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// 16 bytes from global to shared memory, through L2 only; with `valid` false the destination is
// zero-filled (a source size of 0) and nothing is read, though `src` must still be an address of
// the operand. Completes at the next CpAsyncWait covering the group it is committed in.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace kiln::cuda
