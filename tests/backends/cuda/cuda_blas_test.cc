// The CUDA matrix products (cuBLASLt: Gemm, FusedGemm, MatMul, FusedMatMul) and the fused
// Attention kernel against the CPU backend: every provider and every tactic, on fresh random
// inputs, over odd sizes, transposes, batched broadcasting, every epilogue path and f32/f16/bf16.
// Skips where no GPU is present.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <iostream>
#include <limits>
#include <random>

#include "kiln/backends/backend.h"
#include "kiln/ops/op_schema.h"
#include "op_tester.h"

namespace kiln::testing {
namespace {

const std::vector<DataType> kAllFloat = {DataType::kFloat32, DataType::kFloat16,
                                         DataType::kBFloat16};

class CudaBlasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = GetBackend(BackendKind::kCuda);
    if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status().ToString();
  }
};

AttributeMap GemmAttrs(bool ta, bool tb, float alpha, float beta, const std::string& act = "") {
  AttributeMap a;
  a.Set("transA", int64_t{ta});
  a.Set("transB", int64_t{tb});
  a.Set("alpha", alpha);
  a.Set("beta", beta);
  if (!act.empty()) a.Set("activation", act);
  return a;
}

struct GemmCase {
  int64_t m, n, k;
  bool ta = false, tb = false;
  float alpha = 1.f, beta = 1.f;
  std::vector<int64_t> c{};  // empty: no C
  std::string act{};         // non-empty: FusedGemm
  bool const_b = false;      // B as a constant (a weight)
};

// Runs every CUDA tactic of the case for f32, f16 and bf16; returns the combinations run.
int RunGemmCase(const GemmCase& g, uint32_t seed) {
  SCOPED_TRACE(fmt::format("gemm m={} n={} k={} ta={} tb={} alpha={} beta={} C=[{}] act={}", g.m,
                           g.n, g.k, g.ta, g.tb, g.alpha, g.beta, fmt::join(g.c, ","), g.act));
  OpTester t(g.act.empty() ? "Gemm" : "FusedGemm", GemmAttrs(g.ta, g.tb, g.alpha, g.beta, g.act));
  t.Seed(seed);
  t.Input(DataType::kFloat32,
          g.ta ? std::vector<int64_t>{g.k, g.m} : std::vector<int64_t>{g.m, g.k});
  std::vector<int64_t> bd = g.tb ? std::vector<int64_t>{g.n, g.k} : std::vector<int64_t>{g.k, g.n};
  if (g.const_b) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> dist(-2, 2);
    std::vector<double> vals(static_cast<size_t>(bd[0] * bd[1]));
    for (double& v : vals) v = dist(rng);
    t.Constant(MakeTensor(DataType::kFloat32, bd, vals));
  } else {
    t.Input(DataType::kFloat32, bd);
  }
  if (!g.c.empty()) t.Input(DataType::kFloat32, g.c);
  // FP32 without TF32: only the summation order differs from the CPU.
  t.Tolerance(1e-4 * std::sqrt(static_cast<double>(g.k)), 1e-4);
  t.FloatTypes(kAllFloat);
  return t.Run(BackendKind::kCuda);
}

TEST_F(CudaBlasTest, GemmShapesTransposesAndC) {
  int runs = 0;
  runs += RunGemmCase({7, 9, 13}, 1);
  runs += RunGemmCase({1, 1, 1}, 2);
  runs += RunGemmCase({17, 5, 300, true, false, 0.5f, 2.f, {17, 5}}, 3);  // C as cuBLASLt's C
  runs += RunGemmCase({9, 31, 11, false, true, 1.f, 1.f, {31}}, 4);       // C as the bias
  runs += RunGemmCase({9, 31, 11, false, true, 1.f, 1.f, {1, 31}, "", true}, 5);
  runs += RunGemmCase({33, 20, 8, true, true, -1.f, 0.25f, {33, 1}}, 6);  // kiln's epilogue
  runs += RunGemmCase({3, 4, 5, false, false, 1.f, 1.f, {1}}, 7);
  runs += RunGemmCase({64, 48, 40, false, true, 1.f, 0.5f, {48}}, 8);           // bias with beta
  runs += RunGemmCase({130, 257, 129, false, false, 1.f, 0.f, {130, 257}}, 9);  // beta 0
  runs += RunGemmCase({256, 384, 512, false, true, 1.f, 1.f, {384}, "", true}, 10);
  EXPECT_GE(runs, 10 * 3);
}

TEST_F(CudaBlasTest, FusedGemmEveryEpilogue) {
  // cuBLASLt epilogues: relu / gelu_tanh with and without the bias, with a full C.
  RunGemmCase({19, 23, 29, false, true, 1.f, 1.f, {23}, "relu", true}, 11);
  RunGemmCase({19, 23, 29, false, true, 1.f, 1.f, {23}, "gelu_tanh", true}, 12);
  RunGemmCase({19, 23, 29, false, false, 1.f, 1.f, {}, "relu"}, 13);
  RunGemmCase({19, 23, 29, true, false, 0.7f, 1.5f, {19, 23}, "gelu_tanh"}, 14);
  // kiln's epilogue kernel: the other activations, C broadcasts cuBLASLt cannot take.
  RunGemmCase({19, 23, 29, false, true, 1.f, 1.f, {23}, "gelu", true}, 15);
  RunGemmCase({19, 23, 29, false, false, 1.f, 1.f, {19, 1}, "relu"}, 16);
  RunGemmCase({40, 24, 16, false, false, 1.f, 1.f, {24}, "sigmoid"}, 17);
  RunGemmCase({40, 24, 16, false, false, 1.f, 1.f, {40, 24}, "silu"}, 18);
  RunGemmCase({40, 24, 16, false, false, 1.f, 1.f, {}, "hardswish"}, 19);
  RunGemmCase({40, 24, 16, false, false, 2.f, 0.5f, {24}, "relu6"}, 20);
  AttributeMap swish = GemmAttrs(false, true, 1.f, 1.f, "swish");  // CLIP's QuickGELU
  swish.Set("activation_alpha", 1.702f);
  OpTester ts("FusedGemm", swish);
  ts.Input(DataType::kFloat32, {33, 40}).Input(DataType::kFloat32, {24, 40});
  ts.Input(DataType::kFloat32, {24}).FloatTypes(kAllFloat).Tolerance(1e-4, 1e-4);
  EXPECT_GT(ts.Run(BackendKind::kCuda), 0);
  AttributeMap clip = GemmAttrs(false, false, 1.f, 1.f, "clip");
  clip.Set("activation_min", -0.5f);
  clip.Set("activation_max", 1.25f);
  OpTester t("FusedGemm", clip);
  t.Input(DataType::kFloat32, {21, 13}).Input(DataType::kFloat32, {13, 17});
  t.Input(DataType::kFloat32, {17}).FloatTypes(kAllFloat).Tolerance(1e-4, 1e-4);
  EXPECT_GT(t.Run(BackendKind::kCuda), 0);
}

struct MatMulCase {
  std::vector<int64_t> a, b;
  bool ta = false, tb = false;
  float alpha = 1.f;
  bool bias = false;
  std::string act{};
  bool fused = false;
};

int RunMatMulCase(const MatMulCase& c, uint32_t seed) {
  SCOPED_TRACE(fmt::format("matmul A=[{}] B=[{}] ta={} tb={} alpha={} bias={} act={}",
                           fmt::join(c.a, ","), fmt::join(c.b, ","), c.ta, c.tb, c.alpha, c.bias,
                           c.act));
  AttributeMap attrs;
  if (c.fused) {
    attrs.Set("transA", int64_t{c.ta});
    attrs.Set("transB", int64_t{c.tb});
    attrs.Set("alpha", c.alpha);
    if (!c.act.empty()) attrs.Set("activation", c.act);
  }
  OpTester t(c.fused ? "FusedMatMul" : "MatMul", attrs);
  t.Seed(seed);
  t.Input(DataType::kFloat32, c.a).Input(DataType::kFloat32, c.b);
  int64_t k = c.a.size() == 1 ? c.a[0] : (c.ta ? c.a[c.a.size() - 2] : c.a.back());
  if (c.bias) {
    int64_t n = c.b.size() == 1 ? 1 : (c.tb ? c.b[c.b.size() - 2] : c.b.back());
    t.Input(DataType::kFloat32, {n});
  }
  t.Tolerance(1e-4 * std::sqrt(static_cast<double>(k)), 1e-4);
  t.FloatTypes(kAllFloat);
  return t.Run(BackendKind::kCuda);
}

TEST_F(CudaBlasTest, MatMulBatchedBroadcastAndVectors) {
  int runs = 0;
  runs += RunMatMulCase({{5, 7}, {7, 3}}, 21);
  runs += RunMatMulCase({{2, 3, 5, 7}, {7, 6}}, 22);               // batch folded into M
  runs += RunMatMulCase({{2, 3, 5, 7}, {2, 3, 7, 6}}, 23);         // one strided batch
  runs += RunMatMulCase({{2, 1, 5, 7}, {1, 3, 7, 6}}, 24);         // two-sided: several calls
  runs += RunMatMulCase({{5, 7}, {4, 7, 6}}, 25);                  // A broadcast (stride 0)
  runs += RunMatMulCase({{3, 1, 9, 8}, {4, 8, 10}}, 26);           // [3,1] x [4]
  runs += RunMatMulCase({{7}, {3, 7, 2}}, 27);                     // 1-D A
  runs += RunMatMulCase({{2, 5, 7}, {7}}, 28);                     // 1-D B
  runs += RunMatMulCase({{7}, {7}}, 29);                           // dot product
  runs += RunMatMulCase({{3, 33, 65, 17}, {3, 33, 17, 129}}, 30);  // odd sizes
  runs += RunMatMulCase({{4, 128, 64}, {64, 256}}, 31);
  EXPECT_GE(runs, 11 * 3);
}

TEST_F(CudaBlasTest, FusedMatMulTransposesBiasActivations) {
  RunMatMulCase({{2, 3, 7, 5}, {2, 3, 6, 7}, true, true, 0.5f, true, "", true}, 41);
  RunMatMulCase({{2, 5, 7}, {6, 7}, false, true, 1.f, true, "relu", true}, 42);  // folded
  RunMatMulCase({{2, 5, 7}, {6, 7}, false, true, 1.f, true, "gelu_tanh", true}, 43);
  RunMatMulCase({{2, 5, 7}, {7, 6}, false, false, 1.f, true, "gelu", true}, 44);
  RunMatMulCase({{3, 9, 17}, {3, 17, 11}, false, false, 1.f, false, "silu", true}, 45);
  RunMatMulCase({{4, 9, 17}, {9, 11}, true, false, 2.f, true, "sigmoid", true}, 46);
  RunMatMulCase({{2, 1, 9, 17}, {1, 3, 11, 17}, false, true, 1.f, true, "relu", true}, 47);
  RunMatMulCase({{17}, {17, 11}, true, false, 1.f, true, "hardswish", true}, 48);
  // FP16/BF16 erf-GELU takes cuBLASLt's tanh-form epilogue (within FP16's spacing); SiLU:
  // cuBLASLt writes Y with the bias, kiln's kernel activates it in place (16-byte vectors plus a
  // scalar tail: 4*33*70 is not a multiple of 8).
  RunMatMulCase({{4, 33, 64}, {64, 70}, false, false, 1.f, true, "gelu", true}, 49);
  RunMatMulCase({{4, 33, 64}, {64, 70}, false, false, 1.f, true, "silu", true}, 50);
}

// ---- Attention.

struct AttnCase {
  std::vector<int64_t> q, k, v;
  std::string mask_kind = "none";
  std::vector<int64_t> mask{};
  float scale = 0.f;  // 0: default 1/sqrt(D)
  float fill = 0.f;   // 0: default -inf
  std::string layout = "bhsd";
  int64_t heads = 0;  // layouts bsd, sbd
  bool qkv_packed = false;
};

int RunAttention(const AttnCase& c, uint32_t seed) {
  SCOPED_TRACE(fmt::format("attention Q=[{}] K=[{}] V=[{}] mask {} [{}]", fmt::join(c.q, ","),
                           fmt::join(c.k, ","), fmt::join(c.v, ","), c.mask_kind,
                           fmt::join(c.mask, ",")));
  AttributeMap attrs;
  attrs.Set("mask_kind", c.mask_kind);
  if (c.scale != 0.f) attrs.Set("scale", c.scale);
  if (c.fill != 0.f) attrs.Set("mask_fill", c.fill);
  if (c.layout != "bhsd") attrs.Set("layout", c.layout);
  if (c.heads > 0) attrs.Set("num_heads", c.heads);
  if (c.qkv_packed) attrs.Set("qkv_packed", int64_t{1});
  OpTester t("Attention", attrs);
  t.Seed(seed);
  t.Input(DataType::kFloat32, c.q).Input(DataType::kFloat32, c.k).Input(DataType::kFloat32, c.v);
  if (c.mask_kind == "additive") t.Input(DataType::kFloat32, c.mask, -3.0, 1.0);
  if (c.mask_kind == "boolean") t.Input(DataType::kBool, c.mask, 0.0, 1.0);
  t.Tolerance(1e-4, 1e-4).FloatTypes(kAllFloat);
  return t.Run(BackendKind::kCuda);
}

TEST_F(CudaBlasTest, AttentionShapesAndMasks) {
  int runs = 0;
  runs += RunAttention({{2, 3, 17, 32}, {2, 3, 40, 32}, {2, 3, 40, 24}}, 51);
  runs += RunAttention({{1, 2, 64, 64}, {1, 2, 64, 64}, {1, 2, 64, 64}, "causal"}, 52);
  runs += RunAttention({{2, 2, 9, 16}, {2, 2, 37, 16}, {2, 2, 37, 16}, "causal"}, 53);  // Sq < Sk
  runs += RunAttention({{2, 4, 33, 128}, {2, 4, 33, 128}, {2, 4, 33, 128}}, 54);        // D = 128
  runs += RunAttention({{3, 5, 40}, {3, 70, 40}, {3, 70, 72}}, 55);                     // odd D, Dv
  runs += RunAttention({{2, 3, 17, 8}, {2, 1, 20, 8}, {2, 1, 20, 8}}, 56);  // K/V broadcast
  runs += RunAttention({{2, 3, 17, 32}, {2, 3, 40, 32}, {2, 3, 40, 32}, "additive", {2, 1, 1, 40}},
                       57);  // BERT's padding mask
  runs += RunAttention({{2, 3, 17, 32}, {2, 3, 40, 32}, {2, 3, 40, 32}, "additive", {17, 40}}, 58);
  runs += RunAttention(
      {{2, 3, 17, 32}, {2, 3, 40, 32}, {2, 3, 40, 32}, "boolean", {2, 3, 17, 40}, 0.3f, -1e4f}, 59);
  runs += RunAttention({{1, 70, 16}, {1, 70, 16}, {1, 70, 16}, "boolean", {70, 70}}, 60);
  // Several key tiles (the pipelined tactics' buffers alternate and the last tile is partial) and
  // partial 128-row blocks.
  runs += RunAttention({{1, 3, 200, 64}, {1, 3, 300, 64}, {1, 3, 300, 64}}, 61);
  runs += RunAttention({{1, 2, 260, 128}, {1, 2, 260, 128}, {1, 2, 260, 128}, "causal"}, 62);
  runs +=
      RunAttention({{2, 1, 130, 32}, {2, 1, 333, 32}, {2, 1, 333, 32}, "additive", {130, 333}}, 63);
  // Whisper's 1500 frames: 23 full key tiles without a mask (the scale-only path) and a partial
  // one; a negative scale, where the raw scores' max is not the scaled scores' max.
  runs += RunAttention({{1, 2, 1500, 64}, {1, 2, 1500, 64}, {1, 2, 1500, 64}}, 64);
  runs += RunAttention({{1, 2, 300, 32}, {1, 2, 256, 32}, {1, 2, 256, 32}, "none", {}, -0.2f}, 65);
  // ViT's 197 tokens: one key of the last tile's four 16-key groups holds keys, and most warps of
  // the last row block have no rows (plain, causal and additive).
  runs += RunAttention({{2, 3, 197, 64}, {2, 3, 197, 64}, {2, 3, 197, 64}}, 66);
  runs += RunAttention({{1, 2, 197, 64}, {1, 2, 197, 64}, {1, 2, 197, 64}, "causal"}, 67);
  runs += RunAttention(
      {{1, 2, 197, 32}, {1, 2, 150, 32}, {1, 2, 150, 32}, "additive", {1, 1, 197, 150}}, 68);
  // The [B, 1, S, S] padding mask an eager export of newer transformers materializes (BERT's 128
  // tokens, D 64: pairs of mask elements in one load); a boolean mask of odd row length (one
  // element a load) and a broadcast additive one with an odd key count (pairs, the last one's
  // second key out of range).
  runs += RunAttention(
      {{2, 3, 128, 64}, {2, 3, 128, 64}, {2, 3, 128, 64}, "additive", {2, 1, 128, 128}}, 69);
  runs +=
      RunAttention({{2, 2, 45, 64}, {2, 2, 77, 64}, {2, 2, 77, 64}, "boolean", {2, 1, 45, 77}}, 70);
  runs +=
      RunAttention({{2, 2, 45, 64}, {2, 2, 77, 64}, {2, 2, 77, 64}, "additive", {2, 1, 1, 77}}, 71);
  EXPECT_GE(runs, 21 * 3);
}

// Rows whose every key is masked (a padded query row under a padding mask, OPT's clamped scores
// before the canonicalization): zeros, as the CPU kernel gives (AttentionKernel.
// RowMaskedWholeGivesZeros), never NaN, on every tactic: the SIMT one (D 8), the tensor-core ones
// (D 64) and several key tiles (Sk 300), for boolean masks and additive -inf ones.
TEST_F(CudaBlasTest, AttentionRowsMaskedWholeAreZeros) {
  int runs = 0;
  uint32_t seed = 81;
  for (const auto& [b, h, sq, sk, d] : std::vector<std::array<int64_t, 5>>{
           {1, 2, 5, 9, 8}, {2, 2, 70, 64, 64}, {1, 2, 130, 300, 64}}) {
    for (const bool boolean : {true, false}) {
      SCOPED_TRACE(fmt::format("B {} H {} Sq {} Sk {} D {} {}", b, h, sq, sk, d,
                               boolean ? "boolean" : "additive"));
      // Every third query row masked whole; the other rows keep every key but the first.
      std::vector<double> keep(static_cast<size_t>(sq * sk), 1.0);
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          if (i % 3 == 1 || j == 0) keep[static_cast<size_t>(i * sk + j)] = 0.0;
        }
      }
      std::vector<double> mask = keep;
      if (!boolean) {
        for (double& m : mask) m = m != 0.0 ? 0.0 : -std::numeric_limits<double>::infinity();
      }
      AttributeMap attrs;
      attrs.Set("mask_kind", std::string(boolean ? "boolean" : "additive"));
      OpTester t("Attention", attrs);
      t.Seed(seed++);
      t.Input(DataType::kFloat32, {b, h, sq, d})
          .Input(DataType::kFloat32, {b, h, sk, d})
          .Input(DataType::kFloat32, {b, h, sk, d})
          .Input(MakeTensor(boolean ? DataType::kBool : DataType::kFloat32, {sq, sk}, mask));
      t.Tolerance(1e-4, 1e-4).FloatTypes(kAllFloat);
      runs += t.Run(BackendKind::kCuda);
    }
  }
  EXPECT_GE(runs, 6 * 3);
}

// Grouped-query attention as the attention fusion runs it (rank-5 views): Q [B, KVH, n, S, D]
// against K and V [B, KVH, 1, S, D] (stride 0 over the group), with causal, additive
// ([1, 1, 1, S, S]: Llama's constant mask viewed) and per-head masks, D 64 and 128 (the tensor-core
// tactics) and an odd sequence.
TEST_F(CudaBlasTest, AttentionGroupedQueryOnRankFiveViews) {
  int runs = 0;
  runs += RunAttention({{2, 2, 3, 64, 64}, {2, 2, 1, 64, 64}, {2, 2, 1, 64, 64}, "causal"}, 71);
  runs += RunAttention({{2, 4, 3, 33, 128}, {2, 4, 1, 33, 128}, {2, 4, 1, 33, 128}, "causal"}, 72);
  runs += RunAttention(
      {{2, 2, 3, 40, 64}, {2, 2, 1, 40, 64}, {2, 2, 1, 40, 64}, "additive", {1, 1, 1, 40, 40}}, 73);
  runs += RunAttention(
      {{1, 2, 4, 17, 32}, {1, 2, 1, 17, 32}, {1, 2, 1, 17, 32}, "additive", {1, 2, 4, 17, 17}},
      74);  // a mask per query head
  EXPECT_GE(runs, 4 * 3);
}

// Heads interleaved in each row (the attention layout pass): [B, S, H, D] and [B, S, H*D], with
// the tensor-core tactics' head dims, masks, B broadcast and sizes that are not tile multiples.
TEST_F(CudaBlasTest, AttentionInterleavedHeadLayouts) {
  int runs = 0;
  runs += RunAttention(
      {{2, 17, 3, 64}, {2, 40, 3, 64}, {2, 40, 3, 64}, "additive", {2, 1, 1, 40}, 0.f, 0.f, "bshd"},
      61);
  runs += RunAttention({{2, 70, 256}, {2, 70, 256}, {2, 70, 256}, "causal", {}, 0.f, 0.f, "bsd", 4},
                       62);
  runs += RunAttention(
      {{2, 33, 128}, {2, 33, 128}, {2, 33, 128}, "boolean", {2, 4, 33, 33}, 0.2f, -1e4f, "bsd", 4},
      63);
  runs += RunAttention(
      {{3, 129, 2, 128}, {1, 65, 2, 128}, {1, 65, 2, 128}, "none", {}, 0.f, 0.f, "bshd"},
      64);  // K/V broadcast over B, D = 128
  runs +=
      RunAttention({{1, 128, 192}, {1, 128, 192}, {1, 128, 192}, "none", {}, 0.f, 0.f, "bsd", 12},
                   65);  // D = 16
  runs += RunAttention({{2, 5, 24}, {2, 9, 24}, {2, 9, 24}, "none", {}, 0.f, 0.f, "bsd", 3},
                       66);  // D = 8: only the SIMT tactic
  // Q, K, V side by side in each row (GPT-2's c_attn output): thirds of [B, S, 3*H*D].
  runs += RunAttention(
      {{2, 70, 384}, {2, 70, 384}, {2, 70, 384}, "causal", {}, 0.f, 0.f, "bsd", 2, true}, 67);
  runs += RunAttention(
      {{1, 17, 96}, {1, 17, 96}, {1, 17, 96}, "additive", {1, 1, 1, 17}, 0.f, 0.f, "bsd", 1, true},
      68);  // D = 32, one head
  // Sequence first ([S, B, H*D], nn.MultiheadAttention's order): rows of one position B apart.
  runs += RunAttention(
      {{70, 2, 256}, {40, 2, 256}, {40, 2, 256}, "additive", {2, 1, 1, 40}, 0.f, 0.f, "sbd", 4},
      69);
  runs += RunAttention(
      {{33, 3, 384}, {33, 3, 384}, {33, 3, 384}, "causal", {}, 0.f, 0.f, "sbd", 2, true}, 70);
  // Grouped-query heads in rank 5 ([B, S, G, R, D] against K/V [B, S, G, 1, D]; Llama's
  // projections read in place): causal with D 64, an additive mask over [B, G, R, Sq, Sk] with
  // D 128 and partial tiles, and D 32 with a mask per query head.
  runs += RunAttention(
      {{2, 64, 2, 3, 64}, {2, 64, 2, 1, 64}, {2, 64, 2, 1, 64}, "causal", {}, 0.f, 0.f, "bshd"},
      75);
  runs += RunAttention({{2, 33, 4, 3, 128},
                        {2, 40, 4, 1, 128},
                        {2, 40, 4, 1, 128},
                        "additive",
                        {2, 1, 1, 1, 40},
                        0.f,
                        0.f,
                        "bshd"},
                       76);
  runs += RunAttention({{1, 17, 2, 4, 32},
                        {1, 17, 2, 1, 32},
                        {1, 17, 2, 1, 32},
                        "additive",
                        {1, 2, 4, 17, 17},
                        0.f,
                        0.f,
                        "bshd"},
                       77);
  // Multi-query attention as the group of one (GPT-BigCode): [B, S, 1, H, D] against one K/V
  // head [B, S, 1, 1, D], causal.
  runs += RunAttention(
      {{2, 33, 1, 4, 64}, {2, 33, 1, 1, 64}, {2, 33, 1, 1, 64}, "causal", {}, 0.f, 0.f, "bshd"},
      78);
  EXPECT_GE(runs, 14 * 3);
}

// The attention tactics a default build times first (it times two), by sequence length: the
// orders the attention benchmark measured (bench/cuda_kernels). Host code only: runs without a GPU.
TEST(CudaAttentionTactics, OrderFollowsTheSequenceLength) {
  struct Case {
    int64_t seq;
    std::vector<std::string> first_two;
  };
  for (const Case& c : std::vector<Case>{{49, {"mma-64x64", "mma-32x64"}},
                                         {128, {"mma-pipe-64x64", "mma-64x64"}},
                                         {197, {"mma-pipe2m-128x64", "mma-pipe-64x64"}},
                                         {1500, {"mma-pipe2m-128x64", "mma-pipe-128x64"}}}) {
    SCOPED_TRACE(c.seq);
    Graph g;
    Value* q = g.AddInput("q", DataType::kFloat16, MakeShape({32, c.seq, 768}));
    Value* y = g.AddValue("y");
    AttributeMap attrs;
    attrs.Set("layout", std::string("bsd"));
    attrs.Set("num_heads", int64_t{12});
    Node* n = g.AddNode("Attention", "attn", {q, q, q}, {y}, attrs);
    g.MarkOutput(y);
    ASSERT_TRUE(InferShapes(g).ok());
    KernelRequest r;
    r.node = n;
    for (int i = 0; i < 3; ++i)
      r.inputs.push_back({DataType::kFloat16, q->shape(), {32, c.seq, 768}});
    r.outputs.push_back({DataType::kFloat16, y->shape(), {32, c.seq, 768}});
    const KernelProvider* p =
        KernelRegistry::Get().Find(BackendKind::kCuda, "cuda.attention.flash");
    ASSERT_NE(p, nullptr);
    std::vector<TacticConfig> t = p->Tactics(r);
    ASSERT_GE(t.size(), 5u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(t[i].name, "f16-attention-cuda-flash-" + c.first_two[i]);
    }
    // No "-tail" tactic: that variant timed the SIMT kernel under another name (attention.cc).
    for (const TacticConfig& c : t) EXPECT_FALSE(c.name.ends_with("-tail")) << c.name;
  }
}

// CUDA's attention kernels decline head dims above 128; such a layer runs on the host instead.
TEST_F(CudaBlasTest, AttentionRejectsHeadDimsAbove128) {
  Graph g;
  Value* q = g.AddInput("q", DataType::kFloat32, MakeShape({1, 4, 160}));
  Value* y = g.AddValue("y");
  Node* n = g.AddNode("Attention", "attn", {q, q, q}, {y}, {});
  g.MarkOutput(y);
  ASSERT_TRUE(InferShapes(g).ok());
  KernelRequest r;
  r.node = n;
  for (int i = 0; i < 3; ++i) r.inputs.push_back({DataType::kFloat32, q->shape(), {1, 4, 160}});
  r.outputs.push_back({DataType::kFloat32, y->shape(), {1, 4, 160}});
  int host = 0;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, "Attention")) {
    if (p->runs_on_host()) {  // the host fallback (host_fallback.cc) takes what CUDA declines
      host += p->Tactics(r).empty() ? 0 : 1;
      continue;
    }
    EXPECT_TRUE(p->Tactics(r).empty()) << p->id();
  }
  EXPECT_EQ(host, 1);
}

// ---- Tactics chosen at the profile's largest shapes run at smaller ones, and their workspace
// estimate covers what Prepare asks for at the largest.

struct DeviceTensor {
  DeviceBuffer buf;
  TensorView view;
};

TEST_F(CudaBlasTest, TacticsFromMaxShapesRunAtSmallerShapes) {
  Backend* gpu = *GetBackend(BackendKind::kCuda);
  Backend* cpu = *GetBackend(BackendKind::kCpu);
  constexpr int64_t kMaxM = 96, kM = 5, kK = 48, kN = 40;
  Graph g;
  Value* a = g.AddInput("a", DataType::kFloat16, MakeShape({kMaxM, kK}));
  Value* b = g.AddInput("b", DataType::kFloat16, MakeShape({kN, kK}));
  Value* c = g.AddInput("c", DataType::kFloat16, MakeShape({kN}));
  Value* y = g.AddValue("y");
  AttributeMap attrs = GemmAttrs(false, true, 1.f, 1.f, "gelu_tanh");
  Node* node = g.AddNode("FusedGemm", "fc", {a, b, c}, {y}, attrs);
  g.MarkOutput(y);
  ASSERT_TRUE(InferShapes(g).ok());
  KernelRequest req;
  req.node = node;
  req.inputs = {{DataType::kFloat16, a->shape(), {kMaxM, kK}},
                {DataType::kFloat16, b->shape(), {kN, kK}},
                {DataType::kFloat16, c->shape(), {kN}}};
  req.outputs = {{DataType::kFloat16, y->shape(), {kMaxM, kN}}};

  std::mt19937 rng(77);
  std::uniform_real_distribution<double> dist(-1, 1);
  auto random = [&](std::vector<int64_t> dims) {
    Tensor t(DataType::kFloat16, dims);
    for (int64_t i = 0; i < t.num_elements(); ++i) StoreFromDouble(t.view(), i, dist(rng));
    return t;
  };
  std::vector<Tensor> host = {random({kM, kK}), random({kN, kK}), random({kN})};
  Tensor want(DataType::kFloat16, {kM, kN});
  {  // CPU reference
    auto cpu_p = KernelRegistry::Get().Providers(BackendKind::kCpu, "FusedGemm");
    ASSERT_FALSE(cpu_p.empty());
    auto tactics = cpu_p[0]->Tactics(req);
    ASSERT_FALSE(tactics.empty());
    auto k = cpu_p[0]->Create(req, tactics[0]);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    std::vector<TensorView> ins;
    for (const Tensor& t : host) ins.push_back(t.view());
    std::vector<TensorView> outs = {want.view()};
    auto ws = (*k)->Prepare(ins, outs);
    ASSERT_TRUE(ws.ok()) << ws.status().ToString();
    std::vector<std::byte> wsbuf(*ws);
    KernelRunArgs args{ins, outs, wsbuf.data(), wsbuf.size(), nullptr};
    ASSERT_TRUE((*k)->Run(args).ok());
  }
  (void)cpu;

  auto providers = KernelRegistry::Get().Providers(BackendKind::kCuda, "FusedGemm");
  ASSERT_FALSE(providers.empty());
  int runs = 0;
  for (const KernelProvider* p : providers) {
    for (const TacticConfig& tactic : p->Tactics(req)) {
      SCOPED_TRACE(tactic.name);
      EXPECT_EQ(tactic.params.size(), 9u);
      auto kernel = p->Create(req, tactic);
      ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
      // At the max shapes, the estimate covers Prepare's figure.
      std::vector<int64_t> max_a = {kMaxM, kK}, max_y = {kMaxM, kN};
      std::vector<TensorView> max_in = {
          {DataType::kFloat16, max_a, nullptr}, host[1].view(), host[2].view()};
      std::vector<TensorView> max_out = {{DataType::kFloat16, max_y, nullptr}};
      auto max_ws = (*kernel)->Prepare(max_in, max_out);
      ASSERT_TRUE(max_ws.ok()) << max_ws.status().ToString();
      EXPECT_LE(*max_ws, tactic.workspace_bytes);
      // Then at the small shapes, on the device.
      std::vector<DeviceBuffer> bufs;
      std::vector<TensorView> ins;
      for (const Tensor& t : host) {
        auto buf = gpu->Allocate(t.size_bytes());
        ASSERT_TRUE(buf.ok());
        ASSERT_TRUE(gpu->CopyToDevice(buf->data(), t.raw(), t.size_bytes(), nullptr).ok());
        TensorView v = t.view();
        v.data = buf->data();
        ins.push_back(v);
        bufs.push_back(std::move(*buf));
      }
      Tensor got(DataType::kFloat16, {kM, kN});
      auto ybuf = gpu->Allocate(got.size_bytes());
      ASSERT_TRUE(ybuf.ok());
      TensorView yv = got.view();
      yv.data = ybuf->data();
      std::vector<TensorView> outs = {yv};
      auto ws = (*kernel)->Prepare(ins, outs);
      ASSERT_TRUE(ws.ok()) << ws.status().ToString();
      auto wsbuf = gpu->Allocate(*ws);
      ASSERT_TRUE(wsbuf.ok());
      KernelRunArgs args{ins, outs, wsbuf->data(), *ws, nullptr};
      Status s = (*kernel)->Run(args);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(gpu->Synchronize(nullptr).ok());
      ASSERT_TRUE(gpu->CopyToHost(got.mutable_raw(), yv.data, got.size_bytes(), nullptr).ok());
      for (int64_t i = 0; i < got.num_elements(); ++i) {
        double w = want.GetDouble(i), v = got.GetDouble(i);
        ASSERT_NEAR(v, w, 1e-2 + 1e-2 * std::fabs(w)) << "element " << i;
      }
      ++runs;
    }
  }
  EXPECT_GT(runs, 0);
}

TEST_F(CudaBlasTest, TacticNamesAndParamsAreStable) {
  // The heuristic's first algorithm is the first tactic, named by its configuration; params are
  // the algorithm's 8 words and the plan flags.
  Graph g;
  Value* a = g.AddInput("a", DataType::kFloat32, MakeShape({64, 32}));
  Value* b = g.AddInput("b", DataType::kFloat32, MakeShape({32, 16}));
  Value* y = g.AddValue("y");
  Node* n = g.AddNode("Gemm", "g", {a, b}, {y}, GemmAttrs(false, false, 1.f, 1.f));
  g.MarkOutput(y);
  ASSERT_TRUE(InferShapes(g).ok());
  KernelRequest r;
  r.node = n;
  r.inputs = {{DataType::kFloat32, a->shape(), {64, 32}},
              {DataType::kFloat32, b->shape(), {32, 16}}};
  r.outputs = {{DataType::kFloat32, y->shape(), {64, 16}}};
  const KernelProvider* p = KernelRegistry::Get().Find(BackendKind::kCuda, "cuda.gemm.cublaslt");
  ASSERT_NE(p, nullptr);
  auto t1 = p->Tactics(r), t2 = p->Tactics(r);
  ASSERT_FALSE(t1.empty());
  EXPECT_LE(t1.size(), 8u);
  ASSERT_EQ(t1.size(), t2.size());
  for (size_t i = 0; i < t1.size(); ++i) {
    EXPECT_EQ(t1[i].name, t2[i].name);
    EXPECT_EQ(t1[i].params, t2[i].params);
    EXPECT_TRUE(t1[i].name.starts_with("f32-gemm-cuda-cublaslt-algo")) << t1[i].name;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(t1[i].name, t1[j].name);
  }
  for (const TacticConfig& t : t1) std::cout << "  tactic " << t.name << "\n";
  TacticConfig bad = t1[0];
  bad.params.resize(3);
  EXPECT_FALSE(p->Create(r, bad).ok());
}

}  // namespace
}  // namespace kiln::testing
