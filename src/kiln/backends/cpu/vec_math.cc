// Branch-free exp/erf and the loops over them. Each loop is cloned per x86 ISA level so that
// the AVX2/AVX-512 form runs where the CPU has it (the project builds for baseline x86-64).
// The polynomials' a*b+c steps should become FMAs on the AVX2/AVX-512 clones; GCC's ISO mode
// does not contract by itself. (Before the header, so its inline functions get it here too.)
#pragma GCC optimize("fp-contract=fast")

#include "kiln/backends/cpu/vec_math.h"

#include <limits>

namespace kiln::cpu {

#define KILN_VEC_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

KILN_VEC_CLONES void SoftmaxRowInPlace(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float e = FastExp(x[j] - mx);
    x[j] = e;
    sum += e;
  }
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

KILN_VEC_CLONES void GeluErfInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.f + FastErf(x[i] * 0.70710678f));
}

KILN_VEC_CLONES void GeluTanhInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = 0.7978845608f * (v + 0.044715f * v * v * v);
    x[i] = 0.5f * v * (1.f + FastTanh(u));
  }
}

}  // namespace kiln::cpu
