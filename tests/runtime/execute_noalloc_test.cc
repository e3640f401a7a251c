// Asserts that ExecutionContext::Execute performs no heap allocation (DESIGN.md: nothing
// allocates during execute). This binary replaces the global operator new with a counting one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kiln/runtime/runtime.h"
#include "tests/engine/test_engines.h"
#include "tests/runtime/fake_graph_backend.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  size_t align = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
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
  g_allocations = 0;
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

// The same with the CPU backend's own kernels. Disabled: their Run builds a std::function for
// ThreadPool::ParallelFor whose capture does not fit the small-buffer, one allocation per layer
// per run (reported to the backend owners); enable once ParallelFor takes a non-owning callable.
TEST(ExecuteNoAlloc, DISABLED_CpuBackendKernelsAllocateNothing) { ExpectNoAllocation(false); }

}  // namespace
}  // namespace kiln
