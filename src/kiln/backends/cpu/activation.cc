// The fused ops' activation epilogue on the CPU: every row of ops/activations.inc from its formula
// (built on unary_ops.inc's, unary_formula.h), plus vectorised or cheaper loops for the hot kinds.
#include <algorithm>
#include <cmath>

#include "kiln/backends/cpu/sgemm.h"
#include "kiln/backends/cpu/unary_formula.h"
#include "kiln/backends/cpu/vec_math.h"

namespace kiln::cpu {

namespace {

float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// The hot kinds' own loops; false for a kind without one (ApplyListedActivation then runs). Each
// must equal the listed formula within rounding (tests/backends/cpu/activation_test.cc).
bool ApplyOwnLoop(const FusedActivationSpec& act, float* x, int64_t n) {
  switch (act.kind) {
    case FusedActivation::kNone:
      return true;
    case FusedActivation::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
      return true;
    case FusedActivation::kClip:
      for (int64_t i = 0; i < n; ++i) x[i] = std::min(std::max(x[i], act.min), act.max);
      return true;
    // One exp per element (the listed form, stable for large -x, takes two for x < 0).
    case FusedActivation::kSigmoid:
      for (int64_t i = 0; i < n; ++i) x[i] = Sigmoid(x[i]);
      return true;
    case FusedActivation::kSilu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] * Sigmoid(x[i]);
      return true;
    case FusedActivation::kSwish:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] * Sigmoid(act.min * x[i]);
      return true;
    // vec_math.h's loops are cloned per ISA; libm's erff/tanhf per element cost several times
    // the GEMM they follow.
    case FusedActivation::kGelu:
      GeluErfInPlace(x, n);
      return true;
    case FusedActivation::kGeluTanh:
      GeluTanhInPlace(x, n);
      return true;
    default:
      return false;
  }
}

}  // namespace

void ApplyListedActivation(const FusedActivationSpec& act, float* data, int64_t n) {
  [[maybe_unused]] const float lo = act.min, hi = act.max;
  switch (act.kind) {
#define KILN_UNARY(Op, v) Unary<OpType::k##Op>(v, UnaryParams{})
#define KILN_UNARY_TANH_GELU(v) Unary<OpType::kGelu>(v, UnaryParams{.tanh_gelu = true})
#define KILN_ACTIVATION(Kind, name, source, formula) \
  case FusedActivation::k##Kind:                     \
    for (int64_t i = 0; i < n; ++i) {                \
      const float x = data[i];                       \
      data[i] = formula;                             \
    }                                                \
    return;
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
#undef KILN_UNARY_TANH_GELU
#undef KILN_UNARY
  }
}

void ApplyActivation(const FusedActivationSpec& act, float* x, int64_t n) {
  if (!ApplyOwnLoop(act, x, n)) ApplyListedActivation(act, x, n);
}

}  // namespace kiln::cpu
