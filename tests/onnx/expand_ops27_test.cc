// ONNX opset-27 CausalConvWithState and LinearAttention and ai.onnx.preview FlexAttention,
// expanded at import: the expansion's values on the CPU against double-precision references
// written from the spec's formulas (not from its function bodies), as imported and after the
// default passes, on shapes beyond ONNX's node tests (kernel sizes 1-4, one-step decode,
// grouped-query heads, per-head and per-element decay, scalar beta, past states, score_mod
// reading an outer-scope value, prob_mod), and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/passes/pass.h"
#include "tests/onnx/model_builder.h"
#include "tests/passes/pass_test_util.h"

namespace kiln {
namespace {

using kiln::passes::testing::RandomTensor;
using namespace kiln::testing;  // NOLINT
using onnx::TensorProto;

constexpr int32_t kF = TensorProto::FLOAT;

std::vector<DimSpec> Spec(const std::vector<int64_t>& dims) {
  return std::vector<DimSpec>(dims.begin(), dims.end());
}

void ExpectClose(const std::map<std::string, Tensor>& got,
                 const std::map<std::string, std::vector<double>>& want,
                 const std::map<std::string, std::vector<int64_t>>& dims, const std::string& what) {
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no output " << name;
    const Tensor& t = got.at(name);
    if (dims.count(name)) {
      EXPECT_EQ(t.dims(), dims.at(name)) << what << ": " << name;
    }
    ASSERT_EQ(static_cast<size_t>(t.num_elements()), w.size()) << what << ": " << name;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_NEAR(t.GetDouble(static_cast<int64_t>(i)), w[i], 2e-5 * std::max(1.0, std::abs(w[i])))
          << what << ": " << name << "[" << i << "]";
    }
  }
}

void Check(const ModelBuilder& mb, const std::map<std::string, Tensor>& inputs,
           const std::map<std::string, std::vector<double>>& want,
           const std::map<std::string, std::vector<int64_t>>& dims) {
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto before = cpu::EvaluateGraph(**g, inputs);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ExpectClose(*before, want, dims, "as imported");
  auto report = passes::RunDefaultPasses(**g, passes::testing::TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  auto after = cpu::EvaluateGraph(**g, inputs);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ExpectClose(*after, want, dims, "after the passes");
}

double At(const Tensor& t, int64_t i) { return t.GetDouble(i); }

// ---- CausalConvWithState ----

struct ConvCase {
  int64_t b = 2, c = 3, len = 5, k = 3;
  bool bias = false, past = false;
  std::string activation = "none";
};

void CheckCausalConv(const ConvCase& cc) {
  SCOPED_TRACE(::testing::Message()
               << "c " << cc.c << " len " << cc.len << " k " << cc.k << " bias " << cc.bias
               << " past " << cc.past << " " << cc.activation);
  const int64_t B = cc.b, C = cc.c, L = cc.len, K = cc.k;
  std::map<std::string, Tensor> in;
  in["x"] = RandomTensor(DataType::kFloat32, {B, C, L}, 1);
  in["w"] = RandomTensor(DataType::kFloat32, {C, 1, K}, 2);
  if (cc.bias) in["bias"] = RandomTensor(DataType::kFloat32, {C}, 3);
  if (cc.past) in["past"] = RandomTensor(DataType::kFloat32, {B, C, K - 1}, 4);
  ModelBuilder mb(27);
  std::vector<std::string> inputs = {"x", "w", cc.bias ? "bias" : "", cc.past ? "past" : ""};
  for (const auto& [name, t] : in) mb.Input(name, kF, Spec(t.dims()));
  while (inputs.back().empty()) inputs.pop_back();
  auto* n = mb.Node("CausalConvWithState", inputs, {"y", "state"}, "conv");
  if (cc.activation != "none") AttrString(n, "activation", cc.activation);
  mb.Output("y").Output("state");

  std::vector<double> y, state;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t c = 0; c < C; ++c) {
      auto padded = [&](int64_t j) {  // past (or zeros) then the input
        if (j < K - 1) return cc.past ? At(in["past"], (b * C + c) * (K - 1) + j) : 0.0;
        return At(in["x"], (b * C + c) * L + j - (K - 1));
      };
      for (int64_t t = 0; t < L; ++t) {
        double s = cc.bias ? At(in["bias"], c) : 0.0;
        for (int64_t i = 0; i < K; ++i) s += At(in["w"], c * K + i) * padded(t + i);
        if (cc.activation != "none") s = s / (1.0 + std::exp(-s));
        y.push_back(s);
      }
      for (int64_t j = L; j < L + K - 1; ++j) state.push_back(padded(j));
    }
  }
  Check(mb, in, {{"y", y}, {"state", state}}, {{"y", {B, C, L}}, {"state", {B, C, K - 1}}});
}

TEST(ExpandOps27, CausalConvWithState) {
  CheckCausalConv({});
  CheckCausalConv({.bias = true, .past = true});
  CheckCausalConv({.c = 5, .len = 1, .k = 4, .bias = true, .past = true, .activation = "silu"});
  CheckCausalConv({.len = 2, .k = 4, .activation = "swish"});  // shorter than the state
  CheckCausalConv({.c = 1, .k = 2, .past = true});
  CheckCausalConv({.k = 1, .bias = true});
}

TEST(ExpandOps27, CausalConvWithStateRefusals) {
  ModelBuilder mb(27);
  mb.Input("x", kF, {1, 2, 4}).Input("w", kF, {2, 1, 3});
  AttrString(mb.Node("CausalConvWithState", {"x", "w"}, {"y", "s"}, "conv"), "activation", "relu");
  mb.Output("y");
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "");
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidAttribute) << g.status().ToString();

  ModelBuilder sym(27);  // channel count unknown: Conv's group cannot be written
  sym.Input("x", kF, {1, "C", 4}).Input("w", kF, {"C", 1, 3});
  sym.Node("CausalConvWithState", {"x", "w"}, {"y", "s"}, "conv");
  sym.Output("y");
  g = ImportOnnxBytes(AsBytes(sym.Bytes()), "");
  EXPECT_EQ(g.status().code(), ErrorCode::kUnsupportedOps) << g.status().ToString();
  EXPECT_NE(g.status().message().find("channel count"), std::string::npos);
}

// ---- LinearAttention ----

struct LinearCase {
  int64_t b = 2, t = 3, hq = 2, hkv = 2, dk = 3, dv = 2;
  std::string rule = "gated_delta";
  bool past = false;
  bool per_head_decay = false;
  bool scalar_beta = false;
  float scale = 0.0f;
};

void CheckLinearAttention(const LinearCase& lc) {
  SCOPED_TRACE(::testing::Message() << lc.rule << " t " << lc.t << " hq " << lc.hq << " hkv "
                                    << lc.hkv << " past " << lc.past << " per-head decay "
                                    << lc.per_head_decay << " scalar beta " << lc.scalar_beta);
  const int64_t B = lc.b, T = lc.t, Hq = lc.hq, Hkv = lc.hkv, Dk = lc.dk, Dv = lc.dv;
  const bool gated = lc.rule == "gated" || lc.rule == "gated_delta";
  const bool delta = lc.rule == "delta" || lc.rule == "gated_delta";
  std::map<std::string, Tensor> in;
  in["q"] = RandomTensor(DataType::kFloat32, {B, T, Hq * Dk}, 1);
  in["k"] = RandomTensor(DataType::kFloat32, {B, T, Hkv * Dk}, 2);
  in["v"] = RandomTensor(DataType::kFloat32, {B, T, Hkv * Dv}, 3);
  const int64_t decay_w = lc.per_head_decay ? 1 : Dk;
  if (lc.past) in["past"] = RandomTensor(DataType::kFloat32, {B, Hkv, Dk, Dv}, 4);
  if (gated) in["decay"] = RandomTensor(DataType::kFloat32, {B, T, Hkv * decay_w}, 5, -1.0, 0.0);
  const int64_t beta_h = lc.scalar_beta ? 1 : Hkv;
  if (delta) in["beta"] = RandomTensor(DataType::kFloat32, {B, T, beta_h}, 6, 0.0, 1.0);
  ModelBuilder mb(27);
  std::vector<std::string> inputs = {
      "q", "k", "v", lc.past ? "past" : "", gated ? "decay" : "", delta ? "beta" : ""};
  while (inputs.back().empty()) inputs.pop_back();
  for (const auto& [name, t] : in) mb.Input(name, kF, Spec(t.dims()));
  auto* n = mb.Node("LinearAttention", inputs, {"y", "state"}, "la");
  AttrInt(n, "q_num_heads", Hq);
  AttrInt(n, "kv_num_heads", Hkv);
  AttrString(n, "update_rule", lc.rule);
  if (lc.scale != 0.0f) AttrFloat(n, "scale", lc.scale);
  mb.Output("y").Output("state");

  const double scale = lc.scale != 0.0f ? lc.scale : 1.0 / std::sqrt(double(Dk));
  // S[b][h][i][j], dk x dv per K/V head.
  std::vector<double> S(static_cast<size_t>(B * Hkv * Dk * Dv), 0.0);
  auto s = [&](int64_t b, int64_t h, int64_t i, int64_t j) -> double& {
    return S[static_cast<size_t>(((b * Hkv + h) * Dk + i) * Dv + j)];
  };
  if (lc.past) {
    for (size_t i = 0; i < S.size(); ++i) S[i] = At(in["past"], static_cast<int64_t>(i));
  }
  std::vector<double> y(static_cast<size_t>(B * T * Hq * Dv));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        auto key = [&](int64_t i) { return At(in["k"], (b * T + t) * Hkv * Dk + h * Dk + i); };
        auto val = [&](int64_t j) { return At(in["v"], (b * T + t) * Hkv * Dv + h * Dv + j); };
        for (int64_t i = 0; i < Dk; ++i) {
          double a = 1.0;
          if (gated) {
            a = std::exp(At(in["decay"], (b * T + t) * Hkv * decay_w + h * decay_w +
                                             (lc.per_head_decay ? 0 : i)));
          }
          for (int64_t j = 0; j < Dv; ++j) s(b, h, i, j) *= a;
        }
        std::vector<double> w(static_cast<size_t>(Dv));
        for (int64_t j = 0; j < Dv; ++j) {
          w[j] = val(j);
          if (delta) {
            double r = 0.0;
            for (int64_t i = 0; i < Dk; ++i) r += s(b, h, i, j) * key(i);
            double beta = At(in["beta"], (b * T + t) * beta_h + (lc.scalar_beta ? 0 : h));
            w[j] = beta * (val(j) - r);
          }
        }
        for (int64_t i = 0; i < Dk; ++i) {
          for (int64_t j = 0; j < Dv; ++j) s(b, h, i, j) += key(i) * w[j];
        }
      }
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const int64_t h = hq / (Hq / Hkv);
        for (int64_t j = 0; j < Dv; ++j) {
          double o = 0.0;
          for (int64_t i = 0; i < Dk; ++i) {
            o += At(in["q"], (b * T + t) * Hq * Dk + hq * Dk + i) * s(b, h, i, j);
          }
          y[static_cast<size_t>((b * T + t) * Hq * Dv + hq * Dv + j)] = scale * o;
        }
      }
    }
  }
  Check(mb, in, {{"y", y}, {"state", S}}, {{"y", {B, T, Hq * Dv}}, {"state", {B, Hkv, Dk, Dv}}});
}

TEST(ExpandOps27, LinearAttentionRules) {
  for (const char* rule : {"linear", "gated", "delta", "gated_delta"}) {
    CheckLinearAttention({.rule = rule});
    CheckLinearAttention({.t = 1, .hq = 4, .hkv = 2, .rule = rule, .past = true});
  }
  CheckLinearAttention({.hq = 6,
                        .hkv = 1,
                        .dk = 2,
                        .dv = 4,
                        .per_head_decay = true,
                        .scalar_beta = true,
                        .scale = 0.3f});
  CheckLinearAttention(
      {.b = 1, .t = 5, .hq = 2, .hkv = 1, .rule = "gated", .past = true, .per_head_decay = true});
}

TEST(ExpandOps27, LinearAttentionRefusals) {
  auto model = [](std::vector<DimSpec> q_dims, int64_t hq, int64_t hkv, const std::string& rule) {
    ModelBuilder mb(27);
    mb.Input("q", kF, q_dims).Input("k", kF, q_dims).Input("v", kF, q_dims);
    auto* n = mb.Node("LinearAttention", {"q", "k", "v"}, {"y"}, "la");
    AttrInt(n, "q_num_heads", hq);
    AttrInt(n, "kv_num_heads", hkv);
    AttrString(n, "update_rule", rule);
    mb.Output("y");
    return ImportOnnxBytes(AsBytes(mb.Bytes()), "").status();
  };
  EXPECT_TRUE(model({1, 2, 4}, 2, 2, "linear").ok());
  EXPECT_EQ(model({1, 2, 4}, 3, 2, "linear").code(), ErrorCode::kInvalidAttribute);
  EXPECT_EQ(model({1, 2, 4}, 2, 2, "mamba").code(), ErrorCode::kInvalidAttribute);
  EXPECT_EQ(model({1, 2, 4}, 2, 2, "gated").code(), ErrorCode::kInvalidModel);  // no decay
  Status st = model({1, "T", 4}, 2, 2, "linear");
  EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
  EXPECT_NE(st.message().find("sequence length"), std::string::npos) << st.ToString();
}

// ---- FlexAttention ----

// Grouped-query FlexAttention with a score_mod that adds an outer-scope bias [L, S] and a body
// initializer, and a prob_mod that halves the probabilities.
TEST(ExpandOps27, FlexAttentionWithModifiers) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 3, S = 5, D = 4, Dv = 3;
  for (bool mods : {false, true}) {
    SCOPED_TRACE(mods ? "score_mod and prob_mod" : "plain, scale 0.3");
    std::map<std::string, Tensor> in;
    in["Q"] = RandomTensor(DataType::kFloat32, {B, Hq, L, D}, 1);
    in["K"] = RandomTensor(DataType::kFloat32, {B, Hkv, S, D}, 2);
    in["V"] = RandomTensor(DataType::kFloat32, {B, Hkv, S, Dv}, 3);
    in["outer_bias"] = RandomTensor(DataType::kFloat32, {L, S}, 4);
    ModelBuilder mb(26);
    auto* o = mb.model().add_opset_import();
    o->set_domain("ai.onnx.preview");
    o->set_version(1);
    for (const auto& [name, t] : in) mb.Input(name, kF, Spec(t.dims()));
    auto* n = mb.Node("FlexAttention", {"Q", "K", "V"}, {"Y"}, "flex", "ai.onnx.preview");
    if (mods) {
      onnx::GraphProto score;
      score.set_name("score_mod");
      ModelBuilder::FillValueInfo(score.add_input(), "s", kF, {"B", "H", "L", "S"});
      ModelBuilder::FillValueInfo(score.add_output(), "s_out", kF, {"B", "H", "L", "S"});
      auto* c = score.add_initializer();
      c->set_name("half");
      c->set_data_type(kF);
      c->add_float_data(0.5f);
      auto* add = score.add_node();
      add->set_op_type("Add");
      add->add_input("s");
      add->add_input("outer_bias");
      add->add_output("tmp");
      auto* mul = score.add_node();
      mul->set_op_type("Add");
      mul->add_input("tmp");
      mul->add_input("half");
      mul->add_output("s_out");
      auto* a = n->add_attribute();
      a->set_name("score_mod");
      a->set_type(onnx::AttributeProto::GRAPH);
      *a->mutable_g() = score;
      onnx::GraphProto prob;
      prob.set_name("prob_mod");
      ModelBuilder::FillValueInfo(prob.add_input(), "p", kF, {"B", "H", "L", "S"});
      ModelBuilder::FillValueInfo(prob.add_output(), "p_out", kF, {"B", "H", "L", "S"});
      auto* c2 = prob.add_initializer();
      c2->set_name("half");  // the same name as score_mod's
      c2->set_data_type(kF);
      c2->add_float_data(0.5f);
      auto* m = prob.add_node();
      m->set_op_type("Mul");
      m->add_input("p");
      m->add_input("half");
      m->add_output("p_out");
      auto* pa = n->add_attribute();
      pa->set_name("prob_mod");
      pa->set_type(onnx::AttributeProto::GRAPH);
      *pa->mutable_g() = prob;
    } else {
      AttrFloat(n, "scale", 0.3f);
    }
    mb.Output("Y");
    const double scale = mods ? 1.0 / std::sqrt(double(D)) : 0.3;
    std::vector<double> y(static_cast<size_t>(B * Hq * L * Dv));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t kh = h / (Hq / Hkv);
        for (int64_t i = 0; i < L; ++i) {
          std::vector<double> p(static_cast<size_t>(S));
          double mx = -1e300, sum = 0.0;
          for (int64_t j = 0; j < S; ++j) {
            double dot = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              dot += At(in["Q"], ((b * Hq + h) * L + i) * D + d) *
                     At(in["K"], ((b * Hkv + kh) * S + j) * D + d);
            }
            p[j] = dot * scale + (mods ? At(in["outer_bias"], i * S + j) + 0.5 : 0.0);
            mx = std::max(mx, p[j]);
          }
          for (auto& x : p) sum += (x = std::exp(x - mx));
          for (auto& x : p) x = x / sum * (mods ? 0.5 : 1.0);
          for (int64_t e = 0; e < Dv; ++e) {
            double acc = 0.0;
            for (int64_t j = 0; j < S; ++j)
              acc += p[j] * At(in["V"], ((b * Hkv + kh) * S + j) * Dv + e);
            y[static_cast<size_t>(((b * Hq + h) * L + i) * Dv + e)] = acc;
          }
        }
      }
    }
    Check(mb, in, {{"Y", y}}, {{"Y", {B, Hq, L, Dv}}});
  }
}

}  // namespace
}  // namespace kiln
