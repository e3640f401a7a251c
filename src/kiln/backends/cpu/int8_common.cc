// The CPU's threaded activation quantization (the contract is kiln/backends/int8_quant.h).
#include "kiln/backends/cpu/int8_common.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {

namespace {
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void QuantizeRange(
    const float* x, int64_t n, float inv_scale, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = QuantizeInt8(x[i], inv_scale);
}
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
QuantizeRangeModel(const float* x, int64_t n, float scale, float zero_point, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = QuantizeInt8Model(x[i], scale, zero_point);
}
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
QuantizeRangeToFloat(const float* x, int64_t n, const Int8Activation& a, float* q) {
  if (a.from_model) {
    const float zp = static_cast<float>(a.zero_point);
    for (int64_t i = 0; i < n; ++i) {
      q[i] = static_cast<float>(QuantizeInt8Model(x[i], a.scale, zp)) - zp;
    }
  } else {
    const float inv = 1.f / a.scale;
    for (int64_t i = 0; i < n; ++i) q[i] = static_cast<float>(QuantizeInt8(x[i], inv));
  }
}

constexpr int64_t kChunk = 1 << 14;
}  // namespace

void QuantizeActivations(const float* x, int64_t n, float inv_scale, int8_t* q) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  // On OpenMP's threads, like the oneDNN primitive that follows, so that the whole layer runs on
  // one set of threads (kiln's ThreadPool and OpenMP's would otherwise take turns waking up).
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    QuantizeRange(x + lo, hi - lo, inv_scale, q + lo);
  }
}

void QuantizeActivationsModel(const float* x, int64_t n, float scale, int32_t zero_point,
                              int8_t* q) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  const float zp = static_cast<float>(zero_point);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    QuantizeRangeModel(x + lo, hi - lo, scale, zp, q + lo);
  }
}

void QuantizeActivations(const float* x, int64_t n, const Int8Activation& a, float* q) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    QuantizeRangeToFloat(x + lo, hi - lo, a, q + lo);
  }
}

}  // namespace kiln::cpu
