// The fused activations' formulas on the device, one per kind of activations.inc, shared by every
// CUDA epilogue (cuBLASLt's in blas_kernels.cu, cuDNN's in conv_cudnn_epilogue.cu). Same
// formulas as the CPU backend's ApplyActivation (the reference).
#pragma once

#include "kiln/backends/cuda/blas_kernels.h"

namespace kiln::cuda {

__device__ __forceinline__ float Activate(BlasAct act, float x, float lo, float hi) {
  switch (act) {
    case BlasAct::kNone:
      return x;
    case BlasAct::kRelu:
      return x > 0.f ? x : 0.f;
    case BlasAct::kClip:
      return fminf(fmaxf(x, lo), hi);
    case BlasAct::kSigmoid:
      return 1.f / (1.f + expf(-x));
    case BlasAct::kHardSwish:
      return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
    case BlasAct::kSilu:
      return x / (1.f + expf(-x));
    case BlasAct::kGelu:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case BlasAct::kGeluTanh:
      return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

}  // namespace kiln::cuda
