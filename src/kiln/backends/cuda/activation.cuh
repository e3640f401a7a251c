// The fused activations' formulas on the device, one per row of ops/activations.inc (the list
// gives each its formula, built on unary_ops.inc's), shared by every CUDA epilogue (cuBLASLt's in
// blas_kernels.cu, cuDNN's in conv_cudnn_epilogue.cu, the depthwise convolution's).
#pragma once

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/unary_formula.cuh"

namespace kiln::cuda {

__device__ __forceinline__ float Activate(BlasAct act, float x, float lo, float hi) {
  switch (act) {
#define KILN_UNARY(Op, v) Unary<UnaryOp::k##Op>(v, UnaryParams{})
#define KILN_UNARY_TANH_GELU(v) Unary<UnaryOp::kGelu>(v, UnaryParams{0.f, 0.f, 0.f, true})
#define KILN_ACTIVATION(Kind, name, source, formula) \
  case BlasAct::k##Kind:                             \
    return formula;
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
#undef KILN_UNARY_TANH_GELU
#undef KILN_UNARY
  }
  return x;
}

}  // namespace kiln::cuda
