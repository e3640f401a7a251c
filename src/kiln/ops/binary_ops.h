// What the rows of binary_ops.inc name: the operand-type classes, the parameters and
// the scalar helpers their formulas call. Plain C++ with no kiln dependencies, compiled for the
// host and (in the CUDA backend's .cu files) for the device.
#pragma once

#include <cmath>
#include <type_traits>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif

namespace kiln {

// binary_ops.inc's Types column.
enum class BinaryTypes : int { kArith, kArithWide, kCompare, kEquality, kLogic, kPow };
// Whether ops of these types write bool.
constexpr bool WritesBool(BinaryTypes t) {
  return t == BinaryTypes::kCompare || t == BinaryTypes::kEquality || t == BinaryTypes::kLogic;
}

// The attributes a formula reads (`p`), from the node with ops.inc's defaults.
struct BinaryParams {
  bool fmod = false;  // Mod: C's fmod (sign of the dividend) instead of Python's (of the divisor)
};

namespace binary_math {

// ONNX Mod: the remainder with the divisor's sign (fmod: the dividend's, as C's fmod); an integer
// remainder by zero is 0. T is float, double or an integer type.
template <typename T>
KILN_HOST_DEVICE T Mod(T a, T b, bool fmod) {
  if constexpr (std::is_floating_point_v<T>) {
    // f32 (and f16/bf16, computed as f32) or f64.
    T m;
    if constexpr (std::is_same_v<T, float>) {
      m = fmodf(a, b);
    } else {
      m = ::fmod(a, b);
    }
    if (fmod) return m;
    return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
  } else if constexpr (std::is_unsigned_v<T>) {
    // Both signs are positive: Python's and C's remainders agree.
    return b == 0 ? T(0) : static_cast<T>(a % b);
  } else {
    if (b == 0) return 0;
    T m = static_cast<T>(a % b);
    if (!fmod && m != 0 && ((m < 0) != (b < 0))) m = static_cast<T>(m + b);
    return m;
  }
}

// ONNX Pow: integers by squaring (the exponent in the base's type; a negative one gives 0 except
// for bases 1 and -1), f32 ^ f32 in FP32 with x^2 and x^0.5 exact, mixed types in FP64.
template <typename A, typename B>
KILN_HOST_DEVICE A Pow(A a, B b) {
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B>) {
    A base = a, e = static_cast<A>(b), r = 1;
    if (e < 0) return base == 1 ? A(1) : (base == -1 ? A(e % 2 ? -1 : 1) : A(0));
    for (; e > 0; e >>= 1, base *= base) {
      if (e & 1) r *= base;
    }
    return r;
  } else if constexpr (std::is_same_v<A, float> && std::is_same_v<B, float>) {
    return b == 2.f ? a * a : (b == 0.5f ? sqrtf(a) : powf(a, b));
  } else {
    return static_cast<A>(pow(static_cast<double>(a), static_cast<double>(b)));
  }
}

}  // namespace binary_math
}  // namespace kiln
