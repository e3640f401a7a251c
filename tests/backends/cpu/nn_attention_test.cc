// Attention (the graph passes' fused op) on the CPU: every tactic against a double-precision
// softmax(mask(scale Q K^T)) V over mask kinds, broadcast batch dims, causal offsets and query
// blocks longer than one task; and the vectorized exp/erf/softmax/GELU it is built on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/backends/cpu/vec_math.h"
#include "nn_test_util.h"

namespace kiln::testing {
namespace {

struct AttentionParams {
  std::vector<int64_t> q, k, v;  // [..., S, D] each
  std::string mask_kind = "none";
  std::vector<int64_t> mask{};  // additive / boolean mask dims
  float scale = 0;              // 0: the default 1/sqrt(D)
};

int64_t Product(const std::vector<int64_t>& d, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= d[i];
  return n;
}

// Linear index into `dims` (right-aligned, size-1 dims broadcast) of the coordinate `coord` of
// a tensor with dims `full`.
int64_t BroadcastIndex(const std::vector<int64_t>& dims, const std::vector<int64_t>& full,
                       int64_t flat) {
  std::vector<int64_t> coord(full.size());
  for (size_t i = full.size(); i-- > 0;) {
    coord[i] = flat % full[i];
    flat /= full[i];
  }
  int64_t index = 0;
  size_t off = full.size() - dims.size();
  for (size_t i = 0; i < dims.size(); ++i) {
    index = index * dims[i] + (dims[i] == 1 ? 0 : coord[off + i]);
  }
  return index;
}

void RunAttention(const AttentionParams& p, uint32_t seed, DataType dtype = DataType::kFloat32,
                  double atol = 2e-5, double rtol = 2e-5) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "Attention";
  c.attrs.Set("mask_kind", p.mask_kind);
  if (p.scale != 0) c.attrs.Set("scale", p.scale);
  c.inputs = {RandomTensor(p.q, rng, -2.f, 2.f), RandomTensor(p.k, rng, -2.f, 2.f),
              RandomTensor(p.v, rng)};
  if (p.mask_kind == "additive") {
    c.inputs.push_back(RandomTensor(p.mask, rng, -4.f, 0.f));
  } else if (p.mask_kind == "boolean") {
    std::vector<uint8_t> bits(static_cast<size_t>(Product(p.mask, 0, p.mask.size())));
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = (i * 7 + seed) % 3 != 0;
    bits[0] = 1;  // every row keeps a key: no all-masked row
    Tensor m(DataType::kBool, p.mask);
    std::memcpy(m.mutable_raw(), bits.data(), bits.size());
    c.inputs.push_back(std::move(m));
  }
  const size_t r = p.q.size();
  const int64_t sq = p.q[r - 2], d = p.q[r - 1], sk = p.k[r - 2], dv = p.v[r - 1];
  auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    std::vector<int64_t> batch(yd.begin(), yd.end() - 2);
    const int64_t nb = Product(batch, 0, batch.size());
    std::vector<int64_t> score_dims = batch;
    score_dims.push_back(sq);
    score_dims.push_back(sk);
    const double scale = p.scale != 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> y;
    auto batch_of = [&](const std::vector<int64_t>& dims, int64_t b) {
      return BroadcastIndex(std::vector<int64_t>(dims.begin(), dims.end() - 2), batch, b);
    };
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t qb = batch_of(p.q, b), kb = batch_of(p.k, b), vb = batch_of(p.v, b);
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> s(sk);
        double mx = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          double acc = 0;
          for (int64_t t = 0; t < d; ++t) {
            acc += in[0].GetDouble((qb * sq + i) * d + t) * in[1].GetDouble((kb * sk + j) * d + t);
          }
          acc *= scale;
          const int64_t flat = (b * sq + i) * sk + j;
          if (p.mask_kind == "additive")
            acc += in[3].GetDouble(BroadcastIndex(p.mask, score_dims, flat));
          if (p.mask_kind == "boolean" &&
              in[3].GetDouble(BroadcastIndex(p.mask, score_dims, flat)) == 0)
            acc = -INFINITY;
          if (p.mask_kind == "causal" && j > i + (sk - sq)) acc = -INFINITY;
          s[j] = acc;
          mx = std::max(mx, acc);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t t = 0; t < dv; ++t) {
          double acc = 0;
          for (int64_t j = 0; j < sk; ++j)
            acc += s[j] / sum * in[2].GetDouble((vb * sk + j) * dv + t);
          y.push_back(acc);
        }
      }
    }
    return y;
  };
  auto results = CheckAllTactics(c, ref, atol, rtol, dtype);
  EXPECT_FALSE(results.empty());
}

TEST(CpuAttention, NoMask) { RunAttention({{2, 3, 5, 8}, {2, 3, 7, 8}, {2, 3, 7, 6}}, 1); }

TEST(CpuAttention, ExplicitScale) {
  RunAttention({{1, 2, 4, 16}, {1, 2, 4, 16}, {1, 2, 4, 16}, "none", {}, 0.3f}, 2);
}

TEST(CpuAttention, AdditivePaddingMaskBroadcastOverHeadsAndQueries) {
  RunAttention({{2, 3, 5, 8}, {2, 3, 7, 8}, {2, 3, 7, 8}, "additive", {2, 1, 1, 7}}, 3);
}

TEST(CpuAttention, AdditiveFullMaskOfLowerRank) {
  RunAttention({{2, 3, 5, 8}, {2, 3, 7, 8}, {2, 3, 7, 4}, "additive", {5, 7}}, 4);
}

TEST(CpuAttention, BooleanMask) {
  RunAttention({{2, 2, 6, 8}, {2, 2, 6, 8}, {2, 2, 6, 8}, "boolean", {2, 1, 6, 6}}, 5);
}

TEST(CpuAttention, CausalWithMoreKeysThanQueries) {
  RunAttention({{1, 2, 3, 8}, {1, 2, 9, 8}, {1, 2, 9, 8}, "causal"}, 6);
}

TEST(CpuAttention, BroadcastKeyValueBatchDims) {
  RunAttention({{2, 3, 5, 8}, {1, 3, 7, 8}, {2, 1, 7, 8}}, 7);
}

// 150 query rows: three row blocks of one (batch, head), the last one partial.
TEST(CpuAttention, LongSequenceSpansSeveralQueryBlocks) {
  RunAttention({{1, 2, 150, 16}, {1, 2, 150, 16}, {1, 2, 150, 16}, "causal"}, 8);
}

TEST(CpuAttention, Float16Storage) {
  RunAttention({{2, 2, 8, 16}, {2, 2, 8, 16}, {2, 2, 8, 16}, "additive", {2, 1, 1, 8}}, 9,
               DataType::kFloat16, 5e-3, 5e-3);
}

TEST(CpuVecMath, ExpMatchesLibmWithinItsBound) {
  double worst = 0;
  for (float x = -87.f; x < 88.f; x += 0.0013f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::FastExp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(cpu::FastExp(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_EQ(cpu::FastExp(-100.f), 0.f);
  EXPECT_EQ(cpu::FastExp(100.f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(cpu::FastExp(std::nanf(""))));
  EXPECT_EQ(cpu::FastExp(0.f), 1.f);
}

TEST(CpuVecMath, ErfAndTanhMatchLibmWithinTheirBounds) {
  double erf_abs = 0, erf_rel = 0, tanh_abs = 0;
  for (float x = -9.f; x < 9.f; x += 0.00037f) {
    const double want = std::erf(static_cast<double>(x));
    const double err = std::fabs(cpu::FastErf(x) - want);
    erf_abs = std::max(erf_abs, err);
    if (want != 0) erf_rel = std::max(erf_rel, err / std::fabs(want));
    tanh_abs = std::max(tanh_abs, std::fabs(cpu::FastTanh(x) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(erf_abs, 4e-7);
  EXPECT_LT(erf_rel, 1e-6);
  EXPECT_LT(tanh_abs, 5e-7);
  EXPECT_EQ(cpu::FastErf(50.f), 1.f);
  EXPECT_EQ(cpu::FastErf(-50.f), -1.f);
}

TEST(CpuVecMath, SoftmaxRowAndGeluLoops) {
  std::vector<float> row = {1.f, 2.f, 3.f, -std::numeric_limits<float>::infinity()};
  cpu::SoftmaxRowInPlace(row.data(), static_cast<int64_t>(row.size()));
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(row[0], std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(row[2], std::exp(3.0) / z, 1e-7);
  EXPECT_EQ(row[3], 0.f);
  std::vector<float> x(1000), erf_form, tanh_form;
  for (size_t i = 0; i < x.size(); ++i) x[i] = -8.f + 0.016f * static_cast<float>(i);
  erf_form = tanh_form = x;
  cpu::GeluErfInPlace(erf_form.data(), static_cast<int64_t>(x.size()));
  cpu::GeluTanhInPlace(tanh_form.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(erf_form[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 2e-6) << v;
    EXPECT_NEAR(tanh_form[i],
                0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 2e-6)
        << v;
  }
}

}  // namespace
}  // namespace kiln::testing
