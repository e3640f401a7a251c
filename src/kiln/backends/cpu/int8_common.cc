// INT8 quantization helpers (see int8_common.h for the contract).
#include "kiln/backends/cpu/int8_common.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {

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

namespace {
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void QuantizeRange(
    const float* x, int64_t n, float inv_scale, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    // Clamp before converting (an out-of-range float -> int conversion is undefined); written so
    // that NaN saturates too instead of reaching the conversion.
    float v = x[i] * inv_scale;
    v = v < 127.f ? v : 127.f;
    v = v > -127.f ? v : -127.f;
    q[i] = static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(v)));
  }
}
}  // namespace

void QuantizeActivations(const float* x, int64_t n, float inv_scale, int8_t* q) {
  constexpr int64_t kChunk = 1 << 14;
  int64_t chunks = (n + kChunk - 1) / kChunk;
  // On OpenMP's threads, like the oneDNN primitive that follows, so that the whole layer runs on
  // one set of threads (kiln's ThreadPool and OpenMP's would otherwise take turns waking up).
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    QuantizeRange(x + lo, hi - lo, inv_scale, q + lo);
  }
}

}  // namespace kiln::cpu
