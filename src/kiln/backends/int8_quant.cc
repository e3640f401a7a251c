// The INT8 contract's host-side quantization (int8_quant.h), shared by every backend.
#include "kiln/backends/int8_quant.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/ops/op_table.h"

namespace kiln {

std::optional<float> Int8InputAmax(const Node& node) {
  if (!node.attrs().Has(kInt8InputAmaxAttr)) return std::nullopt;
  float amax = node.attrs().GetFloat(kInt8InputAmaxAttr, 0.f);
  if (!std::isfinite(amax) || amax <= 0.f) return std::nullopt;
  return amax;
}

std::optional<Int8Activation> Int8ActivationOf(const Node& node) {
  if (std::optional<ModelInt8Scales> m = ModelInt8ScalesOf(node)) {
    return Int8Activation{m->input_scale, m->input_zero_point, true};
  }
  // A node with some of the model's attributes but not usable ones is no INT8 layer: falling
  // back to a calibrated amax would quantize it with other scales than the model says.
  if (HasModelInt8Attrs(node)) return std::nullopt;
  if (std::optional<float> amax = Int8InputAmax(node)) {
    return Int8Activation{Int8ActivationScale(*amax), 0, false};
  }
  return std::nullopt;
}

Int8Weights QuantizeWeightsPerChannel(const float* w, int64_t channels, int64_t inner,
                                      int64_t channel_stride, int64_t inner_stride) {
  Int8Weights out;
  out.q.resize(static_cast<size_t>(channels * inner));
  out.scales.resize(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    float absmax = 0.f;
    for (int64_t i = 0; i < inner; ++i) {
      absmax = std::max(absmax, std::fabs(w[c * channel_stride + i * inner_stride]));
    }
    float scale = absmax > 0.f ? absmax / 127.f : 1.f;
    out.scales[c] = scale;
    float inv = 1.f / scale;
    for (int64_t i = 0; i < inner; ++i) {
      int64_t at = c * channel_stride + i * inner_stride;
      float v = std::nearbyint(w[at] * inv);
      out.q[at] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
    }
  }
  return out;
}

std::optional<Int8WeightLayout> Int8WeightLayoutOf(const Node& node,
                                                   const std::vector<int64_t>& d) {
  switch (OpTypeOf(node)) {
    case OpType::kConv:
    case OpType::kFusedConv: {
      if (d.size() < 3 || d[0] <= 0) return std::nullopt;
      int64_t inner = 1;
      for (size_t i = 1; i < d.size(); ++i) inner *= d[i];
      return Int8WeightLayout{d[0], inner, inner, 1};
    }
    case OpType::kGemm:
    case OpType::kFusedGemm:
    case OpType::kMatMul:
    case OpType::kFusedMatMul: {
      if (d.size() != 2) return std::nullopt;
      // MatMul has no transB; its fused form shares Gemm's attribute and default (ops.inc).
      const bool trans_b =
          OpTypeOf(node) != OpType::kMatMul && attrs::Gemm::transB(node.attrs()) != 0;
      // Channels are B's columns N: element (n, k) sits at k * N + n, or n * K + k when
      // transposed.
      return trans_b ? Int8WeightLayout{d[0], d[1], d[1], 1}
                     : Int8WeightLayout{d[1], d[0], 1, d[1]};
    }
    default:
      return std::nullopt;
  }
}

StatusOr<Int8Weights> ModelInt8Weights(const float* w, std::span<const float> scales,
                                       const Int8WeightLayout& l) {
  if (static_cast<int64_t>(scales.size()) != l.channels) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "the model's weight scales are {} for a weight of {} output channels",
                     scales.size(), l.channels);
  }
  Int8Weights out;
  out.q.resize(static_cast<size_t>(l.channels * l.inner));
  out.scales.assign(scales.begin(), scales.end());
  for (int64_t c = 0; c < l.channels; ++c) {
    const float s = scales[c];
    for (int64_t i = 0; i < l.inner; ++i) {
      const int64_t at = c * l.channel_stride + i * l.inner_stride;
      const float v = w[at] / s;
      const float q = std::nearbyint(v);
      if (!(std::fabs(v - q) <= 1e-3f) || q < -128.f || q > 127.f) {
        return MakeError(ErrorCode::kInvalidModel,
                         "weight element {} (channel {}) is {}, which is {} times its scale {}; "
                         "the model's INT8 weights must be integers in [-128, 127] times it",
                         at, c, w[at], v, s);
      }
      out.q[at] = static_cast<int8_t>(q);
    }
  }
  return out;
}

StatusOr<Int8Weights> Int8WeightsFor(const Node& node, const Tensor& w) {
  if (w.dtype() != DataType::kFloat32) {
    return MakeError(ErrorCode::kTypeMismatch, "node '{}': the INT8 weight is {}, not float32",
                     node.name(), ToString(w.dtype()));
  }
  std::optional<Int8WeightLayout> l = Int8WeightLayoutOf(node, w.dims());
  if (!l) {
    return MakeError(ErrorCode::kShapeMismatch, "node '{}' ({}): no INT8 weight layout for {}",
                     node.name(), node.op_type(), fmt::format("[{}]", fmt::join(w.dims(), ",")));
  }
  if (std::optional<ModelInt8Scales> m = ModelInt8ScalesOf(node)) {
    StatusOr<Int8Weights> q = ModelInt8Weights(w.data<float>(), m->weight_scales, *l);
    if (!q.ok()) return std::move(q).status().AddContext(fmt::format("node '{}'", node.name()));
    return q;
  }
  return QuantizeWeightsPerChannel(w.data<float>(), l->channels, l->inner, l->channel_stride,
                                   l->inner_stride);
}

}  // namespace kiln
