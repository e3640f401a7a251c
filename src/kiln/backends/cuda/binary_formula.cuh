// The device formula of every row of ops/binary_ops.inc, shared by the broadcasting binary kernels
// (elementwise.cu) and the variadic ones (variadic.cu).
#pragma once

#include <type_traits>

#include "kiln/backends/cuda/cuda_launch.h"

namespace kiln::cuda {

// The row's operand-type class.
constexpr BinaryTypes TypesOf(BinaryOp op) {
  switch (op) {
#define KILN_BINARY_OP(Name, Types, formula) \
  case BinaryOp::k##Name:                    \
    return BinaryTypes::k##Types;
#define KILN_VARIADIC_OP(Name, Types, formula) KILN_BINARY_OP(Name, Types, formula)
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
  }
  return BinaryTypes::kArith;
}

// op(a, b) for compute values (float for f32/f16/bf16 storage): the row's formula, converted to
// the output's compute type (bool for the comparisons and logic, else a's).
template <BinaryOp kOp, typename A, typename B>
__device__ __forceinline__ auto Binary(A a, B b, const BinaryParams& p) {
  using R = std::conditional_t<WritesBool(TypesOf(kOp)), bool, A>;
#define KILN_BINARY_OP(Name, Types, formula) \
  if constexpr (kOp == BinaryOp::k##Name) return static_cast<R>(formula);
#define KILN_VARIADIC_OP(Name, Types, formula) KILN_BINARY_OP(Name, Types, formula)
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
}

}  // namespace kiln::cuda
