// kiln-internal fused ops. Graph passes create them; the ONNX importer never does. Each is an
// ONNX op plus an epilogue computed in FP32 before the single store of the output.
//
// FusedConv(X, W, B?, Z?) -> Y
//   Y = act(Conv(X, W) + B + Z). Attributes: all of Conv's (auto_pad, dilations, group,
//   kernel_shape, pads, strides) plus the activation below. B is [M]; Z (the residual branch of
//   a ResNet block) has exactly Y's shape. The shape rule is Conv's.
// FusedGemm(A, B, C?) -> Y
//   Y = act(alpha * op(A) op(B) + beta * C). Attributes: Gemm's (alpha, beta, transA, transB)
//   plus the activation. C broadcasts to [M, N] as in Gemm.
// FusedMatMul(A, B, bias?) -> Y
//   Y = act(alpha * op(A) @ op(B) + bias). Attributes: transA, transB (swap the last two dims of
//   A / B before the product; ignored for a 1-D operand), alpha (default 1) and the activation.
//   Batched and broadcast as MatMul; bias is 1-D [N], added to every row.
//
// The activation epilogue (every fused op):
//   activation      string: "none" (default), "relu", "relu6", "clip", "sigmoid", "hardswish",
//                   "silu", "swish" (x * sigmoid(alpha * x)), "gelu" (erf form), "gelu_tanh"
//                   (tanh approximation)
//   activation_min  float, for "clip" (default -inf)
//   activation_max  float, for "clip" (default +inf); "relu6" is clip with 0 and 6
//   activation_alpha  float, for "swish" (default 1; CLIP's QuickGELU is 1.702)
#include "kiln/ops/fused.h"

#include <cmath>
#include <limits>

#include "kiln/ops/nn.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"

namespace kiln {

namespace {
struct ActivationRow {
  FusedActivation kind;
  std::string_view name;
  std::string_view source;  // an op type, or empty
};
constexpr ActivationRow kActivations[] = {
#define KILN_ACTIVATION(kind, name, source, formula) {FusedActivation::k##kind, name, source},
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
};
}  // namespace

std::string_view ToString(FusedActivation kind) {
  for (const ActivationRow& a : kActivations) {
    if (a.kind == kind) return a.name;
  }
  return "?";
}

std::optional<FusedActivation> FusedActivationOf(OpType op) {
  for (const ActivationRow& a : kActivations) {
    if (!a.source.empty() && op != OpType::kNumOps && a.source == GetOpSchema(op).name) {
      return a.kind;
    }
  }
  return std::nullopt;
}

StatusOr<FusedActivationSpec> ParseFusedActivation(const AttributeMap& attrs) {
  FusedActivationSpec spec;
  // Every fused op declares the same activation attributes; FusedConv's rows stand for all.
  const std::string name = attrs::FusedConv::activation(attrs);
  if (name == "relu6") return FusedActivationSpec{FusedActivation::kClip, 0.f, 6.f};
  const ActivationRow* row = nullptr;
  for (const ActivationRow& a : kActivations) {
    if (a.name == name) row = &a;
  }
  if (!row) {
    std::string names;
    for (const ActivationRow& a : kActivations) {
      names += fmt::format("{}{}", names.empty() ? "" : ", ", a.name);
      if (a.kind == FusedActivation::kRelu) names += ", relu6";
    }
    return MakeError(ErrorCode::kInvalidAttribute, "activation '{}' is not one of {}", name, names);
  }
  spec.kind = row->kind;
  if (spec.kind == FusedActivation::kClip) {
    spec.min = attrs::FusedConv::activation_min(attrs);
    spec.max = attrs::FusedConv::activation_max(attrs);
    if (spec.min > spec.max) {
      return MakeError(ErrorCode::kInvalidAttribute, "activation_min {} > activation_max {}",
                       spec.min, spec.max);
    }
  } else if (spec.kind == FusedActivation::kSwish) {
    spec.min = attrs::FusedConv::activation_alpha(attrs);
    if (!std::isfinite(spec.min)) {
      return MakeError(ErrorCode::kInvalidAttribute, "activation_alpha {} is not finite", spec.min);
    }
  }
  return spec;
}

StatusOr<AttentionAttrs> ReadAttentionAttrs(const AttributeMap& attrs) {
  AttentionAttrs a;
  const std::string kind = attrs::Attention::mask_kind(attrs);
  if (kind == "none") {
    a.mask = AttentionMask::kNone;
  } else if (kind == "additive") {
    a.mask = AttentionMask::kAdditive;
  } else if (kind == "boolean") {
    a.mask = AttentionMask::kBoolean;
  } else if (kind == "causal") {
    a.mask = AttentionMask::kCausal;
  } else {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "Attention mask_kind '{}' is not one of none, additive, boolean, causal",
                     kind);
  }
  const std::string layout = attrs::Attention::layout(attrs);
  if (layout == "bhsd") {
    a.layout = AttentionLayout::kBhsd;
  } else if (layout == "bshd") {
    a.layout = AttentionLayout::kBshd;
  } else if (layout == "bsd" || layout == "sbd") {
    a.layout = layout == "bsd" ? AttentionLayout::kBsd : AttentionLayout::kSbd;
    a.heads = attrs::Attention::num_heads(attrs);
    if (a.heads <= 0) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "Attention layout '{}' needs num_heads > 0 (got {})", layout, a.heads);
    }
  } else {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "Attention layout '{}' is not one of bhsd, bshd, bsd, sbd", layout);
  }
  a.qkv_packed = attrs::Attention::qkv_packed(attrs) != 0;
  if (a.qkv_packed && a.layout != AttentionLayout::kBsd && a.layout != AttentionLayout::kSbd) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "Attention qkv_packed needs layout 'bsd' or 'sbd'");
  }
  a.default_scale = !attrs.Has("scale");
  a.scale = attrs::Attention::scale(attrs);
  a.mask_fill = attrs::Attention::mask_fill(attrs);
  return a;
}

namespace {
Status CheckActivation(InferenceContext& ctx) {
  auto spec = ParseFusedActivation(ctx.attrs());
  if (!spec.ok()) return ctx.Error(spec.status().code(), "{}", spec.status().message());
  return OkStatus();
}
}  // namespace

namespace {
Status InferFusedConvNchw(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(CheckActivation(ctx));
  KILN_RETURN_IF_ERROR(InferConvLike(ctx));
  if (ctx.has_input(3)) {
    const Shape& z = ctx.input_shape(3);
    const Shape& y = ctx.output(0).shape;
    bool same = z.size() == y.size();
    for (size_t i = 0; same && i < z.size(); ++i) {
      same = z[i] == y[i] || !z[i].is_static() || !y[i].is_static();
    }
    const DataType t = ProductType(ctx);  // Y's float type (int8 on an edge aside)
    if (!same || ctx.input_type(3) != t) {
      return ctx.Error(ErrorCode::kShapeMismatch, "residual input Z {} ({}) must match Y {} ({})",
                       ToString(z), ToString(ctx.input_type(3)), ToString(y), ToString(t));
    }
  }
  return OkStatus();
}

}  // namespace

// A channels-last FusedConv sees X and the residual Z channels-last (nn.h).
Status InferFusedConv(InferenceContext& ctx) {
  return InferWithLayout(ctx, InferFusedConvNchw, {0, 3});
}

Status InferFusedGemm(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(CheckActivation(ctx));
  return InferGemmLike(ctx);
}

Status InferFusedMatMul(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(CheckActivation(ctx));
  KILN_RETURN_IF_ERROR(InferMatMulLike(ctx, attrs::FusedMatMul::transA(ctx.attrs()) != 0,
                                       attrs::FusedMatMul::transB(ctx.attrs()) != 0));
  if (ctx.has_input(2)) {
    const Shape& bias = ctx.input_shape(2);
    const Shape& y = ctx.output(0).shape;
    bool ok = bias.size() == 1 && ctx.input_type(2) == ProductType(ctx) && !y.empty() &&
              (bias[0] == y.back() || !bias[0].is_static() || !y.back().is_static());
    if (!ok) {
      return ctx.Error(ErrorCode::kShapeMismatch, "bias {} must be 1-D [N] with Y {}",
                       ToString(bias), ToString(y));
    }
  }
  return OkStatus();
}

}  // namespace kiln
