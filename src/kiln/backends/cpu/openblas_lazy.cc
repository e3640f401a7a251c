// OpenBLAS, loaded with dlopen on first use instead of linked. Its 60 KB static TLS block, when
// linked, is carved out of every thread's stack; threads created with small stacks then overflow
// (civetweb's metrics-server workers returned empty replies once the CUDA runtime's TLS was added
// too). Loaded lazily, its TLS is allocated dynamically. These definitions take the place of the
// three OpenBLAS functions kiln calls; cblas.h checks their signatures.
#include <cblas.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "kiln/core/logging.h"

namespace {

struct OpenBlas {
  void* lib = nullptr;
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_corename) get_corename = nullptr;
};

const OpenBlas& Lib() {
  static OpenBlas blas = [] {
    OpenBlas b;
    b.lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (b.lib) {
      b.sgemm = reinterpret_cast<decltype(b.sgemm)>(dlsym(b.lib, "cblas_sgemm"));
      b.set_num_threads =
          reinterpret_cast<decltype(b.set_num_threads)>(dlsym(b.lib, "openblas_set_num_threads"));
      b.get_corename =
          reinterpret_cast<decltype(b.get_corename)>(dlsym(b.lib, "openblas_get_corename"));
    }
    if (!b.sgemm) {
      KILN_LOG(Error, BACKEND,
               "OpenBLAS (libopenblas.so.0) could not be loaded ({}); the CPU backend's sgemm "
               "falls back to a slow reference loop. Install libopenblas0 (scripts/deps.sh)",
               b.lib ? "cblas_sgemm missing" : dlerror());
    }
    return b;
  }();
  return blas;
}

}  // namespace

extern "C" void openblas_set_num_threads(int num_threads) {
  if (Lib().set_num_threads) Lib().set_num_threads(num_threads);
}

extern "C" char* openblas_get_corename(void) {
  static char unknown[] = "unavailable";
  return Lib().get_corename ? Lib().get_corename() : unknown;
}

extern "C" void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER order,
                            OPENBLAS_CONST enum CBLAS_TRANSPOSE trans_a,
                            OPENBLAS_CONST enum CBLAS_TRANSPOSE trans_b, OPENBLAS_CONST blasint m,
                            OPENBLAS_CONST blasint n, OPENBLAS_CONST blasint k,
                            OPENBLAS_CONST float alpha, OPENBLAS_CONST float* a,
                            OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* b,
                            OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float* c,
                            OPENBLAS_CONST blasint ldc) {
  if (Lib().sgemm) {
    Lib().sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Reference loop (correct, slow), only when the library is missing; logged once above.
  const bool row = order == CblasRowMajor;
  auto at = [&](const float* p, blasint ld, bool t, blasint r, blasint col) {
    // Element (r, col) of op(P) in the given storage order.
    blasint i = t ? col : r, j = t ? r : col;
    return row ? p[i * ld + j] : p[j * ld + i];
  };
  for (blasint i = 0; i < m; ++i) {
    for (blasint j = 0; j < n; ++j) {
      float acc = 0;
      for (blasint p = 0; p < k; ++p) {
        acc +=
            at(a, lda, trans_a != CblasNoTrans, i, p) * at(b, ldb, trans_b != CblasNoTrans, p, j);
      }
      float& out = row ? c[i * ldc + j] : c[j * ldc + i];
      out = alpha * acc + (beta == 0 ? 0 : beta * out);
    }
  }
}
