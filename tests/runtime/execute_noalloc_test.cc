// Asserts that ExecutionContext::Execute performs no heap allocation (DESIGN.md: nothing
// allocates during execute). This binary replaces the global operator new with a counting one.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <new>

#include "kiln/app/pipeline.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/op_schema.h"
#include "kiln/runtime/runtime.h"
#include "tests/engine/test_engines.h"
#include "tests/runtime/fake_graph_backend.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
// Allocations made by oneDNN's own code (its primitive execution builds per-call argument maps
// that no caller can avoid) are counted apart and reported, not failed: the rule is that kiln's
// kernels allocate nothing; oneDNN's CPU kernels take their memory from kiln's workspace.
std::atomic<long> g_onednn_allocations{0};
// KILN_NOALLOC_TRACE=1 prints the stack of every counted allocation (to find the kernel that
// allocates); backtrace_symbols_fd writes without allocating.
bool g_trace = std::getenv("KILN_NOALLOC_TRACE") != nullptr;

bool InOneDnn(void* caller) {
  Dl_info info;
  return dladdr(caller, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libdnnl") != nullptr;
}

void Count(void* caller) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  if (InOneDnn(caller)) {
    g_onednn_allocations.fetch_add(1);
    return;
  }
  g_allocations.fetch_add(1);
  if (g_trace) {
    g_counting = false;
    void* frames[24];
    int n = backtrace(frames, 24);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    (void)!write(STDERR_FILENO, "----\n", 5);
    g_counting = true;
  }
}

void* Allocate(std::size_t n, void* caller) {
  Count(caller);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* AllocateAligned(std::size_t n, std::align_val_t a, void* caller) {
  Count(caller);
  size_t align = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return Allocate(n, __builtin_return_address(0)); }
void* operator new[](std::size_t n) { return Allocate(n, __builtin_return_address(0)); }
void* operator new(std::size_t n, std::align_val_t a) {
  return AllocateAligned(n, a, __builtin_return_address(0));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return AllocateAligned(n, a, __builtin_return_address(0));
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace kiln {
namespace {

long AllocationsDuring(const std::function<void()>& fn) {
  if (g_trace) {
    void* frame[1];
    backtrace(frame, 1);  // loads the unwinder now, outside the counted region
  }
  g_allocations = 0;
  g_onednn_allocations = 0;
  g_counting = true;
  fn();
  g_counting = false;
  return g_allocations.load();
}

TEST(ExecuteNoAlloc, CounterSeesAllocations) {
  // The counter itself works: a vector allocates.
  long n = AllocationsDuring([] {
    std::vector<int> v(100);
    ASSERT_EQ(v.size(), 100u);
  });
  EXPECT_GE(n, 1);
}

void ExpectNoAllocation(bool test_kernels) {
  for (auto make :
       {+[] { return testing::MakeChainGraph(); }, +[] { return testing::MakeWorkspaceGraph(); },
        +[] { return testing::MakeDiamondGraph(); }}) {
    std::unique_ptr<Graph> graph = make();
    const std::string name = graph->name();
    OptimizationProfile profile;
    if (name == "chain") profile = testing::ChainProfile();
    if (name == "workspace") profile = testing::WorkspaceProfile();
    auto desc = testing::AssembleTestEngine(std::move(graph), profile, test_kernels);
    ASSERT_TRUE(desc.ok()) << desc.status().ToString();
    auto runtime = Runtime::Create(BackendKind::kCpu);
    ASSERT_TRUE(runtime.ok());
    auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*desc)));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto ctx = (*engine)->CreateExecutionContext();
    ASSERT_TRUE(ctx.ok());
    std::vector<float> x(64 * 8, 1.5f), y(64 * 8), b(64 * 8);
    if (name == "chain") {
      ASSERT_TRUE((*ctx)->SetInputShape("x", {3, 4}).ok());
    }
    if (name == "workspace") {
      ASSERT_TRUE((*ctx)->SetInputShape("x", {5, 8}).ok());
    }
    ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress(name == "diamond" ? "d" : "y", y.data()).ok());
    if (name == "diamond") {
      ASSERT_TRUE((*ctx)->SetTensorAddress("b", b.data()).ok());
    }
    ASSERT_TRUE((*ctx)->Execute().ok());  // warm-up: first use of the thread pool
    Status status;
    long n = AllocationsDuring([&] {
      for (int i = 0; i < 10; ++i) status = (*ctx)->Execute();
    });
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(n, 0) << name << ": Execute allocated " << n << " times";
    EXPECT_EQ(y[0], name == "chain" ? 0.5f : name == "workspace" ? 1.5f : 4.5f);
  }
}

// The runtime itself, with kernels that allocate nothing (tests/engine/test_kernels.cc).
TEST(ExecuteNoAlloc, ExecuteAllocatesNothing) { ExpectNoAllocation(true); }

// Graph replay and the event ordering of Execute(nullptr), on a backend that has both (a fake
// over the CPU: CI has no GPU; tests/backends/cuda checks the same on a real one).
TEST(ExecuteNoAlloc, GraphReplayAllocatesNothing) {
  testing::FakeGraphBackend fake(*GetBackend(BackendKind::kCpu));
  fake.records.reserve(1000);
  fake.waits.reserve(1000);
  auto desc = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  ASSERT_TRUE(desc.ok());
  auto engine = Engine::Create(std::shared_ptr<const EngineDesc>(std::move(*desc)), &fake);
  ASSERT_TRUE(engine.ok());
  for (bool graphs : {true, false}) {
    ExecutionOptions o;
    o.cuda_graphs = graphs;
    auto ctx = (*engine)->CreateExecutionContext(o);
    ASSERT_TRUE(ctx.ok());
    std::vector<float> x(12, 1.5f), y(12);
    ASSERT_TRUE((*ctx)->SetInputShape("x", {3, 4}).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
    ASSERT_TRUE((*ctx)->Execute().ok());  // propagation and capture allocate
    Status status;
    long n = AllocationsDuring([&] {
      for (int i = 0; i < 10; ++i) status = (*ctx)->Execute();
    });
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(n, 0) << "graphs " << graphs;
    EXPECT_EQ(y[0], 0.5f);
  }
  EXPECT_EQ(fake.launches, 11);  // the capturing Execute launches its new graph too
}

// The same with the CPU backend's own kernels.
TEST(ExecuteNoAlloc, CpuBackendKernelsAllocateNothing) { ExpectNoAllocation(false); }

// The INT8 tactics (not in FP32 engines): Run of each allocates nothing either.
long Int8RunAllocations(const std::string& op, std::vector<Tensor> inputs, AttributeMap attrs,
                        const std::string& tactic) {
  Graph graph;
  attrs.Set("kiln_int8_input_amax", 1.f);
  std::vector<Value*> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = fmt::format("in{}", i);
    values.push_back(i == 0 ? graph.AddInput(name, inputs[i].dtype(), MakeShape(inputs[i].dims()))
                            : graph.AddConstant(name, inputs[i]));
  }
  Value* out = graph.AddValue("y");
  Node* node = graph.AddNode(op, "n", values, {out}, attrs);
  graph.MarkOutput(out);
  EXPECT_TRUE(InferShapes(graph).ok());
  KernelRequest request;
  request.node = node;
  for (size_t i = 0; i < inputs.size(); ++i) {
    request.inputs.push_back({inputs[i].dtype(), MakeShape(inputs[i].dims()), inputs[i].dims(),
                              node->input(i)->constant()});
  }
  std::vector<int64_t> dims = *StaticDims(out->shape());
  request.outputs.push_back({DataType::kFloat32, out->shape(), dims, nullptr});
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, op)) {
    for (const TacticConfig& t : p->Tactics(request)) {
      if (t.name != tactic) continue;
      auto kernel = p->Create(request, t);
      EXPECT_TRUE(kernel.ok()) << kernel.status().ToString();
      if (!kernel.ok()) return -1;
      Tensor y(DataType::kFloat32, dims);
      std::vector<TensorView> in, outs{y.view()};
      for (const Tensor& x : inputs) in.push_back(x.view());
      auto ws = (*kernel)->Prepare(in, outs);
      EXPECT_TRUE(ws.ok());
      std::vector<float> workspace(*ws / 4 + 16);
      void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(workspace.data()) + 63) &
                                              ~uintptr_t{63});
      KernelRunArgs args{in, outs, aligned, *ws, nullptr};
      EXPECT_TRUE((*kernel)->Run(args).ok());  // warm-up
      Status status;
      long n = AllocationsDuring([&] { status = (*kernel)->Run(args); });
      EXPECT_TRUE(status.ok()) << status.ToString();
      EXPECT_NE(y.ToFloatVector()[0], 0.f);
      return n;
    }
  }
  ADD_FAILURE() << "no tactic " << tactic << " for " << op;
  return -1;
}

Tensor Filled(std::vector<int64_t> dims, float start) {
  std::vector<float> v(static_cast<size_t>(NumElements(dims)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(start + 0.37f * static_cast<float>(i));
  return Tensor::FromVector(DataType::kFloat32, std::move(dims), v);
}

TEST(ExecuteNoAlloc, Int8KernelsAllocateNothing) {
  AttributeMap conv;
  conv.Set("pads", std::vector<int64_t>{1, 1, 1, 1});
  conv.Set("activation", std::string("relu"));
  EXPECT_EQ(Int8RunAllocations("FusedConv",
                               {Filled({1, 8, 6, 6}, 0.1f), Filled({16, 8, 3, 3}, 0.2f),
                                Filled({16}, 0.3f), Filled({1, 16, 6, 6}, 0.4f)},
                               conv, "i8-conv-cpu-onednn"),
            0);
  AttributeMap gemm;
  gemm.Set("transB", int64_t{1});
  EXPECT_EQ(Int8RunAllocations("Gemm",
                               {Filled({4, 32}, 0.5f), Filled({8, 32}, 0.6f), Filled({4, 8}, 0.7f)},
                               gemm, "i8-gemm-cpu-onednn"),
            0);
  EXPECT_EQ(Int8RunAllocations("MatMul", {Filled({2, 3, 32}, 0.8f), Filled({32, 8}, 0.9f)}, {},
                               "i8-matmul-cpu-onednn"),
            0);
}

// Every zoo model's FP32 CPU engine (the tactics the builder picks), on its reference inputs.
std::filesystem::path ZooDir() {
  const char* dir = std::getenv("KILN_SOURCE_DIR");
  return std::filesystem::path(dir ? dir : KILN_TEST_SOURCE_DIR) / "zoo";
}

std::vector<std::string> ZooModels() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ZooDir(), ec)) {
    if (std::filesystem::exists(e.path() / "model.onnx")) names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class ZooNoAlloc : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooNoAlloc, CpuEngineExecuteAllocatesNothing) {
  std::filesystem::path dir = ZooDir() / GetParam();
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  std::vector<std::string> names;
  for (const Value* v : (*graph)->inputs()) names.push_back(v->name());
  std::map<std::string, Tensor> feed;
  BuilderConfig config;
  for (size_t i = 0; i < names.size(); ++i) {
    auto t = LoadTensorProto((dir / "test_data_set_0" / fmt::format("input_{}.pb", i)).string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    if (!IsStatic((*graph)->inputs()[i]->shape())) {
      config.profile.inputs.push_back({names[i], t->dims(), t->dims(), t->dims()});
    }
    feed[names[i]] = std::move(*t);
  }
  auto built = app::BuildFromOnnxFile((dir / "model.onnx").string(), config);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(built->desc)));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto runner = app::HostRunner::Create(*engine);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  ASSERT_TRUE((*runner)->SetInputs(feed).ok());
  ASSERT_TRUE((*runner)->Run().ok());  // warm-up
  std::vector<float> first = (*runner)->outputs().begin()->second.ToFloatVector();
  Status status;
  long n = AllocationsDuring([&] {
    for (int i = 0; i < 3; ++i) status = (*runner)->context().Execute(nullptr);
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(n, 0) << GetParam() << ": Execute allocated " << n << " times in 3 runs";
  std::cout << "[ info ] " << GetParam() << ": oneDNN's own code allocated "
            << g_onednn_allocations.load() << " times in 3 runs (not counted)\n";
  // The runs computed the same outputs as the warm-up.
  EXPECT_EQ((*runner)->outputs().begin()->second.ToFloatVector(), first);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooNoAlloc, ::testing::ValuesIn(ZooModels()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
