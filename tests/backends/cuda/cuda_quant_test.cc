// The CUDA INT8 matrix products (cublaslt_int8.cc: i8-gemm/i8-matmul-cuda-cublaslt-*) against the
// CPU, on fresh random inputs, every tactic the heuristic offers:
//  * contract: against the CPU's FP32 kernel run on the inputs the INT8 contract says the kernel
//    sees (A quantized per tensor with scale amax/127 and saturated, B per output column, both
//    dequantized back to float; C/bias unquantized). Only float rounding separates the two;
//  * the same engine graph on either backend: against the CPU's own INT8 kernel (oneDNN) on the
//    same node;
//  * accuracy: against the CPU's FP32 kernel on the original inputs (2e-2, the CPU INT8 tests'
//    bound: inputs uniform in [-1, 1], amax 1).
// Shapes no IMMA kernel takes as they are (K or N not a multiple of 4, one row, a 1-D A) run
// through the kernel's zero padding; what INT8 cannot run declines (no i8 tactic) and stays FP16.
// The end-to-end test builds bert_tiny with --int8 for CUDA. The FP8 E4M3 products
// (cublaslt_fp8.cc: f8-*) are checked the same way against the FP8 contract's emulation (sm_89+
// only; there is no CPU FP8 kernel), with bert_tiny --fp8 end to end. The host halves (B packed,
// the geometry, E4M3 rounding against CUDA's own conversion) are checked without a GPU.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "kiln/app/pipeline.h"
#include "kiln/backends/backend.h"
#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/cuda_launch.h"
#include "kiln/backends/cuda/implicit_gemm_conv.h"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/cuda/quant_conv_plan.h"
#include "kiln/backends/cuda/quant_gemm_plan.h"
#include "kiln/backends/fp8_quant.h"
#include "kiln/backends/int8_quant.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/graph.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/quant_edge.h"

namespace kiln::testing {
namespace {

constexpr char kAmax[] = "kiln_int8_input_amax";

// The INT8/FP8 tactics are off by default until they have run on a GPU (cublaslt_util.h,
// QuantTacticsEnabled); this binary tests them, so it turns them on before anything asks.
const bool kQuantTacticsOn = setenv("KILN_CUDA_QUANT_TACTICS", "1", 1) == 0;

class CudaInt8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kQuantTacticsOn);
    auto backend = GetBackend(BackendKind::kCuda);
    if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status().ToString();
  }
};

Tensor Random(std::vector<int64_t> dims, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return Tensor::FromVector(DataType::kFloat32, dims, v);
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// One Gemm-family node: A [rows..., K] (or [K, M] with transA), constant B [K, N] (or [N, K]
// with transB), optional C / bias.
struct I8Case {
  std::string op = "Gemm";
  std::vector<int64_t> a;  // A's dims as stored
  int64_t k = 0, n = 0;
  bool ta = false, tb = false;
  float alpha = 1.f, beta = 1.f;
  std::vector<int64_t> c{};  // empty: no C
  bool c_const = false;
  std::string act{};
  std::optional<float> amax = 1.f;  // nullopt: no INT8 attribute
  std::optional<float> fp8_amax{};  // the FP8 attribute (set by FP8 cases, with amax nullopt)
  bool b_const = true;
  std::vector<int64_t> b_dims{};  // overrides B's dims (a batched B)
  // Output column n of B (and of a row bias) scaled by col_factors[n % size]: per-channel range.
  std::vector<float> col_factors{};
  // A QDQ model's scales (ops/int8_layer.h) instead of the calibrated amax.
  std::optional<ModelInt8Scales> model_scales{};
  std::string Describe() const {
    return fmt::format("{} A=[{}] K={} N={} ta={} tb={} alpha={} beta={} C=[{}]{} act={}", op,
                       fmt::join(a, ","), k, n, ta, tb, alpha, beta, fmt::join(c, ","),
                       c_const ? " const" : "", act);
  }
};

// One CUDA tactic for `request` on device copies of `inputs` (run twice: the same bits both
// times); Y as floats, decoded from Y's type.
std::vector<float> RunCudaKernel(const KernelProvider* p, const TacticConfig& t,
                                 const KernelRequest& request, const std::vector<Tensor>& inputs,
                                 const Value& output) {
  Backend* gpu = *GetBackend(BackendKind::kCuda);
  auto kernel = p->Create(request, t);
  EXPECT_TRUE(kernel.ok()) << t.name << ": " << kernel.status().ToString();
  if (!kernel.ok()) return {};
  std::vector<DeviceBuffer> buffers;
  std::vector<TensorView> in, out;
  auto upload = [&](const Tensor& x) -> void* {
    auto buf = gpu->Allocate(std::max<size_t>(x.size_bytes(), 1));
    EXPECT_TRUE(buf.ok());
    if (!buf.ok()) return nullptr;
    EXPECT_TRUE(gpu->CopyToDevice(buf->data(), x.raw(), x.size_bytes(), nullptr).ok());
    buffers.push_back(std::move(*buf));
    return buffers.back().data();
  };
  for (const Tensor& x : inputs) {
    TensorView v = x.view();
    v.data = upload(x);
    in.push_back(v);
  }
  Tensor y(output.dtype(), *StaticDims(output.shape()));
  TensorView yv = y.view();
  yv.data = upload(y);
  out.push_back(yv);
  auto ws = (*kernel)->Prepare(in, out);
  EXPECT_TRUE(ws.ok()) << t.name << ": " << ws.status().ToString();
  if (!ws.ok()) return {};
  EXPECT_LE(*ws, t.workspace_bytes) << t.name << ": the tactic's estimate is at the max shape";
  void* ws_ptr = nullptr;
  if (*ws > 0) {
    auto buf = gpu->Allocate(*ws);
    EXPECT_TRUE(buf.ok());
    if (!buf.ok()) return {};
    // Garbage in the workspace: the kernel must write everything it reads.
    EXPECT_EQ(cudaMemset(buf->data(), 0x7f, *ws), cudaSuccess);
    ws_ptr = buf->data();
    buffers.push_back(std::move(*buf));
  }
  std::vector<float> runs[2];
  for (auto& r : runs) {
    Status st = (*kernel)->Run({in, out, ws_ptr, *ws, nullptr});
    EXPECT_TRUE(st.ok()) << t.name << ": " << st.ToString();
    EXPECT_TRUE(gpu->Synchronize(nullptr).ok()) << t.name;
    EXPECT_TRUE(gpu->CopyToHost(y.mutable_raw(), yv.data, y.size_bytes(), nullptr).ok());
    r = y.ToFloatVector();
  }
  EXPECT_EQ(runs[0], runs[1]) << t.name << ": two runs differ";
  return runs[0];
}

// The tactics of `request`'s node on `backend` whose names start with `prefix`, with their
// providers.
std::vector<std::pair<const KernelProvider*, TacticConfig>> TacticsFor(const KernelRequest& request,
                                                                       BackendKind backend,
                                                                       std::string_view prefix) {
  std::vector<std::pair<const KernelProvider*, TacticConfig>> out;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(backend, *request.node)) {
    for (TacticConfig& t : p->Tactics(request)) {
      if (t.name.starts_with(prefix)) out.emplace_back(p, std::move(t));
    }
  }
  return out;
}

// The first CPU tactic of `request` starting with `prefix`, on host memory (absent optional
// inputs as empty views); Y as floats.
std::vector<float> RunCpuTactic(const KernelRequest& request, const std::vector<Tensor>& inputs,
                                std::string_view prefix) {
  auto tactics = TacticsFor(request, BackendKind::kCpu, prefix);
  if (tactics.empty()) {
    ADD_FAILURE() << "no CPU tactic starting with '" << prefix << "'";
    return {};
  }
  auto& [p, t] = tactics[0];
  auto kernel = p->Create(request, t);
  EXPECT_TRUE(kernel.ok()) << kernel.status().ToString();
  if (!kernel.ok()) return {};
  std::vector<TensorView> in, out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool absent =
        i < request.inputs.size() && request.inputs[i].dtype == DataType::kUndefined;
    in.push_back(absent ? TensorView{} : inputs[i].view());
  }
  const Value& y_value = *request.node->output(0);
  Tensor y(y_value.dtype(), *StaticDims(y_value.shape()));
  out.push_back(y.view());
  auto ws = (*kernel)->Prepare(in, out);
  EXPECT_TRUE(ws.ok()) << ws.status().ToString();
  if (!ws.ok()) return {};
  std::vector<std::byte> workspace(*ws + 64);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(workspace.data()) + 63) &
                                          ~uintptr_t{63});
  Status st = (*kernel)->Run({in, out, aligned, *ws, nullptr});
  EXPECT_TRUE(st.ok()) << t.name << ": " << st.ToString();
  return y.ToFloatVector();
}

// One layer under test: its one-node graph, the kernel request and the host inputs; runs a CPU
// or CUDA tactic and returns Y as floats. Subclasses build the graph, then call MakeRequest.
class TestLayer {
 public:
  std::vector<std::pair<const KernelProvider*, TacticConfig>> Tactics(BackendKind backend,
                                                                      std::string_view prefix) {
    return TacticsFor(request_, backend, prefix);
  }
  // The first CPU tactic starting with `prefix`, on host memory.
  std::vector<float> RunCpu(std::string_view prefix) {
    return RunCpuTactic(request_, inputs_, prefix);
  }
  // One CUDA tactic on device copies of the inputs (run twice: the same bits both times).
  std::vector<float> RunCuda(const KernelProvider* p, const TacticConfig& t) {
    return RunCudaKernel(p, t, request_, inputs_, *node_->output(0));
  }

  const std::vector<Tensor>& inputs() const { return inputs_; }
  const Node& node() const { return *node_; }
  const KernelRequest& request() const { return request_; }

 protected:
  // The request of node_ at the shapes of inputs_ (an input node_ lacks is absent) and of its
  // inferred output.
  void MakeRequest() {
    Status st = InferShapes(*graph_).status();
    EXPECT_TRUE(st.ok()) << st.ToString();
    request_.node = node_;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      OperandDesc d;
      const Value* v = i < node_->inputs().size() ? node_->input(i) : nullptr;
      if (v != nullptr) {
        d.dtype = inputs_[i].dtype();
        d.shape = MakeShape(inputs_[i].dims());
        d.max_dims = inputs_[i].dims();
        d.constant = v->constant();
      }
      request_.inputs.push_back(d);
    }
    const Value* out = node_->output(0);
    OperandDesc o;
    o.dtype = out->dtype();
    o.shape = out->shape();
    if (auto dims = StaticDims(o.shape)) o.max_dims = *dims;
    request_.outputs.push_back(o);
  }

  std::unique_ptr<Graph> graph_ = std::make_unique<Graph>();
  Node* node_ = nullptr;
  std::vector<Tensor> inputs_;
  KernelRequest request_;
};

// A Gemm-family layer (I8Case) in one float storage type.
class Int8Node : public TestLayer {
 public:
  Int8Node(const I8Case& c, std::vector<Tensor> inputs, DataType storage) {
    std::vector<bool> constant = {false, c.b_const, c.c_const};
    std::vector<Value*> ins;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor t = inputs[i].CastTo(storage);
      std::string name = fmt::format("in{}", i);
      ins.push_back(constant[i] ? graph_->AddConstant(name, t)
                                : graph_->AddInput(name, t.dtype(), MakeShape(t.dims())));
      inputs_.push_back(std::move(t));
    }
    AttributeMap attrs;
    if (c.op != "MatMul") {
      attrs.Set("transA", int64_t{c.ta});
      attrs.Set("transB", int64_t{c.tb});
      attrs.Set("alpha", c.alpha);
    }
    if (c.op == "Gemm" || c.op == "FusedGemm") attrs.Set("beta", c.beta);
    if (!c.act.empty()) attrs.Set("activation", c.act);
    if (c.amax) attrs.Set(kAmax, *c.amax);
    if (c.fp8_amax) attrs.Set(kFp8InputAmaxAttr, *c.fp8_amax);
    Value* out = graph_->AddValue("out");
    node_ = graph_->AddNode(c.op, "node", ins, {out}, attrs);
    if (c.model_scales) SetModelInt8Attrs(*node_, *c.model_scales);
    graph_->MarkOutput(out);
    MakeRequest();
  }

  // Raises the request's largest A and Y (a profile's max) above the shapes Run uses.
  void SetMaxShapes(std::vector<int64_t> a, std::vector<int64_t> y) {
    request_.inputs[0].max_dims = std::move(a);
    request_.outputs[0].max_dims = std::move(y);
  }

  // An FP8 edge's producer (ops/quant_edge.h): Y becomes E4M3 for a consumer of `out_amax`.
  void WriteFp8For(float out_amax) {
    node_->mutable_attrs().Set(std::string(kFp8OutputAmaxAttr), out_amax);
    node_->output(0)->set_dtype(kFp8EdgeType);
    request_.outputs[0].dtype = kFp8EdgeType;
  }
  // An FP8 edge's consumer: A arrives as E4M3, quantized with the node's input amax on the host
  // as the FP8 contract does.
  void ReadFp8Input() {
    const float inv = Fp8InvScale(*Fp8InputAmax(*node_));
    const std::vector<float> a = inputs_[0].ToFloatVector();
    Tensor q(kFp8EdgeType, inputs_[0].dims());
    auto* bytes = static_cast<uint8_t*>(q.mutable_raw());
    for (size_t i = 0; i < a.size(); ++i) bytes[i] = ToE4M3(a[i] * inv);
    inputs_[0] = std::move(q);
    node_->input(0)->set_dtype(kFp8EdgeType);
    request_.inputs[0].dtype = kFp8EdgeType;
  }
};

std::vector<Tensor> MakeInputs(const I8Case& c, std::mt19937& rng) {
  std::vector<Tensor> in;
  in.push_back(Random(c.a, rng));
  std::vector<int64_t> bd = !c.b_dims.empty() ? c.b_dims
                            : c.tb            ? std::vector<int64_t>{c.n, c.k}
                                              : std::vector<int64_t>{c.k, c.n};
  in.push_back(Random(bd, rng));
  if (!c.c.empty()) in.push_back(Random(c.c, rng));
  if (!c.col_factors.empty()) {
    auto scale = [&](Tensor& t, bool columns_first) {
      std::vector<float> v = t.ToFloatVector();
      const int64_t cols = t.dims().back();
      for (size_t i = 0; i < v.size(); ++i) {
        const int64_t col =
            columns_first ? static_cast<int64_t>(i) / cols : static_cast<int64_t>(i) % cols;
        v[i] *= c.col_factors[static_cast<size_t>(col) % c.col_factors.size()];
      }
      t = Tensor::FromVector(DataType::kFloat32, t.dims(), v);
    };
    scale(in[1], c.tb);
    if (in.size() > 2 && in[2].num_elements() == c.n) scale(in[2], false);
  }
  return in;
}

// A as the INT8 kernel sees it: scale amax/127, round half to even, saturate.
Tensor DequantizedA(const Tensor& x, float amax) {
  std::vector<float> v = x.ToFloatVector();
  const float scale = amax / 127.f;
  for (float& f : v) f = std::clamp(std::nearbyint(f * (1.f / scale)), -127.f, 127.f) * scale;
  return Tensor::FromVector(DataType::kFloat32, x.dims(), v);
}

// B as the INT8 kernel sees it: per output column n, symmetric absmax, each weight times the
// scale's reciprocal as QuantizeWeightsPerChannel computes it. (Dividing by the scale instead,
// as this helper did until session 28, rounds an occasional weight at a .5 boundary the other way:
// one of the 393216 weights of GemmMatchesTheCpuContract's [768, 512] case, which put every
// tactic, cuBLASLt's and kiln's alike, at 2.22e-5 from the "contract" since session 15.)
Tensor DequantizedB(const Tensor& b, bool tb) {
  std::vector<float> v = b.ToFloatVector();
  const int64_t rows = b.dims()[0], cols = b.dims()[1];
  const int64_t n = tb ? rows : cols, k = tb ? cols : rows;
  auto at = [&](int64_t j, int64_t i) -> float& { return v[tb ? j * k + i : i * n + j]; };
  for (int64_t j = 0; j < n; ++j) {
    float absmax = 0;
    for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::fabs(at(j, i)));
    const float scale = absmax > 0 ? absmax / 127.f : 1.f;
    const float inv = 1.f / scale;
    for (int64_t i = 0; i < k; ++i) {
      at(j, i) = std::clamp(std::nearbyint(at(j, i) * inv), -127.f, 127.f) * scale;
    }
  }
  return Tensor::FromVector(DataType::kFloat32, b.dims(), v);
}

struct Bounds {
  double contract, cpu_int8, fp32;
};
Bounds BoundsFor(DataType storage) {
  switch (storage) {
    case DataType::kFloat16:
      return {2e-3, 2e-3, 2e-2};
    case DataType::kBFloat16:
      return {1e-2, 1e-2, 3e-2};
    default:
      return {1e-5, 1e-4, 2e-2};
  }
}

// Runs every CUDA INT8 tactic of the case in `storage`; checks each as the file's top says.
// Returns the number of tactics run.
int CheckCase(const I8Case& c, uint32_t seed, DataType storage = DataType::kFloat32,
              std::vector<int64_t> max_a = {}, std::vector<int64_t> max_y = {},
              bool check_fp32 = true) {
  SCOPED_TRACE(c.Describe() + " storage " + std::string(ToString(storage)));
  std::mt19937 rng(seed);
  std::vector<Tensor> inputs = MakeInputs(c, rng);
  // Through f16/bf16 storage every reference sees the rounded values, as the kernel does.
  for (Tensor& t : inputs) t = t.CastTo(storage).CastTo(DataType::kFloat32);
  Int8Node node(c, inputs, storage);
  if (!max_a.empty()) node.SetMaxShapes(max_a, max_y);
  auto tactics = node.Tactics(BackendKind::kCuda, "i8-");
  EXPECT_FALSE(tactics.empty()) << "no CUDA INT8 tactic";
  if (tactics.empty()) return 0;

  Int8Node cpu(c, inputs, storage);
  const std::string float_prefix = std::string(ToString(storage)) + "-";
  std::vector<float> cpu_int8 = cpu.RunCpu("i8-");
  std::vector<float> fp32 = Int8Node(c, inputs, DataType::kFloat32).RunCpu("f32-");
  std::vector<Tensor> dq = inputs;
  dq[0] = DequantizedA(inputs[0], *c.amax);
  dq[1] = DequantizedB(inputs[1], c.tb);
  std::vector<float> contract = Int8Node(c, dq, DataType::kFloat32).RunCpu("f32-");
  const Bounds b = BoundsFor(storage);
  for (const auto& [p, t] : tactics) {
    SCOPED_TRACE(t.name);
    EXPECT_TRUE(t.name.starts_with(c.op.find("Gemm") != std::string::npos ? "i8-gemm-cuda-"
                                                                          : "i8-matmul-cuda-"));
    std::vector<float> y = node.RunCuda(p, t);
    if (y.empty()) continue;
    EXPECT_LE(RelL2(y, contract), b.contract) << "against the INT8 contract";
    EXPECT_LE(RelL2(y, cpu_int8), b.cpu_int8) << "against the CPU's INT8 kernel";
    if (check_fp32) {
      EXPECT_LE(RelL2(y, fp32), b.fp32) << "against FP32";
    } else {
      EXPECT_GT(RelL2(y, fp32), 0.1) << "clipping at amax had no effect";
    }
  }
  return static_cast<int>(tactics.size());
}

TEST_F(CudaInt8Test, GemmMatchesTheCpuContract) {
  // B [K, N]: channel n at stride 1; transposed: the other way. C as a row bias, [1, N], a full
  // runtime [M, N], a column [M, 1], a scalar, none; alpha and beta.
  EXPECT_GT(CheckCase({"Gemm", {7, 64}, 64, 24, false, false, 1.f, 1.f, {24}, true}, 1), 0);
  EXPECT_GT(CheckCase({"Gemm", {7, 64}, 64, 24, false, true, 0.5f, 2.f, {1, 24}, true}, 2), 0);
  EXPECT_GT(CheckCase({"Gemm", {32, 9}, 32, 16, true, false, 1.f, 0.5f, {9, 16}, false}, 3), 0);
  EXPECT_GT(CheckCase({"Gemm", {9, 32}, 32, 16, false, false, 1.f, 1.f, {9, 1}, true}, 4), 0);
  EXPECT_GT(CheckCase({"Gemm", {5, 48}, 48, 12, false, false, 1.f, 1.f, {1}, true}, 5), 0);
  EXPECT_GT(CheckCase({"Gemm", {5, 48}, 48, 12}, 6), 0);
  EXPECT_GT(CheckCase({"Gemm", {130, 256}, 256, 384, false, true, 1.f, 0.f, {384}, true}, 7), 0);
  EXPECT_GT(CheckCase({"Gemm", {256, 512}, 512, 768, false, true, 1.f, 1.f, {768}, true}, 8), 0);
}

TEST_F(CudaInt8Test, FusedGemmEveryActivation) {
  for (const char* act : {"relu", "gelu", "gelu_tanh", "sigmoid", "silu", "hardswish", "relu6"}) {
    EXPECT_GT(CheckCase({"FusedGemm", {8, 64}, 64, 32, false, true, 1.f, 1.f, {32}, true, act}, 11),
              0)
        << act;
  }
  EXPECT_GT(
      CheckCase({"FusedGemm", {8, 64}, 64, 32, false, false, 1.f, 1.f, {8, 32}, false, "gelu"}, 12),
      0);
}

TEST_F(CudaInt8Test, MatMulAndFusedMatMul) {
  // Batched A folds into M; a 1-D A is one row.
  EXPECT_GT(CheckCase({"MatMul", {2, 3, 32}, 32, 16}, 21), 0);
  EXPECT_GT(CheckCase({"MatMul", {10, 64}, 64, 24}, 22), 0);
  EXPECT_GT(CheckCase({"MatMul", {64}, 64, 24}, 23), 0);
  EXPECT_GT(
      CheckCase({"FusedMatMul", {10, 64}, 64, 24, false, true, 0.5f, 1.f, {24}, true, "gelu"}, 24),
      0);
  EXPECT_GT(
      CheckCase({"FusedMatMul", {4, 16, 64}, 64, 96, false, false, 1.f, 1.f, {96}, false, "relu"},
                25),
      0);
  EXPECT_GT(CheckCase({"FusedMatMul", {64, 10}, 64, 24, true, false, 1.f, 1.f, {24}, true}, 26), 0);
}

TEST_F(CudaInt8Test, HalfStorage) {
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    EXPECT_GT(CheckCase({"Gemm", {7, 64}, 64, 24, false, true, 1.f, 1.f, {24}, true}, 31, t), 0);
    EXPECT_GT(
        CheckCase(
            {"FusedMatMul", {2, 24, 128}, 128, 384, false, false, 1.f, 1.f, {384}, true, "gelu"},
            32, t),
        0);
    EXPECT_GT(
        CheckCase({"FusedGemm", {33, 20}, 20, 17, false, false, 1.f, 1.f, {33, 17}, false, "silu"},
                  33, t),
        0);
  }
}

// K or N not a multiple of 4 (IMMA needs it), single rows: the kernel pads K and N with zeros.
TEST_F(CudaInt8Test, OddShapesRunThroughThePadding) {
  EXPECT_GT(CheckCase({"Gemm", {1, 3}, 3, 5, false, false, 1.f, 1.f, {5}, true}, 41), 0);
  EXPECT_GT(CheckCase({"Gemm", {7, 13}, 13, 9, false, true, 1.f, 1.f, {7, 9}, false}, 42), 0);
  EXPECT_GT(CheckCase({"MatMul", {3, 5, 31}, 31, 33}, 43), 0);
  EXPECT_GT(
      CheckCase({"FusedGemm", {17, 129}, 129, 257, false, true, 1.f, 1.f, {257}, true, "relu"}, 44),
      0);
  EXPECT_GT(CheckCase({"Gemm", {2, 1}, 1, 1}, 45), 0);
}

// Tactics are chosen at the profile's largest M; each runs at smaller ones too.
TEST_F(CudaInt8Test, TacticsFromMaxShapesRunAtSmallerShapes) {
  EXPECT_GT(CheckCase({"Gemm", {3, 256}, 256, 128, false, true, 1.f, 1.f, {128}, true}, 51,
                      DataType::kFloat16, {512, 256}, {512, 128}),
            0);
  EXPECT_GT(
      CheckCase({"MatMul", {1, 2, 64}, 64, 64}, 52, DataType::kFloat32, {8, 128, 64}, {8, 128, 64}),
      0);
}

// kiln's own tensor-core kernel (int8_mma_gemm.cu) is offered beside cuBLASLt's on sm_80 and
// newer, in each of its tiles, and meets the same bounds (CheckCase runs every tactic) on
// BERT-base's shapes, with M, N and K off every tile's multiple and several K stages.
TEST_F(CudaInt8Test, OwnTensorCoreKernelRunsEveryTile) {
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major < 8) GTEST_SKIP() << "mma.sync int8 needs sm_80";
  std::mt19937 rng(71);
  Int8Node node(
      {"FusedMatMul", {2, 100, 768}, 768, 2304, false, false, 1.f, 1.f, {2304}, true, "gelu"},
      {Random({2, 100, 768}, rng), Random({768, 2304}, rng), Random({2304}, rng)},
      DataType::kFloat16);
  auto tactics = node.Tactics(BackendKind::kCuda, "i8-matmul-cuda-mma-");
  EXPECT_EQ(tactics.size(), 5u);
  const std::vector<I8Case> cases = {
      {"FusedMatMul", {2, 100, 768}, 768, 2304, false, false, 1.f, 1.f, {2304}, true, "gelu"},
      {"FusedGemm", {300, 3072}, 3072, 768, false, true, 1.f, 1.f, {300, 768}, false},
      {"Gemm", {129, 80}, 80, 257, false, false, 1.f, 1.f, {257}, true},
      {"MatMul", {3, 1, 48}, 48, 7}};
  uint32_t seed = 72;
  for (const I8Case& c : cases) {
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
      EXPECT_GT(CheckCase(c, seed++, t), 4);
    }
  }
}

// Whether kiln's wgmma kernel must run here: on a compute capability 9.0 GPU with sm_90a code in
// this build. A build with that code whose kernel the device does not run fails here rather than
// letting the wgmma tests skip unnoticed.
bool WgmmaExpected() {
  const bool available = cuda::Int8WgmmaAvailable();
#ifdef KILN_TEST_BUILT_FOR_SM90A
  int device = 0, major = 0, minor = 0;
  if (!available && cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      major == 9 && minor == 0) {
    ADD_FAILURE() << "this build has sm_90a code and the GPU is compute capability 9.0, yet "
                     "kiln's wgmma probe kernel did not run";
  }
#endif
  return available;
}

// An environment variable set for a scope (the kernel families a provider offers), and its
// earlier value (or its absence) restored after.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) before_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (before_) {
      setenv(name_, before_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> before_;
};

// KILN_CUDA_WGMMA_TILES naming every tile of the warpgroup kernel, those not yet GPU-tested
// (Int8WgmmaTileGpuTested) included: the tests that run every tile offer them all.
std::string EveryWgmmaTileName() {
  std::string names;
  for (int t : cuda::Int8WgmmaTileOrder(cuda::WgmmaTileUse::kProduct)) {
    names += std::string(names.empty() ? "" : ",") + cuda::Int8WgmmaTileName(t);
  }
  return names;
}

// kiln's warpgroup kernel (int8_wgmma_gemm.cu) on Hopper, alone (KILN_CUDA_INT8_KERNEL=wgmma):
// offered in each of its tiles, and meeting the same bounds (CheckCase runs every tactic) on
// BERT-base's shapes and odd ones: M, N and K off every tile's multiple, K within one partial
// 128-byte stage (80) and over 24 stages (3072, the ring of stages wrapping many times).
TEST_F(CudaInt8Test, OwnWarpgroupKernelRunsEveryTile) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  ScopedEnv wgmma_only("KILN_CUDA_INT8_KERNEL", "wgmma");
  ScopedEnv every_tile("KILN_CUDA_WGMMA_TILES", EveryWgmmaTileName().c_str());
  const int tiles = cuda::Int8WgmmaTileCount();
  const std::vector<I8Case> cases = {
      {"FusedMatMul", {2, 100, 768}, 768, 2304, false, false, 1.f, 1.f, {2304}, true, "gelu"},
      {"FusedGemm", {300, 3072}, 3072, 768, false, true, 1.f, 1.f, {300, 768}, false},
      {"Gemm", {129, 80}, 80, 257, false, false, 1.f, 1.f, {257}, true},
      {"MatMul", {1000, 512}, 512, 1000},
      {"MatMul", {3, 1, 48}, 48, 7},
      // More blocks than an H100 or H200 has SMs in every tile (297, 165, 153), most of them
      // inside Y: the whole-tile epilogue (int8_tile::WholeTile) with a bias and GELU.
      {"FusedMatMul", {4100, 300}, 300, 1104, false, false, 1.f, 1.f, {1104}, true, "gelu"}};
  uint32_t seed = 81;
  for (const I8Case& c : cases) {
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
      EXPECT_EQ(CheckCase(c, seed++, t), tiles);
    }
  }
}

// The bound of the TMA kernels' barrier waits: a phase that never completes traps after the
// bound (1 ms here; 10 s in the kernels) and the stream reports the failure, where an unbounded
// wait would spin until the job's own timeout. The trap loses the process's CUDA context, so the
// wait runs in a child process (a re-executed death test), which exits 3 on the reported failure
// (a trap reads as cudaErrorLaunchFailure on the drivers kiln has met; any error ends the wait).
// The child bounds itself with alarm(): a trap that never comes fails the test, it does not hang.
TEST(CudaInt8Device, TheTmaBarrierWaitTrapsAtItsBound) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        alarm(30);  // the child's own bound: a wait that never traps ends it by SIGALRM
        const cudaError_t launched = cuda::LaunchMbarWaitTimeoutProbe(1000 * 1000, nullptr);
        const cudaError_t done = cudaDeviceSynchronize();
        std::fprintf(stderr, "launch: %s; synchronize: %s\n", cudaGetErrorName(launched),
                     cudaGetErrorName(done));
        std::_Exit(launched == cudaSuccess && done != cudaSuccess ? 3 : 1);
      },
      ::testing::ExitedWithCode(3), "synchronize: cudaError");
}

// SkipLayerNormalization writing int8 for an INT8 edge or copy (ops/quant_edge.h): yq is y, as
// stored in its float type, quantized by the INT8 contract, bit for bit what the consumer's own
// quantization of y would give; with y null (an edge: Y itself int8) the same bytes; E4M3 (an FP8
// edge or copy) likewise by the FP8 contract. Both kernels:
// the row-in-registers one (n a multiple of 16 bytes' elements) and the re-reading one (n = 100),
// with and without a residual, in every float type.
TEST_F(CudaInt8Test, LayerNormWritesTheInt8OfItsOutput) {
  std::mt19937 rng(91);
  struct Case {
    DataType type;
    int64_t rows, n;
    bool skip;
  };
  for (const Case& c :
       {Case{DataType::kFloat16, 64, 768, true}, Case{DataType::kFloat16, 8, 100, true},
        Case{DataType::kFloat32, 16, 4096, false}, Case{DataType::kBFloat16, 33, 1536, true},
        Case{DataType::kFloat32, 7, 100, false}}) {
    SCOPED_TRACE(fmt::format("{} rows {} n {} skip {}", ToString(c.type), c.rows, c.n, c.skip));
    const Tensor x = Random({c.rows, c.n}, rng, -3.f, 3.f).CastTo(c.type);
    const Tensor skip = Random({c.rows, c.n}, rng).CastTo(c.type);
    const Tensor gamma = Random({c.n}, rng, 0.5f, 2.f).CastTo(c.type);
    const Tensor beta = Random({c.n}, rng).CastTo(c.type);
    const float scale = 2.5f / 127.f;  // values beyond 2.5 saturate
    const size_t bytes = x.size_bytes(), count = static_cast<size_t>(c.rows * c.n);
    void *dx = nullptr, *dskip = nullptr, *dg = nullptr, *db = nullptr, *dy = nullptr;
    int8_t *dq = nullptr, *dq_only = nullptr;
    uint8_t* d8 = nullptr;
    const float amax8 = 3.f, inv8 = Fp8InvScale(amax8);
    ASSERT_EQ(cudaMalloc(&dx, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dskip, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dg, gamma.size_bytes()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&db, beta.size_bytes()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dq, count), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dq_only, count), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d8, count), cudaSuccess);
    cudaMemcpy(dx, x.raw(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dskip, skip.raw(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dg, gamma.raw(), gamma.size_bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(db, beta.raw(), beta.size_bytes(), cudaMemcpyHostToDevice);
    const cuda::Elem t = c.type == DataType::kFloat16    ? cuda::Elem::kF16
                         : c.type == DataType::kBFloat16 ? cuda::Elem::kBF16
                                                         : cuda::Elem::kF32;
    const void* sk = c.skip ? dskip : nullptr;
    ASSERT_EQ(cuda::LaunchSkipLayerNorm(t, dx, sk, dg, db, dy, nullptr, c.rows, c.n, 1e-5f, nullptr,
                                        dq, 1.f / scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkipLayerNorm(t, dx, sk, dg, db, nullptr, nullptr, c.rows, c.n, 1e-5f,
                                        nullptr, dq_only, 1.f / scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkipLayerNorm(t, dx, sk, dg, db, nullptr, nullptr, c.rows, c.n, 1e-5f,
                                        nullptr, d8, inv8, /*yq_e4m3=*/true),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor y(c.type, {c.rows, c.n});
    std::vector<int8_t> q(count), q_only(count);
    std::vector<uint8_t> e4m3(count);
    cudaMemcpy(y.mutable_raw(), dy, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(q.data(), dq, count, cudaMemcpyDeviceToHost);
    cudaMemcpy(q_only.data(), dq_only, count, cudaMemcpyDeviceToHost);
    cudaMemcpy(e4m3.data(), d8, count, cudaMemcpyDeviceToHost);
    const Tensor yf = y.CastTo(DataType::kFloat32);
    const float* pyf = yf.data<float>();
    int mismatched = 0, saturated = 0, e4m3_mismatched = 0;
    for (size_t i = 0; i < count; ++i) {
      mismatched += q[i] != QuantizeInt8(pyf[i], 1.f / scale) || q_only[i] != q[i];
      saturated += q[i] == 127 || q[i] == -127;
      e4m3_mismatched += e4m3[i] != ToE4M3(pyf[i] * inv8);
    }
    EXPECT_EQ(mismatched, 0);
    EXPECT_EQ(e4m3_mismatched, 0);
    EXPECT_GT(saturated, 0);  // the saturation was exercised
    EXPECT_LT(saturated, static_cast<int>(count / 4));
    for (void* p : {dx, dskip, dg, db, dy, static_cast<void*>(dq), static_cast<void*>(dq_only),
                    static_cast<void*>(d8)}) {
      cudaFree(p);
    }
  }
}

// Saturation above amax, and per-channel scales: columns scaled 1e-3..10 keep their accuracy.
TEST_F(CudaInt8Test, SaturationAndPerChannelScales) {
  I8Case sat{"Gemm", {16, 64}, 64, 8, false, false, 1.f, 1.f, {8}, true};
  sat.amax = 0.25f;
  // The contract and the CPU kernel clip too; FP32 does not.
  EXPECT_GT(CheckCase(sat, 61, DataType::kFloat32, {}, {}, /*check_fp32=*/false), 0);
  I8Case scaled{"Gemm", {16, 64}, 64, 8, false, false, 1.f, 1.f, {8}, true};
  scaled.col_factors = {1e-3f, 1.f, 1e-2f, 10.f};
  EXPECT_GT(CheckCase(scaled, 62), 0);
  scaled.tb = true;
  EXPECT_GT(CheckCase(scaled, 63, DataType::kFloat16), 0);
}

// What INT8 cannot run is declined (no i8 tactic; the layer stays FP16 with a reason), while the
// FP16/FP32 cuBLASLt tactics stay offered.
TEST_F(CudaInt8Test, DeclinesWhatItCannotRun) {
  std::mt19937 rng(71);
  auto offered = [&](const I8Case& c, DataType storage = DataType::kFloat16) {
    Int8Node node(c, MakeInputs(c, rng), storage);
    EXPECT_FALSE(node.Tactics(BackendKind::kCuda, std::string(ToString(storage)) + "-").empty())
        << c.Describe() << ": the float tactics must remain";
    return node.Tactics(BackendKind::kCuda, "i8-").size();
  };
  I8Case base{"Gemm", {8, 64}, 64, 32, false, false, 1.f, 1.f, {32}, true};
  EXPECT_GT(offered(base), 0u);
  I8Case c = base;
  c.amax = std::nullopt;  // not marked by the precision pass
  EXPECT_EQ(offered(c), 0u);
  for (float bad : {0.f, -1.f, std::numeric_limits<float>::infinity()}) {
    c = base;
    c.amax = bad;
    EXPECT_EQ(offered(c), 0u) << bad;
  }
  c = base;
  c.b_const = false;  // B is not a weight
  EXPECT_EQ(offered(c), 0u);
  c = base;
  c.alpha = 0.f;
  EXPECT_EQ(offered(c), 0u);
  // A batched constant B (MatMul [2, K, N]).
  I8Case batched{"MatMul", {2, 8, 64}, 64, 32};
  batched.b_dims = {2, 64, 32};
  EXPECT_EQ(offered(batched), 0u);
  // A transposed A of rank 3.
  I8Case ta3{"FusedMatMul", {2, 64, 8}, 64, 32, true, false, 1.f, 1.f, {32}, true};
  EXPECT_EQ(offered(ta3), 0u);
  // K so deep that 127 * 127 * K could overflow the int32 accumulator.
  I8Case deep{"MatMul", {1, 140000}, 140000, 4};
  EXPECT_EQ(offered(deep, DataType::kFloat32), 0u);
}

// ---- Without a GPU: the host-side plan (geometry, B packed as cuBLASLt's transposed A, A's
// strides, C's broadcasting, the per-column scales) replayed on the host with the product the
// kernel asks cuBLASLt for (column-major D[Np, M] = A_lt^T B_lt, A_lt = packed B stored [Kp, Np],
// B_lt = quantized A stored [Kp, M]) and the epilogue's formula, against the CPU's INT8 kernel.
std::vector<float> ReplayOnHost(const I8Case& c, const Int8Node& node) {
  auto spec = cuda::ReadGemmSpec(node.node());
  EXPECT_TRUE(spec.ok());
  const std::vector<Tensor>& in = node.inputs();
  auto mk = cuda::QuantRowsAndDepth(*spec, in[0].dims());
  EXPECT_TRUE(mk.ok()) << mk.status().ToString();
  const auto [m, k] = *mk;
  const cuda::Int8PackedB b = cuda::PackInt8B(*spec, in[1], *c.amax);
  EXPECT_EQ(b.k, k);
  EXPECT_EQ(b.kp % 4, 0);
  EXPECT_EQ(b.np % 4, 0);
  const cuda::QuantAStrides as = cuda::QuantAStridesFor(*spec, m, k);
  std::vector<int64_t> c_dims = in.size() > 2 ? in[2].dims() : std::vector<int64_t>{};
  auto addend = cuda::ResolveQuantAddend(*spec, in.size() > 2 ? &c_dims : nullptr, m, b.n);
  EXPECT_TRUE(addend.ok()) << addend.status().ToString();
  const std::vector<float> a = in[0].ToFloatVector();
  const float inv = Int8ActivationInvScale(*c.amax);
  std::vector<int8_t> a_q(static_cast<size_t>(m * b.kp), 0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      a_q[i * b.kp + kk] = QuantizeInt8(a[i * as.row_stride + kk * as.col_stride], inv);
    }
  }
  std::vector<float> cv = in.size() > 2 ? in[2].ToFloatVector() : std::vector<float>{};
  std::vector<float> y(static_cast<size_t>(m * b.n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < b.n; ++j) {
      int32_t acc = 0;  // D(j, i) at i * Np + j
      for (int64_t kk = 0; kk < b.kp; ++kk) {
        acc += int32_t{b.packed[j * b.kp + kk]} * int32_t{a_q[i * b.kp + kk]};
      }
      float v = static_cast<float>(acc) * b.col_scale[j];
      if (addend->present) {
        v += addend->factor * cv[i * addend->row_stride + j * addend->col_stride];
      }
      if (c.act == "relu") v = std::max(v, 0.f);
      y[i * b.n + j] = v;
    }
  }
  return y;
}

TEST(CudaInt8Host, ThePackedPlanReplaysTheCpuInt8Kernel) {
  const std::vector<I8Case> cases = {
      {"Gemm", {7, 64}, 64, 24, false, false, 1.f, 1.f, {24}, true},
      {"Gemm", {7, 64}, 64, 24, false, true, 0.5f, 2.f, {1, 24}, true},
      {"Gemm", {32, 9}, 32, 16, true, false, 1.f, 0.5f, {9, 16}, false},
      {"Gemm", {9, 32}, 32, 16, false, false, 1.f, 1.f, {9, 1}, true},
      {"Gemm", {5, 48}, 48, 12, false, false, 1.f, 1.f, {1}, true},
      {"Gemm", {5, 48}, 48, 12, false, false, 1.f, 0.f, {5, 12}, false},
      {"Gemm", {13, 7}, 13, 9, true, true, -1.5f, 1.f, {}, false},
      {"Gemm", {1, 3}, 3, 5, false, false, 1.f, 1.f, {5}, true},
      {"FusedGemm", {17, 129}, 129, 33, false, true, 1.f, 1.f, {33}, true, "relu"},
      {"MatMul", {2, 3, 31}, 31, 33},
      {"MatMul", {64}, 64, 24},
      {"FusedMatMul", {64, 10}, 64, 24, true, false, 1.f, 1.f, {24}, true, "relu"},
      {"FusedMatMul", {4, 6, 20}, 20, 36, false, true, 0.25f, 1.f, {36}, false},
  };
  uint32_t seed = 100;
  for (const I8Case& c : cases) {
    SCOPED_TRACE(c.Describe());
    std::mt19937 rng(++seed);
    std::vector<Tensor> inputs = MakeInputs(c, rng);
    Int8Node node(c, inputs, DataType::kFloat32);
    const std::vector<float> cpu = node.RunCpu("i8-");
    const std::vector<float> replay = ReplayOnHost(c, node);
    EXPECT_LE(RelL2(replay, cpu), 1e-5);
    // Saturation: amax 0.25 clips most of A, on both.
    I8Case sat = c;
    sat.amax = 0.25f;
    Int8Node clipped(sat, inputs, DataType::kFloat32);
    EXPECT_LE(RelL2(ReplayOnHost(sat, clipped), clipped.RunCpu("i8-")), 1e-5) << "amax 0.25";
  }
}

// Without a GPU: GemmMatchesTheCpuContract's largest case (the one at 2.22e-5 on every GPU since
// session 15) replayed on the host, against the contract as CheckCase computes it. The replay is
// what every CUDA INT8 tactic computes (exact int32 sums, one epilogue formula), so the contract's
// 1e-5 bound holds for the arithmetic, here without a GPU.
TEST(CudaInt8Host, TheReplayMeetsTheContractOnTheDeepestCase) {
  const I8Case c{"Gemm", {256, 512}, 512, 768, false, true, 1.f, 1.f, {768}, true};
  std::mt19937 rng(8);  // CheckCase's seed for it
  const std::vector<Tensor> inputs = MakeInputs(c, rng);
  Int8Node node(c, inputs, DataType::kFloat32);
  std::vector<Tensor> dq = inputs;
  dq[0] = DequantizedA(inputs[0], *c.amax);
  dq[1] = DequantizedB(inputs[1], c.tb);
  const std::vector<float> contract = Int8Node(c, dq, DataType::kFloat32).RunCpu("f32-");
  EXPECT_LE(RelL2(ReplayOnHost(c, node), contract), BoundsFor(DataType::kFloat32).contract);
}

// Without a GPU: a layer with a QDQ model's scales (passes/qdq_fusion.cc). With activation zero
// point 0 the CUDA product takes it, packing the model's own integer weights with the model's
// scales; its plan replayed on the host agrees with the CPU kernel, which quantizes A as the
// model's QuantizeLinear (the device's x * (1/s) differs from x / s only at rounding ties, and
// nothing saturates here). Another zero point is declined: the device quantization is symmetric.
// An int8 NHWC convolution problem for implicit_gemm_conv.h: random int8 input and weights, the
// kernels' operands (x with channels padded to Cp, the packed weights), and the direct
// convolution's int32 result [N * OH * OW, K] (rows in NHWC order) to compare with.
struct ConvShape {
  int64_t n, c, h, w, k;
  int32_t r, s, sh, sw, pt, pl, pb, pr, dh, dw;
  std::string Describe() const {
    return fmt::format(
        "N {} C {} H {} W {} K {} window {}x{} stride {}x{} pad {},{},{},{} "
        "dilation {}x{}",
        n, c, h, w, k, r, s, sh, sw, pt, pl, pb, pr, dh, dw);
  }
};
struct ConvProblem {
  cuda::ImplicitGemmConv g;
  int64_t kp = 0;
  std::vector<int8_t> xq, b;
  std::vector<int32_t> want;  // [rows, K]
};
ConvProblem MakeConvProblem(const ConvShape& sh, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(-127, 127);
  ConvProblem pr;
  cuda::ImplicitGemmConv& g = pr.g;
  g.batch = sh.n;
  g.h = sh.h;
  g.w = sh.w;
  g.cp = cuda::PaddedChannels(sh.c);
  g.r = sh.r;
  g.s = sh.s;
  g.stride_h = sh.sh;
  g.stride_w = sh.sw;
  g.pad_top = sh.pt;
  g.pad_left = sh.pl;
  g.dil_h = sh.dh;
  g.dil_w = sh.dw;
  g.oh = (sh.h + sh.pt + sh.pb - sh.dh * (sh.r - 1) - 1) / sh.sh + 1;
  g.ow = (sh.w + sh.pl + sh.pr - sh.dw * (sh.s - 1) - 1) / sh.sw + 1;
  std::vector<int8_t> x(static_cast<size_t>(sh.n * sh.c * sh.h * sh.w));  // NCHW
  for (int8_t& v : x) v = static_cast<int8_t>(dist(rng));
  pr.xq.assign(static_cast<size_t>(sh.n * sh.h * sh.w * g.cp), 0);
  for (int64_t n = 0; n < sh.n; ++n) {
    for (int64_t c = 0; c < sh.c; ++c) {
      for (int64_t i = 0; i < sh.h * sh.w; ++i) {
        pr.xq[static_cast<size_t>((n * sh.h * sh.w + i) * g.cp + c)] =
            x[static_cast<size_t>((n * sh.c + c) * sh.h * sh.w + i)];
      }
    }
  }
  std::vector<int8_t> w(static_cast<size_t>(sh.k * sh.c * sh.r * sh.s));
  for (int8_t& v : w) v = static_cast<int8_t>(dist(rng));
  pr.kp = cuda::QuantPadded(sh.k);
  pr.b = cuda::PackConvWeights(w.data(), sh.k, sh.c, sh.r, sh.s, pr.kp);
  pr.want.assign(static_cast<size_t>(g.rows() * sh.k), 0);
  for (int64_t m = 0; m < g.rows(); ++m) {
    const int64_t n = m / (g.oh * g.ow), oy = m / g.ow % g.oh, ox = m % g.ow;
    for (int64_t k = 0; k < sh.k; ++k) {
      int32_t acc = 0;
      for (int64_t c = 0; c < sh.c; ++c) {
        for (int32_t kr = 0; kr < sh.r; ++kr) {
          for (int32_t ks = 0; ks < sh.s; ++ks) {
            const int64_t iy = oy * sh.sh - sh.pt + kr * sh.dh;
            const int64_t ix = ox * sh.sw - sh.pl + ks * sh.dw;
            if (iy < 0 || iy >= sh.h || ix < 0 || ix >= sh.w) continue;
            acc += x[static_cast<size_t>(((n * sh.c + c) * sh.h + iy) * sh.w + ix)] *
                   w[static_cast<size_t>(((k * sh.c + c) * sh.r + kr) * sh.s + ks)];
          }
        }
      }
      pr.want[static_cast<size_t>(m * sh.k + k)] = acc;
    }
  }
  return pr;
}

// Strides, padding (asymmetric too), dilation, 1x1 and 7x7 windows, channel counts below, at and
// above 16, K off 16.
const ConvShape kConvShapes[] = {
    {2, 3, 7, 9, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1},      // ResNet's stem shape, small
    {1, 64, 8, 8, 16, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1},    // 1x1
    {2, 20, 11, 6, 7, 3, 2, 1, 2, 2, 1, 0, 1, 2, 1},    // asymmetric padding, dilation
    {1, 16, 12, 12, 8, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1},   // 7x7, stride 2
    {3, 32, 9, 9, 12, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1},    // 1x1 downsampling
    {1, 40, 5, 13, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}};  // C off 16, K off 16

// The implicit-GEMM view of an NHWC convolution (implicit_gemm_conv.h), replayed on the host in
// integers: gathering A's rows through RowOf/OffsetOf from the channel-padded input and
// multiplying by the packed weights gives exactly the direct convolution; and every 16-byte
// chunk of a row of A is one contiguous run of x or all padding, as the kernels' 16-byte copies
// need.
TEST(CudaInt8Host, ImplicitGemmRowsGatherTheConvolution) {
  std::mt19937 rng(77);
  for (const ConvShape& sh : kConvShapes) {
    SCOPED_TRACE(sh.Describe());
    const ConvProblem pr = MakeConvProblem(sh, rng);
    const cuda::ImplicitGemmConv& g = pr.g;
    ASSERT_GT(g.rows(), 0);
    ASSERT_EQ(static_cast<int64_t>(pr.b.size()), pr.kp * g.depth());
    int64_t mismatches = 0, bad_chunks = 0;
    for (int64_t m = 0; m < g.rows(); ++m) {
      const cuda::ImplicitGemmRow row = cuda::RowOf(g, m);
      std::vector<int32_t> a(static_cast<size_t>(g.depth()));
      for (int64_t j = 0; j < g.depth(); ++j) {
        const int64_t off = cuda::OffsetOf(g, row, j);
        a[static_cast<size_t>(j)] = off < 0 ? 0 : pr.xq[static_cast<size_t>(off)];
        if (j % 16 == 0) {
          const int64_t last = cuda::OffsetOf(g, row, j + 15);
          bad_chunks += off < 0 ? last >= 0 : last != off + 15;
        }
      }
      for (int64_t k = 0; k < pr.kp; ++k) {
        int32_t got = 0;
        for (int64_t j = 0; j < g.depth(); ++j) {
          got += a[static_cast<size_t>(j)] * pr.b[static_cast<size_t>(k * g.depth() + j)];
        }
        const int32_t want = k < sh.k ? pr.want[static_cast<size_t>(m * sh.k + k)] : 0;
        mismatches += got != want;
      }
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(bad_chunks, 0);
  }
}

// The walk of the kernels' convolution loaders (ImplicitGemmThreadWalk, which
// implicit_gemm_loader.cuh's loader runs): each thread decomposes its rows once (RowOf, NoRow past
// the last) and its column once (ColumnOf), then moves the column a stage at a time (Advance, no
// division). Every chunk it reads, over every stage and thread of several blocks, is the chunk
// OffsetOf gives (or zeros past the rows and the depth), for channel counts below, at and above
// the stage width, in the stage shapes of the wgmma kernel (128 bytes: 128 or 256 rows, 256
// threads) and of the mma.sync kernel (64 bytes: 64 or 128 rows, 128 or 256 threads).
template <int kRows, int kChunks, int kThreads>
void CheckThreadWalk(const cuda::ImplicitGemmConv& g) {
  using Walk = cuda::ImplicitGemmThreadWalk<kRows, kChunks, kThreads>;
  SCOPED_TRACE(fmt::format("{} rows x {} chunks, {} threads", kRows, kChunks, kThreads));
  constexpr int kStage = kChunks * 16;
  const int64_t ktiles = (g.depth() + kStage - 1) / kStage;
  int64_t checked = 0, mismatches = 0;
  for (int64_t row0 = 0; row0 < g.rows() + kRows; row0 += kRows) {
    for (int tid = 0; tid < kThreads; ++tid) {
      Walk walk;
      walk.Init(g, row0, tid);
      for (int64_t kt = 0; kt < ktiles; ++kt) {
        const int64_t j = kt * kStage + (tid % kChunks) * 16;
        for (int it = 0; it < Walk::kPer; ++it) {
          const int64_t m = row0 + Walk::RowInTile(tid, it);
          const int64_t want =
              m < g.rows() && j < g.depth() ? cuda::OffsetOf(g, cuda::RowOf(g, m), j) : -1;
          mismatches += walk.Offset(g, it) != want;
          ++checked;
        }
        walk.Next(g);
      }
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaInt8Host, TheLoadersColumnWalkMatchesTheDividedOffsets) {
  std::mt19937 rng(79);
  std::vector<ConvShape> shapes(std::begin(kConvShapes), std::end(kConvShapes));
  shapes.push_back({1, 200, 5, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1});  // Cp 208: across stages
  shapes.push_back({1, 512, 3, 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2, 2});  // Cp 4 stages, dilation
  for (const ConvShape& sh : shapes) {
    SCOPED_TRACE(sh.Describe());
    const cuda::ImplicitGemmConv g = MakeConvProblem(sh, rng).g;
    ASSERT_TRUE(cuda::ImplicitGemmIndexable(g));
    CheckThreadWalk<128, 8, 256>(g);  // wgmma, one 64-row tile per warpgroup
    CheckThreadWalk<256, 8, 256>(g);  // wgmma, two
    CheckThreadWalk<128, 4, 128>(g);  // mma.sync 128x128, 128x64
    CheckThreadWalk<64, 4, 128>(g);   // mma.sync 64x128
    CheckThreadWalk<128, 4, 256>(g);  // mma.sync 128x256, 128x128 with eight warps
  }
}

// One INT8 Conv or FusedConv node (conv_int8.cc) on random inputs: X, the constant weight
// [K, C, R, S], a constant bias and a residual Z as the case asks, channels-last (kiln_layout
// "NHWC": X [N, H, W, C], Z and Y [N, OH, OW, K]) or ONNX's NCHW. The same case in both layouts
// is the same layer, so the CPU's INT8 kernel (NCHW) checks the CUDA one (NHWC).
struct ConvCase {
  ConvShape sh;
  bool bias = false, z = false;
  std::string act{};  // FusedConv's activation; "" with neither bias nor Z: a plain Conv
  std::string Describe() const {
    return fmt::format("{} bias={} z={} act={}", sh.Describe(), bias, z, act);
  }
  bool fused() const { return bias || z || !act.empty(); }
  int64_t oh() const { return (sh.h + sh.pt + sh.pb - sh.dh * (sh.r - 1) - 1) / sh.sh + 1; }
  int64_t ow() const { return (sh.w + sh.pl + sh.pr - sh.dw * (sh.s - 1) - 1) / sh.sw + 1; }
};

// NCHW <-> NHWC for a 4-D float tensor.
Tensor ToNhwc(const Tensor& t) {
  const auto& d = t.dims();
  const std::vector<float> v = t.ToFloatVector();
  std::vector<float> o(v.size());
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t c = 0; c < d[1]; ++c)
      for (int64_t i = 0; i < d[2] * d[3]; ++i)
        o[static_cast<size_t>((n * d[2] * d[3] + i) * d[1] + c)] =
            v[static_cast<size_t>((n * d[1] + c) * d[2] * d[3] + i)];
  return Tensor::FromVector(DataType::kFloat32, {d[0], d[2], d[3], d[1]}, o);
}

class ConvNode : public TestLayer {
 public:
  // inputs: X, W, bias, Z in NCHW (absent ones skipped), as float32.
  ConvNode(const ConvCase& c, const std::vector<Tensor>& nchw, bool nhwc, DataType storage,
           float amax = 1.f) {
    std::vector<Value*> ins;
    for (size_t i = 0; i < nchw.size(); ++i) {
      const bool activation = i == 0 || i == 3;
      Tensor t = (nhwc && activation ? ToNhwc(nchw[i]) : nchw[i]).CastTo(storage);
      const std::string name = fmt::format("in{}", i);
      ins.push_back(activation ? graph_->AddInput(name, t.dtype(), MakeShape(t.dims()))
                               : graph_->AddConstant(name, t));
      inputs_.push_back(std::move(t));
    }
    if (c.z && !c.bias) ins[2] = nullptr;  // Z without a bias: input 2 absent
    AttributeMap attrs;
    attrs.Set("kernel_shape", std::vector<int64_t>{c.sh.r, c.sh.s});
    attrs.Set("strides", std::vector<int64_t>{c.sh.sh, c.sh.sw});
    attrs.Set("pads", std::vector<int64_t>{c.sh.pt, c.sh.pl, c.sh.pb, c.sh.pr});
    attrs.Set("dilations", std::vector<int64_t>{c.sh.dh, c.sh.dw});
    if (!c.act.empty()) attrs.Set("activation", c.act);
    attrs.Set(kAmax, amax);
    if (nhwc) attrs.Set("kiln_layout", std::string("NHWC"));
    Value* out = graph_->AddValue("out");
    node_ = graph_->AddNode(c.fused() ? "FusedConv" : "Conv", "node", ins, {out}, attrs);
    graph_->MarkOutput(out);
    MakeRequest();
  }

  // The CPU's first tactic starting with `prefix` (an NCHW node: "i8-" its INT8 kernel, "f32-"
  // the float one), Y as floats.
  std::vector<float> RunCpu(std::string_view prefix = "i8-") { return TestLayer::RunCpu(prefix); }
};

// Random X, W (channel k scaled by a factor in [0.25, 2]: per-channel ranges), bias and Z, NCHW.
std::vector<Tensor> MakeConvInputs(const ConvCase& c, std::mt19937& rng) {
  const ConvShape& sh = c.sh;
  std::vector<Tensor> in;
  in.push_back(Random({sh.n, sh.c, sh.h, sh.w}, rng));
  std::vector<float> w = Random({sh.k, sh.c, sh.r, sh.s}, rng).ToFloatVector();
  const int64_t per = sh.c * sh.r * sh.s;
  for (int64_t k = 0; k < sh.k; ++k) {
    const float f = 0.25f + 1.75f * static_cast<float>(k % 7) / 6.f;
    for (int64_t i = 0; i < per; ++i) w[static_cast<size_t>(k * per + i)] *= f;
  }
  in.push_back(Tensor::FromVector(DataType::kFloat32, {sh.k, sh.c, sh.r, sh.s}, w));
  if (c.bias || c.z) in.push_back(Random({sh.k}, rng));
  if (c.z) in.push_back(Random({sh.n, sh.k, c.oh(), c.ow()}, rng));
  return in;
}

const ConvCase kInt8ConvCases[] = {
    {kConvShapes[0], false, false, ""},       // a plain Conv, C 3 (the stem's padding to 16)
    {kConvShapes[1], true, false, "relu"},    // 1x1 with a bias
    {kConvShapes[2], true, true, "relu"},     // bias, residual, dilation, asymmetric padding
    {kConvShapes[3], true, false, ""},        // 7x7 stride 2
    {kConvShapes[4], false, true, ""},        // a residual without a bias
    {kConvShapes[5], true, true, "sigmoid"},  // C and K off 16
};

// The layer's plan (quant_conv_plan.h) replayed on the host: X quantized by the INT8 contract into
// [N, H, W, Cp], A's rows gathered through the implicit GEMM, times the packed weights in int32,
// then the epilogue (col_scale, bias, Z, activation), as the kernel computes it. It agrees with
// the CPU's INT8 convolution on the same layer in NCHW: the same engine graph on either backend.
std::vector<float> ReplayConvOnHost(const ConvCase& c, const ConvNode& node) {
  std::optional<cuda::QuantizedConv> q = cuda::ResolveQuantizedConv(node.request());
  EXPECT_TRUE(q.has_value());
  if (!q) return {};
  const std::vector<Tensor>& in = node.inputs();
  auto y_dims = StaticDims(node.node().output(0)->shape());
  auto g = cuda::ImplicitGemmFor(*q, in[0].dims(), *y_dims);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return {};
  auto w = Int8WeightsFor(node.node(), in[1].CastTo(DataType::kFloat32));
  EXPECT_TRUE(w.ok());
  if (!w.ok()) return {};
  const cuda::Int8PackedConv p = cuda::PackInt8Conv(*q, *w);
  EXPECT_EQ(p.depth, g->depth());
  const std::vector<float> x = in[0].ToFloatVector();
  std::vector<int8_t> xq(static_cast<size_t>(g->batch * g->h * g->w * g->cp), 0);
  for (int64_t i = 0; i < g->batch * g->h * g->w; ++i) {
    for (int64_t ch = 0; ch < q->c; ++ch) {
      xq[static_cast<size_t>(i * g->cp + ch)] =
          QuantizeInt8(x[static_cast<size_t>(i * q->c + ch)], 1.f / q->input.scale);
    }
  }
  const std::vector<float> bias = c.bias ? in[2].ToFloatVector() : std::vector<float>{};
  const std::vector<float> z = c.z ? in[3].ToFloatVector() : std::vector<float>{};
  std::vector<float> y(static_cast<size_t>(g->rows() * q->k));
  for (int64_t m = 0; m < g->rows(); ++m) {
    const cuda::ImplicitGemmRow row = cuda::RowOf(*g, m);
    for (int64_t k = 0; k < q->k; ++k) {
      int32_t acc = 0;
      for (int64_t j = 0; j < g->depth(); ++j) {
        const int64_t off = cuda::OffsetOf(*g, row, j);
        if (off >= 0) {
          acc += int32_t{xq[static_cast<size_t>(off)]} *
                 p.packed[static_cast<size_t>(k * p.depth + j)];
        }
      }
      float v = static_cast<float>(acc) * p.col_scale[static_cast<size_t>(k)];
      if (c.bias) v += bias[static_cast<size_t>(k)];
      if (c.z) v += z[static_cast<size_t>(m * q->k + k)];
      if (c.act == "relu") v = std::max(v, 0.f);
      if (c.act == "sigmoid") v = 1.f / (1.f + std::exp(-v));
      y[static_cast<size_t>(m * q->k + k)] = v;
    }
  }
  return y;
}

// Y [N, K, OH, OW] as NHWC floats.
std::vector<float> NchwToNhwc(const std::vector<float>& v, const ConvCase& c) {
  return ToNhwc(Tensor::FromVector(DataType::kFloat32, {c.sh.n, c.sh.k, c.oh(), c.ow()}, v))
      .ToFloatVector();
}

// Every INT8 family is offered unless KILN_CUDA_INT8_KERNEL names one (kiln's wgmma kernel among
// them by default since every CUDA INT8/FP8 test passed with it, H100, session 34).
TEST(CudaInt8Host, EveryInt8FamilyIsOfferedUnlessOneIsNamed) {
  auto families = [](const char* value) {
    ScopedEnv env("KILN_CUDA_INT8_KERNEL", value ? value : "");
    if (!value) unsetenv("KILN_CUDA_INT8_KERNEL");
    const cuda::Int8Families f = cuda::Int8FamiliesFromEnv();
    return std::tuple{f.lt, f.mma, f.wgmma};
  };
  EXPECT_EQ(families(nullptr), std::tuple(true, true, true));
  EXPECT_EQ(families("all"), std::tuple(true, true, true));
  EXPECT_EQ(families("mma"), std::tuple(false, true, false));
  EXPECT_EQ(families("wgmma"), std::tuple(false, false, true));
  EXPECT_EQ(families("cublaslt"), std::tuple(true, false, false));
}

// The providers offer the warpgroup kernel's tiles likeliest fastest first (a search at the
// default opt level times two of each family): every tile once; for a product the two TMA tiles
// (between them the fastest at BERT-base's four products, H100, sessions 35-36), for a pointwise
// convolution tma-128x256 then 128x128x2 (ResNet-50's, session 36), for a gathering convolution
// 128x128x2 first (session 34).
TEST(CudaInt8Host, TheWarpgroupTilesAreOfferedLikeliestFirstEachOnce) {
  using cuda::WgmmaTileUse;
  struct Case {
    WgmmaTileUse use;
    std::string first, second;
  };
  for (const Case& c : {Case{WgmmaTileUse::kProduct, "tma-128x256", "tma-256x128"},
                        Case{WgmmaTileUse::kPointwiseConv, "tma-128x256", "128x128x2"},
                        Case{WgmmaTileUse::kGatherConv, "128x128x2", "128x128"}}) {
    const bool gather = c.use == WgmmaTileUse::kGatherConv;
    SCOPED_TRACE(c.first + "," + c.second);
    std::vector<int> order = cuda::Int8WgmmaTileOrder(c.use);
    EXPECT_EQ(std::string(cuda::Int8WgmmaTileName(order[0])), c.first);
    EXPECT_EQ(std::string(cuda::Int8WgmmaTileName(order[1])), c.second);
    // Every tile once (a gathering convolution: every tile that gathers once).
    std::vector<int> want;
    for (int t = 0; t < cuda::Int8WgmmaTileCount(); ++t) {
      if (!gather || cuda::Int8WgmmaTileGathers(t)) want.push_back(t);
    }
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, want);
    if (gather) {
      EXPECT_EQ(static_cast<int>(order.size()), cuda::Int8WgmmaConvTileCount());
    }
  }
}

// A product's order for its shape: the tile whose waves of blocks fill the SMs best comes first
// where that makes it more than 10% faster than the use's first tile by the model, which stays
// second. BERT-base's QKV at batch 32 (4096 x 2304) on 132 SMs (an H100 SXM or H200): 288 tiles of
// 128 x 256 or 256 x 128 make three waves, the last on 24 SMs; 384 of 128 x 192 or 256 x 96 fill
// three; its 4096 x 768 products: 96 tiles of the first two (one wave on 96 SMs) against 128. Its
// fc1 (4096 x 3072, 384 tiles of either) and shapes that fill every tile alike keep the order; so
// do a shape or SM count of 0 and the convolutions. On 114 SMs (an H100 PCIe) QKV's 288 tiles
// (3 waves of 32 K outputs) and 384 (4 waves of 24 K) come out even: the order stands.
TEST(CudaInt8Host, AProductsTilesAreOrderedByHowTheirWavesFillTheSms) {
  using cuda::WgmmaTileUse;
  constexpr auto kProduct = WgmmaTileUse::kProduct;
  auto names = [](const std::vector<int>& tiles, size_t count) {
    std::string out;
    for (size_t i = 0; i < count && i < tiles.size(); ++i) {
      out += std::string(out.empty() ? "" : ",") + cuda::Int8WgmmaTileName(tiles[i]);
    }
    return out;
  };
  const std::vector<int>& plain = cuda::Int8WgmmaTileOrder(kProduct);
  EXPECT_EQ(names(cuda::Int8WgmmaTileOrder(kProduct, 4096, 2304, 132), 4),
            "tma-128x192,tma-128x256,tma-256x128,tma-256x96");
  EXPECT_EQ(names(cuda::Int8WgmmaTileOrder(kProduct, 4096, 768, 132), 3),
            "tma-128x192,tma-128x256,tma-256x128");
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kProduct, 4096, 3072, 132), plain);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kProduct, 4096, 2304, 114), plain);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kProduct, 0, 2304, 132), plain);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kProduct, 4096, 2304, 0), plain);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(WgmmaTileUse::kPointwiseConv, 4096, 2304, 132),
            cuda::Int8WgmmaTileOrder(WgmmaTileUse::kPointwiseConv));
  // One row block of 128 (a batch-1 sequence): 12 tiles of 128 x 192 (one wave of 24 K outputs)
  // beat 9 of 128 x 256 (32 K); the 128 x 128 tiles (one wave of 16 K) are not the model's, and
  // they and the persistent and cluster tiles keep their places whatever the shape.
  const std::vector<int> small = cuda::Int8WgmmaTileOrder(kProduct, 128, 2304, 132);
  EXPECT_EQ(names(small, 4), "tma-128x192,tma-128x256,tma-256x128,tma-256x96");
  EXPECT_EQ(names({small.begin() + 4, small.end()}, 9),
            "128x128x2,tma-128x128,128x128,256x128,128x256,128x64x2,pp-128x128,ppc2-128x128,"
            "tmac2-128x256");
  // ViT-B/16's QKV at batch 32 (6304 x 2304): 450 tiles of 128 x 256 (4 waves) against 600 of
  // 128 x 192 (5 waves of 24 K): within 10%, the order stands.
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kProduct, 6304, 2304, 132), plain);
  // An output of at most 64 columns (ResNet-50's stem and layer 1): 128x64x2 first for every use,
  // the rest in the use's order; 65 columns: the order by waves alone.
  for (auto use : {kProduct, WgmmaTileUse::kPointwiseConv, WgmmaTileUse::kGatherConv}) {
    for (int64_t cols : {1, 64}) {
      const std::vector<int> narrow = cuda::Int8WgmmaTileOrder(use, 100352, cols, 132);
      std::vector<int> want = {12};
      for (int t : cuda::Int8WgmmaTileOrder(use)) {
        if (t != 12) want.push_back(t);
      }
      EXPECT_EQ(narrow, want) << cols;
    }
    EXPECT_EQ(names(cuda::Int8WgmmaTileOrder(use, 0, 64, 0), 1), "128x64x2");
    EXPECT_NE(names(cuda::Int8WgmmaTileOrder(use, 100352, 65, 132), 1), "128x64x2");
  }
  for (const std::vector<int>& o : {cuda::Int8WgmmaTileOrder(kProduct, 4096, 2304, 132), small}) {
    std::vector<int> sorted = o;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(static_cast<int>(sorted.size()), cuda::Int8WgmmaTileCount());
    for (int i = 0; i < cuda::Int8WgmmaTileCount(); ++i) EXPECT_EQ(sorted[i], i);
  }
}

// A gathering convolution's order for its shape: 128x64x2 before the use's first, 128x128x2 (two
// blocks an SM both, alike but in width), where its blocks fill the SMs more than 10% better by
// the same model of waves. ResNet-50's 3x3 convolutions at batch 32 on 132 SMs: layer 4's
// (1568 x 512) 104 blocks of 128 x 64 in one wave against 52 of 128 x 128; layer 2's
// (25088 x 128) 392 blocks, three waves of 8 K outputs, against 196, two of 16 K; layer 3's
// (6272 x 256) 196 blocks in two waves against 98 in one: even, the order stands. Unknown shapes
// and devices keep it too.
TEST(CudaInt8Host, AGatheringConvolutionsTilesAreOrderedByHowTheirWavesFillTheSms) {
  constexpr auto kGather = cuda::WgmmaTileUse::kGatherConv;
  const std::vector<int>& plain = cuda::Int8WgmmaTileOrder(kGather);
  ASSERT_EQ(std::string(cuda::Int8WgmmaTileName(plain[0])), "128x128x2");
  auto narrow_first = [&] {
    std::vector<int> want = {12};
    for (int t : plain) {
      if (t != 12) want.push_back(t);
    }
    return want;
  }();
  ASSERT_EQ(std::string(cuda::Int8WgmmaTileName(narrow_first[0])), "128x64x2");
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kGather, 1568, 512, 132), narrow_first);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kGather, 25088, 128, 132), narrow_first);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kGather, 6272, 256, 132), plain);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kGather, 0, 512, 132), plain);
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kGather, 1568, 512, 0), plain);
  // Many full waves either way: the model's 10% is not met (100352 x 256: 784 x 2 blocks, 12
  // waves of 16 K, against 784 x 4, 24 waves of 8 K).
  EXPECT_EQ(cuda::Int8WgmmaTileOrder(kGather, 100352, 256, 132), plain);
}

// KILN_CUDA_WGMMA_TILES narrows and reorders the tiles offered (comparing tiles end to end):
// names of this use's tiles in the order named, each once; others skipped; none left, the default.
TEST(CudaInt8Host, KilnCudaWgmmaTilesPicksTheTilesOffered) {
  constexpr auto kProduct = cuda::WgmmaTileUse::kProduct;
  constexpr auto kPointwise = cuda::WgmmaTileUse::kPointwiseConv;
  constexpr auto kGather = cuda::WgmmaTileUse::kGatherConv;
  auto name_of = [](const std::vector<int>& tiles) {
    std::string names;
    for (int t : tiles) names += std::string(names.empty() ? "" : ",") + cuda::Int8WgmmaTileName(t);
    return names;
  };
  auto tested_of = [](const std::vector<int>& order) {  // the GPU-tested tiles, in order
    std::vector<int> tested;
    for (int t : order) {
      if (cuda::Int8WgmmaTileGpuTested(t)) tested.push_back(t);
    }
    return tested;
  };
  {
    // Unset: the use's order less the tiles not yet GPU-tested.
    ScopedEnv unset("KILN_CUDA_WGMMA_TILES", "");
    for (auto use : {kProduct, kPointwise, kGather}) {
      std::vector<int> tested = tested_of(cuda::Int8WgmmaTileOrder(use));
      EXPECT_EQ(cuda::Int8WgmmaTilesOffered(use), tested);
      // With a shape (ordered for this device's SMs, if any): the same tiles.
      std::vector<int> shaped = cuda::Int8WgmmaTilesOffered(use, 4096, 2304);
      std::sort(shaped.begin(), shaped.end());
      std::sort(tested.begin(), tested.end());
      EXPECT_EQ(shaped, tested);
    }
  }
  {
    // Naming tiles offers them whether GPU-tested or not.
    ScopedEnv named("KILN_CUDA_WGMMA_TILES", "tma-128x192,tma-256x96");
    EXPECT_EQ(name_of(cuda::Int8WgmmaTilesOffered(kProduct)), "tma-128x192,tma-256x96");
    EXPECT_TRUE(cuda::Int8WgmmaTileGpuTested(5));
    EXPECT_FALSE(cuda::Int8WgmmaTileGpuTested(-1));
    EXPECT_FALSE(cuda::Int8WgmmaTileGpuTested(cuda::Int8WgmmaTileCount()));
  }
  {
    ScopedEnv named("KILN_CUDA_WGMMA_TILES", "pp-128x128,,nonsense,tma-128x256,pp-128x128");
    EXPECT_EQ(name_of(cuda::Int8WgmmaTilesOffered(kProduct)), "pp-128x128,tma-128x256");
    EXPECT_EQ(name_of(cuda::Int8WgmmaTilesOffered(kPointwise)), "pp-128x128,tma-128x256");
    // No TMA or persistent tile gathers a convolution: the default (its GPU-tested tiles).
    EXPECT_EQ(cuda::Int8WgmmaTilesOffered(kGather), tested_of(cuda::Int8WgmmaTileOrder(kGather)));
  }
  {
    ScopedEnv named("KILN_CUDA_WGMMA_TILES", "128x128x2");
    EXPECT_EQ(name_of(cuda::Int8WgmmaTilesOffered(kProduct)), "128x128x2");
    EXPECT_EQ(name_of(cuda::Int8WgmmaTilesOffered(kGather)), "128x128x2");
  }
}

// The kernels put Y's row blocks on the grid's y extent (65535 at most): the providers offer a
// tile only where the largest rows fit it, and each tile's rows are the ones its name says.
TEST(CudaInt8Host, ATileIsOfferedOnlyWhereItsRowBlocksFitTheGrid) {
  EXPECT_TRUE(cuda::Int8TileFitsRows(1, 64));
  EXPECT_TRUE(cuda::Int8TileFitsRows(65535 * 64, 64));
  EXPECT_FALSE(cuda::Int8TileFitsRows(65535 * 64 + 1, 64));
  EXPECT_TRUE(cuda::Int8TileFitsRows(65535 * 64 + 1, 128));
  EXPECT_FALSE(cuda::Int8TileFitsRows(int64_t{65535} * 256 + 1, 256));
  EXPECT_FALSE(cuda::Int8TileFitsRows(10, 0));  // no such tile
  // A saturated size (SatMul) fits no tile.
  EXPECT_FALSE(cuda::Int8TileFitsRows(std::numeric_limits<int64_t>::max(), 256));
  // An 8 x 1000 x 1000 output (8M rows) is past the 64-row tile and within the 128-row one;
  // 8 x 1024 x 1024 is one row block past the 128-row tile (65536) and within the 256-row one.
  EXPECT_FALSE(cuda::Int8TileFitsRows(int64_t{8} * 1000 * 1000, 64));
  EXPECT_TRUE(cuda::Int8TileFitsRows(int64_t{8} * 1000 * 1000, 128));
  EXPECT_FALSE(cuda::Int8TileFitsRows(int64_t{8} * 1024 * 1024, 128));
  EXPECT_TRUE(cuda::Int8TileFitsRows(int64_t{8} * 1024 * 1024, 256));
  auto leading_rows = [](std::string name) {
    name = name.substr(name.rfind('-') + 1);  // "tma-256x128": the shape after its kind
    return std::stoi(name.substr(0, name.find('x')));
  };
  for (int t = 0; t < cuda::Int8MmaTileCount(); ++t) {
    EXPECT_EQ(cuda::Int8MmaTileRows(t), leading_rows(cuda::Int8MmaTileName(t))) << t;
  }
  for (int t = 0; t < cuda::Int8WgmmaTileCount(); ++t) {
    EXPECT_EQ(cuda::Int8WgmmaTileRows(t), leading_rows(cuda::Int8WgmmaTileName(t))) << t;
  }
  EXPECT_EQ(cuda::Int8MmaTileRows(cuda::Int8MmaTileCount()), 0);
  EXPECT_EQ(cuda::Int8WgmmaTileRows(-1), 0);
}

// The INT8 convolution provider refuses a wgmma tactic whose tile does not gather for a layer
// with a window or stride (a TMA tile: kInvalidArgument, saying why), and takes a
// gathering tile (128x64x2 among them, not by its index) or, for a pointwise layer, any tile;
// without a GPU those then stop at the device check (kNoTactic), with one they build.
TEST(CudaInt8Host, TheConvProviderTakesOnlyGatheringTilesForAWindow) {
  std::mt19937 rng(97);
  const KernelProvider* provider = nullptr;
  auto kernel_for = [&](const ConvCase& c, int tile) {
    ConvNode nhwc(c, MakeConvInputs(c, rng), true, DataType::kFloat32);
    provider = nullptr;
    for (const KernelProvider* p :
         KernelRegistry::Get().Providers(BackendKind::kCuda, *nhwc.request().node)) {
      if (p->id() == "cuda.fused_conv.i8" || p->id() == "cuda.conv.i8") provider = p;
    }
    if (!provider) return Status(ErrorCode::kInternal, "no INT8 convolution provider");
    TacticConfig t;
    t.name = fmt::format("i8-conv-cuda-wgmma-{}", cuda::Int8WgmmaTileName(tile));
    t.params = {cuda::kWgmmaTag, tile};
    return provider->Create(nhwc.request(), t).status();
  };
  const ConvCase window = kInt8ConvCases[3], pointwise = kInt8ConvCases[1];  // 7x7/2; 1x1
  ASSERT_TRUE(cuda::Int8WgmmaTileGathers(12));
  ASSERT_FALSE(cuda::Int8WgmmaTileGathers(5));
  for (int tile = 0; tile < cuda::Int8WgmmaTileCount(); ++tile) {
    SCOPED_TRACE(cuda::Int8WgmmaTileName(tile));
    const Status w = kernel_for(window, tile);
    ASSERT_NE(provider, nullptr);
    if (cuda::Int8WgmmaTileGathers(tile)) {
      EXPECT_NE(w.code(), ErrorCode::kInvalidArgument) << w.ToString();
    } else {
      EXPECT_EQ(w.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(w.ToString().find("that gathers"), std::string::npos) << w.ToString();
    }
    const Status pw = kernel_for(pointwise, tile);
    EXPECT_NE(pw.code(), ErrorCode::kInvalidArgument) << pw.ToString();
  }
  EXPECT_EQ(kernel_for(window, cuda::Int8WgmmaTileCount()).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(kernel_for(pointwise, -1).code(), ErrorCode::kInvalidArgument);
}

TEST(CudaInt8Host, ThePackedConvPlanReplaysTheCpuInt8Convolution) {
  std::mt19937 rng(91);
  for (const ConvCase& c : kInt8ConvCases) {
    SCOPED_TRACE(c.Describe());
    const std::vector<Tensor> in = MakeConvInputs(c, rng);
    ConvNode nhwc(c, in, true, DataType::kFloat32), nchw(c, in, false, DataType::kFloat32);
    const std::vector<float> cpu = NchwToNhwc(nchw.RunCpu(), c);
    const std::vector<float> replay = ReplayConvOnHost(c, nhwc);
    ASSERT_EQ(replay.size(), cpu.size());
    EXPECT_LE(RelL2(replay, cpu), 1e-5);
    // And within the INT8 bound of the float convolution.
    EXPECT_LE(RelL2(replay, NchwToNhwc(nchw.RunCpu("f32-"), c)), 2e-2);
  }
}

// A pointwise layer (1x1, stride 1, no padding) runs as a plain matrix product on the quantized X
// (conv_int8.cc): its implicit GEMM reads row m, column j at m * Cp + j, which is x as the
// matrix [N * H * W, Cp]. A 1x1 with stride 2, or any larger window, is not pointwise.
TEST(CudaInt8Host, PointwiseConvolutionsAreMatrixProducts) {
  std::mt19937 rng(94);
  for (const ConvCase& c : kInt8ConvCases) {
    SCOPED_TRACE(c.Describe());
    const std::vector<Tensor> in = MakeConvInputs(c, rng);
    ConvNode node(c, in, true, DataType::kFloat32);
    std::optional<cuda::QuantizedConv> q = cuda::ResolveQuantizedConv(node.request());
    ASSERT_TRUE(q.has_value());
    const bool want = c.sh.r == 1 && c.sh.s == 1 && c.sh.sh == 1 && c.sh.sw == 1 &&
                      c.sh.pt + c.sh.pl + c.sh.pb + c.sh.pr == 0;
    EXPECT_EQ(q->pointwise, want);
    auto g = cuda::ImplicitGemmFor(*q, node.inputs()[0].dims(),
                                   *StaticDims(node.node().output(0)->shape()));
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(cuda::IsPointwise(*g), want);
    if (!want) continue;
    int64_t mismatches = 0;
    for (int64_t m = 0; m < g->rows(); ++m) {
      for (int64_t j = 0; j < g->depth(); ++j) {
        mismatches += cuda::OffsetOf(*g, cuda::RowOf(*g, m), j) != m * g->cp + j;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// What the INT8 convolution declines (it stays cuDNN's FP16): NCHW, group 2, no INT8 attribute,
// a model zero point other than 0, a non-constant weight.
TEST(CudaInt8Host, TheConvPlanDeclinesWhatTheKernelCannotRun) {
  std::mt19937 rng(92);
  const ConvCase c = kInt8ConvCases[2];
  const std::vector<Tensor> in = MakeConvInputs(c, rng);
  EXPECT_TRUE(cuda::ResolveQuantizedConv(ConvNode(c, in, true, DataType::kFloat16).request()));
  EXPECT_FALSE(cuda::ResolveQuantizedConv(ConvNode(c, in, false, DataType::kFloat32).request()));
  {
    ConvNode grouped(c, in, true, DataType::kFloat32);
    KernelRequest r = grouped.request();
    const_cast<Node&>(grouped.node()).mutable_attrs().Set("group", int64_t{2});
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r));
  }
  {
    ConvNode plain(c, in, true, DataType::kFloat32);
    const_cast<Node&>(plain.node()).mutable_attrs().Erase(kAmax);
    EXPECT_FALSE(cuda::ResolveQuantizedConv(plain.request()));
  }
  {
    ConvNode model(c, in, true, DataType::kFloat32);
    std::vector<float> ws(static_cast<size_t>(c.sh.k), 0.01f);
    SetModelInt8Attrs(const_cast<Node&>(model.node()), ModelInt8Scales{0.02f, 3, ws, {}});
    EXPECT_FALSE(cuda::ResolveQuantizedConv(model.request()));
  }
  {
    ConvNode live(c, in, true, DataType::kFloat32);
    KernelRequest r = live.request();
    r.inputs[1].constant = nullptr;
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r));
  }
  {
    ConvNode broadcast(c, in, true, DataType::kFloat32);  // a Z that would broadcast
    KernelRequest r = broadcast.request();
    r.inputs[3].max_dims = {1, 1, 1, c.sh.k};
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r));
  }
  // A shape Run gets that does not follow from the window: a catalogued error, not a launch.
  std::optional<cuda::QuantizedConv> q =
      cuda::ResolveQuantizedConv(ConvNode(c, in, true, DataType::kFloat32).request());
  ASSERT_TRUE(q.has_value());
  const std::vector<int64_t> x = {c.sh.n, c.sh.h, c.sh.w, c.sh.c};
  const std::vector<int64_t> bad_y = {c.sh.n, c.oh() + 1, c.ow(), c.sh.k};
  auto g = cuda::ImplicitGemmFor(*q, x, bad_y);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kShapeMismatch);
  // A stride past the kernel's 32-bit window arithmetic: refused before it narrows.
  cuda::QuantizedConv wide = *q;
  wide.attrs.strides[0] = (int64_t{1} << 32) + 1;  // 1 once truncated to int32
  const std::vector<int64_t> one_row = {c.sh.n, 1, c.ow(), c.sh.k};
  auto narrow = cuda::ImplicitGemmFor(wide, x, one_row);
  ASSERT_FALSE(narrow.ok());
  EXPECT_EQ(narrow.status().code(), ErrorCode::kUnimplemented) << narrow.status().ToString();
}

// On INT8 edges (ops/quant_edge.h) the convolution takes an int8 side: an X marked as the edge's
// consumer, read in place (so only with C a multiple of 16), a Y with the scale the producer
// quantizes by, or both; the float type is the other side's, or W's. Never an unmarked int8 X,
// never an int8 Y without a usable scale.
TEST(CudaInt8Host, TheConvPlanTakesTheInt8SidesOfItsEdges) {
  std::mt19937 rng(94);
  const ConvCase c = kInt8ConvCases[1];  // 64 channels, 1x1, bias and ReLU
  const std::vector<Tensor> in = MakeConvInputs(c, rng);
  auto mark = [](const ConvNode& n, const char* attr, float v) {
    AttributeMap& a = const_cast<Node&>(n.node()).mutable_attrs();
    if (std::string_view(attr) == kInt8InputEdgeAttr) {
      a.Set(std::string(attr), int64_t{1});
    } else {
      a.Set(std::string(attr), v);
    }
  };
  auto expect = [](const KernelRequest& r, bool in_int8, float out_scale, cuda::BlasType type) {
    std::optional<cuda::QuantizedConv> q = cuda::ResolveQuantizedConv(r);
    ASSERT_TRUE(q.has_value());
    EXPECT_EQ(q->in_int8, in_int8);
    EXPECT_EQ(q->out_scale, out_scale);
    EXPECT_EQ(q->type, type);
  };
  {
    ConvNode reader(c, in, true, DataType::kFloat16);
    KernelRequest r = reader.request();
    r.inputs[0].dtype = kInt8EdgeType;
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r)) << "an int8 X not marked as an edge";
    mark(reader, kInt8InputEdgeAttr, 0.f);
    expect(r, true, 0.f, cuda::BlasType::kF16);  // Y's type
    // On two edges, int8 in and out: W's float type (the bias with it).
    r.outputs[0].dtype = kInt8EdgeType;
    mark(reader, kInt8OutputScaleAttr, 0.1f);
    expect(r, true, 0.1f, cuda::BlasType::kF16);
    r.inputs[1].dtype = DataType::kFloat32;  // a W whose type the bias does not share
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r));
  }
  {
    ConvNode writer(c, in, true, DataType::kFloat32);
    KernelRequest r = writer.request();
    r.outputs[0].dtype = kInt8EdgeType;
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r)) << "an int8 Y without a scale";
    for (float bad : {0.f, -1.f, std::numeric_limits<float>::infinity()}) {
      mark(writer, kInt8OutputScaleAttr, bad);
      EXPECT_FALSE(cuda::ResolveQuantizedConv(r)) << bad;
    }
    mark(writer, kInt8OutputScaleAttr, 0.05f);
    expect(r, false, 0.05f, cuda::BlasType::kF32);  // X's type
  }
  {
    const ConvCase odd = kInt8ConvCases[5];  // 40 channels: the kernel's X would need padding
    ConvNode reader(odd, MakeConvInputs(odd, rng), true, DataType::kFloat32);
    mark(reader, kInt8InputEdgeAttr, 0.f);
    KernelRequest r = reader.request();
    r.inputs[0].dtype = kInt8EdgeType;
    EXPECT_FALSE(cuda::ResolveQuantizedConv(r));
  }
}

// A matrix product on an edge's 8-bit side (ops/quant_edge.h): an int8 (E4M3) A, Y or both are
// taken as B's float type, as the type rule does, so the product resolves as in floats; another
// edge type's side, or a B whose type the bias does not share, does not.
TEST(CudaInt8Host, TheProductPlanTakesTheSidesOfItsEdges) {
  Graph g;
  const Tensor b(DataType::kFloat16, {32, 16});
  Value* a = g.AddInput("a", DataType::kFloat16, {8, 32});
  Value* w = g.AddConstant("w", b);
  Value* bias = g.AddConstant("bias", Tensor(DataType::kFloat16, {16}));
  Value* y = g.AddValue("y");
  AttributeMap attrs;
  attrs.Set("activation", std::string("relu"));
  Node* n = g.AddNode("FusedMatMul", "m", {a, w, bias}, {y}, std::move(attrs));
  ASSERT_TRUE(InferShapes(g).ok());
  KernelRequest r;
  r.node = n;
  r.inputs.push_back({DataType::kFloat16, a->shape(), {8, 32}, nullptr});
  r.inputs.push_back({DataType::kFloat16, w->shape(), {32, 16}, w->constant()});
  r.inputs.push_back({DataType::kFloat16, bias->shape(), {16}, bias->constant()});
  r.outputs.push_back({DataType::kFloat16, y->shape(), {8, 16}, nullptr});
  auto check = [&](const KernelRequest& q, DataType edge) {
    std::optional<cuda::QuantizedGemm> p = cuda::ResolveQuantizedGemmOnEdges(q, 2.f, edge);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->type, cuda::BlasType::kF16);
    EXPECT_EQ(p->m, 8);
    EXPECT_EQ(p->k, 32);
    EXPECT_EQ(p->n, 16);
    EXPECT_TRUE(p->addend.present);
  };
  check(r, kInt8EdgeType);  // no edge: as ResolveQuantizedGemm
  for (DataType edge : {kInt8EdgeType, kFp8EdgeType}) {
    SCOPED_TRACE(ToString(edge));
    for (int sides : {1, 2, 3}) {  // A, Y, both
      KernelRequest q = r;
      if (sides & 1) q.inputs[0].dtype = edge;
      if (sides & 2) q.outputs[0].dtype = edge;
      EXPECT_FALSE(cuda::ResolveQuantizedGemm(q, 2.f)) << sides;
      check(q, edge);
      const DataType other = edge == kInt8EdgeType ? kFp8EdgeType : kInt8EdgeType;
      EXPECT_FALSE(cuda::ResolveQuantizedGemmOnEdges(q, 2.f, other)) << sides;
    }
  }
  KernelRequest f32_b = r;
  f32_b.inputs[0].dtype = kInt8EdgeType;
  f32_b.inputs[1].dtype = DataType::kFloat32;  // the bias stays FP16: no one float type
  EXPECT_FALSE(cuda::ResolveQuantizedGemmOnEdges(f32_b, 2.f, kInt8EdgeType));
}

TEST(CudaInt8Host, AQdqLayerPacksTheModelsIntegersAndScales) {
  for (const std::string op : {"Gemm", "MatMul"}) {
    SCOPED_TRACE(op);
    const bool gemm = op == "Gemm";  // Gemm under transB: B [N, K]; MatMul: B [K, N]
    I8Case c{op, {7, 64}, 64, 24, false, gemm, gemm ? 0.5f : 1.f, 1.f, {}, false};
    c.amax = std::nullopt;
    std::vector<float> ws(24);
    for (int64_t j = 0; j < 24; ++j) ws[j] = 0.01f + 0.001f * static_cast<float>(j);
    c.model_scales = ModelInt8Scales{0.02f, 0, ws, {}};
    std::mt19937 rng(7);
    std::vector<Tensor> inputs = MakeInputs(c, rng);
    std::vector<int8_t> q(24 * 64);
    std::vector<float> b(24 * 64);
    for (int64_t j = 0; j < 24; ++j) {
      for (int64_t i = 0; i < 64; ++i) {
        const int8_t v = static_cast<int8_t>((j * 37 + i * 11) % 256 - 128);  // -128..127
        const int64_t at = gemm ? j * 64 + i : i * 24 + j;
        q[at] = v;
        b[at] = static_cast<float>(v) * ws[j];
      }
    }
    inputs[1] = Tensor::FromVector(
        DataType::kFloat32, gemm ? std::vector<int64_t>{24, 64} : std::vector<int64_t>{64, 24}, b);
    Int8Node node(c, inputs, DataType::kFloat32);
    std::optional<Int8Activation> act = cuda::CudaInt8Activation(node.node());
    ASSERT_TRUE(act.has_value());
    EXPECT_TRUE(act->from_model);
    EXPECT_EQ(act->scale, 0.02f);
    auto w = Int8WeightsFor(node.node(), inputs[1]);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->q, q);  // the model's integers, not re-quantized
    EXPECT_EQ(w->scales, ws);
    auto spec = cuda::ReadGemmSpec(node.node());
    ASSERT_TRUE(spec.ok());
    const cuda::Int8PackedB p = cuda::PackInt8B(*spec, 64, 24, *w, act->scale);
    const std::vector<float> a = inputs[0].ToFloatVector();
    std::vector<float> replay(7 * 24);
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t j = 0; j < 24; ++j) {
        int32_t acc = 0;
        for (int64_t k = 0; k < 64; ++k) {
          EXPECT_EQ(p.packed[j * p.kp + k], q[gemm ? j * 64 + k : k * 24 + j]);
          acc += int32_t{p.packed[j * p.kp + k]} * QuantizeInt8(a[i * 64 + k], 1.f / act->scale);
        }
        replay[i * 24 + j] = static_cast<float>(acc) * p.col_scale[j];
      }
    }
    EXPECT_EQ(p.col_scale[3], c.alpha * 0.02f * ws[3]);
    EXPECT_LE(RelL2(replay, node.RunCpu("i8-")), 1e-4);
    // A zero point other than 0: declined on CUDA (taken on the CPU).
    I8Case zp = c;
    zp.model_scales->input_zero_point = 5;
    Int8Node shifted(zp, inputs, DataType::kFloat32);
    EXPECT_FALSE(cuda::CudaInt8Activation(shifted.node()).has_value());
    EXPECT_FALSE(shifted.Tactics(BackendKind::kCpu, "i8-").empty());
  }
}

// ---- FP8 E4M3 (cublaslt_fp8.cc).

bool DeviceHasFp8() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major > 8 || (major == 8 && minor >= 9);
}

class CudaFp8Test : public CudaInt8Test {
 protected:
  void SetUp() override {
    CudaInt8Test::SetUp();
    if (IsSkipped()) return;
    if (!DeviceHasFp8()) GTEST_SKIP() << "FP8 needs compute capability 8.9 or later";
  }
};

I8Case Fp8(I8Case c, float amax = 1.f) {
  c.amax = std::nullopt;
  c.fp8_amax = amax;
  return c;
}

// The FP8 contract's view of a tensor: per tensor, scale amax / 448, E4M3 and back.
Tensor DequantizedFp8(const Tensor& x, float amax) {
  std::vector<float> v = x.ToFloatVector();
  const float scale = Fp8Scale(amax), inv = Fp8InvScale(amax);
  for (float& f : v) f = FromE4M3(ToE4M3(f * inv)) * scale;
  return Tensor::FromVector(DataType::kFloat32, x.dims(), v);
}
float AbsMax(const Tensor& t) {
  float m = 0.f;
  for (float f : t.ToFloatVector()) m = std::max(m, std::fabs(f));
  return m;
}

// Every CUDA FP8 tactic of the case against the contract (the CPU's FP32 kernel on E4M3-rounded
// inputs) and against FP32. E4M3 keeps 3 mantissa bits: each operand's rounding error is up to
// 2^-4 relative, rms about 2.5-3% for inputs uniform in [-1, 1]; the host replay of the same
// contract measures 2.3e-2 to 4.2e-2 against FP32, so the bound is 8e-2.
int CheckFp8Case(const I8Case& c, uint32_t seed, DataType storage = DataType::kFloat32,
                 bool check_fp32 = true, std::vector<std::string>* names = nullptr) {
  SCOPED_TRACE(c.Describe() + " fp8, storage " + std::string(ToString(storage)));
  std::mt19937 rng(seed);
  std::vector<Tensor> inputs = MakeInputs(c, rng);
  for (Tensor& t : inputs) t = t.CastTo(storage).CastTo(DataType::kFloat32);
  Int8Node node(c, inputs, storage);
  auto tactics = node.Tactics(BackendKind::kCuda, "f8-");
  EXPECT_FALSE(tactics.empty()) << "no CUDA FP8 tactic";
  if (tactics.empty()) return 0;
  EXPECT_TRUE(node.Tactics(BackendKind::kCuda, "i8-").empty()) << "INT8 without its attribute";
  std::vector<float> fp32 = Int8Node(c, inputs, DataType::kFloat32).RunCpu("f32-");
  std::vector<Tensor> dq = inputs;
  dq[0] = DequantizedFp8(inputs[0], *c.fp8_amax);
  dq[1] = DequantizedFp8(inputs[1], AbsMax(inputs[1]));
  std::vector<float> contract = Int8Node(c, dq, DataType::kFloat32).RunCpu("f32-");
  // Against the contract, FP32 storage: Hopper's and Ada's FP8 MMA accumulate with a 13-bit
  // mantissa (e8m13), not FP32's 23, so each add may lose about 2^-13 = 1.2e-4 relative; an
  // H100 measured 1.15e-4 at K = 129 by every algorithm (bench/results/h100_session17). 5e-4
  // leaves the hardware its rounding and still fails any wrong product (those are near 1).
  // Fast accumulation (cuBLASLt's without promotion, kiln's wgmma kernel) keeps the MMA's own
  // precision over the whole K: 1e-2, FastAccumulationIsOfferedAndStaysNearTheContract's bound.
  const double contract_bound = storage == DataType::kFloat32   ? 5e-4
                                : storage == DataType::kFloat16 ? 2e-3
                                                                : 1e-2;
  for (const auto& [p, t] : tactics) {
    SCOPED_TRACE(t.name);
    if (names) names->push_back(t.name);
    EXPECT_TRUE(t.name.starts_with(c.op.find("Gemm") != std::string::npos ? "f8-gemm-cuda-"
                                                                          : "f8-matmul-cuda-"));
    EXPECT_NE(t.name.find("-e4m3-"), std::string::npos);
    std::vector<float> y = node.RunCuda(p, t);
    if (y.empty()) continue;
    const bool fast = t.name.find("-fast-accum") != std::string::npos;
    EXPECT_LE(RelL2(y, contract), fast ? std::max(contract_bound, 1e-2) : contract_bound)
        << "against the FP8 contract";
    if (check_fp32) {
      EXPECT_LE(RelL2(y, fp32), 8e-2) << "against FP32";
    }
  }
  return static_cast<int>(tactics.size());
}

TEST_F(CudaFp8Test, GemmAndMatMulMatchTheContract) {
  EXPECT_GT(CheckFp8Case(Fp8({"Gemm", {7, 64}, 64, 24, false, false, 1.f, 1.f, {24}, true}), 81),
            0);
  EXPECT_GT(CheckFp8Case(Fp8({"Gemm", {32, 9}, 32, 16, true, true, 0.5f, 2.f, {9, 16}, false}), 82),
            0);
  EXPECT_GT(
      CheckFp8Case(
          Fp8({"FusedGemm", {17, 129}, 129, 257, false, true, 1.f, 1.f, {257}, true, "gelu"}), 83),
      0);
  EXPECT_GT(CheckFp8Case(Fp8({"MatMul", {2, 3, 31}, 31, 33}), 84), 0);
  EXPECT_GT(
      CheckFp8Case(
          Fp8({"FusedMatMul", {4, 16, 256}, 256, 384, false, false, 1.f, 1.f, {384}, true, "relu"}),
          85, DataType::kFloat16),
      0);
  EXPECT_GT(CheckFp8Case(Fp8({"Gemm", {64, 512}, 512, 768, false, true, 1.f, 1.f, {768}, true}), 86,
                         DataType::kBFloat16),
            0);
  // A calibrated absmax well above the values: E4M3's exponent keeps their precision.
  EXPECT_GT(CheckFp8Case(Fp8({"Gemm", {8, 64}, 64, 16}, 16.f), 87), 0);
  // Values beyond it saturate at 448 * scale, in the kernel as in the contract.
  EXPECT_GT(CheckFp8Case(Fp8({"Gemm", {8, 64}, 64, 16}, 0.25f), 89, DataType::kFloat32,
                         /*check_fp32=*/false),
            0);
}

// The direct plan (cuBLASLt writes Y in FP16/BF16 with the bias, C and activation in its
// epilogue): offered where N is a multiple of 16 and the epilogue can do the whole layer, checked
// like the FP32 plan; never offered for FP32 storage, an odd N or an activation cuBLASLt lacks.
// Fast accumulation (no periodic promotion of the partial sums to FP32) is offered beside the
// default for both plans, and stays close to the contract at a K where the MMA's own precision
// shows: the hardware's 13-bit accumulation over K = 768 costs about 2^-13 * sqrt(K) relative at
// worst, far under FP8's own rounding (2e-2 and more against FP32).
TEST_F(CudaFp8Test, FastAccumulationIsOfferedAndStaysNearTheContract) {
  const I8Case c = Fp8({"Gemm", {64, 768}, 768, 256, false, true, 1.f, 1.f, {256}, true}, 2.f);
  std::mt19937 rng(91);
  std::vector<Tensor> inputs = MakeInputs(c, rng);
  for (Tensor& t : inputs) t = t.CastTo(DataType::kFloat16).CastTo(DataType::kFloat32);
  Int8Node node(c, inputs, DataType::kFloat16);
  std::vector<Tensor> dq = inputs;
  dq[0] = DequantizedFp8(inputs[0], *c.fp8_amax);
  dq[1] = DequantizedFp8(inputs[1], AbsMax(inputs[1]));
  std::vector<float> contract = Int8Node(c, dq, DataType::kFloat32).RunCpu("f32-");
  int fast = 0, promoted = 0;
  for (const auto& [p, t] : node.Tactics(BackendKind::kCuda, "f8-")) {
    SCOPED_TRACE(t.name);
    const bool is_fast = t.name.find("-fast-accum") != std::string::npos;
    (is_fast ? fast : promoted)++;
    std::vector<float> y = node.RunCuda(p, t);
    ASSERT_FALSE(y.empty());
    EXPECT_LE(RelL2(y, contract), is_fast ? 1e-2 : 2e-3) << "against the FP8 contract";
  }
  EXPECT_GT(fast, 0);
  EXPECT_GT(promoted, 0);
}

TEST_F(CudaFp8Test, DirectPlanWritesHalfOutputsThroughCublasLtsEpilogue) {
  struct Case {
    I8Case c;
    DataType storage;
    bool direct;
  };
  const DataType f16 = DataType::kFloat16, bf16 = DataType::kBFloat16;
  const std::vector<Case> cases = {
      // FusedMatMul with a bias row and GELU (the tanh form), rows not a multiple of 16
      {Fp8({"FusedMatMul", {3, 37, 128}, 128, 256, false, false, 1.f, 1.f, {256}, true, "gelu"}),
       f16, true},
      {Fp8({"FusedMatMul", {2, 40, 64}, 64, 96, false, false, 1.f, 1.f, {96}, true, "gelu_tanh"}),
       bf16, true},
      // Gemm with a C of Y's shape times beta (a residual), and alpha
      {Fp8({"Gemm", {45, 96}, 96, 64, false, true, 0.5f, 0.75f, {45, 64}, false}), f16, true},
      // MatMul without a bias, K not a multiple of 16 (zero padded)
      {Fp8({"MatMul", {2, 9, 40}, 40, 32}), bf16, true},
      // Gemm with a bias row and ReLU
      {Fp8({"FusedGemm", {33, 64}, 64, 48, false, false, 1.f, 1.f, {48}, true, "relu"}), f16, true},
      // Not direct: N not a multiple of 16; SiLU; a C column; FP32 storage
      {Fp8({"FusedMatMul", {2, 16, 64}, 64, 40, false, false, 1.f, 1.f, {40}, true, "gelu"}), f16,
       false},
      {Fp8({"FusedMatMul", {2, 16, 64}, 64, 64, false, false, 1.f, 1.f, {64}, true, "silu"}), f16,
       false},
      {Fp8({"Gemm", {24, 64}, 64, 32, false, false, 1.f, 1.f, {24, 1}, false}), f16, false},
      {Fp8({"FusedMatMul", {2, 16, 64}, 64, 64, false, false, 1.f, 1.f, {64}, true, "relu"}),
       DataType::kFloat32, false},
  };
  uint32_t seed = 140;
  for (const Case& k : cases) {
    std::vector<std::string> names;
    EXPECT_GT(CheckFp8Case(k.c, seed++, k.storage, true, &names), 0);
    const auto direct = std::count_if(names.begin(), names.end(), [](const std::string& n) {
      return n.find("-lt-epilogue") != std::string::npos;
    });
    SCOPED_TRACE(k.c.Describe());
    if (k.direct) {
      EXPECT_GT(direct, 0) << "no direct-plan tactic";
      EXPECT_LT(direct, static_cast<long>(names.size())) << "no FP32-plan tactic beside them";
    } else {
      EXPECT_EQ(direct, 0);
    }
  }
}

// The two ends of an FP8 edge, kernel by kernel, for every FP8 tactic of a product in FP16:
// - the producer writes E4M3(Y * 448 / out_amax) where the plain kernel writes Y: the FP32
//   plan's epilogue rounds Y to FP16 first, as the consumer's own quantization would, so every
//   byte agrees; cuBLASLt's epilogue (the direct plan) converts its FP32 result directly, so a few
//   values sit one E4M3 step away where the FP16 rounding crossed a rounding boundary;
// - the consumer, handed A already quantized, gives the plain kernel's Y.
std::vector<I8Case> Fp8EdgeCases() {
  return {
      // GELU with a bias row, N a multiple of 16: the direct plan's tactics and the FP32 plan's.
      Fp8({"FusedMatMul", {2, 24, 64}, 64, 256, false, false, 1.f, 1.f, {256}, true, "gelu"}, 2.f),
      // SiLU: kiln's epilogue only.
      Fp8({"FusedMatMul", {3, 17, 48}, 48, 96, false, false, 1.f, 1.f, {96}, true, "silu"}, 2.f),
      // A Gemm with C of Y's shape.
      Fp8({"Gemm", {40, 32}, 32, 64, false, true, 0.5f, 0.75f, {40, 64}, false}, 1.5f),
  };
}
// `tactics`: how many FP8 tactics each case must have (0: any number but none).
void CheckFp8EdgeKernels(const std::vector<I8Case>& cases = Fp8EdgeCases(), int tactics = 0) {
  const DataType f16 = DataType::kFloat16;
  const float out_amax = 3.f;
  uint32_t seed = 301;
  for (const I8Case& c : cases) {
    SCOPED_TRACE(c.Describe());
    std::mt19937 rng(seed++);
    std::vector<Tensor> inputs = MakeInputs(c, rng);
    for (Tensor& t : inputs) t = t.CastTo(f16).CastTo(DataType::kFloat32);
    Int8Node plain(c, inputs, f16);
    auto offered = plain.Tactics(BackendKind::kCuda, "f8-");
    ASSERT_FALSE(offered.empty());
    if (tactics > 0) {
      EXPECT_EQ(static_cast<int>(offered.size()), tactics);
    }
    for (const auto& [p, t] : offered) {
      SCOPED_TRACE(t.name);
      ASSERT_TRUE(p->WritesFp8Output(plain.request(), t));
      ASSERT_TRUE(p->ReadsFp8Input(plain.request(), t));
      const std::vector<float> y = plain.RunCuda(p, t);

      Int8Node producer(c, inputs, f16);
      producer.WriteFp8For(out_amax);
      const std::vector<float> q = producer.RunCuda(p, t);
      ASSERT_EQ(q.size(), y.size());
      const float inv = Fp8InvScale(out_amax);
      std::vector<float> want(y.size());
      size_t differ = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        want[i] = FromE4M3(ToE4M3(y[i] * inv));
        differ += q[i] != want[i];
      }
      if (t.name.find("lt-epilogue") == std::string::npos) {
        EXPECT_EQ(differ, 0u) << "kiln's epilogue quantizes the FP16 value";
      } else {
        EXPECT_LE(differ, y.size() / 20) << "cuBLASLt's E4M3 output";
        EXPECT_LE(RelL2(q, want), 2e-2);
      }

      Int8Node consumer(c, inputs, f16);
      consumer.ReadFp8Input();
      const std::vector<float> z = consumer.RunCuda(p, t);
      EXPECT_LE(RelL2(z, y), 1e-3) << "the consumer of an E4M3 A";
    }
  }
}

TEST_F(CudaFp8Test, EdgeKernelsWriteAndReadE4M3AsTheContractDoes) { CheckFp8EdgeKernels(); }

// The same for kiln's warpgroup kernel (KILN_CUDA_FP8_KERNEL=wgmma): its epilogue rounds Y to
// FP16 before quantizing, so every byte agrees.
TEST_F(CudaFp8Test, WarpgroupEdgeKernelsWriteAndReadE4M3AsTheContractDoes) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  ScopedEnv only("KILN_CUDA_FP8_KERNEL", "wgmma");
  CheckFp8EdgeKernels();
}

// The same on every tile of the warpgroup kernel, those not yet GPU-tested included, at shapes
// where most of Y is whole tiles: an 8-bit Y takes the epilogue's 8-wide stores there
// (int8_tile::WholeTile), every byte as the contract gives it. 384 x 768: whole tiles of every
// width and of 128 rows, the 256-row tiles' second row block half inside Y; 200 x 200 (N off every
// width but 8's multiple) and the odd shapes above.
TEST_F(CudaFp8Test, EveryWarpgroupTileWritesE4M3AsTheContractDoes) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  ScopedEnv only("KILN_CUDA_FP8_KERNEL", "wgmma");
  ScopedEnv every_tile("KILN_CUDA_WGMMA_TILES", EveryWgmmaTileName().c_str());
  std::vector<I8Case> cases = Fp8EdgeCases();
  cases.push_back(Fp8(
      {"FusedMatMul", {2, 192, 256}, 256, 768, false, false, 1.f, 1.f, {768}, true, "gelu"}, 2.f));
  cases.push_back(
      Fp8({"FusedMatMul", {200, 96}, 96, 200, false, false, 1.f, 1.f, {200}, true, "relu"}, 2.f));
  CheckFp8EdgeKernels(cases, cuda::Int8WgmmaTileCount());
}

// kiln's warpgroup kernel for FP8 (KILN_CUDA_FP8_KERNEL=wgmma): offered in each of its tiles and
// meeting CheckFp8Case's bounds on BERT-base's shapes and odd ones (M, N and K off every tile's
// multiple, K within one partial 128-byte stage, K = 3072 wrapping the ring of stages), with a
// bias and GELU, a C of Y's shape with alpha and beta, and each storage type.
TEST_F(CudaFp8Test, OwnWarpgroupKernelRunsEveryTile) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  ScopedEnv only("KILN_CUDA_FP8_KERNEL", "wgmma");
  ScopedEnv every_tile("KILN_CUDA_WGMMA_TILES", EveryWgmmaTileName().c_str());
  const DataType f32 = DataType::kFloat32, f16 = DataType::kFloat16, bf16 = DataType::kBFloat16;
  struct Case {
    I8Case c;
    DataType storage;
  };
  const std::vector<Case> cases = {
      {Fp8({"FusedMatMul", {2, 100, 768}, 768, 2304, false, false, 1.f, 1.f, {2304}, true, "gelu"},
           2.f),
       f16},
      {Fp8({"FusedGemm", {300, 3072}, 3072, 768, false, true, 1.f, 1.f, {300, 768}, false}), bf16},
      {Fp8({"Gemm", {129, 80}, 80, 257, false, false, 1.f, 1.f, {257}, true}), f32},
      {Fp8({"Gemm", {45, 96}, 96, 64, false, true, 0.5f, 0.75f, {45, 64}, false}, 1.5f), f16},
      {Fp8({"MatMul", {2, 3, 31}, 31, 33}), f32},
      // Many blocks, most of them inside Y (OwnWarpgroupKernelRunsEveryTile's).
      {Fp8({"FusedMatMul", {4100, 300}, 300, 1104, false, false, 1.f, 1.f, {1104}, true, "gelu"}),
       f16},
  };
  uint32_t seed = 501;
  for (const Case& k : cases) {
    std::vector<std::string> names;
    EXPECT_EQ(CheckFp8Case(k.c, seed++, k.storage, true, &names), cuda::Int8WgmmaTileCount());
    for (const std::string& n : names) EXPECT_NE(n.find("-wgmma-"), std::string::npos) << n;
  }
}

// Attention as an FP8 or INT8 edge's producer (its reader, the output projection, is an FP8 or
// INT8 product): the mma kernels store Y's FP16 pairs as E4M3 (int8), byte for byte what
// quantizing the plain kernel's FP16 Y by the FP8 (INT8) contract gives, saturating where the
// test's amax is below some outputs; the other kernels decline.
void CheckAttentionWrites8Bits(bool fp8) {
  const DataType f16 = DataType::kFloat16;
  const DataType edge_type = fp8 ? kFp8EdgeType : kInt8EdgeType;
  const char* attr = fp8 ? kFp8OutputAmaxAttr : kInt8OutputScaleAttr;
  // FP8: the amax; INT8: the scale, whose amax 0.5 the first rows of the causal mask exceed.
  const float param = fp8 ? 0.25f : 0.5f / 127.f;
  const float inv = fp8 ? Fp8InvScale(param) : 1.f / param;
  const float saturated_value = fp8 ? kFp8E4M3Max : 127.f;
  uint32_t seed = fp8 ? 401 : 431;
  for (const auto& [b, s, h, d] :
       std::vector<std::array<int64_t, 4>>{{2, 70, 4, 64}, {1, 33, 2, 128}, {3, 16, 2, 32}}) {
    SCOPED_TRACE(fmt::format("B {} S {} H {} D {}", b, s, h, d));
    std::mt19937 rng(seed++);
    Graph g;
    std::vector<Tensor> inputs;
    std::vector<Value*> ins;
    for (int i = 0; i < 3; ++i) {
      inputs.push_back(Random({b, s, h * d}, rng).CastTo(f16));
      ins.push_back(g.AddInput(fmt::format("x{}", i), f16, MakeShape(inputs.back().dims())));
    }
    AttributeMap attrs;
    attrs.Set("layout", std::string("bsd"));
    attrs.Set("num_heads", h);
    attrs.Set("mask_kind", std::string("causal"));
    Value* y = g.AddValue("y");
    Node* node = g.AddNode("Attention", "attention", ins, {y}, attrs);
    g.MarkOutput(y);
    ASSERT_TRUE(InferShapes(g).ok());
    KernelRequest request;
    request.node = node;
    for (const Tensor& t : inputs) {
      request.inputs.push_back({f16, MakeShape(t.dims()), t.dims(), nullptr});
    }
    request.outputs.push_back({f16, y->shape(), {b, s, h * d}, nullptr});
    int joined = 0;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, *node)) {
      for (const TacticConfig& t : p->Tactics(request)) {
        SCOPED_TRACE(t.name);
        const bool writes = fp8 ? p->WritesFp8Output(request, t) : p->WritesInt8Output(request, t);
        EXPECT_EQ(writes, t.name.find("-mma-") != std::string::npos);
        if (!writes) continue;
        const std::vector<float> plain = RunCudaKernel(p, t, request, inputs, *y);
        node->mutable_attrs().Set(std::string(attr), param);
        y->set_dtype(edge_type);
        KernelRequest edge = request;
        edge.outputs[0].dtype = edge_type;
        const std::vector<float> q = RunCudaKernel(p, t, edge, inputs, *y);
        node->mutable_attrs().Erase(std::string(attr));
        y->set_dtype(f16);
        ASSERT_EQ(q.size(), plain.size());
        size_t differ = 0, saturated = 0;
        for (size_t i = 0; i < q.size(); ++i) {
          const float want = fp8 ? FromE4M3(ToE4M3(plain[i] * inv))
                                 : static_cast<float>(QuantizeInt8(plain[i], inv));
          differ += q[i] != want;
          saturated += std::fabs(q[i]) == saturated_value;
        }
        EXPECT_EQ(differ, 0u);
        EXPECT_GT(saturated, 0u) << "the test's amax should clip some outputs";
        ++joined;
      }
    }
    EXPECT_GE(joined, 3) << "the mma tactics";
  }
}
TEST_F(CudaFp8Test, AttentionWritesE4M3ForAnFp8Reader) { CheckAttentionWrites8Bits(true); }
TEST_F(CudaInt8Test, AttentionWritesInt8ForAnInt8Reader) { CheckAttentionWrites8Bits(false); }

TEST_F(CudaFp8Test, DeclinesWithoutTheAttributeOrAConstantB) {
  std::mt19937 rng(88);
  I8Case plain{"Gemm", {8, 64}, 64, 32, false, false, 1.f, 1.f, {32}, true};
  plain.amax = std::nullopt;
  EXPECT_TRUE(Int8Node(plain, MakeInputs(plain, rng), DataType::kFloat16)
                  .Tactics(BackendKind::kCuda, "f8-")
                  .empty());
  I8Case dynamic_b = Fp8(plain);
  dynamic_b.b_const = false;
  EXPECT_TRUE(Int8Node(dynamic_b, MakeInputs(dynamic_b, rng), DataType::kFloat16)
                  .Tactics(BackendKind::kCuda, "f8-")
                  .empty());
}

// Without a GPU: the host's E4M3 conversion is CUDA's (__nv_cvt_float_to_fp8, which the device
// quantization kernel calls), bit for bit, so B packed on the host and A quantized on the device
// follow one rounding.
TEST(CudaFp8Host, HostE4M3IsCudasConversion) {
  std::vector<float> values = {0.f,
                               -0.f,
                               1.f,
                               -1.f,
                               448.f,
                               -448.f,
                               449.f,
                               464.f,
                               465.f,
                               1e9f,
                               -1e9f,
                               0.0625f,
                               0.015625f,
                               0.0078125f,
                               0.001953125f,
                               0.0009765625f,
                               0.00293f,
                               1e-9f,
                               1.0625f,
                               1.1875f,
                               17.f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> exp(-14, 10);
  for (int i = 0; i < 200000; ++i) values.push_back(std::ldexp(mant(rng), exp(rng)));
  // Every E4M3 value and the midpoints between neighbours (ties round to even).
  for (int b = 0; b < 256; ++b) {
    const float v = FromE4M3(static_cast<uint8_t>(b));
    if (std::isnan(v)) continue;
    values.push_back(v);
    const float next = FromE4M3(static_cast<uint8_t>(b + 1 < 256 ? b + 1 : b));
    if (!std::isnan(next)) values.push_back((v + next) / 2);
  }
  int checked = 0;
  for (float v : values) {
    const uint8_t want = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    ASSERT_EQ(ToE4M3(v), want) << "x = " << v;
    if ((want & 0x7f) != 0x7f) {
      EXPECT_EQ(ToE4M3(FromE4M3(want)), want) << "round trip of " << int{want};
    }
    ++checked;
  }
  EXPECT_EQ(ToE4M3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(FromE4M3(0x7e), 448.f);
  EXPECT_EQ(FromE4M3(0x01), std::ldexp(1.f, -9));
  EXPECT_GT(checked, 200000);
}

// Without a GPU: B packed as E4M3 [Np, Kp] with its per-tensor scale, replayed on the host with
// the product the kernel asks cuBLASLt for, against the FP8 contract's emulation.
TEST(CudaFp8Host, ThePackedPlanReplaysTheContract) {
  const std::vector<I8Case> cases = {
      {"Gemm", {7, 64}, 64, 24, false, false, 1.f, 1.f, {24}, true},
      {"Gemm", {32, 9}, 32, 16, true, true, 0.5f, 2.f, {9, 16}, false},
      {"MatMul", {2, 3, 31}, 31, 33},
      {"FusedMatMul", {5, 20}, 20, 36, false, true, 0.25f, 1.f, {36}, false, "relu"},
  };
  uint32_t seed = 300;
  for (const I8Case& base : cases) {
    const I8Case c = Fp8(base, 1.f);
    SCOPED_TRACE(c.Describe());
    std::mt19937 rng(++seed);
    std::vector<Tensor> inputs = MakeInputs(c, rng);
    Int8Node node(c, inputs, DataType::kFloat32);
    auto spec = cuda::ReadGemmSpec(node.node());
    ASSERT_TRUE(spec.ok());
    auto mk = cuda::QuantRowsAndDepth(*spec, inputs[0].dims());
    ASSERT_TRUE(mk.ok());
    const auto [m, k] = *mk;
    const cuda::Fp8PackedB b = cuda::PackFp8B(*spec, inputs[1]);
    EXPECT_FLOAT_EQ(b.scale, AbsMax(inputs[1]) / 448.f);
    const cuda::QuantAStrides as = cuda::QuantAStridesFor(*spec, m, k);
    std::vector<int64_t> c_dims = inputs.size() > 2 ? inputs[2].dims() : std::vector<int64_t>{};
    auto addend = cuda::ResolveQuantAddend(*spec, inputs.size() > 2 ? &c_dims : nullptr, m, b.n);
    ASSERT_TRUE(addend.ok());
    const std::vector<float> a = inputs[0].ToFloatVector();
    std::vector<float> cv = inputs.size() > 2 ? inputs[2].ToFloatVector() : std::vector<float>{};
    std::vector<uint8_t> a_q(static_cast<size_t>(m * b.kp), 0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t kk = 0; kk < k; ++kk) {
        a_q[i * b.kp + kk] =
            ToE4M3(a[i * as.row_stride + kk * as.col_stride] * Fp8InvScale(*c.fp8_amax));
      }
    }
    std::vector<float> y(static_cast<size_t>(m * b.n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < b.n; ++j) {
        float acc = 0.f;
        for (int64_t kk = 0; kk < b.kp; ++kk) {
          acc += FromE4M3(b.packed[j * b.kp + kk]) * FromE4M3(a_q[i * b.kp + kk]);
        }
        float v = spec->alpha * Fp8Scale(*c.fp8_amax) * b.scale * acc;
        if (addend->present) {
          v += addend->factor * cv[i * addend->row_stride + j * addend->col_stride];
        }
        if (c.act == "relu") v = std::max(v, 0.f);
        y[i * b.n + j] = v;
      }
    }
    std::vector<Tensor> dq = inputs;
    dq[0] = DequantizedFp8(inputs[0], *c.fp8_amax);
    dq[1] = DequantizedFp8(inputs[1], AbsMax(inputs[1]));
    std::vector<float> contract = Int8Node(c, dq, DataType::kFloat32).RunCpu("f32-");
    EXPECT_LE(RelL2(y, contract), 1e-5);
    const double vs_fp32 = RelL2(y, node.RunCpu("f32-"));
    EXPECT_LE(vs_fp32, 8e-2);
    EXPECT_GT(vs_fp32, 1e-3) << "nothing was rounded to E4M3";
  }
}

// ---- End to end: --int8 and --fp8 CUDA builds of bert_tiny.

std::string ZooDir(const std::string& model) {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  return std::string(root ? root : ".") + "/zoo/" + model;
}

Status AddZooProfile(const std::string& dir, BuilderConfig& config) {
  std::ifstream info_file(dir + "/info.json");
  if (!info_file.good()) return MakeError(ErrorCode::kIoError, "no {}/info.json", dir);
  nlohmann::json info = nlohmann::json::parse(info_file);
  for (const auto& [name, p] : info["profile"].items()) {
    std::string spec = name;
    spec.append(":");
    for (const char* which : {"min", "opt", "max"}) {
      bool first = true;
      for (const auto& d : p[which]) {
        if (!first) spec.append("x");
        spec.append(std::to_string(d.get<int64_t>()));
        first = false;
      }
      if (std::string_view(which) != "max") spec.append(",");
    }
    KILN_RETURN_IF_ERROR(ParseProfileSpec(spec, &config.profile));
  }
  return OkStatus();
}

StatusOr<std::map<std::string, Tensor>> RunEngine(const EngineDesc& desc, BackendKind backend,
                                                  const std::map<std::string, Tensor>& feed) {
  KILN_ASSIGN_OR_RETURN(auto bytes, SerializeEngine(desc));
  KILN_ASSIGN_OR_RETURN(auto runtime, Runtime::Create(backend));
  KILN_ASSIGN_OR_RETURN(auto engine, runtime->DeserializeEngine(bytes));
  KILN_ASSIGN_OR_RETURN(auto runner, app::HostRunner::Create(engine));
  KILN_RETURN_IF_ERROR(runner->SetInputs(feed));
  KILN_RETURN_IF_ERROR(runner->Run());
  return runner->outputs();
}

// A zoo model's test_data_set_<set>: its inputs and expected (PyTorch FP32) outputs by name.
Status LoadZooSet(const std::string& dir, const Graph& g, int set,
                  std::map<std::string, Tensor>* feed, std::map<std::string, Tensor>* expected) {
  const std::string data = fmt::format("{}/test_data_set_{}", dir, set);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Tensor t, LoadTensorProto(fmt::format("{}/input_{}.pb", data, i)));
    (*feed)[g.inputs()[i]->name()] = std::move(t);
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Tensor t, LoadTensorProto(fmt::format("{}/output_{}.pb", data, i)));
    (*expected)[g.outputs()[i]->name()] = std::move(t);
  }
  return OkStatus();
}

bool GemmFamily(const std::string& op) {
  return op == "Gemm" || op == "FusedGemm" || op == "MatMul" || op == "FusedMatMul";
}

// Builds bert_tiny for CUDA with --int8 or --fp8 (calibrated on its zoo data sets), checks that
// its matrix products with constant weights took the quantized kernels, and runs both data sets
// against PyTorch's FP32 outputs (and, for INT8, against the CPU's INT8 engine of the same
// model: one engine graph, either backend).
void CheckBertTiny(bool fp8) {
  const std::string dir = ZooDir("bert_tiny");
  if (!std::filesystem::exists(dir + "/model.onnx")) GTEST_SKIP() << "no zoo at " << dir;
  const std::string label = fp8 ? "f8" : "i8";
  BuilderConfig config;
  config.int8 = !fp8;
  config.fp8 = fp8;
  config.calibration_dir = dir;
  // Every INT8/FP8 layer stays so (no sensitivity fallback): the kernels are what is tested.
  config.int8_tolerance = std::numeric_limits<double>::infinity();
  config.fp8_tolerance = std::numeric_limits<double>::infinity();
  config.search_tactics = false;
  ASSERT_TRUE(AddZooProfile(dir, config).ok());

  config.backend = BackendKind::kCuda;
  auto gpu = app::BuildFromOnnxFile(dir + "/model.onnx", config);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  int quantized = 0;
  for (const LayerReport& l : gpu->report.layer_reports) {
    if (!GemmFamily(l.op_type)) continue;
    SCOPED_TRACE(l.name + " (" + l.op_type + "): " + l.precision + ", " + l.tactic + ", " +
                 l.precision_reason);
    EXPECT_EQ(l.precision_reason.find(fp8 ? "no fp8 kernel" : "no int8 kernel"), std::string::npos);
    if (l.precision == label) {
      ++quantized;
      EXPECT_TRUE(l.tactic.starts_with(label + "-matmul-cuda-") ||
                  l.tactic.starts_with(label + "-gemm-cuda-"));
    }
  }
  // The projections and feed-forward products of both encoder layers (and the pooler).
  std::printf("bert_tiny on cuda: %d %s matrix products\n", quantized, label.c_str());
  EXPECT_GE(quantized, 5);

  std::optional<app::BuiltEngine> cpu;
  if (!fp8) {
    config.backend = BackendKind::kCpu;
    auto built = app::BuildFromOnnxFile(dir + "/model.onnx", config);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    cpu = std::move(*built);
  }
  // The model's input and output names in order (input_I.pb / output_O.pb are in that order).
  auto model = ImportOnnxFile(dir + "/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status().ToString();

  for (int set : {0, 1}) {
    SCOPED_TRACE(fmt::format("test_data_set_{}", set));
    std::map<std::string, Tensor> feed, expected;
    Status loaded = LoadZooSet(dir, **model, set, &feed, &expected);
    ASSERT_TRUE(loaded.ok()) << loaded.ToString();
    auto on_gpu = RunEngine(*gpu->desc, BackendKind::kCuda, feed);
    ASSERT_TRUE(on_gpu.ok()) << on_gpu.status().ToString();
    std::optional<std::map<std::string, Tensor>> on_cpu;
    if (cpu) {
      auto r = RunEngine(*cpu->desc, BackendKind::kCpu, feed);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      on_cpu = std::move(*r);
    }
    for (const auto& [name, want] : expected) {
      std::vector<float> got = on_gpu->at(name).ToFloatVector();
      const double vs_fp32 = RelL2(got, want.ToFloatVector());
      std::printf("bert_tiny %s on cuda, set %d, %s: rel_l2 %.3g vs PyTorch FP32\n", label.c_str(),
                  set, name.c_str(), vs_fp32);
      // The zoo INT8 bound (tests/precision/zoo_accuracy_test.cc); FP8 E4M3 per tensor rounds
      // each operand to 3 mantissa bits (about 4e-2 per layer on random data, no sensitivity
      // fallback): a first bound, to be tightened from the H200 run.
      EXPECT_LE(vs_fp32, fp8 ? 2e-1 : 1e-1) << name;
      if (on_cpu) {
        // The two INT8 engines differ by FP16 rounding and the odd activation rounded to the
        // neighbouring int8 step.
        const double vs_cpu = RelL2(got, on_cpu->at(name).ToFloatVector());
        std::printf("  %.3g vs the CPU's INT8 engine\n", vs_cpu);
        EXPECT_LE(vs_cpu, 5e-2) << name;
      }
    }
  }
}

TEST_F(CudaInt8Test, BertTinyInt8BuildKeepsItsMatrixProductsInt8) { CheckBertTiny(false); }
TEST_F(CudaFp8Test, BertTinyFp8BuildKeepsItsMatrixProductsFp8) { CheckBertTiny(true); }

// The FP8 sensitivity fallback at its default tolerance (5e-2, the issue's bar), measured on the
// device by reruns: some products go back to FP16 with their figures, the others stay FP8, and
// the engine is within the bar of PyTorch FP32 on both zoo sets (every product FP8: 0.057-0.071,
// an H100).
TEST_F(CudaFp8Test, BertTinyFp8FallbackKeepsTheEngineWithinTheBar) {
  const std::string dir = ZooDir("bert_tiny");
  if (!std::filesystem::exists(dir + "/model.onnx")) GTEST_SKIP() << "no zoo at " << dir;
  BuilderConfig config;
  config.fp8 = true;
  config.calibration_dir = dir;
  config.search_tactics = false;
  config.backend = BackendKind::kCuda;
  ASSERT_TRUE(AddZooProfile(dir, config).ok());
  auto built = app::BuildFromOnnxFile(dir + "/model.onnx", config);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  int fp8 = 0, fell_back = 0;
  for (const LayerReport& l : built->report.layer_reports) {
    if (!GemmFamily(l.op_type)) continue;
    fp8 += l.precision == "f8";
    fell_back += l.precision_reason.find("fp8 sensitivity rel-L2") != std::string::npos &&
                 l.precision_reason.find("> tolerance 0.05") != std::string::npos;
  }
  std::printf("bert_tiny fp8 fallback: %d FP8 products, %d back to FP16\n", fp8, fell_back);
  EXPECT_GT(fp8, 0);
  EXPECT_GT(fell_back, 0);
  auto model = ImportOnnxFile(dir + "/model.onnx");
  ASSERT_TRUE(model.ok());
  for (int set : {0, 1}) {
    std::map<std::string, Tensor> feed, expected;
    ASSERT_TRUE(LoadZooSet(dir, **model, set, &feed, &expected).ok());
    auto out = RunEngine(*built->desc, BackendKind::kCuda, feed);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    for (const auto& [name, want] : expected) {
      const double e = RelL2(out->at(name).ToFloatVector(), want.ToFloatVector());
      std::printf("bert_tiny fp8 fallback set %d %s: rel_l2 %.3g vs PyTorch FP32\n", set,
                  name.c_str(), e);
      EXPECT_LE(e, 5e-2) << name << " set " << set;
    }
  }
}

// Runs an engine built with quantized edges and the same build without them on the zoo model's
// two data sets: the two may differ by `share` of the unjoined engine's distance from PyTorch
// FP32, and the edges must not make the engine less accurate (within 1.25x and 1e-3).
void CompareJoinedWithApart(const std::string& dir, const EngineDesc& joined,
                            const EngineDesc& apart, const char* label, double share) {
  auto model = ImportOnnxFile(dir + "/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (int set : {0, 1}) {
    SCOPED_TRACE(fmt::format("test_data_set_{}", set));
    std::map<std::string, Tensor> feed, expected;
    Status loaded = LoadZooSet(dir, **model, set, &feed, &expected);
    ASSERT_TRUE(loaded.ok()) << loaded.ToString();
    auto with = RunEngine(joined, BackendKind::kCuda, feed);
    ASSERT_TRUE(with.ok()) << with.status().ToString();
    auto without = RunEngine(apart, BackendKind::kCuda, feed);
    ASSERT_TRUE(without.ok()) << without.status().ToString();
    for (const auto& [name, want] : expected) {
      const std::vector<float> got = with->at(name).ToFloatVector();
      const double vs_apart = RelL2(got, without->at(name).ToFloatVector());
      const double vs_fp32 = RelL2(got, want.ToFloatVector());
      const double apart_vs_fp32 = RelL2(without->at(name).ToFloatVector(), want.ToFloatVector());
      std::printf("%s %s set %d %s: edges vs none %.3g; vs FP32 %.3g (none: %.3g)\n",
                  std::filesystem::path(dir).filename().c_str(), label, set, name.c_str(), vs_apart,
                  vs_fp32, apart_vs_fp32);
      EXPECT_LE(vs_apart, share * apart_vs_fp32) << name;
      EXPECT_LE(vs_fp32, apart_vs_fp32 * 1.25 + 1e-3) << name;
    }
  }
}

// A zoo model (at dir) built for CUDA twice with `config`'s quantization and no tactic search: with
// its quantized edges (`joined`), and with `edges` (BuilderConfig::fp8_edges or int8_edges) off.
struct EdgeBuilds {
  app::BuiltEngine joined, apart;
};
std::optional<EdgeBuilds> BuildWithAndWithoutEdges(const std::string& dir, BuilderConfig config,
                                                   bool BuilderConfig::*edges) {
  config.calibration_dir = dir;
  config.search_tactics = false;
  config.backend = BackendKind::kCuda;
  EXPECT_TRUE(AddZooProfile(dir, config).ok());
  auto joined = app::BuildFromOnnxFile(dir + "/model.onnx", config);
  EXPECT_TRUE(joined.ok()) << joined.status().ToString();
  config.*edges = false;
  auto apart = app::BuildFromOnnxFile(dir + "/model.onnx", config);
  EXPECT_TRUE(apart.ok()) << apart.status().ToString();
  if (!joined.ok() || !apart.ok()) return std::nullopt;
  return EdgeBuilds{std::move(*joined), std::move(*apart)};
}

// FP8 edges (builder/quant_edges.h) on bert_tiny: each feed-forward block's first product (GELU)
// writes E4M3 for the second, which reads it in place (and attention for the output projection).
// The engine, serialized and loaded again, agrees with the same build without edges (the only
// difference: the edge quantizes the producer's FP32 result where the FP16 path quantizes it after
// rounding to FP16) and with PyTorch FP32 as the FP8 build does.
void CheckFp8Edges() {
  const std::string dir = ZooDir("bert_tiny");
  if (!std::filesystem::exists(dir + "/model.onnx")) GTEST_SKIP() << "no zoo at " << dir;
  BuilderConfig config;
  config.fp8 = true;
  config.fp8_tolerance = std::numeric_limits<double>::infinity();  // every product FP8
  auto builds = BuildWithAndWithoutEdges(dir, config, &BuilderConfig::fp8_edges);
  ASSERT_TRUE(builds);
  auto* joined = &builds->joined;
  auto* apart = &builds->apart;
  EXPECT_EQ(apart->report.fp8_edges, 0);
  // Two encoder layers: the feed-forward edge of each, and the attention -> output projection
  // edge where the mma attention kernel was chosen (LayerNorm outputs have a second reader, the
  // residual, and stay FP16).
  EXPECT_GE(joined->report.fp8_edges, 2);
  // One note on each side of each edge or copy (a norm's copy has one per reader).
  int writes = 0, readers = 0;
  for (const LayerReport& l : joined->report.layer_reports) {
    SCOPED_TRACE(l.name + ": " + l.precision + ", " + l.tactic + ", " + l.precision_reason);
    int notes = 0;
    for (size_t at = l.precision_reason.find("writes E4M3 for"); at != std::string::npos;
         at = l.precision_reason.find("writes E4M3 for", at + 1)) {
      ++notes;
    }
    const bool reads = l.precision_reason.find("reads E4M3 from") != std::string::npos;
    writes += notes;
    readers += reads;
    // A reader is an FP8 product; a writer is one too, or attention or a norm (which stay FP16
    // inside).
    if (reads || (notes > 0 && l.op_type != "Attention" && l.op_type != "SkipLayerNormalization")) {
      EXPECT_EQ(l.precision, "f8");
    }
  }
  EXPECT_EQ(writes, joined->report.fp8_edges);
  EXPECT_EQ(readers, joined->report.fp8_edges);
  // The value between them is E4M3 in the engine's graph (one per edge; a copy may serve several).
  int e4m3_values = 0;
  for (const Value* v : joined->desc->graph->values()) e4m3_values += v->dtype() == kFp8EdgeType;
  EXPECT_LE(e4m3_values, joined->report.fp8_edges);
  EXPECT_GE(e4m3_values, 1);
  std::printf("bert_tiny fp8: %lld edges\n", static_cast<long long>(joined->report.fp8_edges));

  // The two FP8 engines differ where an E4M3 rounding flipped (one step, 1/8 of the value or
  // less) and the flip propagated; that is FP8's own noise, so the bound is a share of the
  // unjoined engine's distance from FP32 (H100, 2026-12-06: at most 0.46 of it, pooler output
  // 0.0307 against 0.067).
  CompareJoinedWithApart(dir, *joined->desc, *apart->desc, "fp8", 0.6);
}
TEST_F(CudaFp8Test, EdgesBetweenFp8ProductsMatchTheBuildWithout) { CheckFp8Edges(); }

// The same with every FP8 product on kiln's warpgroup kernel (KILN_CUDA_FP8_KERNEL=wgmma).
TEST_F(CudaFp8Test, EdgesOnTheWarpgroupKernelMatchTheBuildWithout) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  ScopedEnv only("KILN_CUDA_FP8_KERNEL", "wgmma");
  CheckFp8Edges();
}

// INT8 edges (builder/quant_edges.h) on bert_tiny, with every product INT8 on kiln's own INT8
// kernel (KILN_CUDA_INT8_KERNEL=mma: one that reads and writes int8) and no tactic search:
// each feed-forward block's first product writes int8 for the second. The engine agrees with the
// same build without edges (the edge quantizes the producer's FP32 result where the other path
// quantizes it after rounding to FP16) and is as close to PyTorch FP32.
// A convolution network (model resnet_tiny; min_edges its edges at least) takes the same checks
// with its convolutions channels-last (config.fp16, as `kiln build --int8` implies).
void CheckInt8Edges(const char* family, const char* model = "bert_tiny", int min_edges = 2) {
  const std::string dir = ZooDir(model);
  if (!std::filesystem::exists(dir + "/model.onnx")) GTEST_SKIP() << "no zoo at " << dir;
  ScopedEnv own_kernel_only("KILN_CUDA_INT8_KERNEL", family);
  BuilderConfig config;
  config.int8 = true;
  config.fp16 = std::string_view(model) != "bert_tiny";
  config.int8_tolerance = std::numeric_limits<double>::infinity();  // every product INT8
  auto builds = BuildWithAndWithoutEdges(dir, config, &BuilderConfig::int8_edges);
  ASSERT_TRUE(builds);
  auto* joined = &builds->joined;
  auto* apart = &builds->apart;
  EXPECT_EQ(apart->report.int8_edges, 0);
  EXPECT_EQ(joined->report.fp8_edges, 0);
  EXPECT_GE(joined->report.int8_edges, min_edges);
  // Each edge or copy puts one note on each side; a norm writing one copy for several products
  // has a note per reader.
  int writes = 0, readers = 0;
  for (const LayerReport& l : joined->report.layer_reports) {
    SCOPED_TRACE(l.name + ": " + l.precision + ", " + l.tactic + ", " + l.precision_reason);
    // The float layers that write int8 for a product: a norm's copy, attention's output.
    const bool float_writer = l.op_type == "SkipLayerNormalization" || l.op_type == "Attention";
    int notes = 0;
    for (size_t at = l.precision_reason.find("writes int8 for"); at != std::string::npos;
         at = l.precision_reason.find("writes int8 for", at + 1)) {
      ++notes;
    }
    const bool reads = l.precision_reason.find("reads int8 from") != std::string::npos;
    writes += notes;
    readers += reads;
    if ((reads || notes > 0) && !float_writer) {
      EXPECT_EQ(l.precision, "i8");
      EXPECT_NE(l.tactic.find(std::string("-cuda-") + family + "-"), std::string::npos);
    }
  }
  EXPECT_EQ(writes, joined->report.int8_edges);
  EXPECT_EQ(readers, joined->report.int8_edges);
  // Int8 values: one per edge, one per copy (which readers with one scale share).
  int int8_values = 0, copies = 0;
  for (const Value* v : joined->desc->graph->values()) {
    if (v->dtype() != kInt8EdgeType) continue;
    ++int8_values;
    copies += v->producer() && QuantCopyOutputIndex(v->producer()->op_type()) ==
                                   static_cast<size_t>(v->producer_output());
  }
  EXPECT_LE(int8_values, joined->report.int8_edges);
  EXPECT_GE(int8_values, 1);
  std::printf("%s int8: %lld edges, %d of them INT8 copies\n", model,
              static_cast<long long>(joined->report.int8_edges), copies);

  // The engines differ where a value near a rounding boundary of the int8 grid fell to the other
  // side (one step, 1/127 of the range) and the flip propagated through the layers after it:
  // INT8's own noise, so the bound is the unjoined engine's distance from FP32 (H100,
  // 2026-12-06: 0.54-0.83 of it, pooler output 0.0152 against 0.0182).
  CompareJoinedWithApart(dir, *joined->desc, *apart->desc, "int8", 1.0);
}

TEST_F(CudaInt8Test, EdgesBetweenInt8ProductsMatchTheBuildWithout) {
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major < 8) GTEST_SKIP() << "kiln's INT8 kernel needs sm_80";
  CheckInt8Edges("mma");
}

// kiln's 8-bit kernels as an INT8 convolution (`launch`, every tile of `tiles`): the NHWC output
// equals the direct convolution exactly (a unit column scale and an FP32 Y hold the int32 sums
// exactly: below 2^24), over kConvShapes and two larger ones whose rows and channels span several
// tiles and whose depth spans several stages.
using ConvLaunch = cudaError_t (*)(const cuda::Int8MmaGemmParams&, const cuda::ImplicitGemmConv&,
                                   cudaStream_t);
void CheckDirectConvolution(ConvLaunch launch, const std::vector<int>& tiles) {
  std::vector<ConvShape> shapes(std::begin(kConvShapes), std::end(kConvShapes));
  shapes.push_back({2, 64, 14, 14, 160, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1});
  shapes.push_back({1, 256, 7, 7, 300, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1});
  std::mt19937 rng(78);
  for (const ConvShape& sh : shapes) {
    SCOPED_TRACE(sh.Describe());
    const ConvProblem pr = MakeConvProblem(sh, rng);
    const int64_t rows = pr.g.rows();
    std::vector<float> scale(static_cast<size_t>(pr.kp), 0.f);
    std::fill(scale.begin(), scale.begin() + sh.k, 1.f);
    void *x = nullptr, *b = nullptr, *cs = nullptr, *y = nullptr;
    const size_t y_bytes = static_cast<size_t>(rows * sh.k) * sizeof(float);
    ASSERT_EQ(cudaMalloc(&x, pr.xq.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, pr.b.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&cs, scale.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&y, y_bytes), cudaSuccess);
    cudaMemcpy(x, pr.xq.data(), pr.xq.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(b, pr.b.data(), pr.b.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(cs, scale.data(), scale.size() * sizeof(float), cudaMemcpyHostToDevice);
    for (int tile : tiles) {
      SCOPED_TRACE(fmt::format("tile {}", tile));
      cuda::Int8MmaGemmParams p;
      p.a = static_cast<const int8_t*>(x);
      p.lda = pr.g.cp;
      p.b = static_cast<const int8_t*>(b);
      p.ldb = pr.g.depth();
      p.np = pr.kp;
      p.depth = pr.g.depth();
      p.tile = tile;
      p.epi.col_scale = static_cast<const float*>(cs);
      p.epi.y = y;
      p.epi.type = cuda::BlasType::kF32;
      p.epi.rows = rows;
      p.epi.cols = sh.k;
      cudaMemset(y, 0xff, y_bytes);  // NaNs: an output the kernel misses shows
      ASSERT_EQ(launch(p, pr.g, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> got(static_cast<size_t>(rows * sh.k));
      cudaMemcpy(got.data(), y, y_bytes, cudaMemcpyDeviceToHost);
      int64_t mismatches = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        mismatches += got[i] != static_cast<float>(pr.want[i]);
      }
      EXPECT_EQ(mismatches, 0);
    }
    cudaFree(x);
    cudaFree(b);
    cudaFree(cs);
    cudaFree(y);
  }
}

TEST_F(CudaInt8Test, WarpgroupConvolutionMatchesTheDirectConvolution) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  // Every gathering tile, those not yet GPU-tested included.
  CheckDirectConvolution(cuda::LaunchInt8WgmmaConv,
                         cuda::Int8WgmmaTileOrder(cuda::WgmmaTileUse::kGatherConv));
}

TEST_F(CudaInt8Test, MmaConvolutionMatchesTheDirectConvolution) {
  if (!cuda::MmaCapable()) GTEST_SKIP() << "kiln's mma.sync INT8 kernel needs sm_80";
  std::vector<int> tiles(static_cast<size_t>(cuda::Int8MmaTileCount()));
  std::iota(tiles.begin(), tiles.end(), 0);
  CheckDirectConvolution(cuda::LaunchInt8MmaConv, tiles);
}

// The INT8 convolution layer (conv_int8.cc): every tile of the provider's tactics in each family
// (`family`: KILN_CUDA_INT8_KERNEL), in f32 and f16 storage, against its plan replayed on the
// host (the INT8 contract: only float rounding between them) and against the CPU's INT8
// convolution of the same layer in NCHW. The workspace starts as garbage and each tactic runs
// twice (RunCudaKernel).
void CheckInt8ConvolutionLayer(const char* family) {
  ScopedEnv only("KILN_CUDA_INT8_KERNEL", family);
  // Every tile, those not yet GPU-tested included (a pointwise layer runs on each).
  ScopedEnv every_tile("KILN_CUDA_WGMMA_TILES", EveryWgmmaTileName().c_str());
  const bool wgmma = std::string_view(family) == "wgmma";
  std::vector<ConvCase> cases(std::begin(kInt8ConvCases), std::end(kInt8ConvCases));
  cases.push_back({{2, 64, 14, 14, 160, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}, true, true, "relu"});
  cases.push_back({{1, 256, 7, 7, 300, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1}, true, false, ""});
  std::mt19937 rng(93);
  for (const ConvCase& c : cases) {
    for (DataType storage : {DataType::kFloat32, DataType::kFloat16}) {
      SCOPED_TRACE(c.Describe() + " storage " + std::string(ToString(storage)));
      std::vector<Tensor> in = MakeConvInputs(c, rng);
      for (Tensor& t : in) t = t.CastTo(storage).CastTo(DataType::kFloat32);
      ConvNode nhwc(c, in, true, storage);
      const std::vector<float> cpu = NchwToNhwc(ConvNode(c, in, false, storage).RunCpu(), c);
      const std::vector<float> replay =
          ReplayConvOnHost(c, ConvNode(c, in, true, DataType::kFloat32));
      auto tactics = nhwc.Tactics(BackendKind::kCuda, "i8-");
      const bool pointwise = c.sh.r == 1 && c.sh.s == 1 && c.sh.sh == 1 && c.sh.sw == 1 &&
                             c.sh.pt + c.sh.pl + c.sh.pb + c.sh.pr == 0;
      EXPECT_EQ(static_cast<int>(tactics.size()), !wgmma      ? cuda::Int8MmaTileCount()
                                                  : pointwise ? cuda::Int8WgmmaTileCount()
                                                              : cuda::Int8WgmmaConvTileCount());
      const Bounds b = BoundsFor(storage);
      for (const auto& [p, t] : tactics) {
        SCOPED_TRACE(t.name);
        EXPECT_TRUE(t.name.starts_with(
            fmt::format("i8-{}-cuda-{}-", c.fused() ? "fused-conv" : "conv", family)));
        const std::vector<float> y = nhwc.RunCuda(p, t);
        if (y.empty()) continue;
        EXPECT_LE(RelL2(y, replay), b.contract) << "against the plan replayed on the host";
        EXPECT_LE(RelL2(y, cpu), b.cpu_int8) << "against the CPU's INT8 convolution";
      }
    }
  }
}

TEST_F(CudaInt8Test, Int8ConvolutionLayerMatchesTheCpuInt8Kernel) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  CheckInt8ConvolutionLayer("wgmma");
}

TEST_F(CudaInt8Test, MmaInt8ConvolutionLayerMatchesTheCpuInt8Kernel) {
  if (!cuda::MmaCapable()) GTEST_SKIP() << "kiln's mma.sync INT8 kernel needs sm_80";
  CheckInt8ConvolutionLayer("mma");
}

// A convolution whose output rows (N * OH * OW at the profile's largest) pass a tile's 65535 row
// blocks is not offered that tile (its launch would fail): 8 x 1024 x 1024 rows leave only the
// 256-row tiles. Only tactics are listed; nothing of that size is allocated.
TEST_F(CudaInt8Test, TilesWhoseRowBlocksPassTheGridAreNotOffered) {
  if (!cuda::MmaCapable()) GTEST_SKIP() << "kiln's INT8 convolution needs sm_80";
  ScopedEnv all("KILN_CUDA_INT8_KERNEL", "all");
  std::mt19937 rng(95);
  const ConvCase c = kInt8ConvCases[1];  // 1x1, stride 1, no padding: Y's pixels are X's
  ConvNode node(c, MakeConvInputs(c, rng), true, DataType::kFloat32);
  const size_t all_tiles = TacticsFor(node.request(), BackendKind::kCuda, "i8-").size();
  ASSERT_GT(all_tiles, 0u);
  KernelRequest big = node.request();
  big.inputs[0].max_dims = {8, 1024, 1024, c.sh.c};
  big.outputs[0].max_dims = {8, 1024, 1024, c.sh.k};
  size_t offered = 0;
  for (const auto& [provider, t] : TacticsFor(big, BackendKind::kCuda, "i8-")) {
    const int tile = static_cast<int>(t.params.at(1));
    const int rows =
        t.family == "wgmma" ? cuda::Int8WgmmaTileRows(tile) : cuda::Int8MmaTileRows(tile);
    EXPECT_EQ(rows, 256) << t.name;
    ++offered;
  }
  EXPECT_LT(offered, all_tiles);
  if (WgmmaExpected()) {
    EXPECT_GT(offered, 0u);  // the warpgroup kernel's 256-row tiles
  }
}

// The same with Hopper's warpgroup kernel (KILN_CUDA_INT8_KERNEL=wgmma) reading and writing int8.
TEST_F(CudaInt8Test, EdgesOnTheWarpgroupKernelMatchTheBuildWithout) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  CheckInt8Edges("wgmma");
}

// INT8 edges between convolutions (conv_int8.cc) on resnet_tiny (one BasicBlock per stage, 16-128
// channels): each block's first convolution writes int8 for its second, which reads it in place
// (the block's input has a second reader, the residual or the downsampling convolution, and
// stays float): 4 blocks, 4 edges. On the mma.sync kernel (sm_80+) and on the warpgroup kernel
// (Hopper).
TEST_F(CudaInt8Test, ConvolutionEdgesMatchTheBuildWithout) {
  if (!cuda::MmaCapable()) GTEST_SKIP() << "kiln's mma.sync INT8 kernel needs sm_80";
  CheckInt8Edges("mma", "resnet_tiny", 4);
}
TEST_F(CudaInt8Test, ConvolutionEdgesOnTheWarpgroupKernelMatchTheBuildWithout) {
  if (!WgmmaExpected()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  CheckInt8Edges("wgmma", "resnet_tiny", 4);
}

}  // namespace
}  // namespace kiln::testing
