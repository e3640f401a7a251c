// kiln's own depthwise convolution (channels-last, one filter per channel: group = C, weight
// [C, 1, r, s]) beside cuDNN's engines, with the FusedConv epilogue (bias, residual, activation)
// in the same pass. Plain structs only, so conv_depthwise.cu stays free of kiln's C++ headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backends/cuda/cuda_launch.h"

namespace kiln::cuda {

// Which depthwise kernel runs: the register-tiled ones (any dtype, any filter up to 7x7) or the
// shared-memory tile (FP16/BF16, square 3/5/7 filters, stride 1 or 2 both ways, C % 8 == 0).
enum class DepthwiseVariant : int { kRegisterTile = 0, kSharedTile = 1 };

struct DepthwiseConvArgs {
  Elem dtype = Elem::kF32;     // f32, f16 or bf16 (x, w, bias, z and y share it)
  const void* x = nullptr;     // [n, h, w, c]
  const void* w = nullptr;     // [r * s, c]: the filter taps, channels contiguous
  const void* bias = nullptr;  // [c] or nullptr
  const void* z = nullptr;     // residual, y's shape, or nullptr
  void* y = nullptr;           // [n, oh, ow, c]
  int64_t n = 0, h = 0, w_in = 0, c = 0, oh = 0, ow = 0;
  int r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  // FusedActivation's value (kiln/ops/fused.h; kept out of nvcc's way; the kernel reads it as
  // the BlasAct of activation.cuh, the same list) and the clip bounds.
  int act = 0;
  float act_min = 0.f, act_max = 0.f;
  DepthwiseVariant variant = DepthwiseVariant::kRegisterTile;
};

// Whether the shared-memory tile variant runs this convolution (x 16-byte aligned at run time).
bool DepthwiseSmemSupports(Elem dtype, int64_t c, int r, int s, int stride_h, int stride_w);

// y = act(conv(x, w) + bias + z), FP32 accumulation; enqueued on `stream`. The shared-tile
// variant fails with cudaErrorNotSupported outside what DepthwiseSmemSupports allows, and runs
// the register-tiled kernel when a pointer is off its alignment.
cudaError_t LaunchDepthwiseConv(const DepthwiseConvArgs& a, cudaStream_t stream);

// Grouped convolution with small groups (RegNet's group width 24, ResNeXt's 8-32): channels-last
// x [n, h, w, group * cpg] and y [n, oh, ow, group * kpg], the filter in FP32 as
// [group][r * s][cpg][kpg] (conv_grouped.cu).
struct GroupedConvArgs {
  Elem dtype = Elem::kF32;     // f32, f16 or bf16 (x, bias, z and y share it)
  const void* x = nullptr;     // [n, h, w, group * cpg]
  const float* w = nullptr;    // [group][r * s][cpg][kpg], FP32
  const void* bias = nullptr;  // [group * kpg] or nullptr
  const void* z = nullptr;     // residual, y's shape, or nullptr
  void* y = nullptr;           // [n, oh, ow, group * kpg]
  int64_t n = 0, h = 0, w_in = 0, oh = 0, ow = 0;
  int group = 1, cpg = 0, kpg = 0;
  int r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int act = 0;
  float act_min = 0.f, act_max = 0.f;
};

// Whether LaunchGroupedConv runs these channel counts: cpg a multiple of 8 and kpg one of the
// compiled widths (8, 16, 24, 32, 48, 64), with the group's FP32 filter within
// kGroupedConvMaxFilterBytes of shared memory.
inline constexpr int64_t kGroupedConvMaxFilterBytes = 96 * 1024;
bool GroupedConvSupports(int64_t cpg, int64_t kpg, int64_t taps);

// y = act(conv(x, w) + bias + z), FP32 accumulation; x, y, bias and z 16-byte aligned
// (cudaErrorMisalignedAddress otherwise); enqueued on `stream`.
cudaError_t LaunchGroupedConv(const GroupedConvArgs& a, cudaStream_t stream);

}  // namespace kiln::cuda
