// Memory plan tests: exact offsets for graphs with known liveness, and a property test that no
// two simultaneously live buffers overlap on random DAGs.
#include "kiln/plan/memory_plan.h"

#include <gtest/gtest.h>

#include <random>

namespace kiln {
namespace {

// Adds a node whose output has `shape` (the planner reads shapes from values; no inference).
Value* Op(Graph& g, const std::string& name, std::vector<Value*> ins, Shape shape,
          DataType dtype = DataType::kFloat32) {
  Value* out = g.AddValue(name, dtype);
  out->set_shape(std::move(shape));
  g.AddNode(ins.size() == 1 ? "Relu" : "Add", "n_" + name, std::move(ins), {out});
  return out;
}

std::vector<PlanLayer> Layers(const Graph& g, int64_t workspace = 0) {
  std::vector<PlanLayer> out;
  auto order = g.TopologicalOrder();  // kept in a variable: the loop must not outlive it
  for (const Node* n : *order) out.push_back({n, workspace});
  return out;
}

TEST(MemoryPlan, ChainReusesEveryOtherBuffer) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4, 16});  // 256 bytes
  Value* a = Op(g, "a", {x}, {4, 16});
  Value* b = Op(g, "b", {a}, {4, 16});
  Value* c = Op(g, "c", {b}, {4, 16});
  g.MarkOutput(Op(g, "y", {c}, {4, 16}));
  auto plan = PlanMemory(g, Layers(g), {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->offsets.size(), 3u);  // x and y are bound by the caller
  EXPECT_EQ(plan->offsets.at("a"), 0);
  EXPECT_EQ(plan->offsets.at("b"), 256);
  EXPECT_EQ(plan->offsets.at("c"), 0);  // a is dead once b is computed
  EXPECT_EQ(plan->arena_bytes, 512);
  EXPECT_EQ(plan->workspace_bytes, 0);
  EXPECT_EQ(plan->peak_bytes, 512);
}

TEST(MemoryPlan, DiamondKeepsBothBranchesLive) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {64});
  Value* a = Op(g, "a", {x}, {64});
  Value* b = Op(g, "b", {a}, {64});
  Value* c = Op(g, "c", {a}, {64});
  g.MarkOutput(Op(g, "y", {b, c}, {64}));
  auto detail = PlanMemoryDetailed(g, Layers(g), {});
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  const MemoryPlan& plan = detail->plan;
  EXPECT_EQ(plan.offsets.at("a"), 0);
  EXPECT_EQ(plan.offsets.at("b"), 256);
  EXPECT_EQ(plan.offsets.at("c"), 512);  // a (read by c's layer), b and c are live together
  EXPECT_EQ(plan.arena_bytes, 768);
  EXPECT_EQ(NaivePeak(*detail), 768);
}

TEST(MemoryPlan, LongSkipConnectionPinsItsBuffer) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {64});
  Value* r1 = Op(g, "r1", {x}, {64});
  Value* r2 = Op(g, "r2", {r1}, {64});
  Value* r3 = Op(g, "r3", {r2}, {64});
  Value* r4 = Op(g, "r4", {r3}, {64});
  g.MarkOutput(Op(g, "y", {r1, r4}, {64}));
  auto detail = PlanMemoryDetailed(g, Layers(g), {});
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  const MemoryPlan& plan = detail->plan;
  EXPECT_EQ(plan.offsets.at("r1"), 0);  // live from layer 0 to layer 4
  EXPECT_EQ(plan.offsets.at("r2"), 256);
  EXPECT_EQ(plan.offsets.at("r3"), 512);  // r1 and r2 still live
  EXPECT_EQ(plan.offsets.at("r4"), 256);  // r2 is dead: reuses its slot
  EXPECT_EQ(plan.arena_bytes, 768);
  EXPECT_EQ(NaivePeak(*detail), 1024);
}

TEST(MemoryPlan, SmallBufferFillsTheHoleBetweenLiveBuffers) {
  // `mid` reuses dead `big`'s bytes, leaving [512,1024) free below `keep`; `t`, live together
  // with `mid` and `keep`, goes into that hole instead of growing the arena.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {16});
  Value* big = Op(g, "big", {x}, {256});     // 1024 bytes, [0,1]
  Value* keep = Op(g, "keep", {big}, {16});  // 64 bytes, [1,4]
  Value* mid = Op(g, "mid", {keep}, {128});  // 512 bytes, [2,3]
  Value* t = Op(g, "t", {mid}, {16});        // 64 bytes, [3,4]
  g.MarkOutput(Op(g, "y", {keep, t}, {16}));
  auto plan = PlanMemory(g, Layers(g), {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->offsets.at("big"), 0);
  EXPECT_EQ(plan->offsets.at("mid"), 0);      // big is dead by then
  EXPECT_EQ(plan->offsets.at("keep"), 1024);  // overlaps big
  EXPECT_EQ(plan->offsets.at("t"), 512);      // overlaps mid and keep: gap [512,1024)
  EXPECT_EQ(plan->arena_bytes, 1088);
}

TEST(MemoryPlan, DynamicBatchUsesProfileMaxAndWorkspaceIsShared) {
  Graph g;
  Dim batch = Dim::Symbol("batch");
  Value* x = g.AddInput("x", DataType::kFloat16, {batch, 100});
  Value* w = g.AddConstant("w", Tensor(DataType::kFloat16, {100}));  // 200 -> 256 bytes
  Value* a = Op(g, "a", {x, w}, {batch, 100}, DataType::kFloat16);
  Value* b = Op(g, "b", {a}, {batch * 2, 100}, DataType::kFloat16);
  g.MarkOutput(Op(g, "y", {b}, {batch * 2, 100}, DataType::kFloat16));
  OptimizationProfile profile;
  profile.inputs.push_back({"x", {1, 100}, {4, 100}, {8, 100}});
  std::vector<PlanLayer> layers = Layers(g);
  layers[0].workspace_bytes = 100;
  layers[1].workspace_bytes = 1000;
  auto plan = PlanMemory(g, layers, profile);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->offsets.at("a"), 3200);  // b (16*100*2 = 3200 bytes) is placed first
  EXPECT_EQ(plan->offsets.at("b"), 0);
  EXPECT_EQ(plan->arena_bytes, 3200 + 1600);
  EXPECT_EQ(plan->workspace_bytes, 1024);  // the largest, aligned; not the sum
  EXPECT_EQ(plan->weights_bytes, 256);
  EXPECT_EQ(plan->peak_bytes, 256 + 4800 + 1024);

  Status over = CheckBudget(*plan, 4096);
  EXPECT_EQ(over.code(), ErrorCode::kMemoryBudgetExceeded);
  EXPECT_NE(over.message().find("needs 6080 bytes"), std::string::npos) << over.message();
  EXPECT_NE(over.message().find("budget is 4096 bytes"), std::string::npos) << over.message();
  EXPECT_TRUE(CheckBudget(*plan, 6080).ok());
}

TEST(MemoryPlan, MissingProfileAndUnboundSymbolsAreNamed) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4});
  g.MarkOutput(
      Op(g, "y", {Op(g, "a", {x}, {Dim::Symbol("n"), Dim::Symbol("k")})}, {Dim::Symbol("n"), 4}));
  auto no_profile = PlanMemory(g, Layers(g), {});
  EXPECT_EQ(no_profile.status().code(), ErrorCode::kMissingProfile);
  EXPECT_NE(no_profile.status().message().find("'x'"), std::string::npos);

  OptimizationProfile profile;
  profile.inputs.push_back({"x", {1, 4}, {2, 4}, {3, 4}});
  auto unbound = PlanMemory(g, Layers(g), profile);
  EXPECT_EQ(unbound.status().code(), ErrorCode::kMissingProfile);
  EXPECT_NE(unbound.status().message().find("value 'a'"), std::string::npos)
      << unbound.status().message();
  EXPECT_NE(unbound.status().message().find("'k'"), std::string::npos);

  profile.inputs[0].max = {3};
  EXPECT_EQ(PlanMemory(g, Layers(g), profile).status().code(), ErrorCode::kInvalidProfile);
}

// Random DAGs: every pair of buffers whose lifetimes overlap must occupy disjoint bytes.
TEST(MemoryPlan, PropertyNoLiveBuffersOverlapOnRandomDags) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    Graph g;
    std::vector<Value*> pool = {g.AddInput("x", DataType::kFloat32, {8})};
    int n = 2 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      int fan_in = 1 + static_cast<int>(rng() % 3);
      std::vector<Value*> ins;
      for (int k = 0; k < fan_in; ++k) ins.push_back(pool[rng() % pool.size()]);
      int64_t elems = 1 + static_cast<int64_t>(rng() % 500);
      pool.push_back(Op(g, "v" + std::to_string(i), ins, {elems}));
    }
    g.MarkOutput(pool.back());
    auto detail = PlanMemoryDetailed(g, Layers(g), {});
    ASSERT_TRUE(detail.ok()) << detail.status().ToString();
    const auto& bufs = detail->buffers;
    int64_t sum = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
      sum += bufs[i].bytes;
      EXPECT_EQ(bufs[i].offset % kPlanAlignment, 0);
      EXPECT_LE(bufs[i].offset + bufs[i].bytes, detail->plan.arena_bytes);
      EXPECT_GE(bufs[i].bytes, static_cast<int64_t>(bufs[i].value->shape()[0].value() * 4));
      for (size_t j = i + 1; j < bufs.size(); ++j) {
        bool live_together = bufs[i].first <= bufs[j].last && bufs[j].first <= bufs[i].last;
        bool disjoint = bufs[i].offset + bufs[i].bytes <= bufs[j].offset ||
                        bufs[j].offset + bufs[j].bytes <= bufs[i].offset;
        if (live_together) {
          ASSERT_TRUE(disjoint) << "trial " << trial << ": " << bufs[i].value->name() << " and "
                                << bufs[j].value->name();
        }
      }
    }
    EXPECT_LE(detail->plan.arena_bytes, sum);
    EXPECT_EQ(NaivePeak(*detail), sum);
  }
}

}  // namespace
}  // namespace kiln
