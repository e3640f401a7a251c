// Gemm, MatMul, FusedGemm and FusedMatMul on the CPU: every tactic against a double reference,
// over transposes, C broadcasting, batched broadcasting and 1-D operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/core/thread_pool.h"
#include "nn_test_util.h"

namespace kiln::testing {
namespace {

double Act(const std::string& act, double v) {
  if (act == "relu") return std::max(v, 0.0);
  if (act == "gelu") return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  if (act == "sigmoid") return 1 / (1 + std::exp(-v));
  if (act == "silu") return v / (1 + std::exp(-v));
  return v;
}

struct GemmParams {
  int64_t m, n, k;
  bool ta = false, tb = false;
  float alpha = 1.f, beta = 1.f;
  std::vector<int64_t> c{};  // C dims; empty = no C
};

std::vector<std::string> RunGemm(const GemmParams& p, uint32_t seed, const std::string& act = "",
                                 DataType dtype = DataType::kFloat32) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = act.empty() ? "Gemm" : "FusedGemm";
  c.attrs.Set("transA", int64_t{p.ta});
  c.attrs.Set("transB", int64_t{p.tb});
  c.attrs.Set("alpha", p.alpha);
  c.attrs.Set("beta", p.beta);
  if (!act.empty()) c.attrs.Set("activation", act);
  c.inputs = {
      RandomTensor(p.ta ? std::vector<int64_t>{p.k, p.m} : std::vector<int64_t>{p.m, p.k}, rng),
      RandomTensor(p.tb ? std::vector<int64_t>{p.n, p.k} : std::vector<int64_t>{p.k, p.n}, rng)};
  c.constant = {false, true, true};
  if (!p.c.empty()) c.inputs.push_back(RandomTensor(p.c, rng));
  auto ref = [p, act](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    EXPECT_EQ(yd, (std::vector<int64_t>{p.m, p.n}));
    std::vector<double> y;
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < p.k; ++l) {
          acc += in[0].GetDouble(p.ta ? l * p.m + i : i * p.k + l) *
                 in[1].GetDouble(p.tb ? j * p.k + l : l * p.n + j);
        }
        acc *= p.alpha;
        if (!p.c.empty()) {
          int64_t cm = p.c.size() == 2 ? p.c[0] : 1, cn = p.c.empty() ? 1 : p.c.back();
          acc += p.beta * in[2].GetDouble((cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j));
        }
        y.push_back(Act(act, acc));
      }
    return y;
  };
  double tol = dtype == DataType::kFloat32 ? 1e-4 : dtype == DataType::kFloat16 ? 5e-2 : 3e-1;
  std::vector<std::string> names;
  for (const auto& r : CheckAllTactics(c, ref, tol, tol, dtype)) names.push_back(r.tactic);
  return names;
}

TEST(CpuGemm, TransposesAndCBroadcast) {
  auto names = RunGemm({7, 9, 13}, 1);
  EXPECT_EQ(names, (std::vector<std::string>{"f32-gemm-cpu-openblas", "f32-gemm-cpu-blocked-8x8"}));
  RunGemm({17, 5, 300, true, false, 0.5f, 2.f, {17, 5}}, 2);  // K > one block of 256
  RunGemm({9, 31, 11, false, true, 1.f, 1.f, {31}}, 3);
  RunGemm({33, 20, 8, true, true, -1.f, 0.25f, {33, 1}}, 4);
  RunGemm({3, 4, 5, false, false, 1.f, 1.f, {1}}, 5);
}

// A product large enough to be split over threads, with K over several blocks: every schedule
// is offered (one thread only where the pool has several) and each matches the reference.
TEST(CpuGemm, LargeProductOffersEveryScheduleAndEachIsCorrect) {
  auto names = RunGemm({64, 96, 300, false, true, 1.f, 1.f, {96}}, 7, "relu");
  std::vector<std::string> expected = {"f32-gemm-cpu-openblas", "f32-gemm-cpu-blocked-8x8"};
  if (ThreadPool::Default().size() > 1) expected.push_back("f32-gemm-cpu-openblas-1thread");
  expected.push_back("f32-gemm-cpu-blocked-8x8-k128");
  EXPECT_EQ(names, expected);
  // K within one small block: the K-128 variant would be the same schedule, so it is not offered.
  auto small_k = RunGemm({64, 96, 100, true, false, 1.f, 0.f, {}}, 8);
  EXPECT_EQ(std::count(small_k.begin(), small_k.end(), "f32-gemm-cpu-blocked-8x8-k128"), 0);
}

TEST(CpuGemm, HalfTypes) {
  EXPECT_EQ(RunGemm({7, 9, 13, false, true, 1.f, 1.f, {9}}, 6, "", DataType::kFloat16).front(),
            "f16-gemm-cpu-openblas");
  RunGemm({7, 9, 13, false, true, 1.f, 1.f, {9}}, 6, "", DataType::kBFloat16);
}

TEST(CpuFusedGemm, Activations) {
  for (std::string act : {"none", "relu", "gelu", "sigmoid", "silu"}) {
    RunGemm({12, 10, 17, false, true, 1.f, 1.f, {10}}, 7, act);
  }
}

struct MatMulParams {
  std::vector<int64_t> a{}, b{}, y{};
  bool ta = false, tb = false;
  float alpha = 1.f;
  bool bias = false;
  std::string act{};
};

void RunMatMul(const MatMulParams& p, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  bool fused = p.ta || p.tb || p.bias || !p.act.empty() || p.alpha != 1.f;
  c.op = fused ? "FusedMatMul" : "MatMul";
  if (fused) {
    c.attrs.Set("transA", int64_t{p.ta});
    c.attrs.Set("transB", int64_t{p.tb});
    c.attrs.Set("alpha", p.alpha);
    if (!p.act.empty()) c.attrs.Set("activation", p.act);
  }
  c.inputs = {RandomTensor(p.a, rng), RandomTensor(p.b, rng)};
  c.constant = {false, true, true};
  if (p.bias) c.inputs.push_back(RandomTensor({p.y.back()}, rng));
  auto dims = InferOutputDims(c);
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  EXPECT_EQ(*dims, p.y);
  auto ref = [p](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    // Normalise to [batch..., M, K] x [batch..., K, N] with numpy rules.
    std::vector<int64_t> a = p.a, b = p.b;
    bool av = a.size() == 1, bv = b.size() == 1;
    if (av) a.insert(a.begin(), 1);
    if (bv) b.push_back(1);
    size_t ra = a.size(), rb = b.size();
    int64_t m = p.ta && !av ? a[ra - 1] : a[ra - 2], k = p.ta && !av ? a[ra - 2] : a[ra - 1];
    int64_t n = p.tb && !bv ? b[rb - 2] : b[rb - 1];
    size_t rank = std::max(ra, rb) - 2;
    std::vector<int64_t> batch(rank);
    for (size_t i = 0; i < rank; ++i) {
      int64_t da = i + ra - 2 >= rank ? a[i + ra - 2 - rank] : 1;
      int64_t db = i + rb - 2 >= rank ? b[i + rb - 2 - rank] : 1;
      batch[i] = std::max(da, db);
    }
    int64_t nb = 1;
    for (int64_t d : batch) nb *= d;
    std::vector<double> y;
    for (int64_t q = 0; q < nb; ++q) {
      // Batch coordinates -> offsets in A and B (broadcast dims of size 1 stay at 0).
      int64_t rem = q, ao = 0, bo = 0, as = m * k, bs = k * n;
      for (size_t i = rank; i-- > 0;) {
        int64_t coord = rem % batch[i];
        rem /= batch[i];
        int64_t da = i + ra - 2 >= rank ? a[i + ra - 2 - rank] : 1;
        int64_t db = i + rb - 2 >= rank ? b[i + rb - 2 - rank] : 1;
        ao += (da == 1 ? 0 : coord) * as;
        bo += (db == 1 ? 0 : coord) * bs;
        as *= da;
        bs *= db;
      }
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t l = 0; l < k; ++l) {
            acc += in[0].GetDouble(ao + (p.ta && !av ? l * m + i : i * k + l)) *
                   in[1].GetDouble(bo + (p.tb && !bv ? j * k + l : l * n + j));
          }
          acc *= p.alpha;
          if (p.bias) acc += in[2].GetDouble(j);
          y.push_back(Act(p.act, acc));
        }
    }
    EXPECT_EQ(static_cast<int64_t>(y.size()), NumElements(yd));
    return y;
  };
  // openblas and blocked-8x8 always; the one-thread and K-128 schedules where they differ.
  EXPECT_GE(CheckAllTactics(c, ref, 1e-4, 1e-4).size(), 2u);
}

TEST(CpuMatMul, BatchedBroadcastingAnd1D) {
  RunMatMul({{2, 3, 5, 7}, {7, 4}, {2, 3, 5, 4}}, 10);        // folded batch (BERT case)
  RunMatMul({{3, 5, 7}, {3, 7, 6}, {3, 5, 6}}, 11);           // batched both
  RunMatMul({{5, 7}, {2, 3, 7, 4}, {2, 3, 5, 4}}, 12);        // A broadcast
  RunMatMul({{2, 1, 5, 7}, {1, 3, 7, 4}, {2, 3, 5, 4}}, 13);  // both broadcast
  RunMatMul({{7}, {7, 4}, {4}}, 14);                          // 1-D A
  RunMatMul({{3, 5, 7}, {7}, {3, 5}}, 15);                    // 1-D B
  RunMatMul({{7}, {7}, {}}, 16);                              // dot product
  RunMatMul({{1, 300}, {300, 9}, {1, 9}}, 17);                // K > one block
}

TEST(CpuFusedMatMul, TransposesBiasActivation) {
  RunMatMul({{2, 4, 6}, {5, 6}, {2, 4, 5}, false, true, 1.f, true, "gelu"}, 20);
  RunMatMul({{2, 6, 4}, {2, 6, 5}, {2, 4, 5}, true, false, 0.5f, true, "relu"}, 21);
  RunMatMul({{3, 6, 4}, {3, 5, 6}, {3, 4, 5}, true, true, 2.f, false, ""}, 22);
}

}  // namespace
}  // namespace kiln::testing
