// The host-side half of the CUDA INT8 convolution (conv_int8.cc: "i8-conv-cuda-wgmma-<tile>"),
// without any CUDA call: which Conv/FusedConv nodes it takes, the implicit-GEMM geometry of one
// run (implicit_gemm_conv.h) and the weights quantized and packed for it, so that a test can
// replay the whole layer on the host where there is no GPU.
//
// The layer follows the INT8 contract (backends/int8_quant.h) as the CPU's oneDNN convolution
// does: X quantized per tensor (scale amax / 127, or the model's scale with zero point 0), the
// constant weight per output channel, int32 accumulation, then per channel
// y = act(acc * x_scale * w_scale[k] + bias[k] + Z) in the layer's float type.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/implicit_gemm_conv.h"
#include "kiln/backends/int8_quant.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/nn.h"

namespace kiln::cuda {

// A Conv or FusedConv the INT8 convolution takes: tagged channels-last (kiln_layout "NHWC": X
// [N, H, W, C], Y [N, OH, OW, K]), two spatial dims, group 1, an INT8 activation with zero point
// 0 (CudaInt8Activation), a constant float weight [K, C, R, S], X, Y, the bias [K] and the
// residual Z (Y's dims) in one float storage type (X, Y or both int8 on INT8 edges), and a depth
// R * S * C small enough that int32 cannot overflow.
struct QuantizedConv {
  BlasType type = BlasType::kF32;
  Int8Activation input;  // how X is quantized
  int64_t k = 0, c = 0;
  int32_t r = 1, s = 1;
  nn::WindowAttrs attrs;
  bool has_bias = false, has_z = false;
  FusedActivationSpec act;
  // On INT8 edges (ops/quant_edge.h): X arrives as int8 [N, H, W, C] (C a multiple of 16, so
  // that it is the kernel's quantized X as it stands), Y leaves as int8 quantized with out_scale
  // (> 0; 0 for a float Y), or both; `type` is then the other side's float type, or W's.
  bool in_int8 = false;
  float out_scale = 0.f;
  // A 1x1 window, stride 1, no padding (IsPointwise at every shape): X quantized is A itself, and
  // every tile of the matrix kernel runs it, the TMA ones included.
  bool pointwise = false;
};
std::optional<QuantizedConv> ResolveQuantizedConv(const KernelRequest& request);

// The implicit GEMM of one run from X's and Y's (NHWC) dims; a shape error when they do not
// agree with the weight and the window attributes.
StatusOr<ImplicitGemmConv> ImplicitGemmFor(const QuantizedConv& q, std::span<const int64_t> x,
                                           std::span<const int64_t> y);

// The weights (Int8WeightsFor: [K, C, R, S] integers and per-channel scales) packed as the
// kernel's B [kp, R * S * Cp] (PackConvWeights), with col_scale[k] = x_scale * w_scale[k] for k <
// K and 0 in the padding up to kp (a multiple of 16), as the CPU kernel computes its output
// scales.
struct Int8PackedConv {
  int64_t kp = 0, depth = 0;
  std::vector<int8_t> packed;
  std::vector<float> col_scale;
};
Int8PackedConv PackInt8Conv(const QuantizedConv& q, const Int8Weights& w);

}  // namespace kiln::cuda
