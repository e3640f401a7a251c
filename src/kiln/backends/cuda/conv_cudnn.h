// Shared by the cuDNN convolution providers (conv_cudnn.cc) and their CUDA epilogue kernel
// (conv_cudnn_epilogue.cu): the fallback that applies bias, residual and activation in place
// when no cuDNN engine runs the fused operation graph (and after ConvTranspose's data-gradient
// convolution, which cuDNN does not fuse).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kiln/ir/dtype.h"

namespace kiln::cuda {

struct ConvEpilogueArgs {
  DataType dtype = DataType::kFloat32;  // of y, bias and z
  void* y = nullptr;                    // N x C x HW (NCHW) or N x HW x C (NHWC), in place
  const void* bias = nullptr;           // [C] or nullptr
  const void* z = nullptr;              // residual, y's shape, or nullptr
  int64_t n = 0, c = 0, hw = 0;
  bool channels_last = false;
  // FusedActivation's value (kiln/ops/fused.h; kept out of nvcc's way) and the clip bounds.
  int act = 0;
  float act_min = 0.f, act_max = 0.f;
};

// y = act(y + bias[c] + z), computed in FP32; enqueued on `stream` (no allocation, no sync).
cudaError_t LaunchConvEpilogue(const ConvEpilogueArgs& args, cudaStream_t stream);

// Finalised cuDNN plans of this process: built (finalised from an engine configuration), loaded
// (deserialised from the plan store, KILN_CUDNN_PLAN_CACHE: no compilation) and stored (runtime-
// compiled plans written to it).
struct CudnnPlanStats {
  int64_t built = 0, loaded = 0, stored = 0;
};
CudnnPlanStats GetCudnnPlanStats();
// Tests: a plan store in `dir` ("" none; nullopt: back to KILN_CUDNN_PLAN_CACHE), and an empty
// in-process plan cache (as in a new process).
void SetCudnnPlanStoreForTesting(std::optional<std::string> dir);
void ClearCudnnPlanCacheForTesting();

}  // namespace kiln::cuda
