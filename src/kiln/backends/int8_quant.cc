// The INT8 contract's host-side quantization (int8_quant.h), shared by every backend.
#include "kiln/backends/int8_quant.h"

namespace kiln {

std::optional<float> Int8InputAmax(const Node& node) {
  if (!node.attrs().Has(kInt8InputAmaxAttr)) return std::nullopt;
  float amax = node.attrs().GetFloat(kInt8InputAmaxAttr, 0.f);
  if (!std::isfinite(amax) || amax <= 0.f) return std::nullopt;
  return amax;
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

}  // namespace kiln
