// ONNX's Attention (23, 24) and RotaryEmbedding (23), expanded at import: the expansion's values
// on the CPU against a direct double-precision reference written from the spec (3-D and 4-D
// inputs, grouped-query heads, float and boolean masks padded to the total length, causal with a
// cache, softcap, qk_matmul_output modes, nonpad_kv_seqlen; rotary halves and interleaved pairs,
// partial rotation, position ids), before and after the default passes, and the fusions that
// take the plain forms back to kiln's internal Attention and RotaryEmbedding.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/passes/pass.h"
#include "tests/onnx/model_builder.h"
#include "tests/passes/pass_test_util.h"

namespace kiln {
namespace {

using kiln::passes::testing::RandomTensor;
using namespace kiln::testing;  // NOLINT

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::vector<DimSpec> Spec(const std::vector<int64_t>& dims) {
  return std::vector<DimSpec>(dims.begin(), dims.end());
}

struct AttentionCase {
  int64_t b = 2, hq = 2, hkv = 2, sq = 3, skv = 4, past = 0, d = 4, dv = 4;
  bool three_d = false;
  bool causal = false;
  std::vector<int64_t> mask;  // mask dims; empty: none
  bool bool_mask = false;
  float scale = 0.0f;  // 0: the default
  float softcap = 0.0f;
  int64_t mode = -1;            // qk_matmul_output_mode; -1: no qk_matmul_output
  std::vector<int64_t> nonpad;  // nonpad_kv_seqlen (opset 24); empty: none
  bool symbolic = false;        // sequence lengths declared as dim_params
  int64_t softmax_precision = 0;
};

// Every input of the case, random (the mask's booleans keep key 0, so no row is all masked).
std::map<std::string, Tensor> AttentionInputs(const AttentionCase& c) {
  std::map<std::string, Tensor> in;
  auto qkv = [&](int64_t h, int64_t s, int64_t d) {
    return c.three_d ? std::vector<int64_t>{c.b, s, h * d} : std::vector<int64_t>{c.b, h, s, d};
  };
  in["Q"] = RandomTensor(DataType::kFloat32, qkv(c.hq, c.sq, c.d), 1);
  in["K"] = RandomTensor(DataType::kFloat32, qkv(c.hkv, c.skv, c.d), 2);
  in["V"] = RandomTensor(DataType::kFloat32, qkv(c.hkv, c.skv, c.dv), 3);
  if (!c.mask.empty()) {
    Tensor m = RandomTensor(c.bool_mask ? DataType::kBool : DataType::kFloat32, c.mask, 4);
    if (c.bool_mask) {
      for (int64_t i = 0; i < m.num_elements(); i += c.mask.back()) StoreFromDouble(m.view(), i, 1);
    }
    in["attn_mask"] = std::move(m);
  }
  if (c.past > 0) {
    in["past_key"] = RandomTensor(DataType::kFloat32, {c.b, c.hkv, c.past, c.d}, 5);
    in["past_value"] = RandomTensor(DataType::kFloat32, {c.b, c.hkv, c.past, c.dv}, 6);
  }
  if (!c.nonpad.empty()) {
    in["nonpad_kv_seqlen"] =
        Tensor::FromVector<int64_t>(DataType::kInt64, {c.b}, std::vector<int64_t>(c.nonpad));
  }
  return in;
}

std::string AttentionModel(const AttentionCase& c) {
  ModelBuilder mb(c.nonpad.empty() ? 23 : 24);
  std::map<std::string, Tensor> in = AttentionInputs(c);
  std::vector<std::string> inputs = {"Q", "K", "V", "", "", "", ""};
  for (const char* name :
       {"Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"}) {
    auto it = in.find(name);
    if (it == in.end()) continue;
    std::vector<DimSpec> dims = Spec(it->second.dims());
    if (c.symbolic) {
      // The sequence axes: Q's and K/V's (1 in 3-D, 2 in 4-D), the cache's, the mask's last two.
      const std::string n = name;
      const size_t seq = c.three_d ? 1 : 2;
      if (n == "Q") dims[seq] = "q_len";
      if (n == "K" || n == "V") dims[seq] = "kv_len";
      if (n == "past_key" || n == "past_value") dims[2] = "past_len";
      if (n == "attn_mask") {
        dims.back() = "mask_len";
        if (dims.size() >= 2 && c.mask[c.mask.size() - 2] != 1) dims[dims.size() - 2] = "q_len";
      }
    }
    mb.Input(name,
             it->second.dtype() == DataType::kBool    ? onnx::TensorProto::BOOL
             : it->second.dtype() == DataType::kInt64 ? onnx::TensorProto::INT64
                                                      : onnx::TensorProto::FLOAT,
             dims);
  }
  if (!c.mask.empty()) inputs[3] = "attn_mask";
  if (c.past > 0) inputs[4] = "past_key", inputs[5] = "past_value";
  if (!c.nonpad.empty()) inputs[6] = "nonpad_kv_seqlen";
  while (inputs.back().empty()) inputs.pop_back();
  std::vector<std::string> outputs = {"Y"};
  if (c.past > 0 || c.mode >= 0) outputs.push_back(c.past > 0 ? "present_key" : "");
  if (c.past > 0 || c.mode >= 0) outputs.push_back(c.past > 0 ? "present_value" : "");
  if (c.mode >= 0) outputs.push_back("qk");
  auto* n = mb.Node("Attention", inputs, outputs, "attn");
  if (c.three_d) {
    AttrInt(n, "q_num_heads", c.hq);
    AttrInt(n, "kv_num_heads", c.hkv);
  }
  if (c.causal) AttrInt(n, "is_causal", 1);
  if (c.scale != 0.0f) AttrFloat(n, "scale", c.scale);
  if (c.softcap != 0.0f) AttrFloat(n, "softcap", c.softcap);
  if (c.mode > 0) AttrInt(n, "qk_matmul_output_mode", c.mode);
  if (c.softmax_precision) AttrInt(n, "softmax_precision", c.softmax_precision);
  for (const auto& o : outputs) {
    if (!o.empty()) mb.Output(o);
  }
  return mb.Bytes();
}

// The spec, element by element, in double. Outputs: Y, present_key, present_value, qk.
std::map<std::string, std::vector<double>> AttentionReference(
    const AttentionCase& c, const std::map<std::string, Tensor>& in) {
  const int64_t t_len = c.past + c.skv, rep = c.hq / c.hkv;
  auto q = [&](int64_t b, int64_t h, int64_t i, int64_t x) {
    const Tensor& t = in.at("Q");
    return c.three_d ? t.GetDouble((b * c.sq + i) * c.hq * c.d + h * c.d + x)
                     : t.GetDouble(((b * c.hq + h) * c.sq + i) * c.d + x);
  };
  // K or V with the cache in front, [B, Hkv, T, width].
  auto cached = [&](const char* name, const char* past, int64_t width) {
    std::vector<double> out(c.b * c.hkv * t_len * width);
    for (int64_t b = 0; b < c.b; ++b) {
      for (int64_t g = 0; g < c.hkv; ++g) {
        for (int64_t j = 0; j < t_len; ++j) {
          for (int64_t x = 0; x < width; ++x) {
            double v;
            if (j < c.past) {
              v = in.at(past).GetDouble(((b * c.hkv + g) * c.past + j) * width + x);
            } else {
              int64_t s = j - c.past;
              v = c.three_d ? in.at(name).GetDouble((b * c.skv + s) * c.hkv * width + g * width + x)
                            : in.at(name).GetDouble(((b * c.hkv + g) * c.skv + s) * width + x);
            }
            out[((b * c.hkv + g) * t_len + j) * width + x] = v;
          }
        }
      }
    }
    return out;
  };
  std::vector<double> k = cached("K", "past_key", c.d), v = cached("V", "past_value", c.dv);
  auto mask_at = [&](int64_t b, int64_t h, int64_t i, int64_t j) -> double {
    if (c.mask.empty()) return 0.0;
    if (j >= c.mask.back()) return kNegInf;  // padded to the total length
    const int64_t coords[4] = {b, h, i, j};
    int64_t index = 0, stride = 1;
    for (size_t a = 0; a < c.mask.size(); ++a) {
      const size_t axis = c.mask.size() - 1 - a;
      const int64_t coord = coords[3 - a];
      index += (c.mask[axis] == 1 ? 0 : coord) * stride;
      stride *= c.mask[axis];
    }
    const double m = in.at("attn_mask").GetDouble(index);
    return c.bool_mask ? (m != 0 ? 0.0 : kNegInf) : m;
  };
  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  std::map<std::string, std::vector<double>> out;
  auto& y = out["Y"];
  auto& qk = out["qk"];
  y.assign(c.b * c.hq * c.sq * c.dv, 0.0);
  qk.assign(c.b * c.hq * c.sq * t_len, 0.0);
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t g = h / rep;
      for (int64_t i = 0; i < c.sq; ++i) {
        std::vector<double> s(t_len);
        double mx = kNegInf;
        for (int64_t j = 0; j < t_len; ++j) {
          double raw = 0;
          for (int64_t x = 0; x < c.d; ++x) {
            raw += q(b, h, i, x) * k[((b * c.hkv + g) * t_len + j) * c.d + x];
          }
          raw *= scale;
          double capped = c.softcap > 0 ? c.softcap * std::tanh(raw / c.softcap) : raw;
          double biased = capped + mask_at(b, h, i, j);
          if (c.causal && j > i + c.past) biased = kNegInf;
          if (!c.nonpad.empty() && j >= c.nonpad[b]) biased = kNegInf;
          s[j] = biased;
          mx = std::max(mx, biased);
          const int64_t at = ((b * c.hq + h) * c.sq + i) * t_len + j;
          qk[at] = c.mode <= 0 ? raw : c.mode == 1 ? capped : biased;
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < t_len; ++j) {
          s[j] /= sum;
          if (c.mode == 3) qk[((b * c.hq + h) * c.sq + i) * t_len + j] = s[j];
          for (int64_t x = 0; x < c.dv; ++x) {
            const double vv = v[((b * c.hkv + g) * t_len + j) * c.dv + x];
            const int64_t at = c.three_d ? (b * c.sq + i) * c.hq * c.dv + h * c.dv + x
                                         : ((b * c.hq + h) * c.sq + i) * c.dv + x;
            y[at] += s[j] * vv;
          }
        }
      }
    }
  }
  out["present_key"] = k;
  out["present_value"] = v;
  return out;
}

void ExpectClose(const std::map<std::string, Tensor>& got,
                 const std::map<std::string, std::vector<double>>& want, const std::string& what,
                 double tol) {
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(want.count(name)) << what << ": unexpected output " << name;
    const std::vector<double>& w = want.at(name);
    ASSERT_EQ(static_cast<size_t>(t.num_elements()), w.size()) << what << ": " << name;
    for (size_t i = 0; i < w.size(); ++i) {
      const double g = t.GetDouble(static_cast<int64_t>(i));
      if (std::isinf(w[i])) {
        EXPECT_EQ(g, w[i]) << what << ": " << name << "[" << i << "]";
      } else {
        EXPECT_NEAR(g, w[i], tol * std::max(1.0, std::abs(w[i])))
            << what << ": " << name << "[" << i << "]";
      }
    }
  }
}

passes::PassOptions Options() { return passes::testing::TestOptions(); }

// Imports the model, checks its outputs against `want` as imported and after the default
// passes; returns the optimised graph.
std::unique_ptr<Graph> CheckModel(const std::string& bytes,
                                  const std::map<std::string, Tensor>& inputs,
                                  const std::map<std::string, std::vector<double>>& want,
                                  double tol = 1e-5) {
  auto g = ImportOnnxBytes(AsBytes(bytes), "");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto before = cpu::EvaluateGraph(**g, inputs);
  EXPECT_TRUE(before.ok()) << before.status().ToString();
  if (before.ok()) ExpectClose(*before, want, "as imported", tol);
  auto report = passes::RunDefaultPasses(**g, Options());
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  auto after = cpu::EvaluateGraph(**g, inputs);
  EXPECT_TRUE(after.ok()) << after.status().ToString();
  if (after.ok()) ExpectClose(*after, want, "after the passes", tol);
  return std::move(g).value();
}

int Count(const Graph& g, const std::string& op) { return passes::testing::CountOps(g, op); }

std::unique_ptr<Graph> CheckAttention(const AttentionCase& c, double tol = 1e-5) {
  std::map<std::string, Tensor> in = AttentionInputs(c);
  return CheckModel(AttentionModel(c), in, AttentionReference(c, in), tol);
}

TEST(OnnxAttention, FourDimensionalGroupedQueryWithFloatMaskFusesToOneAttention) {
  AttentionCase c;
  c.hq = 6;
  c.hkv = 2;
  c.mask = {3, 4};
  auto g = CheckAttention(c);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Attention"), 1);
  EXPECT_EQ(Count(*g, "Softmax"), 0);
  EXPECT_EQ(Count(*g, "Expand"), 0) << "K and V are read un-repeated";
}

TEST(OnnxAttention, PlainFourDimensionalFusesToOneAttention) {
  AttentionCase c;
  c.dv = 6;
  auto g = CheckAttention(c);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Attention"), 1);
  EXPECT_EQ(Count(*g, "MatMul"), 0);
}

TEST(OnnxAttention, BooleanMaskFusesWithTheMaskAsAnInput) {
  AttentionCase c;
  c.mask = {2, 1, 3, 4};
  c.bool_mask = true;
  auto g = CheckAttention(c);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Attention"), 1);
}

TEST(OnnxAttention, ThreeDimensionalGroupedQueryCausalFuses) {
  AttentionCase c;
  c.three_d = true;
  c.hq = 4;
  c.hkv = 2;
  c.sq = c.skv = 5;
  c.causal = true;
  auto g = CheckAttention(c);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Attention"), 1);
}

TEST(OnnxAttention, ThreeDimensionalWithCacheBoolMaskCausalSoftcapAndScoresAfterTheBias) {
  AttentionCase c;
  c.three_d = true;
  c.hq = 3;
  c.hkv = 3;
  c.d = 4;
  c.dv = 5;
  c.past = 3;
  c.mask = {3, 7};
  c.bool_mask = true;
  c.causal = true;
  c.scale = 0.3f;
  c.softcap = 2.0f;
  c.mode = 2;
  CheckAttention(c);
}

TEST(OnnxAttention, QkMatmulOutputModes) {
  for (int64_t mode : {0, 1, 3}) {
    SCOPED_TRACE(mode);
    AttentionCase c;
    c.hq = 4;
    c.hkv = 1;  // multi-query
    c.mask = {3, 4};
    c.softcap = 1.5f;
    c.mode = mode;
    CheckAttention(c);
  }
}

TEST(OnnxAttention, ShortMaskIsPaddedAndNonpadKvSeqlenMasksTheRest) {
  AttentionCase c;
  c.skv = 6;
  c.mask = {2, 1, 3, 4};  // keys 4 and 5 padded with -inf
  c.nonpad = {4, 2};
  CheckAttention(c);
  AttentionCase past;
  past.past = 2;
  past.mask = {3, 5};  // one short of past + kv = 6
  past.causal = true;
  CheckAttention(past);
}

// softmax_precision other than Q's type: the softmax runs in FP16 between two Casts (values
// within FP16's precision); the same type as Q adds nothing and fuses.
TEST(OnnxAttention, SoftmaxPrecision) {
  AttentionCase half;
  half.mask = {3, 4};
  half.softmax_precision = onnx::TensorProto::FLOAT16;
  auto g = CheckAttention(half, 2e-3);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Cast"), 2);
  EXPECT_EQ(Count(*g, "Softmax"), 1);
  AttentionCase same;
  same.softmax_precision = onnx::TensorProto::FLOAT;
  g = CheckAttention(same);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Attention"), 1);
}

// Symbolic sequence lengths: the mask's extension, the causal mask and the cache work on dims
// that are known only at run time (the passes run on the symbolic graph).
TEST(OnnxAttention, SymbolicSequenceLengthsWithCacheShortMaskAndCausal) {
  AttentionCase c;
  c.symbolic = true;
  c.hq = 4;
  c.past = 2;
  c.mask = {3, 5};
  c.causal = true;
  CheckAttention(c);
  AttentionCase three;
  three.symbolic = true;
  three.three_d = true;
  three.mask = {2, 1, 3, 4};
  three.bool_mask = true;
  CheckAttention(three);
}

// Without value_info, Q's rank and type follow from the ops that made it (here Reshape by a
// constant shape and a Mul), and the node expands.
TEST(OnnxAttention, QRankAndTypeFollowFromItsProducers) {
  AttentionCase c;
  std::map<std::string, Tensor> in = AttentionInputs(c);
  ModelBuilder mb(23);
  for (const char* name : {"Q", "K", "V"}) {
    mb.Input(name, onnx::TensorProto::FLOAT, Spec(in.at(name).dims()));
  }
  auto shape = [&](const std::string& name, std::vector<int64_t> dims) {
    auto* t = mb.graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(dims.size()));
    for (int64_t d : dims) t->add_int64_data(d);
  };
  shape("flat", {c.b, -1});
  shape("heads", {c.b, c.hq, c.sq, c.d});
  mb.Initializer("one", {1.0f}, {});
  mb.Node("Reshape", {"Q", "flat"}, {"q_flat"}, "flatten");
  mb.Node("Reshape", {"q_flat", "heads"}, {"q_heads"}, "split_heads");
  mb.Node("Mul", {"q_heads", "one"}, {"q"}, "scale");
  mb.Node("Attention", {"q", "K", "V"}, {"Y"}, "attn");
  mb.Output("Y");
  auto g = CheckModel(mb.Bytes(), in, AttentionReference(c, in));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "Attention"), 1);
}

TEST(OnnxAttention, UndeclaredQIsReportedWithTheReason) {
  ModelBuilder mb(23);
  mb.Input("x", onnx::TensorProto::FLOAT, Spec({2, 2, 3, 4}));
  // q: no value_info, reshaped by a run-time shape of unknown length: its element type follows
  // from x's, its rank does not.
  mb.Input("s", onnx::TensorProto::INT64, std::vector<DimSpec>{std::string("n")});
  mb.Node("Reshape", {"x", "s"}, {"q"}, "reshape");
  mb.Node("Attention", {"q", "x", "x"}, {"y"}, "attn");
  mb.Output("y");
  std::string bytes = mb.Bytes();
  auto g = ImportOnnxBytes(AsBytes(bytes), "");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kUnsupportedOps);
  EXPECT_NE(g.status().message().find("Attention-23"), std::string::npos);
  EXPECT_NE(g.status().message().find("the rank of Q is not declared"), std::string::npos)
      << g.status().message();
  // Q from an op whose result type the importer does not follow: its type is the reason.
  ModelBuilder hb(23);
  hb.Input("x", onnx::TensorProto::FLOAT, Spec({2, 2, 3, 4}));
  hb.Node("Hardmax", {"x"}, {"q"}, "hardmax");
  hb.Node("Attention", {"q", "x", "x"}, {"y"}, "attn");
  hb.Output("y");
  std::string hbytes = hb.Bytes();
  auto h = ImportOnnxBytes(AsBytes(hbytes), "");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("the element type of Q is not declared"), std::string::npos)
      << h.status().message();
  // Declared, it imports.
  ModelBuilder::FillValueInfo(mb.graph().add_value_info(), "q", onnx::TensorProto::FLOAT,
                              Spec({2, 2, 3, 4}));
  bytes = mb.Bytes();
  EXPECT_TRUE(ImportOnnxBytes(AsBytes(bytes), "").ok());
}

TEST(OnnxAttention, ThreeDimensionalWithoutHeadCountsIsAnInvalidAttribute) {
  ModelBuilder mb(23);
  mb.Input("x", onnx::TensorProto::FLOAT, Spec({2, 3, 8}));
  mb.Node("Attention", {"x", "x", "x"}, {"y"}, "attn");
  mb.Output("y");
  std::string bytes = mb.Bytes();
  auto g = ImportOnnxBytes(AsBytes(bytes), "");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidAttribute);
  EXPECT_NE(g.status().message().find("q_num_heads"), std::string::npos);
}

// ---- RotaryEmbedding

struct RotaryCase {
  int64_t b = 2, h = 3, s = 4, d = 8;
  bool three_d = false;
  bool interleaved = false;
  int64_t rotary_dim = 0;
  bool position_ids = true;
  int64_t max_pos = 16;
};

std::map<std::string, Tensor> RotaryInputs(const RotaryCase& c) {
  const int64_t half = (c.rotary_dim ? c.rotary_dim : c.d) / 2;
  std::map<std::string, Tensor> in;
  in["X"] = RandomTensor(DataType::kFloat32,
                         c.three_d ? std::vector<int64_t>{c.b, c.s, c.h * c.d}
                                   : std::vector<int64_t>{c.b, c.h, c.s, c.d},
                         11);
  std::vector<int64_t> table =
      c.position_ids ? std::vector<int64_t>{c.max_pos, half} : std::vector<int64_t>{c.b, c.s, half};
  in["cos"] = RandomTensor(DataType::kFloat32, table, 12);
  in["sin"] = RandomTensor(DataType::kFloat32, table, 13);
  if (c.position_ids) {
    std::vector<int64_t> pos;
    for (int64_t i = 0; i < c.b * c.s; ++i) pos.push_back((i * 5 + 3) % c.max_pos);
    in["pos"] = Tensor::FromVector<int64_t>(DataType::kInt64, {c.b, c.s}, pos);
  }
  return in;
}

std::string RotaryModel(const RotaryCase& c, const std::map<std::string, Tensor>& in) {
  ModelBuilder mb(23);
  std::vector<std::string> inputs = {"X", "cos", "sin"};
  if (c.position_ids) inputs.push_back("pos");
  for (const auto& name : inputs) {
    mb.Input(name, name == "pos" ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT,
             Spec(in.at(name).dims()));
  }
  auto* n = mb.Node("RotaryEmbedding", inputs, {"Y"}, "rope");
  if (c.interleaved) AttrInt(n, "interleaved", 1);
  if (c.rotary_dim) AttrInt(n, "rotary_embedding_dim", c.rotary_dim);
  if (c.three_d) AttrInt(n, "num_heads", c.h);
  mb.Output("Y");
  return mb.Bytes();
}

std::map<std::string, std::vector<double>> RotaryReference(
    const RotaryCase& c, const std::map<std::string, Tensor>& in) {
  const int64_t rot = c.rotary_dim ? c.rotary_dim : c.d, half = rot / 2;
  const Tensor& x = in.at("X");
  std::vector<double> y(x.num_elements());
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.h; ++h) {
      for (int64_t s = 0; s < c.s; ++s) {
        const int64_t base =
            c.three_d ? (b * c.s + s) * c.h * c.d + h * c.d : ((b * c.h + h) * c.s + s) * c.d;
        const int64_t row = c.position_ids ? in.at("pos").GetInt(b * c.s + s) : b * c.s + s;
        for (int64_t i = 0; i < c.d; ++i) y[base + i] = x.GetDouble(base + i);
        for (int64_t i = 0; i < half; ++i) {
          const double cs = in.at("cos").GetDouble(row * half + i);
          const double sn = in.at("sin").GetDouble(row * half + i);
          const int64_t i1 = c.interleaved ? 2 * i : i, i2 = c.interleaved ? 2 * i + 1 : i + half;
          const double x1 = x.GetDouble(base + i1), x2 = x.GetDouble(base + i2);
          y[base + i1] = cs * x1 - sn * x2;
          y[base + i2] = sn * x1 + cs * x2;
        }
      }
    }
  }
  return {{"Y", y}};
}

std::unique_ptr<Graph> CheckRotary(const RotaryCase& c) {
  std::map<std::string, Tensor> in = RotaryInputs(c);
  return CheckModel(RotaryModel(c, in), in, RotaryReference(c, in));
}

TEST(OnnxRotaryEmbedding, HalvesWithPositionIdsFuseToOneRotaryEmbedding) {
  auto g = CheckRotary(RotaryCase{});
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "RotaryEmbedding"), 1);
  EXPECT_EQ(Count(*g, "Split"), 0);
}

TEST(OnnxRotaryEmbedding, InterleavedFusesToOneRotaryEmbedding) {
  RotaryCase c;
  c.interleaved = true;
  auto g = CheckRotary(c);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Count(*g, "RotaryEmbedding"), 1);
}

TEST(OnnxRotaryEmbedding, PartialRotationPassesTheRestThrough) {
  for (const auto& [interleaved, three_d] :
       std::vector<std::pair<bool, bool>>{{false, false}, {true, false}, {false, true}}) {
    SCOPED_TRACE(::testing::Message() << "interleaved " << interleaved << " 3-D " << three_d);
    RotaryCase c;
    c.interleaved = interleaved;
    c.three_d = three_d;
    c.rotary_dim = 4;
    auto g = CheckRotary(c);
    ASSERT_NE(g, nullptr);
    // One rotation over the whole head: the rotary fusion folds the pass-through Slice and the
    // Concat into rotary_embedding_dim.
    ASSERT_EQ(Count(*g, "RotaryEmbedding"), 1);
    for (const Node* node : g->nodes()) {
      if (node->is_dead() || node->op_type() != "RotaryEmbedding") continue;
      EXPECT_EQ(node->attrs().GetInt("rotary_embedding_dim", 0), 4);
      ASSERT_NE(node->input(0), nullptr);
      const Node* p = node->input(0)->producer();
      EXPECT_TRUE(p == nullptr || p->op_type() != "Slice");
      for (const Node* reader : node->output(0)->consumers()) {
        EXPECT_NE(reader->op_type(), "Concat");
      }
    }
  }
}

TEST(OnnxRotaryEmbedding, ThreeDimensionalInputWithoutPositionIds) {
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved);
    RotaryCase c;
    c.three_d = true;
    c.position_ids = false;
    c.interleaved = interleaved;
    CheckRotary(c);
  }
}

}  // namespace
}  // namespace kiln
