// The CPU formula of every row of ops/unary_ops.inc, shared by the elementwise unary kernels
// (elementwise_unary.cc) and the fused activation epilogue (activation.cc).
#pragma once

#include <algorithm>
#include <cmath>

#include "kiln/backends/cpu/vec_math.h"
#include "kiln/ops/op_schema.h"

namespace kiln::cpu {

// The attributes a unary formula reads (`p`).
struct UnaryParams {
  float alpha = 0, beta = 0, gamma = 0;
  bool tanh_gelu = false;  // Gelu with approximate = "tanh"
};

// The math the shared formulas call: std:: functions, and vec_math.h's erf and tanh for Gelu,
// which vectorize.
namespace m {
inline float exp(float x) { return std::exp(x); }
inline float tanh(float x) { return std::tanh(x); }
inline float erf(float x) { return std::erf(x); }
inline float log(float x) { return std::log(x); }
inline float sqrt(float x) { return std::sqrt(x); }
inline float fabs(float x) { return std::fabs(x); }
inline float floor(float x) { return std::floor(x); }
inline float ceil(float x) { return std::ceil(x); }
inline float nearbyint(float x) { return std::nearbyint(x); }
inline float sin(float x) { return std::sin(x); }
inline float cos(float x) { return std::cos(x); }
inline float log1p(float x) { return std::log1p(x); }
inline float expm1(float x) { return std::expm1(x); }
inline float max(float a, float b) { return std::max(a, b); }
inline float min(float a, float b) { return std::min(a, b); }
inline float clamp(float v, float lo, float hi) { return std::clamp(v, lo, hi); }
inline float fast_tanh(float x) { return FastTanh(x); }
inline float fast_erf(float x) { return FastErf(x); }
}  // namespace m

// op(x) in FP32, for an op with a KILN_UNARY_OP row.
template <OpType kOp>
inline float Unary(float x, [[maybe_unused]] const UnaryParams& p) {
#define KILN_UNARY_OP(Name, formula)      \
  if constexpr (kOp == OpType::k##Name) { \
    return formula;                       \
  } else
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  {
    static_assert(kOp != kOp, "no KILN_UNARY_OP row for this op");
    return x;
  }
}

}  // namespace kiln::cpu
