// Window geometry of Conv, ConvTranspose and the pools, shared by the shape rules (nn.cc) and
// the kernels, so the padding and output-size arithmetic is written once. The formulas are
// templates over Dim (build time, symbolic) and int64_t (kernels, concrete dims).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/attribute.h"
#include "kiln/ir/dim.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/sizes.h"

namespace kiln {
class InferenceContext;
// Conv's shape rule over inputs X, W, B; FusedConv (fused.cc) reuses it.
Status InferConvLike(InferenceContext& ctx);
// MatMul's rule with optional transposes of the last two dims of A and B; FusedMatMul reuses it.
Status InferMatMulLike(InferenceContext& ctx, bool trans_a, bool trans_b);
// Gemm's rule (A, B, optional C; transA, transB); FusedGemm reuses it.
Status InferGemmLike(InferenceContext& ctx);
// The float type a Gemm/MatMul-family node computes in: A's, or B's where A arrives as FP8 E4M3
// from an FP8 producer (ops/quant_edge.h). Y has this type unless the node writes FP8 itself.
// Conv/FusedConv compute in it too (X, W; an int8 X on an INT8 edge stands for W's type).
DataType ProductType(const InferenceContext& ctx);
// The first n present inputs share ProductType, a float type (input 0 standing for it on an
// edge): the products' and the convolutions' type rule.
Status SameFloatTypes(const InferenceContext& ctx, size_t n);

// The layout pass (passes/layout_nhwc.cc) tags convolution-stack nodes with the string attribute
// kiln_layout = "NHWC": their activation inputs and outputs are N, spatial..., C (weights stay as
// in ONNX). True when `attrs` carry that tag.
bool IsChannelsLast(const AttributeMap& attrs);
// N,C,D... <-> N,D...,C for ranks >= 3 (other ranks are returned unchanged).
Shape ChannelsLastToFirst(const Shape& s);
Shape ChannelsFirstToLast(const Shape& s);
// Runs the channels-first shape rule `rule` for a node that may be tagged channels-last: the
// inputs listed in `activations` are seen channels-first and every output is turned back.
Status InferWithLayout(InferenceContext& ctx, Status (*rule)(InferenceContext&),
                       std::initializer_list<size_t> activations);
}  // namespace kiln

namespace kiln::nn {

enum class AutoPad : uint8_t { kNotSet, kSameUpper, kSameLower, kValid };

// Validated window attributes of one Conv/ConvTranspose/pool node, every vector of length
// `rank` (the spatial rank); pads has 2*rank entries (all begins, then all ends) as in ONNX.
struct WindowAttrs {
  AutoPad auto_pad = AutoPad::kNotSet;
  std::vector<int64_t> kernel, strides, dilations, pads;
  int64_t group = 1;
  bool ceil_mode = false;
  std::vector<int64_t> output_padding;  // ConvTranspose only
  std::vector<int64_t> output_shape;    // ConvTranspose only (spatial; empty when absent)
};

// Reads auto_pad, kernel_shape (or `kernel_from_weights` when the attribute is absent),
// strides, dilations, pads, group, ceil_mode, output_padding and output_shape. Errors name the
// attribute (KILN-E2009). Kernel sizes, strides, dilations, pads, output_padding and the dilated
// kernel are at most kMaxDim (ir/sizes.h), so the formulas below cannot overflow on checked dims.
StatusOr<WindowAttrs> ReadWindowAttrs(const AttributeMap& attrs, size_t rank,
                                      const std::vector<int64_t>& kernel_from_weights);

inline int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t CeilDiv(int64_t a, int64_t b) { return FloorDiv(a + b - 1, b); }

// Output size of a Conv or pool along one axis. For ceil_mode the last window must start inside
// the input or the begin padding (the rule PyTorch and ONNX Runtime apply); with a symbolic
// input that correction cannot be decided, so the plain ceil form is used.
template <typename T>
T WindowOutDim(const T& in, const WindowAttrs& a, size_t i) {
  if constexpr (!std::is_same_v<T, int64_t>) {
    if (in.is_static()) return T(WindowOutDim<int64_t>(in.value(), a, i));
  }
  int64_t k_eff = a.dilations[i] * (a.kernel[i] - 1) + 1;
  int64_t s = a.strides[i];
  switch (a.auto_pad) {
    case AutoPad::kSameUpper:
    case AutoPad::kSameLower:
      return CeilDiv(in, T(s));
    case AutoPad::kValid:
      return CeilDiv(in - T(k_eff - 1), T(s));
    case AutoPad::kNotSet:
      break;
  }
  T span = in + T(a.pads[i] + a.pads[i + a.kernel.size()] - k_eff);
  if (!a.ceil_mode) return FloorDiv(span, T(s)) + T(1);
  T out = CeilDiv(span, T(s)) + T(1);
  if constexpr (std::is_same_v<T, int64_t>) {
    if ((out - 1) * s >= in + a.pads[i]) --out;
  }
  return out;
}

// Begin padding along one axis for concrete sizes (auto_pad resolved).
int64_t WindowPadBegin(int64_t in, int64_t out, const WindowAttrs& a, size_t i);

// ConvTranspose output size along one axis (output_shape wins when given).
template <typename T>
T TransposeOutDim(const T& in, const WindowAttrs& a, size_t i) {
  if (!a.output_shape.empty()) return T(a.output_shape[i]);
  int64_t k_eff = a.dilations[i] * (a.kernel[i] - 1) + 1;
  int64_t s = a.strides[i];
  // Stride times input may pass int64 even for checked values: Dim saturates, int64 must too.
  auto mul = [](const T& x, int64_t y) {
    if constexpr (std::is_same_v<T, int64_t>) {
      return SatMul(x, y);
    } else {
      return x * T(y);
    }
  };
  if (a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower) return mul(in, s);
  int64_t pads = a.auto_pad == AutoPad::kValid ? 0 : a.pads[i] + a.pads[i + a.kernel.size()];
  return mul(in - T(1), s) + T(a.output_padding[i] + k_eff - pads);
}

// ConvTranspose begin padding for concrete sizes: the total padding implied by in/out is split
// as the ONNX spec says (SAME_UPPER puts the smaller half first).
int64_t TransposePadBegin(int64_t in, int64_t out, const WindowAttrs& a, size_t i);

}  // namespace kiln::nn
