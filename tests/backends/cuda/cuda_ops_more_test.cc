// CUDA-only checks of the kernels for the ops that first ran only on the CPU: the run-time index
// check of Gather, GatherElements and ScatterND, run-time Pad amounts, and host-side coverage and
// tactic checks that run without a GPU. Their conformance cases (values against the CPU on fresh
// random inputs) are rows of the op conformance suite (tests/backends/conformance/).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "conformance/op_cases.h"
#include "kiln/backends/backend.h"
#include "kiln/backends/kernel.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "op_tester.h"

namespace kiln {
namespace {

using namespace testing;  // op_cases.h: Attrs, F32, I64, kAllFloats...
// One operand of a hand-built request: a tensor, passed as a constant or as a run-time input (a
// default Tensor: an omitted optional input).
struct Operand {
  Tensor value;
  bool constant = false;
};

// A one-node graph and its request with the given operands (output dims given, not inferred, so
// run-time shape inputs work).
struct Layer {
  Graph graph;
  KernelRequest request;
};
std::unique_ptr<Layer> MakeLayer(const std::string& op, AttributeMap attrs,
                                 const std::vector<Operand>& ins, const std::vector<Tensor>& outs) {
  auto l = std::make_unique<Layer>();
  std::vector<Value*> in_values, out_values;
  for (size_t i = 0; i < ins.size(); ++i) {
    const Tensor& t = ins[i].value;
    if (t.dtype() == DataType::kUndefined) {  // an omitted optional input
      in_values.push_back(nullptr);
      l->request.inputs.emplace_back();
      continue;
    }
    in_values.push_back(
        ins[i].constant ? l->graph.AddConstant(fmt::format("c{}", i), t)
                        : l->graph.AddInput(fmt::format("x{}", i), t.dtype(), MakeShape(t.dims())));
    l->request.inputs.push_back({t.dtype(), MakeShape(t.dims()), t.dims(),
                                 ins[i].constant ? in_values.back()->constant() : nullptr});
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    out_values.push_back(l->graph.AddValue(fmt::format("y{}", i), outs[i].dtype()));
    l->request.outputs.push_back(
        {outs[i].dtype(), MakeShape(outs[i].dims()), outs[i].dims(), nullptr});
  }
  l->request.node = l->graph.AddNode(op, "node", in_values, out_values, std::move(attrs));
  return l;
}

// ---- direct provider runs (index checks, run-time pads) ----------------------------------------

// The single CUDA provider of `op` with a kernel of its own that offers a tactic for `r` (the
// host fallback, host_fallback.cc, is not one: it runs the CPU's kernel).
const KernelProvider* CudaProviderFor(const std::string& op, const KernelRequest& r) {
  for (const KernelProvider* p :
       KernelRegistry::Get().NativeProviders(BackendKind::kCuda, *LookupOpType(op))) {
    if (!p->Tactics(r).empty()) return p;
  }
  return nullptr;
}

// Runs `kernel` on `kind` with host tensors in and out (device copies made and freed here).
Status RunKernel(BackendKind kind, Kernel& kernel, const std::vector<Tensor>& ins,
                 std::vector<Tensor>& outs) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(kind));
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
  KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel.Prepare(in_views, out_views));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer ws, backend->Allocate(ws_bytes));
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = ws.data();
  args.workspace_bytes = ws_bytes;
  Status run = kernel.Run(args);
  KILN_RETURN_IF_ERROR(backend->Synchronize(nullptr));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].size_bytes() == 0) continue;
    KILN_RETURN_IF_ERROR(backend->CopyToHost(outs[i].mutable_raw(), out_views[i].data,
                                             outs[i].size_bytes(), nullptr));
  }
  return run;
}

bool HaveCuda() { return GetBackend(BackendKind::kCuda).ok(); }

// Gather with run-time indices: an out-of-range index is KILN-E6001 naming it, like the CPU; the
// next in-range run of the same kernel succeeds (the record is cleared) and matches.
TEST(CudaIndexCheck, GatherRuntimeIndexOutOfRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor bad = I64({3}, {1, 4, -1});
  Tensor out(kF32, {3, 3});
  auto l = MakeLayer("Gather", Attrs({{"axis", int64_t{0}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("Gather", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad}, outs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index 4 is out of range for an axis of size 4"), std::string::npos)
      << s.ToString();
  // The CPU says the same kind of thing.
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, "Gather");
  ASSERT_FALSE(cpu.empty());
  auto cpu_kernel = cpu[0]->Create(l->request, cpu[0]->Tactics(l->request)[0]);
  ASSERT_TRUE(cpu_kernel.ok());
  std::vector<Tensor> cpu_outs = {out};
  EXPECT_EQ(RunKernel(BackendKind::kCpu, **cpu_kernel, {data, bad}, cpu_outs).code(),
            ErrorCode::kKernelFailed);
  // In range again: no stale record; rows 1, 3 and 0.
  Tensor good = I64({3}, {1, -1, 0});
  s = RunKernel(BackendKind::kCuda, **kernel, {data, good}, outs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<float> want = {3, 4, 5, 9, 10, 11, 0, 1, 2};
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(outs[0].GetDouble(i), want[i]) << i;
}

TEST(CudaIndexCheck, GatherInt32IndexBelowRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor bad = I32({2}, {0, -6});
  Tensor out(kF32, {2, 2});
  auto l = MakeLayer("Gather", Attrs({{"axis", int64_t{1}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("Gather", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad}, outs);
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index -6"), std::string::npos) << s.ToString();
}

TEST(CudaIndexCheck, GatherElementsRuntimeIndexOutOfRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor bad = I64({2, 2}, {0, 2, 3, 1});
  Tensor out(kF32, {2, 2});
  auto l = MakeLayer("GatherElements", Attrs({{"axis", int64_t{1}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("GatherElements", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad}, outs);
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index 3 is out of range for an axis of size 3"), std::string::npos)
      << s.ToString();
  // The valid elements were still gathered: [0][0] = 0, [0][1] = 2, [1][1] = 4.
  EXPECT_EQ(outs[0].GetDouble(0), 0);
  EXPECT_EQ(outs[0].GetDouble(1), 2);
  EXPECT_EQ(outs[0].GetDouble(3), 4);
}

TEST(CudaIndexCheck, ScatterNDRuntimeIndexOutOfRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor bad = I64({2, 1}, {-4, 1});
  Tensor upd = F32({2, 2}, {7, 7, 9, 9});
  Tensor out(kF32, {3, 2});
  auto l = MakeLayer("ScatterND", {}, {{data}, {bad}, {upd}}, {out});
  const KernelProvider* p = CudaProviderFor("ScatterND", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad, upd}, outs);
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index -4"), std::string::npos) << s.ToString();
  // Row 1 was still written, rows 0 and 2 kept.
  std::vector<float> want = {0, 1, 9, 9, 4, 5};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(outs[0].GetDouble(i), want[i]) << i;
}

// Inside a CUDA graph capture nothing can be waited for: the launch records nothing, Run
// succeeds, and the replay writes zeros for the bad index (index_fault.h documents the gap).
TEST(CudaIndexCheck, CapturedGatherIsNotCheckedAndWritesZeros) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Backend* backend = *GetBackend(BackendKind::kCuda);
  Tensor data = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor bad = I64({2}, {2, 7});
  Tensor out(kF32, {2, 2});
  auto l = MakeLayer("Gather", Attrs({{"axis", int64_t{0}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("Gather", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  auto db = backend->Allocate(data.size_bytes());
  auto ib = backend->Allocate(bad.size_bytes());
  auto ob = backend->Allocate(out.size_bytes());
  ASSERT_TRUE(db.ok() && ib.ok() && ob.ok());
  ASSERT_TRUE(backend->CopyToDevice(db->data(), data.raw(), data.size_bytes(), nullptr).ok());
  ASSERT_TRUE(backend->CopyToDevice(ib->data(), bad.raw(), bad.size_bytes(), nullptr).ok());
  std::vector<TensorView> ins = {data.view(), bad.view()}, outs = {out.view()};
  ins[0].data = db->data();
  ins[1].data = ib->data();
  outs[0].data = ob->data();
  ASSERT_TRUE((*kernel)->Prepare(ins, outs).ok());
  auto stream = backend->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  KernelRunArgs args;
  args.inputs = ins;
  args.outputs = outs;
  args.stream = stream->get();
  ASSERT_TRUE(backend->BeginCapture(args.stream).ok());
  Status run = (*kernel)->Run(args);
  auto graph = backend->EndCapture(args.stream);
  ASSERT_TRUE(run.ok()) << run.ToString();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  ASSERT_TRUE(backend->LaunchGraph(graph->get(), args.stream).ok());
  ASSERT_TRUE(backend->Synchronize(args.stream).ok());
  Tensor got(kF32, {2, 2});
  ASSERT_TRUE(backend->CopyToHost(got.mutable_raw(), ob->data(), got.size_bytes(), nullptr).ok());
  std::vector<float> want = {5, 6, 0, 0};
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(got.GetDouble(i), want[i]) << i;
}

// Pad whose pads and axes are run-time tensors (the one-node harness needs them constant for
// shape inference): the kernel reads them on the device; compared with the CPU.
TEST(CudaPad, RuntimePadsMatchCpu) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> dist(-2, 2);
    std::vector<float> xv(4 * 5 * 3);
    for (float& v : xv) v = dist(rng);
    Tensor x = F32({4, 5, 3}, xv);
    Tensor pads = I64({4}, {2, -1, 1, 3});  // axes 2 and 0: begin 2, -1; end 1, 3
    Tensor axes = I64({2}, {-1, 0});
    Tensor fill = F32({}, {0.5f});
    Tensor out(kF32, {4 - 1 + 3, 5, 3 + 2 + 1});
    auto l = MakeLayer("Pad", Attrs({{"mode", std::string(mode)}}), {{x}, {pads}, {fill}, {axes}},
                       {out});
    const KernelProvider* p = CudaProviderFor("Pad", l->request);
    ASSERT_NE(p, nullptr);
    auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
    ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
    std::vector<Tensor> got = {out};
    Status s = RunKernel(BackendKind::kCuda, **kernel, {x, pads, fill, axes}, got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, "Pad");
    ASSERT_FALSE(cpu.empty());
    auto cpu_kernel = cpu[0]->Create(l->request, cpu[0]->Tactics(l->request)[0]);
    ASSERT_TRUE(cpu_kernel.ok());
    std::vector<Tensor> want = {out};
    s = RunKernel(BackendKind::kCpu, **cpu_kernel, {x, pads, fill, axes}, want);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int64_t i = 0; i < out.num_elements(); ++i) {
      ASSERT_EQ(got[0].GetDouble(i), want[0].GetDouble(i)) << "element " << i;
    }
  }
}

// ---- host-side checks: run without a GPU -------------------------------------------------------

// Every op kiln declares has at least one CUDA provider, or a reason it has none in the op table
// (KILN_OP_NO_KERNEL).
TEST(CudaOpsCoverage, EveryDeclaredOpHasACudaProvider) {
  std::vector<std::string> missing;
  for (const OpSchema& s : AllOpSchemas()) {
    if (auto op = LookupOpType(s.name); op && !NoKernelReason(*op, "cuda").empty()) continue;
    if (KernelRegistry::Get().Providers(BackendKind::kCuda, s.name).empty()) {
      missing.emplace_back(s.name);
    }
  }
  EXPECT_TRUE(missing.empty()) << "no CUDA provider for: " << ::testing::PrintToString(missing);
}

// The builder asks for tactics on machines that only build: offered without a device, named
// by the storage type.
TEST(CudaOpsCoverage, TacticsWithoutADevice) {
  struct T {
    std::string op;
    AttributeMap attrs;
    std::vector<Operand> ins;
    std::vector<Tensor> outs;
    std::string tactic;
  };
  Tensor x16(DataType::kFloat16, {2, 8});
  std::vector<T> cases;
  cases.push_back({"Sum", {}, {{x16}, {x16}, {x16}}, {x16}, "f16-sum-cuda-variadic"});
  cases.push_back({"Max", {}, {{x16}, {x16}, {x16}}, {x16}, "f16-max-cuda-variadic"});
  cases.push_back({"CumSum", {}, {{x16}, {I64({}, {1}), true}}, {x16}, "f16-cum-sum-cuda"});
  cases.push_back({"ArgMax", {}, {{x16}}, {Tensor(kI64, {1, 8})}, "f16-arg-max-cuda"});
  cases.push_back({"Tile",
                   {},
                   {{x16}, {I64({2}, {1, 2}), true}},
                   {Tensor(DataType::kFloat16, {2, 16})},
                   "f16-tile-cuda"});
  cases.push_back({"Pad",
                   {},
                   {{x16}, {I64({4}, {0, 1, 0, 1}), true}},
                   {Tensor(DataType::kFloat16, {2, 10})},
                   "f16-pad-cuda"});
  cases.push_back({"Resize",
                   Attrs({{"mode", std::string("cubic")}}),
                   {{x16}, {Tensor()}, {Tensor()}, {I64({2}, {4, 16}), true}},
                   {Tensor(DataType::kFloat16, {4, 16})},
                   "f16-resize-cuda-direct"});
  cases.push_back(
      {"Einsum",  // heads after the sequence: no matrix product, so on a GPU too the direct kernel
       Attrs({{"equation", std::string("bihd,bjhd->bhij")}}),
       {{Tensor(DataType::kFloat16, {2, 5, 3, 8})}, {Tensor(DataType::kFloat16, {2, 7, 3, 8})}},
       {Tensor(DataType::kFloat16, {2, 3, 5, 7})},
       "f16-einsum-cuda-direct"});
  const Tensor q8 = Tensor::FromVector(DataType::kInt8, {}, std::vector<int8_t>{3});
  cases.push_back(
      {"QuantizeLinear",
       Attrs({{"axis", int64_t{1}}}),
       {{x16}, {F32({8}, std::vector<float>(8, 0.1f)).CastTo(DataType::kFloat16), true}},
       {Tensor(DataType::kUInt8, {2, 8})},
       "f16-quantize-linear-cuda"});
  cases.push_back({"DequantizeLinear",
                   {},
                   {{Tensor(DataType::kInt8, {2, 8})}, {F32({}, {0.5f}), true}, {q8, true}},
                   {Tensor(kF32, {2, 8})},
                   "i8-dequantize-linear-cuda"});
  for (T& c : cases) {
    SCOPED_TRACE(c.op);
    std::vector<Operand> ins;
    for (const Operand& o : c.ins) ins.push_back(o);
    auto l = MakeLayer(c.op, c.attrs, ins, c.outs);
    const KernelProvider* p = CudaProviderFor(c.op, l->request);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->Tactics(l->request)[0].name, c.tactic);
  }
}

// Antialiased Resize stays on the CPU.
TEST(CudaOpsCoverage, ResizeCasesLeftToTheCpu) {
  Tensor x(kF32, {4, 4});
  auto l = MakeLayer("Resize", Attrs({{"mode", std::string("cubic")}, {"antialias", int64_t{1}}}),
                     {{x}}, {Tensor(kF32, {8, 8})});
  EXPECT_EQ(CudaProviderFor("Resize", l->request), nullptr);
}

// Constant out-of-range indices are found in Prepare (no device needed), with the CPU's code.
TEST(CudaIndexCheck, ConstantIndicesCheckedInPrepare) {
  struct C {
    std::string op;
    AttributeMap attrs;
    std::vector<Operand> ins;
    Tensor out;
    std::string says;
  };
  Tensor data(kF32, {4, 3});
  std::vector<C> cases;
  cases.push_back({"Gather",
                   Attrs({{"axis", int64_t{1}}}),
                   {{data}, {I64({2}, {0, 3}), true}},
                   Tensor(kF32, {4, 2}),
                   "constant index 3"});
  cases.push_back({"Gather",
                   Attrs({{"axis", int64_t{0}}}),
                   {{data}, {I32({1}, {-5}), true}},
                   Tensor(kF32, {1, 3}),
                   "constant index -5"});
  cases.push_back({"GatherElements",
                   Attrs({{"axis", int64_t{0}}}),
                   {{data}, {I64({1, 3}, {0, 4, 1}), true}},
                   Tensor(kF32, {1, 3}),
                   "constant index 4"});
  cases.push_back({"ScatterND",
                   {},
                   {{data}, {I64({1, 1}, {9}), true}, {Tensor(kF32, {1, 3})}},
                   Tensor(kF32, {4, 3}),
                   "constant index 9"});
  for (C& c : cases) {
    SCOPED_TRACE(c.op);
    auto l = MakeLayer(c.op, c.attrs, c.ins, {c.out});
    const KernelProvider* p = CudaProviderFor(c.op, l->request);
    ASSERT_NE(p, nullptr);
    auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
    ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
    // Shapes only: Prepare reads dims, never data (as the builder's PreparedWorkspace calls it).
    std::vector<TensorView> ins, outs = {c.out.view()};
    for (const Operand& o : c.ins) ins.push_back(o.value.view());
    auto prepared = (*kernel)->Prepare(ins, outs);
    ASSERT_FALSE(prepared.ok());
    EXPECT_EQ(prepared.status().code(), ErrorCode::kKernelFailed);
    EXPECT_NE(prepared.status().ToString().find(c.says), std::string::npos)
        << prepared.status().ToString();
  }
}

}  // namespace
}  // namespace kiln
