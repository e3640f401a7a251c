// FP32 GEMM: OpenBLAS and kiln's own packed, blocked kernel; the bias/residual epilogue (the
// activation itself is activation.cc's).
#include "kiln/backends/cpu/sgemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "kiln/core/logging.h"
#include "kiln/core/thread_pool.h"

// The kernels below rely on multiply-add contraction; the project builds in ISO C++ mode, where
// GCC's default is no contraction.
#pragma GCC optimize("fp-contract=fast")

namespace kiln::cpu {

namespace {
constexpr int64_t kKc = 256;  // K block: one A strip (8 x kKc) and one B strip fit in L1
constexpr int64_t kKcSmall = 128;

int64_t KcOf(GemmImpl impl) { return impl == GemmImpl::kBlocked8x8K128 ? kKcSmall : kKc; }
bool IsBlocked(GemmImpl impl) {
  return impl == GemmImpl::kBlocked8x8 || impl == GemmImpl::kBlocked8x8K128;
}
constexpr int64_t kMc = 64;   // rows per parallel tile
constexpr int64_t kNc = 128;  // columns per parallel tile

int64_t Round8(int64_t x) { return (x + 7) / 8 * 8; }
size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

// Packs rows [i0, i0 + rows) x k-range [k0, k0 + kc) of op(A) as 8-row strips: strip s holds
// kc groups of 8 floats (rows 8s..8s+7 at one k); rows past the end are zero.
void PackA(bool trans, const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t k0,
           int64_t kc, float* out) {
  for (int64_t s = 0; s < Round8(rows) / 8; ++s) {
    float* dst = out + s * kc * 8;
    for (int r = 0; r < 8; ++r) {
      int64_t i = i0 + s * 8 + r;
      if (s * 8 + r >= rows) {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * 8 + r] = 0.f;
      } else if (trans) {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * 8 + r] = a[(k0 + kk) * lda + i];
      } else {
        const float* src = a + i * lda + k0;
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * 8 + r] = src[kk];
      }
    }
  }
}

// Packs columns [j0, j0 + cols) of op(B) over [k0, k0 + kc) as 8-column strips.
void PackB(bool trans, const float* b, int64_t ldb, int64_t j0, int64_t cols, int64_t k0,
           int64_t kc, float* out) {
  for (int64_t t = 0; t < Round8(cols) / 8; ++t) {
    float* dst = out + t * kc * 8;
    int64_t valid = std::min<int64_t>(8, cols - t * 8);
    for (int64_t kk = 0; kk < kc; ++kk) {
      float* d = dst + kk * 8;
      for (int64_t c = 0; c < 8; ++c) {
        int64_t j = j0 + t * 8 + c;
        d[c] = c >= valid ? 0.f : (trans ? b[j * ldb + k0 + kk] : b[(k0 + kk) * ldb + j]);
      }
    }
  }
}

// One 8x8 register tile over kc: acc = Ap strip x Bp strip, then C = alpha*acc (+ beta*C or
// + C). The eight accumulator rows are GCC vectors (one AVX register each); the function is
// cloned per ISA so the FMA form is used where the CPU has it.
typedef float V8 __attribute__((vector_size(32)));

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void Tile8x8(
    const float* ap, const float* bp, int64_t kc, int64_t rows, int64_t cols, float* c, int64_t ldc,
    float alpha, float beta, bool accumulate) {
  V8 acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {}, acc4 = {}, acc5 = {}, acc6 = {}, acc7 = {};
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float* a = ap + kk * 8;
    V8 b;
    std::memcpy(&b, bp + kk * 8, sizeof(b));
    acc0 += a[0] * b;
    acc1 += a[1] * b;
    acc2 += a[2] * b;
    acc3 += a[3] * b;
    acc4 += a[4] * b;
    acc5 += a[5] * b;
    acc6 += a[6] * b;
    acc7 += a[7] * b;
  }
  const V8 acc[8] = {acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7};
  for (int64_t r = 0; r < rows; ++r) {
    float* crow = c + r * ldc;
    if (accumulate) {
      for (int64_t j = 0; j < cols; ++j) crow[j] += alpha * acc[r][j];
    } else if (beta == 0.f) {
      for (int64_t j = 0; j < cols; ++j) crow[j] = alpha * acc[r][j];
    } else {
      for (int64_t j = 0; j < cols; ++j) crow[j] = alpha * acc[r][j] + beta * crow[j];
    }
  }
}

void BlockedSgemm(int64_t kc_max, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  float* c, int64_t ldc, void* workspace) {
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    }
    return;
  }
  int64_t m8 = Round8(m), n8 = Round8(n);
  auto* ap = static_cast<float*>(workspace);
  // Same layout as SgemmWorkspaceBytes: packed A for one K block, then packed B.
  float* bp = ap + Align64(static_cast<size_t>(m8 * std::min(kc_max, k)) * 4) / 4;
  ThreadPool& pool = ThreadPool::Default();
  int64_t mt = (m + kMc - 1) / kMc, nt = (n + kNc - 1) / kNc;
  for (int64_t k0 = 0; k0 < k; k0 += kc_max) {
    int64_t kc = std::min(kc_max, k - k0);
    pool.ParallelFor(m8 / 8, [&](int64_t s0, int64_t s1) {
      PackA(trans_a, a, lda, s0 * 8, std::min(m, s1 * 8) - s0 * 8, k0, kc, ap + s0 * 8 * kc);
    });
    pool.ParallelFor(n8 / 8, [&](int64_t t0, int64_t t1) {
      PackB(trans_b, b, ldb, t0 * 8, std::min(n, t1 * 8) - t0 * 8, k0, kc, bp + t0 * 8 * kc);
    });
    bool accumulate = k0 > 0;
    pool.ParallelFor(mt * nt, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t i0 = (t / nt) * kMc, j0 = (t % nt) * kNc;
        int64_t i1 = std::min(m, i0 + kMc), j1 = std::min(n, j0 + kNc);
        for (int64_t i = i0; i < i1; i += 8) {
          for (int64_t j = j0; j < j1; j += 8) {
            Tile8x8(ap + i * kc, bp + j * kc, kc, std::min<int64_t>(8, i1 - i),
                    std::min<int64_t>(8, j1 - j), c + i * ldc + j, ldc, alpha, beta, accumulate);
          }
        }
      }
    });
  }
}

}  // namespace

size_t SgemmWorkspaceBytes(GemmImpl impl, int64_t m, int64_t n, int64_t k) {
  if (!IsBlocked(impl)) return 0;
  int64_t kc = std::min(KcOf(impl), std::max<int64_t>(k, 1));
  return Align64(static_cast<size_t>(Round8(m) * kc) * 4) +
         Align64(static_cast<size_t>(Round8(n) * kc) * 4);
}

bool SgemmSplitsOverThreads(int64_t m, int64_t n, int64_t k) {
  return ThreadPool::Default().size() > 1 &&
         static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= 2e5;
}

std::vector<TacticConfig> GemmTactics(const std::string& prefix, int64_t m, int64_t n, int64_t k) {
  std::vector<TacticConfig> out;
  auto add = [&](const char* suffix, GemmImpl impl) {
    out.push_back(
        {prefix + suffix, {static_cast<int64_t>(impl)}, SgemmWorkspaceBytes(impl, m, n, k)});
  };
  add("-openblas", GemmImpl::kOpenBlas);
  add("-blocked-8x8", GemmImpl::kBlocked8x8);
  if (SgemmSplitsOverThreads(m, n, k)) add("-openblas-1thread", GemmImpl::kOpenBlasSingle);
  if (k > kKcSmall) add("-blocked-8x8-k128", GemmImpl::kBlocked8x8K128);
  return out;
}

StatusOr<GemmImpl> GemmImplOf(const TacticConfig& tactic, std::string_view provider) {
  if (tactic.params.size() != 1 || tactic.params[0] < 0 || tactic.params[0] >= kNumGemmImpls) {
    return MakeError(ErrorCode::kInvalidArgument, "{}: tactic '{}' has invalid params", provider,
                     tactic.name);
  }
  return static_cast<GemmImpl>(tactic.params[0]);
}

void ConfigureBlasThreads() {
  static std::once_flag once;
  std::call_once(once, [] {
    openblas_set_num_threads(1);
    // OpenBLAS 0.3.21 falls back to its SSE3 "Prescott" kernels on CPUs it does not recognise
    // (seen on a virtualised Sapphire Rapids: 14 instead of 112 GFLOP/s per core). The choice is
    // made when the library loads, so all kiln can do is say how to fix it.
    std::string core = openblas_get_corename();
    bool old_core = core == "Prescott" || core == "Core2" || core == "Nehalem" ||
                    core == "Katmai" || core == "Atom" || core == "Barcelona";
    if (old_core && __builtin_cpu_supports("avx2")) {
      KILN_LOG(Warn, BACKEND,
               "OpenBLAS chose its '{}' kernels on a CPU with AVX2{}; sgemm runs several times "
               "slower. Set OPENBLAS_CORETYPE={} in the environment before starting kiln",
               core, __builtin_cpu_supports("avx512f") ? "/AVX-512" : "",
               __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
    }
  });
}

void Sgemm(GemmImpl impl, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc, void* workspace) {
  if (m == 0 || n == 0) return;
  if (IsBlocked(impl)) {
    BlockedSgemm(KcOf(impl), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                 workspace);
    return;
  }
  ConfigureBlasThreads();
  auto call = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const float* as = trans_a ? a + i0 : a + i0 * lda;
    const float* bs = trans_b ? b + j0 * ldb : b + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(i1 - i0),
                static_cast<blasint>(j1 - j0), static_cast<blasint>(k), alpha, as,
                static_cast<blasint>(std::max<int64_t>(lda, 1)), bs,
                static_cast<blasint>(std::max<int64_t>(ldb, 1)), beta, c + i0 * ldc + j0,
                static_cast<blasint>(std::max<int64_t>(ldc, 1)));
  };
  ThreadPool& pool = ThreadPool::Default();
  int64_t threads = pool.size();
  // Small products are not worth a fork/join.
  if (impl == GemmImpl::kOpenBlasSingle || !SgemmSplitsOverThreads(m, n, k)) {
    call(0, m, 0, n);
    return;
  }
  // Split the larger output dimension into one slice per thread (N in multiples of 16 floats,
  // M in multiples of 8 rows, the shapes of OpenBLAS's own micro-kernels).
  if (n >= m) {
    int64_t chunk = std::max<int64_t>(16, ((n + threads - 1) / threads + 15) / 16 * 16);
    pool.ParallelFor((n + chunk - 1) / chunk, [&](int64_t s0, int64_t s1) {
      call(0, m, s0 * chunk, std::min(n, s1 * chunk));
    });
  } else {
    int64_t chunk = std::max<int64_t>(8, ((m + threads - 1) / threads + 7) / 8 * 8);
    pool.ParallelFor((m + chunk - 1) / chunk, [&](int64_t s0, int64_t s1) {
      call(s0 * chunk, std::min(m, s1 * chunk), 0, n);
    });
  }
}

void ApplyEpilogue(float* x, int64_t rows, int64_t cols, int64_t ld, const float* row_bias,
                   const float* col_bias, const float* residual, const FusedActivationSpec& act) {
  if (!row_bias && !col_bias && !residual && act.kind == FusedActivation::kNone) return;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    if (row_bias) {
      float bias = row_bias[r];
      for (int64_t j = 0; j < cols; ++j) row[j] += bias;
    }
    if (col_bias) {
      for (int64_t j = 0; j < cols; ++j) row[j] += col_bias[j];
    }
    if (residual) {
      const float* z = residual + r * ld;
      for (int64_t j = 0; j < cols; ++j) row[j] += z[j];
    }
    ApplyActivation(act, row, cols);
  }
}

}  // namespace kiln::cpu
