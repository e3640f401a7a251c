// FP32 matrix multiply for the CPU kernels (Gemm, MatMul, Conv, ConvTranspose and the fused
// ops), with two implementations a tactic can choose between, and the activation epilogue.
//
// Threads: Debian's OpenBLAS (pthread build) keeps its own thread pool whose idle threads spin
// for a long time after each call; oneDNN (conv_onednn.cc) has OpenMP's; kiln has ThreadPool.
// Measured on 16 cores, OpenBLAS's spinning threads slowed the next oneDNN or ThreadPool layer
// by 10-100x. So OpenBLAS runs single-threaded (openblas_set_num_threads(1), once per process)
// and Sgemm splits a product into per-thread slices on kiln's ThreadPool, each slice one
// single-threaded cblas_sgemm call (OpenBLAS is safe to call from several threads at once).
// The blocked kernel threads with kiln's ThreadPool too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu {

// The values are stored in engines (tactic params): never renumber.
enum class GemmImpl : uint8_t {
  kOpenBlas = 0,  // cblas_sgemm, split into one slice per thread when the product is large
  kBlocked8x8 =
      1,  // kiln's packed, cache-blocked kernel with an 8x8 register tile, K blocks of 256
  kOpenBlasSingle = 2,  // one cblas_sgemm call on the calling thread (no fork/join)
  kBlocked8x8K128 = 3,  // the blocked kernel with K blocks of 128 (half the L1 footprint)
};
constexpr int64_t kNumGemmImpls = 4;

// Bytes of workspace Sgemm needs for an M x N x K product with this implementation.
size_t SgemmWorkspaceBytes(GemmImpl impl, int64_t m, int64_t n, int64_t k);

// True when OpenBLAS alone would split this product over the threads (so kOpenBlasSingle is a
// different schedule worth timing).
bool SgemmSplitsOverThreads(int64_t m, int64_t n, int64_t k);

// The tactics a Gemm/MatMul layer of this size offers, named "<prefix>-openblas" and so on,
// params {impl}: each one only when it is a distinct schedule for this size (K blocks of 128
// only when K > 128, one thread only when the threaded split would apply).
std::vector<TacticConfig> GemmTactics(const std::string& prefix, int64_t m, int64_t n, int64_t k);
// The schedule of a tactic GemmTactics made; KILN-E1001 (invalid argument) naming `provider`
// for any other params (a tactic from a foreign or corrupt engine or timing cache).
StatusOr<GemmImpl> GemmImplOf(const TacticConfig& tactic, std::string_view provider);

// Row-major C[m x n] = alpha * op(A) op(B) + beta * C, op = transpose when trans_*. `workspace`
// must hold SgemmWorkspaceBytes (64-byte aligned). beta == 0 ignores C's old contents.
void Sgemm(GemmImpl impl, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc, void* workspace);

// Sets OpenBLAS to one thread, once per process (see the note above).
void ConfigureBlasThreads();

// Applies the activation to n contiguous floats in place (activation.cc): a vectorised or cheaper
// loop for the hot kinds, ApplyListedActivation for the rest.
void ApplyActivation(const FusedActivationSpec& act, float* x, int64_t n);
// The same with the formula of the kind's row in ops/activations.inc, for every kind: the
// fallback, and the reference ApplyActivation's own loops are tested against.
void ApplyListedActivation(const FusedActivationSpec& act, float* x, int64_t n);

// Epilogue on rows of a row-major matrix block: for r in [0, rows), x[r * ld + j] for j in
// [0, cols): adds row_bias[r] (per-row, e.g. conv channel) and/or col_bias[j], adds
// residual[r * ld + j], then applies the activation. Any pointer may be null.
void ApplyEpilogue(float* x, int64_t rows, int64_t cols, int64_t ld, const float* row_bias,
                   const float* col_bias, const float* residual, const FusedActivationSpec& act);

}  // namespace kiln::cpu
