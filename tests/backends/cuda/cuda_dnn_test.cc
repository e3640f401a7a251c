// cuDNN convolutions (backends/cuda/conv_cudnn.cc) and kiln's depthwise and grouped kernels
// (conv_depthwise.cc) against the CPU backend: every provider and every tactic it offers, on fresh
// random inputs, for Conv (groups, depthwise, stride, dilation, 1x1, odd sizes, asymmetric pads,
// 1-D), each FusedConv epilogue and ConvTranspose, in f32, f16 and bf16, NCHW and NHWC
// (kiln_layout). The reference is the CPU's NCHW kernel on the same rounded inputs, in f32. Skips
// without a GPU. On the GPU machine: KILN_BUNDLE_BINS=cuda_dnn_tests scripts/bundle_gpu.sh here,
// then there `source scripts/gpu_env.sh && cuda_dnn_tests --gtest_filter='*cuda_*' --gtest_brief=1`
// (KILN_CUDNN_MAX_TACTICS bounds the tactics per layer; KILN_LOG_LEVEL=DEBUG says why a cuDNN
// graph or engine configuration gave no tactic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "kiln/backends/backend.h"
#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/backends/cuda/conv_cudnn.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

using enum DataType;

struct ConvCase {
  std::string name;
  std::string op;
  std::vector<int64_t> x, w;  // X in NCHW, W as in ONNX
  bool bias = false, residual = false;
  std::string activation;  // FusedConv only
  std::vector<std::pair<std::string, std::vector<int64_t>>> ints;
  int64_t group = 1;
};

void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name; }

std::vector<ConvCase> Cases() {
  using P = std::pair<std::string, std::vector<int64_t>>;
  return {
      {"conv3x3_odd",
       "Conv",
       {2, 16, 13, 11},
       {32, 16, 3, 3},
       true,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}}},
      {"conv3x3_stride2",
       "Conv",
       {2, 8, 15, 15},
       {16, 8, 3, 3},
       false,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}, P{"strides", {2, 2}}}},
      {"conv3x3_dilation2",
       "Conv",
       {1, 8, 12, 12},
       {8, 8, 3, 3},
       true,
       false,
       "",
       {P{"pads", {2, 2, 2, 2}}, P{"dilations", {2, 2}}}},
      {"conv1x1", "Conv", {2, 32, 7, 7}, {64, 32, 1, 1}, false, false, "", {}},
      {"depthwise3x3",
       "Conv",
       {2, 16, 9, 9},
       {16, 1, 3, 3},
       true,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}},
       16},
      {"grouped4",
       "Conv",
       {1, 16, 8, 8},
       {32, 4, 3, 3},
       false,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}},
       4},
      {"conv5x5_asym_pads",
       "Conv",
       {1, 8, 10, 9},
       {8, 8, 5, 5},
       false,
       false,
       "",
       {P{"pads", {1, 2, 2, 1}}, P{"strides", {1, 2}}}},
      {"conv1d", "Conv", {2, 8, 17}, {16, 8, 3}, true, false, "", {P{"pads", {1, 1}}}},
      {"fused_bias_relu",
       "FusedConv",
       {2, 16, 9, 9},
       {16, 16, 3, 3},
       true,
       false,
       "relu",
       {P{"pads", {1, 1, 1, 1}}}},
      {"fused_bias_residual_relu",
       "FusedConv",
       {2, 16, 9, 9},
       {16, 16, 3, 3},
       true,
       true,
       "relu",
       {P{"pads", {1, 1, 1, 1}}}},
      {"fused_relu6_stride2",
       "FusedConv",
       {1, 8, 11, 11},
       {16, 8, 3, 3},
       true,
       false,
       "relu6",
       {P{"pads", {1, 1, 1, 1}}, P{"strides", {2, 2}}}},
      {"fused_silu_1x1", "FusedConv", {2, 16, 6, 6}, {32, 16, 1, 1}, true, false, "silu", {}},
      // Depthwise shapes for kiln's own kernel (conv_depthwise.cu, NHWC) beside cuDNN's: 7x7 as
      // ConvNeXt (C a multiple of 8: 16-byte loads), odd channels (one channel per thread), 5x5
      // stride 2 with asymmetric pads (EfficientNet), 3x3 stride 2 on an odd extent.
      {"depthwise7x7_convnext",
       "Conv",
       {2, 96, 14, 14},
       {96, 1, 7, 7},
       true,
       false,
       "",
       {P{"pads", {3, 3, 3, 3}}},
       96},
      {"depthwise7x7_odd_channels",
       "Conv",
       {1, 20, 9, 11},
       {20, 1, 7, 7},
       true,
       false,
       "",
       {P{"pads", {3, 3, 3, 3}}},
       20},
      {"depthwise5x5_stride2_asym",
       "Conv",
       {2, 24, 15, 13},
       {24, 1, 5, 5},
       false,
       false,
       "",
       {P{"pads", {1, 2, 2, 1}}, P{"strides", {2, 2}}},
       24},
      {"depthwise3x3_stride2_odd",
       "Conv",
       {1, 40, 17, 17},
       {40, 1, 3, 3},
       true,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}, P{"strides", {2, 2}}},
       40},
      // The row-tiled kernel (4 outputs per thread, filter widths 3/5/7, stride 1 or 2): a width
      // that is no multiple of the tile, a 3x5 filter with asymmetric pads, stride 2 on 7 wide.
      {"depthwise7x7_wide_tail",
       "Conv",
       {1, 64, 5, 30},
       {64, 1, 7, 7},
       true,
       false,
       "",
       {P{"pads", {3, 3, 3, 3}}},
       64},
      {"depthwise3x5_asym",
       "Conv",
       {2, 32, 10, 19},
       {32, 1, 3, 5},
       true,
       false,
       "",
       {P{"pads", {1, 2, 0, 1}}},
       32},
      {"depthwise7x7_stride2",
       "Conv",
       {1, 16, 13, 21},
       {16, 1, 7, 7},
       false,
       false,
       "",
       {P{"pads", {3, 2, 3, 2}}, P{"strides", {2, 2}}},
       16},
      // The shared-memory tile (16 rows x 8 columns x 32 channels a block at stride 1, 8 rows at
      // stride 2): several row and column tiles with partial ones at the edges, and a channel
      // count that leaves the last block 8 of its 32 channels.
      {"depthwise3x3_smem_tiles",
       "Conv",
       {1, 72, 37, 19},
       {72, 1, 3, 3},
       true,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}},
       72},
      {"depthwise5x5_stride2_smem_tiles",
       "Conv",
       {2, 48, 40, 35},
       {48, 1, 5, 5},
       true,
       false,
       "",
       {P{"pads", {2, 2, 2, 2}}, P{"strides", {2, 2}}},
       48},
      {"fused_residual_gelu_depthwise7x7",
       "FusedConv",
       {2, 32, 8, 8},
       {32, 1, 7, 7},
       true,
       true,
       "gelu",
       {P{"pads", {3, 3, 3, 3}}},
       32},
      {"fused_hardswish_depthwise",
       "FusedConv",
       {1, 16, 7, 7},
       {16, 1, 3, 3},
       true,
       false,
       "hardswish",
       {P{"pads", {1, 1, 1, 1}}},
       16},
      // EfficientNet's and MobileNetV3's depthwise layers: 5x5 stride 2 with SiLU, 3x3 with ReLU.
      {"fused_silu_depthwise5x5_stride2",
       "FusedConv",
       {2, 144, 15, 15},
       {144, 1, 5, 5},
       true,
       false,
       "silu",
       {P{"pads", {2, 2, 2, 2}}, P{"strides", {2, 2}}},
       144},
      {"fused_relu_depthwise3x3",
       "FusedConv",
       {1, 72, 9, 9},
       {72, 1, 3, 3},
       true,
       false,
       "relu",
       {P{"pads", {1, 1, 1, 1}}},
       72},
      // Grouped shapes for kiln's grouped kernel (conv_grouped.cu, NHWC) beside cuDNN's: RegNet's
      // 24-channel groups, ResNeXt-like 8 in / 16 out with a residual, stride 2, dilation with a
      // filter above 48 KiB of shared memory (48 out per group), 1x1 with 64 out per group, 8
      // out per group with asymmetric pads.
      {"grouped3x3_regnet_relu",
       "FusedConv",
       {2, 48, 9, 11},
       {48, 24, 3, 3},
       true,
       false,
       "relu",
       {P{"pads", {1, 1, 1, 1}}},
       2},
      {"grouped3x3_stride2",
       "Conv",
       {1, 96, 13, 13},
       {96, 24, 3, 3},
       true,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}, P{"strides", {2, 2}}},
       4},
      {"grouped3x3_residual_silu_8to16",
       "FusedConv",
       {2, 32, 7, 7},
       {64, 8, 3, 3},
       true,
       true,
       "silu",
       {P{"pads", {1, 1, 1, 1}}},
       4},
      {"grouped3x3_dilation2_48",
       "Conv",
       {1, 96, 10, 10},
       {96, 48, 3, 3},
       false,
       false,
       "",
       {P{"pads", {2, 2, 2, 2}}, P{"dilations", {2, 2}}},
       2},
      {"grouped1x1_32to64", "Conv", {2, 64, 5, 5}, {128, 32, 1, 1}, true, false, "", {}, 2},
      {"grouped3x3_8to8_asym",
       "Conv",
       {1, 32, 9, 8},
       {32, 8, 3, 3},
       true,
       false,
       "",
       {P{"pads", {0, 1, 2, 1}}},
       4},
      // Squeeze-excite's second convolution: 1x1 on a 1x1 map, then a sigmoid (cuDNN offers
      // runtime-compiled engines for it).
      {"fused_1x1_on_1x1_sigmoid",
       "FusedConv",
       {3, 40, 1, 1},
       {72, 40, 1, 1},
       true,
       false,
       "sigmoid",
       {}},
      {"fused_residual_gelu_nobias",
       "FusedConv",
       {1, 8, 8, 8},
       {8, 8, 3, 3},
       false,
       true,
       "gelu",
       {P{"pads", {1, 1, 1, 1}}}},
      {"convtranspose_k2s2_bias",
       "ConvTranspose",
       {2, 16, 5, 6},
       {16, 8, 2, 2},
       true,
       false,
       "",
       {P{"strides", {2, 2}}}},
      {"convtranspose_k3s2_outpad",
       "ConvTranspose",
       {1, 8, 5, 5},
       {8, 4, 3, 3},
       false,
       false,
       "",
       {P{"strides", {2, 2}}, P{"pads", {1, 1, 1, 1}}, P{"output_padding", {1, 1}}}},
      {"convtranspose_grouped2_bias",
       "ConvTranspose",
       {1, 8, 6, 6},
       {8, 3, 3, 3},
       true,
       false,
       "",
       {P{"pads", {1, 1, 1, 1}}},
       2},
  };
}

// 4-D NCHW <-> NHWC on host f32 data.
Tensor ToNhwc(const Tensor& t) {
  const auto& d = t.dims();
  Tensor out(t.dtype(), {d[0], d[2], d[3], d[1]});
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t c = 0; c < d[1]; ++c)
      for (int64_t h = 0; h < d[2]; ++h)
        for (int64_t w = 0; w < d[3]; ++w) {
          out.mutable_data<float>()[((n * d[2] + h) * d[3] + w) * d[1] + c] =
              t.data<float>()[((n * d[1] + c) * d[2] + h) * d[3] + w];
        }
  return out;
}
Tensor ToNchw(const Tensor& t) {
  const auto& d = t.dims();  // N, H, W, C
  Tensor out(t.dtype(), {d[0], d[3], d[1], d[2]});
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t h = 0; h < d[1]; ++h)
      for (int64_t w = 0; w < d[2]; ++w)
        for (int64_t c = 0; c < d[3]; ++c) {
          out.mutable_data<float>()[((n * d[3] + c) * d[1] + h) * d[2] + w] =
              t.data<float>()[((n * d[1] + h) * d[2] + w) * d[3] + c];
        }
  return out;
}

Tensor Random(std::vector<int64_t> dims, double scale, std::mt19937& rng) {
  Tensor t(kFloat32, std::move(dims));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    t.mutable_data<float>()[i] = static_cast<float>(u(rng) * scale);
  }
  return t;
}

// |got - want| <= abs + rel * |want|, by storage type (FP32 accumulation everywhere; f16/bf16
// add the rounding of the output, and of the intermediate on the unfused-epilogue path).
std::pair<double, double> Tolerance(DataType t) {
  if (t == kFloat16) return {1e-2, 1e-2};
  if (t == kBFloat16) return {5e-2, 2e-2};
  return {1e-3, 1e-3};
}

AttributeMap MakeAttrs(const ConvCase& c, bool nhwc) {
  AttributeMap a;
  for (const auto& [k, v] : c.ints) a.Set(k, v);
  if (c.group != 1) a.Set("group", c.group);
  if (!c.activation.empty()) a.Set("activation", c.activation);
  if (nhwc) a.Set("kiln_layout", std::string("NHWC"));
  return a;
}

// One node over graph inputs/constants; returns the node (shapes inferred).
Node* OneNode(Graph& g, const ConvCase& c, bool nhwc, const std::vector<Tensor>& ins,
              const std::vector<bool>& is_const) {
  std::vector<Value*> values;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].empty()) {
      values.push_back(nullptr);
    } else if (is_const[i]) {
      values.push_back(g.AddConstant("c" + std::to_string(i), ins[i]));
    } else {
      values.push_back(
          g.AddInput("in" + std::to_string(i), ins[i].dtype(), MakeShape(ins[i].dims())));
    }
  }
  Value* y = g.AddValue("y");
  Node* n = g.AddNode(c.op, "node", values, {y}, MakeAttrs(c, nhwc));
  g.MarkOutput(y);
  Status s = InferShapes(g).status();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return n;
}

// The backend under test is CUDA; the same harness also runs the CPU backend's own providers
// (for NHWC, its transposing adapter), which checks the harness itself on machines without a GPU.
class CudnnConvTest
    : public ::testing::TestWithParam<std::tuple<ConvCase, DataType, bool /*nhwc*/, BackendKind>> {
};

// Runs every tactic every provider offers for `c` on `kind` against the CPU reference.
void CheckEveryTactic(const ConvCase& c, DataType dtype, bool nhwc, BackendKind kind) {
  auto backend = GetBackend(kind);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  Backend* gpu = *backend;

  uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int64_t fan_in = 1;
  for (size_t i = 1; i < c.w.size(); ++i) fan_in *= c.w[i];
  // Inputs rounded to the storage type, so the reference sees exactly what the GPU sees.
  auto round = [&](const Tensor& t) { return t.CastTo(dtype).CastTo(kFloat32); };
  Tensor x = round(Random(c.x, 1.0, rng));
  Tensor w = round(Random(c.w, 1.0 / std::sqrt(static_cast<double>(fan_in)), rng));
  int64_t m = c.op == "ConvTranspose" ? c.w[1] * c.group : c.w[0];
  Tensor b = c.bias ? round(Random({m}, 0.5, rng)) : Tensor();

  // The CPU reference (NCHW, f32). Z needs Y's shape, from the reference graph's shape rule.
  auto ref_graph = std::make_unique<Graph>();
  std::vector<Tensor> ref_in = {x, w, b};
  std::vector<bool> consts = {false, true, true, false};
  Node* ref_node = OneNode(*ref_graph, c, false, ref_in, consts);
  if (c.residual) {
    ref_in.push_back(round(Random(*StaticDims(ref_node->output(0)->shape()), 1.0, rng)));
    ref_graph = std::make_unique<Graph>();
    ref_node = OneNode(*ref_graph, c, false, ref_in, consts);
  }
  std::vector<const Tensor*> ref_ptrs;
  for (const Tensor& t : ref_in) ref_ptrs.push_back(t.empty() ? nullptr : &t);
  auto want = cpu::EvaluateNode(*ref_node, ref_ptrs);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  const Tensor& y_ref = (*want)[0];

  // The GPU node, in its storage type and layout.
  std::vector<Tensor> gpu_in;
  for (size_t i = 0; i < ref_in.size(); ++i) {
    const Tensor& t = ref_in[i];
    if (t.empty()) {
      gpu_in.emplace_back();
      continue;
    }
    bool activation = i == 0 || i == 3;
    gpu_in.push_back((nhwc && activation ? ToNhwc(t) : t).CastTo(dtype));
  }
  Graph g;
  Node* node = OneNode(g, c, nhwc, gpu_in, consts);
  KernelRequest request;
  request.node = node;
  for (size_t i = 0; i < gpu_in.size(); ++i) {
    OperandDesc d;
    if (!gpu_in[i].empty()) {
      d = {dtype, MakeShape(gpu_in[i].dims()), gpu_in[i].dims(), consts[i] ? &gpu_in[i] : nullptr};
    }
    request.inputs.push_back(d);
  }
  std::vector<int64_t> y_dims = *StaticDims(node->output(0)->shape());
  request.outputs.push_back({dtype, MakeShape(y_dims), y_dims, nullptr});

  // Device copies of the operands.
  std::vector<DeviceBuffer> dev;
  std::vector<TensorView> in_views;
  for (const Tensor& t : gpu_in) {
    if (t.empty()) {
      dev.emplace_back();
      in_views.push_back({});
      continue;
    }
    auto buf = gpu->Allocate(t.size_bytes());
    ASSERT_TRUE(buf.ok()) << buf.status().ToString();
    ASSERT_TRUE(gpu->CopyToDevice(buf->data(), t.raw(), t.size_bytes(), nullptr).ok());
    in_views.push_back({dtype, t.dims(), buf->data()});
    dev.push_back(std::move(*buf));
  }
  Tensor y_host(dtype, y_dims);
  auto y_dev = gpu->Allocate(y_host.size_bytes());
  ASSERT_TRUE(y_dev.ok());
  TensorView y_view{dtype, y_host.dims(), y_dev->data()};

  Tensor nan_fill = Tensor(kFloat32, y_dims);
  for (int64_t i = 0; i < nan_fill.num_elements(); ++i) {
    nan_fill.mutable_data<float>()[i] = std::nanf("");
  }
  nan_fill = nan_fill.CastTo(dtype);
  auto [abs_tol, rel_tol] = Tolerance(dtype);
  int tactics_run = 0;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(kind, *node)) {
    const std::vector<TacticConfig> tactics = p->Tactics(request);
    // KILN_CUDNN_RUNTIME_COMPILED's default: at most one engine that compiles its kernel at
    // finalisation (seconds of build time each) per convolution.
    const auto compiled = std::count_if(tactics.begin(), tactics.end(), [](const TacticConfig& t) {
      return t.name.find("-rtc") != std::string::npos;
    });
    EXPECT_LE(compiled, 1) << p->id() << " offers " << compiled << " runtime-compiled engines";
    for (const TacticConfig& tactic : tactics) {
      SCOPED_TRACE(tactic.name);
      auto kernel = p->Create(request, tactic);
      ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
      auto ws = (*kernel)->Prepare(in_views, {&y_view, 1});
      ASSERT_TRUE(ws.ok()) << ws.status().ToString();
      // The builder budgets memory with the tactic's estimate (the CPU's f16/bf16 wrapper
      // leaves its conversion buffers out of it, so this is asserted for CUDA only).
      if (kind == BackendKind::kCuda) {
        EXPECT_LE(*ws, tactic.workspace_bytes) << "the tactic's workspace estimate is not honest";
      }
      DeviceBuffer ws_buf;
      if (*ws) {
        auto b2 = gpu->Allocate(*ws);
        ASSERT_TRUE(b2.ok());
        ws_buf = std::move(*b2);
      }
      // A stale result must not pass: Y starts as NaN.
      ASSERT_TRUE(
          gpu->CopyToDevice(y_dev->data(), nan_fill.raw(), nan_fill.size_bytes(), nullptr).ok());
      KernelRunArgs args;
      args.inputs = in_views;
      args.outputs = {&y_view, 1};
      args.workspace = ws_buf.data();
      args.workspace_bytes = *ws;
      Status run = (*kernel)->Run(args);
      ASSERT_TRUE(run.ok()) << run.ToString();
      ASSERT_TRUE(gpu->Synchronize(nullptr).ok());
      ASSERT_TRUE(
          gpu->CopyToHost(y_host.mutable_raw(), y_dev->data(), y_host.size_bytes(), nullptr).ok());
      Tensor got = y_host.CastTo(kFloat32);
      if (nhwc) got = ToNchw(got);
      ASSERT_EQ(got.dims(), y_ref.dims());
      int bad = 0;
      double worst = 0;
      for (int64_t i = 0; i < got.num_elements(); ++i) {
        double want_v = y_ref.data<float>()[i], got_v = got.data<float>()[i];
        double err = std::abs(got_v - want_v);
        double allowed = abs_tol + rel_tol * std::abs(want_v);
        if (!(err <= allowed)) {
          ++bad;
          worst = std::max(worst, std::isnan(err) ? 1e30 : err);
        }
      }
      EXPECT_EQ(bad, 0) << bad << " of " << got.num_elements() << " elements off; worst error "
                        << worst;
      ++tactics_run;
      if (kind == BackendKind::kCuda) {
        std::printf("[ tactic   ] %s ws %zu%s\n", tactic.name.c_str(), *ws, bad ? " FAILED" : "");
      }
    }
  }
  EXPECT_GT(tactics_run, 0) << "no tactic for " << c.name;
  ::testing::Test::RecordProperty("tactics", tactics_run);
}

TEST_P(CudnnConvTest, EveryTacticMatchesCpu) {
  const auto& [c, dtype, nhwc, kind] = GetParam();
  auto backend = GetBackend(kind);
  if (!backend.ok()) GTEST_SKIP() << "no GPU: " << backend.status().ToString();
  if (nhwc && c.x.size() != 4) GTEST_SKIP() << "NHWC is 4-D only";
  CheckEveryTactic(c, dtype, nhwc, kind);
}

// Runtime-compiled plans go to the plan store (KILN_CUDNN_PLAN_CACHE) and come back from it in a
// process that has none in memory: deserialised, not compiled again, and still right.
TEST(CudnnPlanStore, RuntimeCompiledPlansComeBackFromDisk) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no GPU";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-plans-{}", ::getpid());
  fs::remove_all(dir);
  cuda::SetCudnnPlanStoreForTesting(dir.string());
  cuda::ClearCudnnPlanCacheForTesting();
  using P = std::pair<std::string, std::vector<int64_t>>;
  const std::vector<ConvCase> cases = {
      {"se_1x1_sigmoid", "FusedConv", {3, 40, 1, 1}, {72, 40, 1, 1}, true, false, "sigmoid", {}},
      {"conv3x3_silu",
       "FusedConv",
       {2, 16, 9, 9},
       {32, 16, 3, 3},
       true,
       false,
       "silu",
       {P{"pads", {1, 1, 1, 1}}}}};
  const cuda::CudnnPlanStats before = cuda::GetCudnnPlanStats();
  for (const ConvCase& c : cases) CheckEveryTactic(c, kFloat16, true, BackendKind::kCuda);
  const cuda::CudnnPlanStats first = cuda::GetCudnnPlanStats();
  const int64_t stored = first.stored - before.stored;
  int64_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".blob";
  EXPECT_EQ(files, stored);
  if (stored == 0) {
    cuda::SetCudnnPlanStoreForTesting(std::nullopt);
    fs::remove_all(dir);
    GTEST_SKIP() << "cuDNN offered no runtime-compiled engine for these graphs";
  }
  cuda::ClearCudnnPlanCacheForTesting();
  for (const ConvCase& c : cases) CheckEveryTactic(c, kFloat16, true, BackendKind::kCuda);
  const cuda::CudnnPlanStats second = cuda::GetCudnnPlanStats();
  EXPECT_EQ(second.loaded - first.loaded, stored);
  EXPECT_EQ(second.stored, first.stored) << "a plan was compiled and stored again";
  std::printf("[ plans    ] stored %lld, loaded %lld\n", static_cast<long long>(stored),
              static_cast<long long>(second.loaded - first.loaded));
  cuda::SetCudnnPlanStoreForTesting(std::nullopt);
  fs::remove_all(dir);
}

std::string CaseName(const ::testing::TestParamInfo<CudnnConvTest::ParamType>& info) {
  const auto& [c, dtype, nhwc, kind] = info.param;
  return std::string(ToString(kind)) + "_" + c.name + "_" + std::string(ToString(dtype)) +
         (nhwc ? "_nhwc" : "_nchw");
}

INSTANTIATE_TEST_SUITE_P(Cudnn, CudnnConvTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::Values(kFloat16, kFloat32, kBFloat16),
                                            ::testing::Values(true, false),
                                            ::testing::Values(BackendKind::kCuda,
                                                              BackendKind::kCpu)),
                         CaseName);

// On a machine without a GPU the providers offer nothing (and do not fail): the builder then
// reports the missing kernel with its catalog code.
TEST(CudnnConvNoGpu, NoTacticsWithoutAGpu) {
  if (GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "a GPU is present";
  ConvCase c = Cases()[0];
  Graph g;
  std::mt19937 rng(1);
  std::vector<Tensor> ins = {Random(c.x, 1, rng), Random(c.w, 1, rng), Tensor()};
  Node* node = OneNode(g, c, false, ins, {false, true, true});
  KernelRequest request;
  request.node = node;
  request.inputs.push_back({kFloat32, MakeShape(c.x), c.x, nullptr});
  request.inputs.push_back({kFloat32, MakeShape(c.w), c.w, &ins[1]});
  std::vector<int64_t> y = *StaticDims(node->output(0)->shape());
  request.outputs.push_back({kFloat32, MakeShape(y), y, nullptr});
  const KernelProvider* p = KernelRegistry::Get().Find(BackendKind::kCuda, "cuda.conv.cudnn");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->op_type(), "Conv");
  EXPECT_TRUE(p->Tactics(request).empty());
}

// A tactic from another kiln's engine file (unknown params layout) is a catalog error at Create,
// before any device work, not a crash or a silently different plan.
TEST(CudnnConvParams, MalformedParamsAreAnError) {
  ConvCase c = Cases()[0];
  Graph g;
  std::mt19937 rng(1);
  std::vector<Tensor> ins = {Random(c.x, 1, rng), Random(c.w, 1, rng), Tensor()};
  Node* node = OneNode(g, c, false, ins, {false, true, true});
  KernelRequest request;
  request.node = node;
  request.inputs.push_back({kFloat32, MakeShape(c.x), c.x, nullptr});
  request.inputs.push_back({kFloat32, MakeShape(c.w), c.w, &ins[1]});
  std::vector<int64_t> y = *StaticDims(node->output(0)->shape());
  request.outputs.push_back({kFloat32, MakeShape(y), y, nullptr});
  const KernelProvider* p = KernelRegistry::Get().Find(BackendKind::kCuda, "cuda.conv.cudnn");
  ASSERT_NE(p, nullptr);
  for (std::vector<int64_t> params : {std::vector<int64_t>{}, std::vector<int64_t>{99, 1, 3, 0},
                                      std::vector<int64_t>{1, 0, 3, 2, 7}}) {
    auto kernel = p->Create(request, {"f32-conv-nchw-cudnn-engine3", params, 0});
    ASSERT_FALSE(kernel.ok());
    EXPECT_EQ(kernel.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(kernel.status().message().find("malformed"), std::string::npos)
        << kernel.status().ToString();
  }
}

}  // namespace
}  // namespace kiln
