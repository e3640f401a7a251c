// The CPU backend's INT8 tactics (i8-conv-cpu-onednn, i8-gemm-cpu-onednn, i8-matmul-cpu-onednn)
// for Conv, FusedConv, Gemm, FusedGemm, MatMul and FusedMatMul, each checked two ways on fresh
// random inputs:
//  * contract: against the FP32 CPU kernel run on the inputs the contract says the INT8 kernel
//    sees (X quantized with scale amax/127 and saturated, W quantized per output channel, both
//    dequantized back to float; bias and residual unquantized). Only float rounding separates
//    the two: rel-L2 <= 1e-4 (1e-3 through f16 storage).
//  * accuracy: against the FP32 CPU kernel on the original inputs. With inputs uniform in
//    [-1, 1] (amax 1), one quantization step is 1/127 for X and |w|max/127 for W; rounding
//    error is uniform within half a step, so each product's relative error has rms about
//    (1/127)/sqrt(12)/rms(x) = 0.0039 per operand (rms(x) = 1/sqrt(3)), 0.0056 for both. The
//    bound 2e-2 leaves a 3.5x margin; a per-tensor weight scale or a wrong scale breaks it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"
#include "nn_test_util.h"

namespace kiln::testing {
namespace {

constexpr char kAmax[] = "kiln_int8_input_amax";

// One single-node graph, its kernel request and a runner for any of its tactics.
class OneNode {
 public:
  explicit OneNode(const OpCase& c, DataType dtype = DataType::kFloat32) {
    graph_ = std::make_unique<Graph>();
    std::vector<Value*> ins;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      if (t.empty()) {
        ins.push_back(nullptr);
        inputs_.emplace_back();
        continue;
      }
      Tensor cast = t.CastTo(dtype);
      bool is_const = i < c.constant.size() && c.constant[i];
      std::string name = fmt::format("in{}", i);
      ins.push_back(is_const ? graph_->AddConstant(name, cast)
                             : graph_->AddInput(name, cast.dtype(), MakeShape(cast.dims())));
      inputs_.push_back(std::move(cast));
    }
    Value* out = graph_->AddValue("out");
    node_ = graph_->AddNode(c.op, "node", ins, {out}, c.attrs);
    graph_->MarkOutput(out);
    Status st = InferShapes(*graph_).status();
    EXPECT_TRUE(st.ok()) << st.ToString();
    request_.node = node_;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      OperandDesc d;
      if (!inputs_[i].empty()) {
        d.dtype = inputs_[i].dtype();
        d.shape = MakeShape(inputs_[i].dims());
        d.max_dims = inputs_[i].dims();
        d.constant = node_->input(i)->constant();
      }
      request_.inputs.push_back(d);
    }
    OperandDesc o;
    o.dtype = out->dtype();
    o.shape = out->shape();
    if (auto dims = StaticDims(o.shape)) o.max_dims = *dims;
    request_.outputs.push_back(o);
  }

  // Names of every CPU tactic offered for the node.
  std::vector<std::string> TacticNames() const {
    std::vector<std::string> names;
    for (const KernelProvider* p :
         KernelRegistry::Get().Providers(BackendKind::kCpu, node_->op_type())) {
      for (const TacticConfig& t : p->Tactics(request_)) names.push_back(t.name);
    }
    return names;
  }

  // Runs the first tactic whose name starts with `prefix`; returns Y as f32 values.
  std::vector<float> Run(const std::string& prefix, std::string* chosen = nullptr) {
    for (const KernelProvider* p :
         KernelRegistry::Get().Providers(BackendKind::kCpu, node_->op_type())) {
      for (const TacticConfig& t : p->Tactics(request_)) {
        if (!t.name.starts_with(prefix)) continue;
        if (chosen) *chosen = t.name;
        auto kernel = p->Create(request_, t);
        EXPECT_TRUE(kernel.ok()) << kernel.status().ToString();
        if (!kernel.ok()) return {};
        std::vector<TensorView> in_views, out_views;
        for (const Tensor& in : inputs_) in_views.push_back(in.empty() ? TensorView{} : in.view());
        Tensor out(node_->output(0)->dtype(), *StaticDims(node_->output(0)->shape()));
        out_views.push_back(out.view());
        auto ws = (*kernel)->Prepare(in_views, out_views);
        EXPECT_TRUE(ws.ok()) << ws.status().ToString();
        if (!ws.ok()) return {};
        EXPECT_LE(*ws, t.workspace_bytes) << t.name << ": the tactic's estimate is at max shape";
        // NaN-filled so a kernel that reads its workspace before writing it shows up.
        std::vector<float> workspace(*ws / 4 + 16, std::nanf(""));
        auto* aligned = reinterpret_cast<void*>(
            (reinterpret_cast<uintptr_t>(workspace.data()) + 63) & ~uintptr_t{63});
        Status st = (*kernel)->Run({in_views, out_views, aligned, *ws, nullptr});
        EXPECT_TRUE(st.ok()) << t.name << ": " << st.ToString();
        // Run twice: a second run with the same inputs gives the same outputs.
        std::vector<float> first = out.ToFloatVector();
        st = (*kernel)->Run({in_views, out_views, aligned, *ws, nullptr});
        EXPECT_TRUE(st.ok()) << t.name << ": " << st.ToString();
        EXPECT_EQ(out.ToFloatVector(), first) << t.name;
        return first;
      }
    }
    ADD_FAILURE() << "no tactic starting with '" << prefix << "' for " << node_->op_type();
    return {};
  }

 private:
  std::unique_ptr<Graph> graph_;
  Node* node_ = nullptr;
  std::vector<Tensor> inputs_;
  KernelRequest request_;
};

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// X as the INT8 kernel sees it: symmetric, scale amax/127, x times the scale's reciprocal (the
// contract's arithmetic: dividing instead rounds an occasional value at a .5 boundary the other
// way), round to nearest, saturate.
Tensor DequantizedActivations(const Tensor& x, float amax) {
  std::vector<float> v = x.ToFloatVector();
  const float scale = amax / 127.f, inv = 1.f / scale;
  for (float& f : v) f = std::clamp(std::nearbyint(f * inv), -127.f, 127.f) * scale;
  return Tensor::FromVector(DataType::kFloat32, x.dims(), v);
}

// W as the INT8 kernel sees it: per channel, symmetric absmax, times the reciprocal as above.
// Channel c's elements are at
// c * channel_stride + i * inner_stride.
Tensor DequantizedWeights(const Tensor& w, int64_t channels, int64_t channel_stride,
                          int64_t inner_stride) {
  std::vector<float> v = w.ToFloatVector();
  int64_t inner = static_cast<int64_t>(v.size()) / channels;
  for (int64_t c = 0; c < channels; ++c) {
    float absmax = 0;
    for (int64_t i = 0; i < inner; ++i) {
      absmax = std::max(absmax, std::fabs(v[c * channel_stride + i * inner_stride]));
    }
    const float scale = absmax > 0 ? absmax / 127.f : 1.f, inv = 1.f / scale;
    for (int64_t i = 0; i < inner; ++i) {
      float& f = v[c * channel_stride + i * inner_stride];
      f = std::clamp(std::nearbyint(f * inv), -127.f, 127.f) * scale;
    }
  }
  return Tensor::FromVector(DataType::kFloat32, w.dims(), v);
}

// Multiplies channel c of W (layout as above) by factors[c % factors.size()].
Tensor ScaleChannels(const Tensor& w, int64_t channels, int64_t channel_stride,
                     int64_t inner_stride, const std::vector<float>& factors) {
  std::vector<float> v = w.ToFloatVector();
  int64_t inner = static_cast<int64_t>(v.size()) / channels;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < inner; ++i) {
      v[c * channel_stride + i * inner_stride] *= factors[c % factors.size()];
    }
  }
  return Tensor::FromVector(DataType::kFloat32, w.dims(), v);
}

struct Int8Check {
  double contract_rel_l2 = 0;  // INT8 vs FP32 on dequantized inputs
  double fp32_rel_l2 = 0;      // INT8 vs FP32 on the original inputs
  std::vector<float> int8, fp32;
  std::string tactic;
};

// Runs the case's INT8 tactic and the FP32 kernel on original and dequantized inputs. The
// weight's channels are described by (channels, channel_stride, inner_stride).
Int8Check CheckInt8(OpCase c, float amax, int64_t channels, int64_t channel_stride,
                    int64_t inner_stride, DataType dtype = DataType::kFloat32) {
  c.attrs.Set(kAmax, amax);
  Int8Check r;
  // Through f16 storage the reference sees the f16-rounded values, as the kernel does.
  for (Tensor& t : c.inputs) {
    if (!t.empty()) t = t.CastTo(dtype).CastTo(DataType::kFloat32);
  }
  OneNode node(c, dtype);
  std::string prefix = dtype == DataType::kFloat32 ? "f32-" : std::string(ToString(dtype)) + "-";
  r.int8 = node.Run("i8-", &r.tactic);
  r.fp32 = node.Run(prefix);
  OpCase dq = c;
  dq.inputs[0] = DequantizedActivations(c.inputs[0], amax);
  dq.inputs[1] = DequantizedWeights(c.inputs[1], channels, channel_stride, inner_stride);
  OneNode emulated(dq, DataType::kFloat32);
  std::vector<float> expected = emulated.Run("f32-");
  r.contract_rel_l2 = RelL2(r.int8, expected);
  r.fp32_rel_l2 = RelL2(r.int8, r.fp32);
  return r;
}

// Conv X [n, c, h, w], W [m, c/group, k, k], optional bias / residual, pads k/2.
OpCase ConvCase(std::mt19937& rng, int64_t n, int64_t c, int64_t hw, int64_t m, int64_t k,
                int64_t group = 1, bool bias = true, bool residual = false,
                const std::string& act = "", int64_t stride = 1) {
  OpCase oc;
  oc.op = residual || !act.empty() ? "FusedConv" : "Conv";
  oc.attrs.Set("kernel_shape", std::vector<int64_t>{k, k});
  oc.attrs.Set("pads", std::vector<int64_t>{k / 2, k / 2, k / 2, k / 2});
  oc.attrs.Set("strides", std::vector<int64_t>{stride, stride});
  oc.attrs.Set("group", group);
  if (!act.empty()) oc.attrs.Set("activation", act);
  oc.inputs = {RandomTensor({n, c, hw, hw}, rng), RandomTensor({m, c / group, k, k}, rng)};
  oc.constant = {false, true, true, false};
  oc.inputs.push_back(bias ? RandomTensor({m}, rng) : Tensor());
  if (residual) {
    int64_t out = (hw + 2 * (k / 2) - k) / stride + 1;
    oc.inputs.push_back(RandomTensor({n, m, out, out}, rng));
  }
  return oc;
}

void ExpectInt8Accuracy(const Int8Check& r, const std::string& what, double contract = 1e-4) {
  EXPECT_TRUE(r.tactic.starts_with("i8-")) << what << ": " << r.tactic;
  EXPECT_LE(r.contract_rel_l2, contract) << what << " (" << r.tactic << ")";
  EXPECT_LE(r.fp32_rel_l2, 2e-2) << what << " (" << r.tactic << ")";
}

TEST(CpuInt8, NoInt8TacticWithoutTheAttribute) {
  std::mt19937 rng(1);
  OneNode conv(ConvCase(rng, 1, 4, 6, 8, 3));
  std::vector<std::string> names = conv.TacticNames();
  EXPECT_FALSE(names.empty());
  for (const auto& n : names) EXPECT_FALSE(n.starts_with("i8-")) << n;
  // With the attribute, the INT8 tactic is offered (alongside the FP32 ones).
  OpCase marked = ConvCase(rng, 1, 4, 6, 8, 3);
  marked.attrs.Set(kAmax, 1.f);
  names = OneNode(marked).TacticNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "i8-conv-cpu-onednn"), names.end());
  // Unusable amax (zero, negative) or weights that are not constant: no INT8 tactic.
  for (float bad : {0.f, -1.f}) {
    OpCase c = ConvCase(rng, 1, 4, 6, 8, 3);
    c.attrs.Set(kAmax, bad);
    for (const auto& n : OneNode(c).TacticNames()) EXPECT_FALSE(n.starts_with("i8-")) << bad;
  }
  OpCase dynamic_w = ConvCase(rng, 1, 4, 6, 8, 3);
  dynamic_w.attrs.Set(kAmax, 1.f);
  dynamic_w.constant[1] = false;
  for (const auto& n : OneNode(dynamic_w).TacticNames()) EXPECT_FALSE(n.starts_with("i8-")) << n;
}

TEST(CpuInt8, Conv) {
  std::mt19937 rng(11);
  ExpectInt8Accuracy(CheckInt8(ConvCase(rng, 2, 16, 10, 32, 3), 1.f, 32, 16 * 9, 1), "conv 3x3");
  ExpectInt8Accuracy(CheckInt8(ConvCase(rng, 1, 32, 9, 16, 1, 1, false), 1.f, 16, 32, 1),
                     "conv 1x1 no bias");
  ExpectInt8Accuracy(
      CheckInt8(ConvCase(rng, 1, 24, 12, 48, 3, 1, true, false, "", 2), 1.f, 48, 24 * 9, 1),
      "conv stride 2");
  ExpectInt8Accuracy(CheckInt8(ConvCase(rng, 2, 16, 8, 16, 3, 16), 1.f, 16, 9, 1), "depthwise");
  ExpectInt8Accuracy(CheckInt8(ConvCase(rng, 1, 16, 8, 32, 3, 4), 1.f, 32, 4 * 9, 1), "grouped");
  OpCase one_d;
  one_d.op = "Conv";
  one_d.attrs.Set("kernel_shape", std::vector<int64_t>{3});
  one_d.attrs.Set("pads", std::vector<int64_t>{1, 1});
  one_d.inputs = {RandomTensor({2, 8, 20}, rng), RandomTensor({16, 8, 3}, rng),
                  RandomTensor({16}, rng)};
  one_d.constant = {false, true, true};
  ExpectInt8Accuracy(CheckInt8(one_d, 1.f, 16, 8 * 3, 1), "1-D conv");
}

TEST(CpuInt8, FusedConvBiasReluResidual) {
  std::mt19937 rng(12);
  ExpectInt8Accuracy(
      CheckInt8(ConvCase(rng, 2, 16, 8, 32, 3, 1, true, false, "relu"), 1.f, 32, 16 * 9, 1),
      "bias+relu");
  ExpectInt8Accuracy(
      CheckInt8(ConvCase(rng, 2, 16, 8, 16, 3, 1, true, true, "relu"), 1.f, 16, 16 * 9, 1),
      "bias+residual+relu");
  ExpectInt8Accuracy(
      CheckInt8(ConvCase(rng, 1, 16, 8, 16, 1, 1, false, true, "none"), 1.f, 16, 16, 1),
      "residual only");
  // A bias that is a graph input rather than a constant goes through the sum post-op.
  OpCase runtime_bias = ConvCase(rng, 2, 16, 8, 32, 3, 1, true, false, "relu6");
  runtime_bias.constant[2] = false;
  ExpectInt8Accuracy(CheckInt8(runtime_bias, 1.f, 32, 16 * 9, 1), "runtime bias+relu6");
}

TEST(CpuInt8, ConvSaturatesAboveAmax) {
  // X in [-1, 1] with amax 0.5: about half the values clip to +-0.5. The kernel matches the
  // saturating contract exactly and is far from the unclipped FP32 result.
  std::mt19937 rng(13);
  OpCase c = ConvCase(rng, 1, 16, 8, 16, 3);
  Int8Check r = CheckInt8(c, 0.5f, 16, 16 * 9, 1);
  EXPECT_LE(r.contract_rel_l2, 1e-4);
  EXPECT_GT(r.fp32_rel_l2, 0.1) << "clipping at amax had no effect";
  // Against FP32 on the clipped input, the usual quantization bound holds.
  std::vector<float> x = c.inputs[0].ToFloatVector();
  for (float& v : x) v = std::clamp(v, -0.5f, 0.5f);
  OpCase clipped = c;
  clipped.inputs[0] = Tensor::FromVector(DataType::kFloat32, c.inputs[0].dims(), x);
  EXPECT_LE(RelL2(r.int8, OneNode(clipped).Run("f32-")), 2e-2);
}

TEST(CpuInt8, ConvPerChannelScales) {
  // Output channels whose weights differ by up to 1000x: each channel keeps its own accuracy
  // (a single per-tensor scale would leave the small channels almost all zeros).
  std::mt19937 rng(14);
  const int64_t m = 16, hw = 6;
  OpCase c = ConvCase(rng, 1, 8, hw, m, 3);
  c.inputs[1] = ScaleChannels(c.inputs[1], m, 8 * 9, 1, {1e-2f, 1e-1f, 1.f, 10.f});
  c.inputs[2] = ScaleChannels(c.inputs[2], m, 1, 0, {1e-2f, 1e-1f, 1.f, 10.f});
  Int8Check r = CheckInt8(c, 1.f, m, 8 * 9, 1);
  ExpectInt8Accuracy(r, "per-channel conv");
  for (int64_t ch = 0; ch < m; ++ch) {
    std::vector<float> a(r.int8.begin() + ch * hw * hw, r.int8.begin() + (ch + 1) * hw * hw);
    std::vector<float> b(r.fp32.begin() + ch * hw * hw, r.fp32.begin() + (ch + 1) * hw * hw);
    EXPECT_LE(RelL2(a, b), 2e-2) << "channel " << ch;
  }
}

TEST(CpuInt8, ConvF16Storage) {
  std::mt19937 rng(15);
  Int8Check r = CheckInt8(ConvCase(rng, 1, 16, 8, 16, 3, 1, true, true, "relu"), 1.f, 16, 16 * 9, 1,
                          DataType::kFloat16);
  // f16 output rounding (2^-11 relative) separates the INT8 run from the f32 emulation.
  ExpectInt8Accuracy(r, "f16 storage", 1e-3);
}

OpCase GemmCase(std::mt19937& rng, const std::string& op, int64_t m, int64_t k, int64_t n, bool ta,
                bool tb, float alpha, float beta, std::vector<int64_t> c_dims, bool c_const,
                const std::string& act = "") {
  OpCase c;
  c.op = op;
  if (op != "MatMul") {
    c.attrs.Set("transA", int64_t{ta});
    c.attrs.Set("transB", int64_t{tb});
    c.attrs.Set("alpha", alpha);
  }
  if (op == "Gemm" || op == "FusedGemm") c.attrs.Set("beta", beta);
  if (!act.empty()) c.attrs.Set("activation", act);
  c.inputs = {RandomTensor(ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, rng),
              RandomTensor(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, rng)};
  c.constant = {false, true, c_const};
  if (!c_dims.empty()) c.inputs.push_back(RandomTensor(c_dims, rng));
  return c;
}

TEST(CpuInt8, Gemm) {
  std::mt19937 rng(21);
  // B [K, N]: channel n at stride 1, its K elements at stride N; transposed: the other way.
  ExpectInt8Accuracy(CheckInt8(GemmCase(rng, "Gemm", 7, 64, 24, false, false, 1.f, 1.f, {24}, true),
                               1.f, 24, 1, 24),
                     "gemm + const row C");
  ExpectInt8Accuracy(
      CheckInt8(GemmCase(rng, "Gemm", 7, 64, 24, false, true, 0.5f, 2.f, {1, 24}, true), 1.f, 24,
                64, 1),
      "gemm transB alpha beta");
  ExpectInt8Accuracy(
      CheckInt8(GemmCase(rng, "Gemm", 9, 32, 16, true, false, 1.f, 0.5f, {9, 16}, false), 1.f, 16,
                1, 16),
      "gemm transA + runtime C [M, N]");
  ExpectInt8Accuracy(
      CheckInt8(GemmCase(rng, "Gemm", 9, 32, 16, false, false, 1.f, 1.f, {9, 1}, true), 1.f, 16, 1,
                16),
      "gemm C [M, 1]");
  ExpectInt8Accuracy(CheckInt8(GemmCase(rng, "Gemm", 5, 48, 12, false, false, 1.f, 1.f, {}, false),
                               1.f, 12, 1, 12),
                     "gemm without C");
}

TEST(CpuInt8, FusedGemm) {
  std::mt19937 rng(22);
  ExpectInt8Accuracy(
      CheckInt8(GemmCase(rng, "FusedGemm", 8, 64, 32, false, true, 1.f, 1.f, {32}, true, "relu"),
                1.f, 32, 64, 1),
      "fused gemm bias+relu");
  ExpectInt8Accuracy(CheckInt8(GemmCase(rng, "FusedGemm", 8, 64, 32, false, false, 1.f, 1.f,
                                        {8, 32}, false, "gelu"),
                               1.f, 32, 1, 32),
                     "fused gemm runtime C+gelu");
}

TEST(CpuInt8, MatMul) {
  std::mt19937 rng(23);
  OpCase c = GemmCase(rng, "MatMul", 6, 32, 16, false, false, 1.f, 0.f, {}, false);
  // Batched A [2, 3, K]: the batch folds into M.
  c.inputs[0] = RandomTensor({2, 3, 32}, rng);
  ExpectInt8Accuracy(CheckInt8(c, 1.f, 16, 1, 16), "batched matmul");
  ExpectInt8Accuracy(
      CheckInt8(GemmCase(rng, "MatMul", 10, 64, 24, false, false, 1.f, 0.f, {}, false), 1.f, 24, 1,
                24),
      "matmul");
}

TEST(CpuInt8, FusedMatMulBiasActivation) {
  std::mt19937 rng(24);
  ExpectInt8Accuracy(CheckInt8(GemmCase(rng, "FusedMatMul", 10, 64, 24, false, true, 0.5f, 0.f,
                                        {24}, true, "gelu"),
                               1.f, 24, 64, 1),
                     "fused matmul const bias + gelu");
  ExpectInt8Accuracy(CheckInt8(GemmCase(rng, "FusedMatMul", 10, 64, 24, false, false, 1.f, 0.f,
                                        {24}, false, "relu"),
                               1.f, 24, 1, 24),
                     "fused matmul runtime bias + relu");
}

TEST(CpuInt8, GemmSaturationAndPerChannelScales) {
  std::mt19937 rng(25);
  OpCase c = GemmCase(rng, "Gemm", 16, 64, 8, false, false, 1.f, 1.f, {8}, true);
  c.inputs[1] = ScaleChannels(c.inputs[1], 8, 1, 8, {1e-3f, 1.f, 1e-2f, 10.f});
  c.inputs[2] = ScaleChannels(c.inputs[2], 8, 1, 0, {1e-3f, 1.f, 1e-2f, 10.f});
  Int8Check r = CheckInt8(c, 1.f, 8, 1, 8);
  ExpectInt8Accuracy(r, "per-channel gemm");
  for (int64_t j = 0; j < 8; ++j) {
    std::vector<float> a, b;
    for (int64_t i = 0; i < 16; ++i) {
      a.push_back(r.int8[i * 8 + j]);
      b.push_back(r.fp32[i * 8 + j]);
    }
    EXPECT_LE(RelL2(a, b), 2e-2) << "column " << j;
  }
  // Saturation: amax 0.25 clips most of A.
  Int8Check sat = CheckInt8(GemmCase(rng, "Gemm", 16, 64, 8, false, false, 1.f, 1.f, {8}, true),
                            0.25f, 8, 1, 8);
  EXPECT_LE(sat.contract_rel_l2, 1e-4);
  EXPECT_GT(sat.fp32_rel_l2, 0.1) << "clipping at amax had no effect";
}

}  // namespace
}  // namespace kiln::testing
