// Vectorizable exp, erf and the row loops built on them (softmax, GELU) for the CPU kernels.
// libm's expf/erff/tanhf are scalar calls; in the fused Attention and the GELU epilogue of
// FusedMatMul they cost more than the matrix products around them (bert_tiny: erf 0.23 ms of a
// 0.29 ms MatMul+GELU layer). These are branch-free polynomials, so GCC vectorizes the loops.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln::cpu {

// The scalar functions are inline so that a kernel's element loop vectorizes with them.

// exp(x), relative error below 3e-7 for x in [-87.3, 88.3] (above, 2^127 caps it); exactly 0
// below -87.3, +inf above 88.72, NaN for NaN. exp(x) = 2^n e^r with n = round(x / ln 2) and
// |r| <= ln(2)/2; e^r by its Taylor polynomial to degree 7 (2e-8 relative at |r| = 0.347).
inline float FastExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 split so that n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  float c = x < -87.3f ? -87.3f : x;    // NaN passes through both clamps
  c = c > 88.3f ? 88.3f : c;            // n <= 127: 2^n stays a normal float
  const float shifted = c * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = (c - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  float y = p * scale;
  y = x < -87.3f ? 0.f : y;
  y = x > 88.72f ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;  // NaN in, NaN out
}

// erf(x), absolute error below 4e-7, relative below 1e-6. Abramowitz & Stegun 7.1.26:
// erf(a) = 1 - t(a1 + t(a2 + ...)) e^{-a^2}, t = 1/(1 + p a), a >= 0 (1.5e-7 in exact arithmetic).
inline float FastErf(float x) {
  const float a = std::fabs(x);
  const float t = 1.f / (1.f + 0.3275911f * a);
  float poly = 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  poly *= t;
  const float far = 1.f - poly * FastExp(-a * a);
  // Near 0 the form above cancels (1 - ~1); the Maclaurin series of 2/sqrt(pi) (x - x^3/3 +
  // x^5/10 - ...) to x^11 is exact to 2e-8 for |x| <= 0.5.
  const float z = a * a;
  float s = -1.f / 1320.f;
  s = s * z + 1.f / 216.f;
  s = s * z - 1.f / 42.f;
  s = s * z + 1.f / 10.f;
  s = s * z - 1.f / 3.f;
  s = s * z + 1.f;
  const float near = 1.1283791671f * a * s;
  return std::copysign(a < 0.5f ? near : far, x);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1), saturating to +-1 through e^{2u} = inf or 0; absolute error
// below 5e-7.
inline float FastTanh(float u) { return 1.f - 2.f / (FastExp(2.f * u) + 1.f); }

// In place over n contiguous floats: softmax (max subtraction, FP32 sum). A row whose entries
// are all -inf becomes NaN, as with the textbook formula.
void SoftmaxRowInPlace(float* x, int64_t n);

// In place: 0.5 x (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void GeluErfInPlace(float* x, int64_t n);
void GeluTanhInPlace(float* x, int64_t n);

}  // namespace kiln::cpu
