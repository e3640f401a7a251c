// The CPU formula of every row of ops/unary_ops.inc, shared by the elementwise unary kernels
// (elementwise_unary.cc) and the fused activation epilogue (activation.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kiln/backends/cpu/vec_math.h"
#include "kiln/ops/op_schema.h"

namespace kiln::cpu {

// The attributes a unary formula reads (`p`).
struct UnaryParams {
  float alpha = 0, beta = 0, gamma = 0;
  bool tanh_gelu = false;  // Gelu with approximate = "tanh"
};

// The math the shared formulas call: std:: functions, and vec_math.h's erf and tanh for Gelu,
// which vectorize. Each takes and gives the compute type T: float for f32 (and f16/bf16), double
// for f64; the formulas' float literals and parameters then promote to T.
namespace m {
#define KILN_CPU_MATH_1(name) \
  template <typename T>       \
  inline T name(T x) {        \
    return std::name(x);      \
  }
KILN_CPU_MATH_1(exp)
KILN_CPU_MATH_1(tanh)
KILN_CPU_MATH_1(erf)
KILN_CPU_MATH_1(log)
KILN_CPU_MATH_1(sqrt)
KILN_CPU_MATH_1(fabs)
KILN_CPU_MATH_1(floor)
KILN_CPU_MATH_1(ceil)
KILN_CPU_MATH_1(nearbyint)
KILN_CPU_MATH_1(sin)
KILN_CPU_MATH_1(cos)
KILN_CPU_MATH_1(tan)
KILN_CPU_MATH_1(asin)
KILN_CPU_MATH_1(acos)
KILN_CPU_MATH_1(atan)
KILN_CPU_MATH_1(sinh)
KILN_CPU_MATH_1(cosh)
KILN_CPU_MATH_1(asinh)
KILN_CPU_MATH_1(acosh)
KILN_CPU_MATH_1(atanh)
KILN_CPU_MATH_1(log1p)
KILN_CPU_MATH_1(expm1)
#undef KILN_CPU_MATH_1
// Mixed operands (a float literal and a double) compute in the wider type.
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  return std::max<std::common_type_t<A, B>>(a, b);
}
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  return std::min<std::common_type_t<A, B>>(a, b);
}
template <typename V, typename L, typename H>
inline std::common_type_t<V, L, H> clamp(V v, L lo, H hi) {
  return std::clamp<std::common_type_t<V, L, H>>(v, lo, hi);
}
// FP32 uses the vectorising approximations; FP64 the exact functions.
template <typename T>
inline T fast_tanh(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return FastTanh(x);
  } else {
    return std::tanh(x);
  }
}
template <typename T>
inline T fast_erf(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return FastErf(x);
  } else {
    return std::erf(x);
  }
}
}  // namespace m

// op(x) in T (float: FP32 for f32/f16/bf16; double for f64), for an op with a KILN_UNARY_OP row.
template <OpType kOp, typename T = float>
inline T Unary(T x, [[maybe_unused]] const UnaryParams& p) {
#define KILN_UNARY_OP(Name, formula)      \
  if constexpr (kOp == OpType::k##Name) { \
    return static_cast<T>(formula);       \
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
