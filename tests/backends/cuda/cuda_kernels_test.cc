// CUDA-only checks of kiln's own CUDA kernels: direct provider runs the one-node harness cannot
// express (NHWC pools, device-side Slice bounds, copy plans), and host-side checks that run
// without a GPU (provider coverage, tactic names, broadcast coalescing, zoo coverage). The
// kernels' conformance cases (values against the CPU backend on fresh random inputs, in f32, f16
// and bf16) are rows of the op conformance suite (tests/backends/conformance/).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "conformance/op_cases.h"
#include "kiln/app/pipeline.h"
#include "kiln/backends/backend.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/builder/builder.h"
#include "kiln/builder/builder_config.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "op_tester.h"

namespace kiln {
namespace {

// The CUDA providers of `op` with kernels of their own: without the host fallback
// (host_fallback.cc), whose one provider per op runs the CPU's kernel when no native one can.
std::vector<const KernelProvider*> NativeCudaProviders(const std::string& op) {
  return KernelRegistry::Get().NativeProviders(BackendKind::kCuda, *LookupOpType(op));
}

using namespace testing;  // op_cases.h: Attrs, F32, I64, kAllFloats...

// ---- direct provider runs: cases the one-node harness cannot express -------------------------

// Runs `p`'s first tactic for `r` on `kind` with host tensors in and out.
Status RunProvider(BackendKind kind, const KernelProvider& p, const KernelRequest& r,
                   const std::vector<Tensor>& ins, std::vector<Tensor>& outs) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(kind));
  auto tactics = p.Tactics(r);
  if (tactics.empty()) return MakeError(ErrorCode::kUnimplemented, "no tactic from {}", p.id());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel, p.Create(r, tactics[0]));
  std::vector<DeviceBuffer> bufs;
  std::vector<TensorView> in_views, out_views;
  for (const Tensor& t : ins) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend->Allocate(t.size_bytes()));
    if (t.size_bytes() > 0) {
      KILN_RETURN_IF_ERROR(backend->CopyToDevice(b.data(), t.raw(), t.size_bytes(), nullptr));
    }
    TensorView v = t.view();
    v.data = b.data();
    in_views.push_back(v);
    bufs.push_back(std::move(b));
  }
  for (Tensor& t : outs) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend->Allocate(t.size_bytes()));
    TensorView v = t.view();
    v.data = b.data();
    out_views.push_back(v);
    bufs.push_back(std::move(b));
  }
  KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel->Prepare(in_views, out_views));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer ws, backend->Allocate(ws_bytes));
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = ws.data();
  args.workspace_bytes = ws_bytes;
  KILN_RETURN_IF_ERROR(kernel->Run(args));
  KILN_RETURN_IF_ERROR(backend->Synchronize(nullptr));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].size_bytes() == 0) continue;
    KILN_RETURN_IF_ERROR(backend->CopyToHost(outs[i].mutable_raw(), out_views[i].data,
                                             outs[i].size_bytes(), nullptr));
  }
  return OkStatus();
}

Tensor RandomTensor(DataType t, std::vector<int64_t> dims, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-2, 2);
  Tensor x(t, std::move(dims));
  for (int64_t i = 0; i < x.num_elements(); ++i) StoreFromDouble(x.view(), i, dist(rng));
  return x;
}

// NCHW <-> NHWC on the host (to_nhwc picks the direction).
Tensor Relayout(const Tensor& x, bool to_nhwc) {
  const auto& d = x.dims();
  std::vector<int64_t> out_dims = to_nhwc ? std::vector<int64_t>{d[0], d[2], d[3], d[1]}
                                          : std::vector<int64_t>{d[0], d[3], d[1], d[2]};
  Tensor y(x.dtype(), out_dims);
  int64_t n = d[0];
  int64_t c = to_nhwc ? d[1] : d[3], h = to_nhwc ? d[2] : d[1], w = to_nhwc ? d[3] : d[2];
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t iw = 0; iw < w; ++iw) {
          int64_t nchw = ((in * c + ic) * h + ih) * w + iw;
          int64_t nhwc = ((in * h + ih) * w + iw) * c + ic;
          StoreFromDouble(y.view(), to_nhwc ? nhwc : nchw, x.GetDouble(to_nhwc ? nchw : nhwc));
        }
  return y;
}

void ExpectNear(const Tensor& got, const Tensor& want, double tol) {
  ASSERT_EQ(got.dims(), want.dims());
  int bad = 0;
  for (int64_t i = 0; i < want.num_elements() && bad < 5; ++i) {
    double g = got.GetDouble(i), w = want.GetDouble(i);
    if (!(std::fabs(g - w) <= tol + tol * std::fabs(w))) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": got " << g << ", want " << w;
    }
  }
}

// A pool in kiln_layout=NHWC on CUDA agrees with the CPU's NCHW pool, relaid out.
void CheckNhwcPool(const std::string& op, AttributeMap attrs, std::vector<int64_t> x_dims,
                   DataType t) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no CUDA device";
  Tensor x = RandomTensor(t, x_dims, 7);
  // CPU reference in NCHW.
  Graph g;
  Value* xv = g.AddInput("x", t, MakeShape(x_dims));
  Value* yv = g.AddValue("y");
  Node* n = g.AddNode(op, "pool", {xv}, {yv}, attrs);
  g.MarkOutput(yv);
  ASSERT_TRUE(InferShapes(g).ok());
  std::vector<int64_t> y_dims = *StaticDims(yv->shape());
  KernelRequest r;
  r.node = n;
  r.inputs = {{t, MakeShape(x_dims), x_dims, nullptr}};
  r.outputs = {{t, MakeShape(y_dims), y_dims, nullptr}};
  // The CPU's first provider that takes the request (MaxPool's first is the Indices form).
  const KernelProvider* cpu = nullptr;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, op)) {
    if (!p->Tactics(r).empty()) {
      cpu = p;
      break;
    }
  }
  ASSERT_NE(cpu, nullptr) << "no CPU provider takes " << op;
  std::vector<Tensor> want = {Tensor(t, y_dims)};
  Status s = RunProvider(BackendKind::kCpu, *cpu, r, {x}, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // The same pool on CUDA in NHWC.
  Graph g2;
  std::vector<int64_t> xn = {x_dims[0], x_dims[2], x_dims[3], x_dims[1]};
  std::vector<int64_t> yn = {y_dims[0], y_dims[2], y_dims[3], y_dims[1]};
  attrs.Set("kiln_layout", std::string("NHWC"));
  Value* xv2 = g2.AddInput("x", t, MakeShape(xn));
  Value* yv2 = g2.AddValue("y", t);
  Node* n2 = g2.AddNode(op, "pool_nhwc", {xv2}, {yv2}, attrs);
  KernelRequest r2;
  r2.node = n2;
  r2.inputs = {{t, MakeShape(xn), xn, nullptr}};
  r2.outputs = {{t, MakeShape(yn), yn, nullptr}};
  // CUDA's own kernel (not the host fallback of the CPU's).
  const KernelProvider* cuda = nullptr;
  for (const KernelProvider* p :
       KernelRegistry::Get().NativeProviders(BackendKind::kCuda, OpTypeOf(*n2))) {
    if (!p->Tactics(r2).empty()) {
      cuda = p;
      break;
    }
  }
  ASSERT_NE(cuda, nullptr) << "no CUDA kernel takes " << op << " in NHWC";
  std::vector<Tensor> got = {Tensor(t, yn)};
  s = RunProvider(BackendKind::kCuda, *cuda, r2, {Relayout(x, true)}, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectNear(Relayout(got[0], false), want[0], t == DataType::kFloat32 ? 1e-5 : 1e-2);
}

// 5 channels take the one-channel kernel; 16 and 64 the one of 16-byte channel vectors (ResNet's
// stem pool has 64).
TEST(CudaNhwcPool, MaxPool) {
  for (DataType t : kAllFloats) {
    for (int64_t c : {5, 16, 64}) {
      SCOPED_TRACE(std::string(ToString(t)) + ", " + std::to_string(c) + " channels");
      CheckNhwcPool("MaxPool",
                    Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                           {"strides", std::vector<int64_t>{2, 2}},
                           {"pads", std::vector<int64_t>{1, 1, 1, 1}}}),
                    {2, c, 9, 11}, t);
    }
  }
}
TEST(CudaNhwcPool, AveragePool) {
  CheckNhwcPool("AveragePool",
                Attrs({{"kernel_shape", std::vector<int64_t>{2, 2}},
                       {"strides", std::vector<int64_t>{2, 2}}}),
                {1, 8, 6, 7}, DataType::kFloat32);
  // Padded windows, with and without the pad counted, on channel vectors.
  for (DataType t : kAllFloats) {
    for (int64_t include : {0, 1}) {
      SCOPED_TRACE(std::string(ToString(t)) + ", count_include_pad " + std::to_string(include));
      CheckNhwcPool("AveragePool",
                    Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                           {"strides", std::vector<int64_t>{2, 2}},
                           {"pads", std::vector<int64_t>{1, 0, 1, 2}},
                           {"count_include_pad", include}}),
                    {2, 24, 10, 9}, t);
    }
  }
}
// Global pools in NHWC: rows split over blocks with partials in the workspace (large H*W, few
// images and channels), 16-byte channel vectors and the scalar path (C not a multiple of the
// vector), several channel tiles, one row, one image.
TEST(CudaNhwcPool, GlobalAveragePoolAndGlobalMaxPool) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 24, 7, 5}, {3, 32, 56, 56}, {2, 13, 40, 9}, {1, 1280, 7, 7},
      {4, 8, 1, 1},  {1, 3000, 2, 2}, {5, 3, 17, 19}};
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (const auto& dims : shapes) {
      for (DataType t : kAllFloats) {
        SCOPED_TRACE(fmt::format("{} {} {}", op, fmt::join(dims, "x"), ToString(t)));
        CheckNhwcPool(op, {}, dims, t);
      }
    }
  }
}

// Slice whose bounds are run-time tensors: the kernel reads them on the device.
TEST(CudaDeviceSlice, RuntimeBoundsMatchCpu) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no CUDA device";
  Tensor x = RandomTensor(DataType::kFloat32, {6, 10, 4}, 3);
  Tensor starts = I64({2}, {-2, 1}), ends = I64({2}, {-100, 9}), axes = I64({2}, {1, 0}),
         steps = I64({2}, {-3, 2});
  // Axis 1: 8, 5, 2 (3 values); axis 0: 1, 3, 5, 7 clipped to 6 -> 1, 3, 5 (3 values).
  std::vector<int64_t> y_dims = {3, 3, 4};
  Graph g;
  std::vector<Value*> ins = {g.AddInput("x", DataType::kFloat32, MakeShape({6, 10, 4}))};
  for (const char* name : {"starts", "ends", "axes", "steps"}) {
    ins.push_back(g.AddInput(name, kI64, MakeShape({2})));
  }
  Value* y = g.AddValue("y", DataType::kFloat32);
  Node* n = g.AddNode("Slice", "slice", ins, {y}, {});
  KernelRequest r;
  r.node = n;
  r.inputs.push_back({DataType::kFloat32, MakeShape({6, 10, 4}), {6, 10, 4}, nullptr});
  for (int i = 0; i < 4; ++i) r.inputs.push_back({kI64, MakeShape({2}), {2}, nullptr});
  r.outputs = {{DataType::kFloat32, MakeShape(y_dims), y_dims, nullptr}};
  std::vector<Tensor> in_tensors = {x, starts, ends, axes, steps};
  std::vector<Tensor> want = {Tensor(DataType::kFloat32, y_dims)};
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, "Slice");
  ASSERT_FALSE(cpu.empty());
  Status s = RunProvider(BackendKind::kCpu, *cpu[0], r, in_tensors, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<Tensor> got = {Tensor(DataType::kFloat32, y_dims)};
  auto cuda_providers = KernelRegistry::Get().Providers(BackendKind::kCuda, "Slice");
  ASSERT_EQ(cuda_providers.size(), 1u);
  s = RunProvider(BackendKind::kCuda, *cuda_providers[0], r, in_tensors, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectNear(got[0], want[0], 0.0);
  // Spot-check one element by hand: y[0][0][0] = x[1][8][0].
  EXPECT_EQ(got[0].GetDouble(0), x.GetDouble((1 * 10 + 8) * 4));
}

// ---- host-side checks: run without a GPU
// ---------------------------------------------------------

// The op types the zoo models' engines contain after the builder's passes (collected with
// `kiln build zoo/<m>/model.onnx --report`), minus the library-backed ones (GEMM, convolution,
// attention), plus the rest of the op set issue 4 names.
TEST(CudaKernelCoverage, EveryRuntimeOpHasACudaProvider) {
  for (const char* op : {"Add",
                         "Sub",
                         "Mul",
                         "Div",
                         "Pow",
                         "Relu",
                         "Sigmoid",
                         "Tanh",
                         "Erf",
                         "Gelu",
                         "Sqrt",
                         "Exp",
                         "Clip",
                         "HardSwish",
                         "HardSigmoid",
                         "Where",
                         "Equal",
                         "Less",
                         "Greater",
                         "Cast",
                         "LayerNormalization",
                         "SkipLayerNormalization",
                         "RMSNormalization",
                         "SkipRMSNormalization",
                         "RotaryEmbedding",
                         "GatedActivation",
                         "Softmax",
                         "MaxPool",
                         "AveragePool",
                         "GlobalAveragePool",
                         "BatchNormalization",
                         "Resize",
                         "Gather",
                         "Concat",
                         "Slice",
                         "Split",
                         "Transpose",
                         "Reshape",
                         "Flatten",
                         "Squeeze",
                         "Unsqueeze",
                         "Identity",
                         "Expand",
                         "ReduceMean",
                         "ReduceSum",
                         "ReduceMax",
                         "Trilu",
                         "Shape",
                         "ConstantOfShape",
                         "Range"}) {
    auto providers = KernelRegistry::Get().Providers(BackendKind::kCuda, op);
    EXPECT_FALSE(providers.empty()) << op;
    for (const KernelProvider* p : providers) {
      EXPECT_EQ(p->backend(), BackendKind::kCuda);
      EXPECT_EQ(p->id().substr(0, 5), "cuda.") << p->id();
    }
  }
}

// Tactics are offered (and named by dtype) without touching the device: the builder asks for
// them on machines that only build.
TEST(CudaKernelCoverage, TacticNamesCarryTheStorageType) {
  for (DataType t : kAllFloats) {
    Graph g;
    Value* a = g.AddInput("a", t, MakeShape({2, 8}));
    Value* b = g.AddInput("b", t, MakeShape({8}));
    Value* y = g.AddValue("y");
    Node* n = g.AddNode("Add", "add", {a, b}, {y}, {});
    g.MarkOutput(y);
    ASSERT_TRUE(InferShapes(g).ok());
    KernelRequest r;
    r.node = n;
    r.inputs = {{t, MakeShape({2, 8}), {2, 8}, nullptr}, {t, MakeShape({8}), {8}, nullptr}};
    r.outputs = {{t, MakeShape({2, 8}), {2, 8}, nullptr}};
    auto providers = NativeCudaProviders("Add");
    ASSERT_EQ(providers.size(), 1u);
    auto tactics = providers[0]->Tactics(r);
    ASSERT_EQ(tactics.size(), 1u);
    EXPECT_EQ(tactics[0].name, std::string(ToString(t)) + "-add-cuda");
  }
}

// LayerNormalization offers both kernels to the builder's timing (warp-vec only without the
// statistics outputs); SkipLayerNormalization has its own.
std::vector<std::string> CudaTacticNames(const std::string& op, int inputs, int outputs,
                                         DataType t) {
  Graph g;
  std::vector<Value*> ins = {g.AddInput("x", t, MakeShape({4, 768}))};
  if (op == "SkipLayerNormalization") ins.push_back(g.AddInput("s", t, MakeShape({4, 768})));
  while (static_cast<int>(ins.size()) < inputs) {
    ins.push_back(g.AddInput("p" + std::to_string(ins.size()), t, MakeShape({768})));
  }
  std::vector<Value*> outs;
  for (int i = 0; i < outputs; ++i) outs.push_back(g.AddValue("y" + std::to_string(i)));
  Node* n = g.AddNode(op, "n", ins, outs, {});
  for (Value* v : outs) g.MarkOutput(v);
  EXPECT_TRUE(InferShapes(g).ok());
  KernelRequest r;
  r.node = n;
  for (Value* v : ins)
    r.inputs.push_back({v->dtype(), v->shape(), *StaticDims(v->shape()), nullptr});
  for (Value* v : outs) {
    r.outputs.push_back({v->dtype(), v->shape(), *StaticDims(v->shape()), nullptr});
  }
  std::vector<std::string> names;
  for (const KernelProvider* p : NativeCudaProviders(op)) {
    for (const TacticConfig& c : p->Tactics(r)) names.push_back(c.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CudaKernelCoverage, LayerNormTacticsIncludeWarpVec) {
  using V = std::vector<std::string>;
  EXPECT_EQ(CudaTacticNames("LayerNormalization", 3, 1, DataType::kFloat16),
            (V{"f16-layer-normalization-cuda-row", "f16-layer-normalization-cuda-warp-vec"}));
  EXPECT_EQ(CudaTacticNames("LayerNormalization", 3, 3, DataType::kFloat16),
            V{"f16-layer-normalization-cuda-row"});
  EXPECT_EQ(CudaTacticNames("SkipLayerNormalization", 4, 2, DataType::kBFloat16),
            V{"bf16-skip-layer-normalization-cuda-warp-vec"});
  EXPECT_EQ(CudaTacticNames("SkipLayerNormalization", 3, 1, DataType::kFloat32),
            V{"f32-skip-layer-normalization-cuda-warp-vec"});
}

TEST(CudaKernelCoverage, PoolsRunChannelsLastNodes) {
  for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool"}) {
    auto providers = NativeCudaProviders(op);
    ASSERT_EQ(providers.size(), 1u) << op;
    auto* p = dynamic_cast<const cuda::CudaOpProvider*>(providers[0]);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p->SupportsLayout("NHWC")) << op;
    EXPECT_TRUE(p->SupportsLayout("")) << op;
  }
  auto add = NativeCudaProviders("Add");
  ASSERT_EQ(add.size(), 1u);
  EXPECT_FALSE(dynamic_cast<const cuda::CudaOpProvider*>(add[0])->SupportsLayout("NHWC"));
}

TEST(CudaKernelCoverage, UnsupportedRequestsGetNoTactics) {
  Graph g;
  Value* x = g.AddInput("x", kF32, MakeShape({4, 4}));
  Value* y = g.AddValue("y");
  AttributeMap at;
  // Cubic runs on CUDA now (cuda_ops_more_test.cc); antialiasing still does not.
  at.Set("mode", std::string("linear"));
  at.Set("antialias", int64_t{1});
  Node* n = g.AddNode("Resize", "resize", {x}, {y}, at);
  KernelRequest r;
  r.node = n;
  r.inputs = {{kF32, MakeShape({4, 4}), {4, 4}, nullptr}};
  r.outputs = {{kF32, MakeShape({8, 8}), {8, 8}, nullptr}};
  auto providers = NativeCudaProviders("Resize");
  ASSERT_EQ(providers.size(), 1u);
  EXPECT_TRUE(providers[0]->Tactics(r).empty());
  // The layer runs on the host instead: the host fallback's one Resize provider takes it.
  int host = 0;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, "Resize")) {
    if (p->runs_on_host() && !p->Tactics(r).empty()) ++host;
  }
  EXPECT_EQ(host, 1);
}

TEST(CudaBroadcastSpace, MergesContiguousAndBroadcastDims) {
  // [2,3,4,5] + [3,1,1]: a's dims 2..3 merge (both dense), b is broadcast over them.
  std::vector<int64_t> a = {2, 3, 4, 5}, b = {3, 1, 1}, out = {2, 3, 4, 5};
  std::span<const int64_t> ins[2] = {a, b};
  auto s = cuda::BroadcastSpace(ins, out);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->rank, 3);
  EXPECT_EQ(s->dims[0], 2);
  EXPECT_EQ(s->dims[1], 3);
  EXPECT_EQ(s->dims[2], 20);
  EXPECT_EQ(s->strides[0][0], 60);
  EXPECT_EQ(s->strides[0][1], 20);
  EXPECT_EQ(s->strides[0][2], 1);
  EXPECT_EQ(s->strides[1][0], 0);
  EXPECT_EQ(s->strides[1][1], 1);
  EXPECT_EQ(s->strides[1][2], 0);
}

TEST(CudaBroadcastSpace, SameShapesCollapseToOneDim) {
  std::vector<int64_t> a = {7, 1, 9, 11};
  std::span<const int64_t> ins[2] = {a, a};
  auto s = cuda::BroadcastSpace(ins, a);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->rank, 1);
  EXPECT_EQ(s->dims[0], 7 * 9 * 11);
  EXPECT_EQ(s->strides[0][0], 1);
  EXPECT_EQ(s->strides[1][0], 1);
}

TEST(CudaBroadcastSpace, RejectsIncompatibleDims) {
  std::vector<int64_t> a = {3, 4}, out = {3, 5};
  std::span<const int64_t> ins[1] = {a};
  auto s = cuda::BroadcastSpace(ins, out);
  EXPECT_FALSE(s.ok());
}

TEST(CudaBroadcastSpace, TransposeStridesStayUnmerged) {
  // [2,3,4] -> perm (2,0,1): out dims [4,2,3], source strides [1,12,4]; dims 1 and 2 merge
  // (12 == 4 * 3), dim 0 does not.
  std::vector<int64_t> out = {4, 2, 3}, strides = {1, 12, 4};
  cuda::Strided s = cuda::CoalesceOne(out, strides, 0);
  ASSERT_EQ(s.rank, 2);
  EXPECT_EQ(s.dims[0], 4);
  EXPECT_EQ(s.dims[1], 6);
  EXPECT_EQ(s.strides[0][0], 1);
  EXPECT_EQ(s.strides[0][1], 4);
}

// The index plans the copy and broadcast kernels execute, checked on the host: applying a plan's
// Strided space to the input (what StridedCopyKernel / BinaryStridedKernel do per element) must
// reproduce the CPU backend's result, for many shapes and permutations.
// The launchers turn on 32-bit multiply-high division (EnableFastDivision) for spaces below 2^31
// indices; this applies the space both ways, the kernels' fast division mirrored on the host, and
// requires the same offsets.
std::vector<double> ApplySpace(const cuda::Strided& s0, const Tensor& x, int operand, int64_t n) {
  cuda::Strided s = s0;
  cuda::EnableFastDivision(s, n);
  EXPECT_EQ(s.div32, n > 0);  // an empty space launches nothing
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = i, off = s.offset[operand];
    uint32_t u = static_cast<uint32_t>(i);
    int64_t fast_off = s.offset[operand];
    for (int d = s.rank - 1; d >= 0; --d) {
      off += (r % s.dims[d]) * s.strides[operand][d];
      r /= s.dims[d];
      uint32_t q = cuda::FastDivide(u, {s.div_mul[d], s.div_shift[d]});
      fast_off +=
          static_cast<int64_t>(u - q * static_cast<uint32_t>(s.dims[d])) * s.strides[operand][d];
      u = q;
    }
    EXPECT_EQ(fast_off, off) << "index " << i;
    out[static_cast<size_t>(i)] = x.GetDouble(off);
  }
  return out;
}

TEST(CudaFastDivision, MatchesIntegerDivisionBelowTwoToThe31) {
  std::mt19937 rng(7);
  std::vector<uint32_t> divisors = {1,
                                    2,
                                    3,
                                    5,
                                    7,
                                    49,
                                    56,
                                    96,
                                    641,
                                    3136,
                                    65535,
                                    65536,
                                    65537,
                                    1u << 20,
                                    (1u << 20) + 1,
                                    1000000007u,
                                    (1u << 30) + 3,
                                    0x7fffffffu};
  for (int k = 0; k < 200; ++k) divisors.push_back(1 + rng() % 0x7fffffffu);
  for (int k = 0; k < 200; ++k) divisors.push_back(1 + rng() % 4096);
  for (uint32_t d : divisors) {
    cuda::FastDivisor f = cuda::MakeFastDivisor(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 0x7ffffffeu, 0x7fffffffu};
    for (uint32_t m = 1; m < 64; ++m) {
      uint64_t v = static_cast<uint64_t>(d) * m;
      if (v <= 0x7fffffffu)
        ns.insert(ns.end(), {static_cast<uint32_t>(v), static_cast<uint32_t>(v - 1)});
    }
    for (int k = 0; k < 2000; ++k) ns.push_back(rng() & 0x7fffffffu);
    for (uint32_t n : ns) {
      if (n > 0x7fffffffu) continue;
      ASSERT_EQ(cuda::FastDivide(n, f), n / d) << n << " / " << d;
    }
  }
}

TEST(CudaFastDivision, LargeSpacesKeepSixtyFourBitDivision) {
  cuda::Strided s;
  s.rank = 2;
  s.dims[0] = 1 << 20;
  s.dims[1] = 1 << 12;  // 2^32 indices
  cuda::EnableFastDivision(s, s.dims[0] * s.dims[1]);
  EXPECT_FALSE(s.div32);
  s.dims[0] = 1 << 18;  // 2^30
  cuda::EnableFastDivision(s, s.dims[0] * s.dims[1]);
  EXPECT_TRUE(s.div32);
}

Tensor RunCpuOp(const std::string& op, const AttributeMap& attrs, const std::vector<Tensor>& ins,
                const std::vector<bool>& constant) {
  Graph g;
  std::vector<Value*> vals;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = std::string(constant[i] ? "c" : "x").append(std::to_string(i));
    vals.push_back(constant[i] ? g.AddConstant(name, ins[i])
                               : g.AddInput(name, ins[i].dtype(), MakeShape(ins[i].dims())));
  }
  Value* y = g.AddValue("y");
  Node* n = g.AddNode(op, "n", vals, {y}, attrs);
  g.MarkOutput(y);
  EXPECT_TRUE(InferShapes(g).ok());
  std::vector<int64_t> y_dims = *StaticDims(y->shape());
  KernelRequest r;
  r.node = n;
  for (size_t i = 0; i < ins.size(); ++i) {
    r.inputs.push_back({ins[i].dtype(), MakeShape(ins[i].dims()), ins[i].dims(),
                        constant[i] ? vals[i]->constant() : nullptr});
  }
  r.outputs = {{y->dtype(), y->shape(), y_dims, nullptr}};
  std::vector<Tensor> outs = {Tensor(y->dtype(), y_dims)};
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, op);
  EXPECT_FALSE(cpu.empty());
  Status s = RunProvider(BackendKind::kCpu, *cpu[0], r, ins, outs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return outs[0];
}

void ExpectSame(const std::vector<double>& got, const Tensor& want) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.num_elements());
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    ASSERT_EQ(got[static_cast<size_t>(i)], want.GetDouble(i)) << "element " << i;
  }
}

TEST(CudaCopyPlans, TransposeMatchesCpuForEveryPermutation) {
  uint32_t seed = 1;
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{5, 7}, std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{2, 1, 4, 3},
        std::vector<int64_t>{3, 2, 1, 2, 5}}) {
    std::vector<int64_t> perm(dims.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    do {
      SCOPED_TRACE(::testing::PrintToString(dims) + " perm " + ::testing::PrintToString(perm));
      Tensor x = RandomTensor(DataType::kFloat32, dims, seed++);
      AttributeMap at;
      at.Set("perm", perm);
      Tensor want = RunCpuOp("Transpose", at, {x}, {false});
      auto space = cuda::TransposeSpace(dims, perm, want.dims());
      ASSERT_TRUE(space.ok()) << space.status().ToString();
      ExpectSame(ApplySpace(*space, x, 0, want.num_elements()), want);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST(CudaCopyPlans, SliceMatchesCpu) {
  struct S {
    std::vector<int64_t> dims, starts, ends, axes, steps;
  };
  uint32_t seed = 100;
  for (const S& c : std::vector<S>{{{10, 12}, {1, -4}, {8, 100}, {0, 1}, {2, 1}},
                                   {{4, 9}, {-1}, {-100}, {1}, {-2}},
                                   {{5, 6, 7}, {1, 2}, {4, 5}, {}, {}},
                                   {{6, 10, 4}, {-2, 1}, {-100, 9}, {1, 0}, {-3, 2}},
                                   {{3, 8, 5}, {0, 7, 0}, {3, 0, 5}, {0, 1, 2}, {1, -1, 2}},
                                   {{9}, {100}, {200}, {0}, {1}}}) {
    SCOPED_TRACE(::testing::PrintToString(c.dims) + " starts " +
                 ::testing::PrintToString(c.starts));
    Tensor x = RandomTensor(DataType::kFloat32, c.dims, seed++);
    int64_t k = static_cast<int64_t>(c.starts.size());
    std::vector<Tensor> ins = {x, I64({k}, c.starts), I64({k}, c.ends)};
    std::vector<bool> constant = {false, true, true};
    if (!c.axes.empty()) {
      ins.push_back(I64({k}, c.axes));
      constant.push_back(true);
      if (!c.steps.empty()) {
        ins.push_back(I64({k}, c.steps));
        constant.push_back(true);
      }
    }
    Tensor want = RunCpuOp("Slice", {}, ins, constant);
    auto space = cuda::SliceSpace(c.starts, c.axes, c.steps, c.dims, want.dims());
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    ExpectSame(ApplySpace(*space, x, 0, want.num_elements()), want);
  }
}

TEST(CudaCopyPlans, BroadcastAddMatchesCpu) {
  uint32_t seed = 200;
  for (std::pair<std::vector<int64_t>, std::vector<int64_t>> p :
       std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{3, 5, 7}, {3, 5, 7}},
           {{3, 1, 7}, {5, 1}},
           {{}, {2, 3}},
           {{2, 3, 4, 5}, {3, 1, 1}},
           {{4, 1, 6, 1}, {1, 5, 1, 2}},
           {{1}, {7, 1, 3}},
           {{2, 1, 1, 3, 1}, {2, 4, 1, 3, 5}}}) {
    SCOPED_TRACE(::testing::PrintToString(p.first) + " + " + ::testing::PrintToString(p.second));
    Tensor a = RandomTensor(DataType::kFloat32, p.first, seed++);
    Tensor b = RandomTensor(DataType::kFloat32, p.second, seed++);
    Tensor want = RunCpuOp("Add", {}, {a, b}, {false, false});
    std::span<const int64_t> ins[2] = {a.dims(), b.dims()};
    auto space = cuda::BroadcastSpace(ins, want.dims());
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    std::vector<double> va = ApplySpace(*space, a, 0, want.num_elements());
    std::vector<double> vb = ApplySpace(*space, b, 1, want.num_elements());
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      float sum = static_cast<float>(va[i]) + static_cast<float>(vb[i]);
      ASSERT_EQ(sum, static_cast<float>(want.GetDouble(i))) << "element " << i;
    }
  }
}

// The builder's requests for every layer of the zoo models' engines (after its passes; built
// for the CPU here, where no GPU can time CUDA tactics): each layer that is not library-backed
// (GEMM, convolution, attention) gets a CUDA tactic, in FP32 and with float operands as FP16.
bool LibraryBacked(const std::string& op) {
  for (const char* lib : {"Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul",
                          "FusedMatMul", "Attention"}) {
    if (op == lib) return true;
  }
  return false;
}

TEST(CudaZooCoverage, EveryZooLayerGetsACudaTactic) {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  std::string zoo = std::string(root ? root : ".") + "/zoo";
  if (!std::filesystem::exists(zoo + "/resnet_tiny/model.onnx"))
    GTEST_SKIP() << "no zoo at " << zoo;
  int layers_checked = 0;
  for (const char* model : {"resnet_tiny", "mobilenetv3_tiny", "efficientnet_tiny",
                            "squeezenet_tiny", "vit_tiny", "bert_tiny", "gpt_tiny", "unet_tiny"}) {
    SCOPED_TRACE(model);
    std::string dir = zoo + "/" + model;
    std::ifstream info_file(dir + "/info.json");
    ASSERT_TRUE(info_file.good());
    nlohmann::json info = nlohmann::json::parse(info_file);
    BuilderConfig config;
    config.backend = BackendKind::kCpu;
    for (const auto& [name, p] : info["profile"].items()) {
      // "name:1x3x64x64,4x3x64x64,16x3x64x64" (appends: GCC 12 warns falsely on + chains).
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
      ASSERT_TRUE(ParseProfileSpec(spec, &config.profile).ok()) << spec;
    }
    auto built = app::BuildFromOnnxFile(dir + "/model.onnx", config);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    const EngineDesc& desc = *built->desc;
    std::vector<Node*> order;
    for (const LayerDesc& l : desc.layers) order.push_back(const_cast<Node*>(l.node));
    auto dims = ConcreteDims(*desc.graph, order, desc.profile, 2);
    ASSERT_TRUE(dims.ok()) << dims.status().ToString();
    for (const LayerDesc& l : desc.layers) {
      const std::string& op = l.node->op_type();
      if (LibraryBacked(op)) continue;
      KernelRequest r = MakeKernelRequest(*l.node, *dims);
      for (bool half : {false, true}) {
        KernelRequest q = r;
        if (half) {
          for (auto& d : q.inputs) {
            if (d.dtype == DataType::kFloat32) d.dtype = DataType::kFloat16;
          }
          for (auto& d : q.outputs) {
            if (d.dtype == DataType::kFloat32) d.dtype = DataType::kFloat16;
          }
        }
        bool offered = false;
        for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, op)) {
          offered |= !p->Tactics(q).empty();
        }
        EXPECT_TRUE(offered) << "no CUDA tactic for layer '" << l.node->name() << "' (" << op
                             << (half ? ", f16" : ", f32") << ")";
        ++layers_checked;
      }
    }
  }
  EXPECT_GT(layers_checked, 100);
}

TEST(CudaKernelNames, KebabCaseAndTacticName) {
  EXPECT_EQ(cuda::KebabCase("LayerNormalization"), "layer-normalization");
  EXPECT_EQ(cuda::KebabCase("GlobalAveragePool"), "global-average-pool");
  EXPECT_EQ(cuda::TacticName(DataType::kBFloat16, "Softmax", "warp"), "bf16-softmax-cuda-warp");
}

}  // namespace
}  // namespace kiln
