// Memory plan tests: exact offsets for graphs with known liveness, a property test that no two
// simultaneously live buffers overlap on random DAGs, and view aliasing (shared buffers, merged
// lifetimes, the cases that keep their copy, and a simulated run over random DAGs with views).
#include "kiln/plan/memory_plan.h"

#include <gtest/gtest.h>

#include <map>

#include <limits>
#include <optional>
#include <random>
#include <set>

#include "kiln/ir/sizes.h"
#include "kiln/ops/op_table.h"

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

// A view node (Reshape, Unsqueeze...) of `in` with the output shape given; extra inputs (the
// Reshape target, Unsqueeze axes) do not matter to the planner.
Value* View(Graph& g, const std::string& op, const std::string& name, Value* in, Shape shape) {
  Value* out = g.AddValue(name, in->dtype());
  out->set_shape(std::move(shape));
  g.AddNode(op, "n_" + name, {in}, {out});
  return out;
}

// A layer as the builder hands it over: a view when the op table says the op is one.
PlanLayer Layer(const Node* n, int64_t workspace = 0, bool allow_alias = true) {
  return {n, workspace, allow_alias && HasTrait(*n, op_traits::kView)};
}

std::vector<PlanLayer> Layers(const Graph& g, int64_t workspace = 0, bool allow_alias = true) {
  std::vector<PlanLayer> out;
  auto order = g.TopologicalOrder();  // kept in a variable: the loop must not outlive it
  for (const Node* n : *order) out.push_back(Layer(n, workspace, allow_alias));
  return out;
}

const PlannedBuffer* BufferOf(const MemoryPlanDetail& d, const std::string& name) {
  for (const PlannedBuffer& b : d.buffers) {
    if (b.value->name() == name) return &b;
  }
  return nullptr;
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

// A dim with a negative term (a Pad or Concat of width T - M) is sized for the largest shape
// the profile allows: T at its max with M at 0 bounds it, where T and M both at their max would
// give T_max - M_max (0 when they share a max: a buffer of no bytes that the run then overflows).
TEST(MemoryPlan, DimsWithNegativeTermsAreSizedByAnUpperBound) {
  Graph g;
  Dim t = Dim::Symbol("T"), m = Dim::Symbol("M");
  Value* x = g.AddInput("x", DataType::kFloat32, {t - m, 100});
  std::map<std::string, int64_t> at_max = {{"T", 16}, {"M", 16}};
  auto bytes = PlannedBytes(*x, at_max);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, 16 * 100 * 4);  // not 0
  // Positive terms and constants count at the max: 2T + 3 - M.
  Value* y = g.AddInput("y", DataType::kFloat32, {t * 2 + 3 - m});
  auto ybytes = PlannedBytes(*y, {{"T", 10}, {"M", 4}});
  ASSERT_TRUE(ybytes.ok());
  EXPECT_GE(*ybytes, (2 * 10 + 3) * 4);
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

// Sizes past the limits of ir/sizes.h are KILN-E3008 naming the value or input and the value,
// never a wrapped figure: 2^32 x 2^32 floats once planned as "peak 0 B".
TEST(MemoryPlan, SizesPastTheLimitsAreE3008NamingTheValue) {
  const int64_t k2to32 = int64_t{1} << 32;
  {
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4});
    g.MarkOutput(Op(g, "y", {Op(g, "a", {x}, {Dim::Symbol("n"), 4})}, {Dim::Symbol("n"), 4}));
    OptimizationProfile profile;
    profile.inputs.push_back({"x", {1, 4}, {2, 4}, {int64_t{1} << 62, 4}});
    auto plan = PlanMemory(g, Layers(g), profile);
    EXPECT_EQ(plan.status().code(), ErrorCode::kProfileTooLarge) << plan.status().ToString();
    EXPECT_NE(plan.status().message().find("max shape of input 'x'"), std::string::npos)
        << plan.status().message();
    EXPECT_NE(plan.status().message().find("4611686018427387904"), std::string::npos);

    // Within the per-input limit, but a symbolic product past it at the max shapes.
    Graph h;
    Dim n = Dim::Symbol("n");
    Value* hx = h.AddInput("x", DataType::kFloat32, {n, 4});
    h.MarkOutput(Op(h, "y", {Op(h, "sq", {hx}, {n, n})}, {n, 4}));
    profile.inputs[0].max = {k2to32, 4};
    profile.inputs[0].opt = {2, 4};
    plan = PlanMemory(h, Layers(h), profile);
    EXPECT_EQ(plan.status().code(), ErrorCode::kProfileTooLarge) << plan.status().ToString();
    EXPECT_NE(plan.status().message().find("value 'sq'"), std::string::npos)
        << plan.status().message();
  }
  {
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {4});
    g.MarkOutput(Op(g, "y", {Op(g, "a", {x}, {k2to32, k2to32})}, {4}));
    auto plan = PlanMemory(g, Layers(g), {});
    EXPECT_EQ(plan.status().code(), ErrorCode::kProfileTooLarge);
    EXPECT_NE(plan.status().message().find("value 'a'"), std::string::npos);
  }
  {
    // A workspace past the limits (a tactic's estimate at huge max shapes).
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {4});
    g.MarkOutput(Op(g, "y", {Op(g, "a", {x}, {4})}, {4}));
    auto plan = PlanMemory(g, Layers(g, std::numeric_limits<int64_t>::max()), {});
    EXPECT_EQ(plan.status().code(), ErrorCode::kProfileTooLarge);
    EXPECT_NE(plan.status().message().find("workspace of layer"), std::string::npos);
  }
  {
    // Each buffer within the per-tensor limit, their sum past the total limit (2^50 bytes).
    Graph g;
    Value* prev = g.AddInput("x", DataType::kFloat32, {4});
    const int64_t count = kMaxTotalBytes / kMaxTensorBytes + 1;
    for (int64_t i = 0; i < count; ++i) {
      prev = Op(g, fmt::format("t{}", i), {prev}, {int64_t{1} << 38});  // 1 TiB each
    }
    g.MarkOutput(Op(g, "y", {prev}, {4}));
    auto plan = PlanMemory(g, Layers(g), {});
    EXPECT_EQ(plan.status().code(), ErrorCode::kProfileTooLarge);
    EXPECT_NE(plan.status().message().find("activations"), std::string::npos)
        << plan.status().message();
  }
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

TEST(MemoryPlanViews, ChainOfViewsSharesItsRootsBufferAndLifetime) {
  // Layers: 0 a = Relu(x), 1 r1 = Reshape(a), 2 r2 = Unsqueeze(r1), 3 b = Relu(r2),
  // 4 c = Relu(b), 5 y = Relu(c). r1 and r2 are a's bytes; a stays live until b reads r2.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4, 16});  // 256 bytes
  Value* a = Op(g, "a", {x}, {4, 16});
  Value* r1 = View(g, "Reshape", "r1", a, {64});
  Value* r2 = View(g, "Unsqueeze", "r2", r1, {1, 64});
  Value* b = Op(g, "b", {r2}, {1, 64});
  Value* c = Op(g, "c", {b}, {1, 64});
  g.MarkOutput(Op(g, "y", {c}, {1, 64}));

  auto detail = PlanMemoryDetailed(g, Layers(g), {});
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  EXPECT_EQ(detail->aliases, (std::map<std::string, std::string>{{"r1", "a"}, {"r2", "a"}}));
  ASSERT_EQ(detail->buffers.size(), 3u);  // a, b, c: the views have no buffer of their own
  const PlannedBuffer* ba = BufferOf(*detail, "a");
  ASSERT_NE(ba, nullptr);
  EXPECT_EQ(ba->first, 0);
  EXPECT_EQ(ba->last, 3);  // the union: a's own reads (layer 1) and r2's reader (layer 3)
  const MemoryPlan& plan = detail->plan;
  EXPECT_EQ(plan.offsets.at("a"), 0);
  EXPECT_EQ(plan.offsets.at("r1"), 0);
  EXPECT_EQ(plan.offsets.at("r2"), 0);
  EXPECT_EQ(plan.offsets.at("b"), 256);  // a is still live (r2 is read by b's layer)
  EXPECT_EQ(plan.offsets.at("c"), 0);    // a is dead once b is computed
  EXPECT_EQ(plan.arena_bytes, 512);
  EXPECT_EQ(NaivePeak(*detail), 768);

  // Without aliasing every view has its own buffer, live from its layer to its reader.
  auto copies = PlanMemoryDetailed(g, Layers(g, 0, /*allow_alias=*/false), {});
  ASSERT_TRUE(copies.ok()) << copies.status().ToString();
  EXPECT_TRUE(copies->aliases.empty());
  EXPECT_EQ(copies->buffers.size(), 5u);
  EXPECT_EQ(BufferOf(*copies, "a")->last, 1);
  EXPECT_NE(copies->plan.offsets.at("r1"), copies->plan.offsets.at("a"));
  EXPECT_NE(copies->plan.offsets.at("r2"), copies->plan.offsets.at("r1"));
  EXPECT_EQ(NaivePeak(*copies), 5 * 256);
}

TEST(MemoryPlanViews, AViewReadLateKeepsTheRootFromBeingReused) {
  // a's only direct reader is the view at layer 1, but r is read at layer 4: nothing produced in
  // between may take a's bytes.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {64});
  Value* a = Op(g, "a", {x}, {64});
  Value* r = View(g, "Flatten", "r", a, {1, 64});
  Value* p = Op(g, "p", {x}, {64});
  Value* q = Op(g, "q", {p}, {64});
  g.MarkOutput(Op(g, "y", {View(g, "Reshape", "rq", q, {1, 64}), r}, {1, 64}));
  std::vector<PlanLayer> layers;
  for (const char* n : {"n_a", "n_r", "n_p", "n_q", "n_rq", "n_y"}) {
    for (const Node* node : g.nodes()) {
      if (node->name() == n) layers.push_back(Layer(node));
    }
  }
  auto detail = PlanMemoryDetailed(g, layers, {});
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  EXPECT_EQ(detail->aliases, (std::map<std::string, std::string>{{"r", "a"}, {"rq", "q"}}));
  EXPECT_EQ(BufferOf(*detail, "a")->last, 5);
  EXPECT_EQ(BufferOf(*detail, "q")->last, 5);
  const MemoryPlan& plan = detail->plan;
  std::set<int64_t> live_at_4 = {plan.offsets.at("a"), plan.offsets.at("p"), plan.offsets.at("q")};
  EXPECT_EQ(live_at_4.size(), 3u);  // a, p and q are live together at layer 3
  EXPECT_EQ(plan.offsets.at("r"), plan.offsets.at("a"));
  EXPECT_EQ(plan.offsets.at("rq"), plan.offsets.at("q"));
}

TEST(MemoryPlanViews, ViewsOfInputsConstantsAndIntoOutputsKeepTheirCopy) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {4, 16});
  Value* w = g.AddConstant("w", Tensor(DataType::kFloat32, {4, 16}));
  Value* rx = View(g, "Reshape", "rx", x, {64});     // the caller's bytes
  Value* rw = View(g, "Squeeze", "rw", w, {4, 16});  // the weights' bytes
  Value* a = Op(g, "a", {rx, rw}, {64});
  Value* ra = View(g, "Identity", "ra", a, {64});  // a graph output: the caller's bytes
  g.MarkOutput(ra);
  Value* o = Op(g, "o", {a}, {64});  // a graph output read by a view
  g.MarkOutput(o);
  Value* ro = View(g, "Unsqueeze", "ro", o, {1, 64});
  g.MarkOutput(Op(g, "z", {ro}, {1, 64}));

  auto detail = PlanMemoryDetailed(g, Layers(g), {});
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  EXPECT_TRUE(detail->aliases.empty());
  const MemoryPlan& plan = detail->plan;
  ASSERT_EQ(plan.offsets.size(), 4u);  // rx, rw, a and ro: the views copy into own buffers
  EXPECT_EQ(plan.offsets.count("ra"), 0u);
  EXPECT_EQ(plan.offsets.count("o"), 0u);
  std::set<int64_t> offsets = {plan.offsets.at("rx"), plan.offsets.at("rw")};
  EXPECT_EQ(offsets.size(), 2u);  // both are read by a's layer
}

TEST(MemoryPlanViews, AViewThatLooksLargerAtTheMaxShapesKeepsItsCopy) {
  // r has a's elements at run time, but its dims use m, which the profile bounds higher than n:
  // sized on its own, r would overflow a's buffer, so it gets its own.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n")});
  Value* z = g.AddInput("z", DataType::kFloat32, {Dim::Symbol("m")});
  Value* a = Op(g, "a", {x}, {Dim::Symbol("n")});
  Value* r = View(g, "Reshape", "r", a, {Dim::Symbol("m")});
  g.MarkOutput(Op(g, "y", {r, z}, {Dim::Symbol("m")}));
  OptimizationProfile profile;
  profile.inputs.push_back({"x", {1}, {8}, {64}});
  profile.inputs.push_back({"z", {1}, {8}, {128}});
  auto detail = PlanMemoryDetailed(g, Layers(g), profile);
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  EXPECT_TRUE(detail->aliases.empty());
  EXPECT_EQ(BufferOf(*detail, "a")->bytes, 256);
  EXPECT_EQ(BufferOf(*detail, "r")->bytes, 512);
  EXPECT_NE(detail->plan.offsets.at("r"), detail->plan.offsets.at("a"));
}

TEST(MemoryPlanViews, ViewNamesAndOps) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}) {
    EXPECT_TRUE(HasTrait(*LookupOpType(op), op_traits::kView)) << op;
  }
  for (const char* op : {"Transpose", "Expand", "Slice", "Cast", "Relu"}) {
    EXPECT_FALSE(HasTrait(*LookupOpType(op), op_traits::kView)) << op;
  }
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat16, {2, 8});
  Value* a = Op(g, "a", {x}, {2, 8}, DataType::kFloat16);
  Value* r = View(g, "Unsqueeze", "r", a, {1, 2, 8});
  Value* c = g.AddValue("c", DataType::kFloat32);
  c->set_shape({2, 8});
  const Node* cast = g.AddNode("Identity", "bad_identity", {a}, {c});  // dtype changes
  EXPECT_EQ(ViewInput(*r->producer()), a);
  EXPECT_EQ(ViewInput(*cast), nullptr);
  EXPECT_EQ(ViewTacticName(*r->producer()), "f16-unsqueeze-view");
}

// Random DAGs with views, run on a simulated arena: every layer that runs (views that are
// aliased do not) stamps its output's bytes with the value whose contents they hold, and every
// read must find the stamps of the value it reads (for an aliased view: of its root). The plan
// must also keep its invariants (aligned, inside the arena, views on their roots' offsets).
TEST(MemoryPlanViews, PropertySimulatedRunsReadWhatWasWritten) {
  std::mt19937 rng(98765);
  const std::vector<std::string> view_ops = {"Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                             "Identity"};
  int aliased_total = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Graph g;
    std::vector<Value*> pool = {g.AddInput("x", DataType::kFloat32, {8})};
    int n = 2 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      Value* in = pool[rng() % pool.size()];
      const std::string name = "v" + std::to_string(i);
      if (rng() % 2 == 0) {
        int64_t elems = in->shape().size() == 1 ? in->shape()[0].value() : 8;
        if (in->shape().size() == 1) {
          pool.push_back(View(g, view_ops[rng() % view_ops.size()], name, in, {1, elems}));
        } else {
          pool.push_back(View(g, "Reshape", name, in, {in->shape()[1]}));
        }
        continue;
      }
      int fan_in = 1 + static_cast<int>(rng() % 3);
      std::vector<Value*> ins;
      for (int k = 0; k < fan_in; ++k) ins.push_back(pool[rng() % pool.size()]);
      int64_t elems = 1 + static_cast<int64_t>(rng() % 500);
      pool.push_back(Op(g, name, ins, {elems}));
    }
    g.MarkOutput(pool.back());
    if (rng() % 3 == 0) g.MarkOutput(pool[pool.size() / 2]);
    std::vector<PlanLayer> layers = Layers(g);
    auto detail = PlanMemoryDetailed(g, layers, {});
    ASSERT_TRUE(detail.ok()) << detail.status().ToString();
    const MemoryPlan& plan = detail->plan;
    aliased_total += static_cast<int>(detail->aliases.size());

    for (const auto& [alias, root] : detail->aliases) {
      EXPECT_EQ(plan.offsets.at(alias), plan.offsets.at(root)) << alias;
      EXPECT_EQ(detail->aliases.count(root), 0u) << "the root of " << alias << " is a view";
    }
    auto root_of = [&](const Value* v) {
      auto it = detail->aliases.find(v->name());
      return it == detail->aliases.end() ? v->name() : it->second;
    };
    auto region = [&](const Value* v) -> std::optional<std::pair<int64_t, int64_t>> {
      auto it = plan.offsets.find(v->name());
      if (it == plan.offsets.end()) return std::nullopt;
      int64_t bytes = 4;
      for (const Dim& d : v->shape()) bytes *= d.value();
      return std::make_pair(it->second,
                            (bytes + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment);
    };
    std::vector<std::string> stamp(static_cast<size_t>(plan.arena_bytes / kPlanAlignment));
    for (const PlanLayer& l : layers) {
      for (const Value* in : l.node->inputs()) {
        auto r = region(in);
        if (!r) continue;
        ASSERT_LE(r->first + r->second, plan.arena_bytes);
        for (int64_t c = r->first / kPlanAlignment; c < (r->first + r->second) / kPlanAlignment;
             ++c) {
          ASSERT_EQ(stamp[c], root_of(in))
              << "trial " << trial << ": layer " << l.node->name() << " reads " << in->name();
        }
      }
      if (detail->aliases.count(l.node->output(0)->name())) continue;  // launches nothing
      auto w = region(l.node->output(0));
      if (!w) continue;
      EXPECT_EQ(w->first % kPlanAlignment, 0);
      for (int64_t c = w->first / kPlanAlignment; c < (w->first + w->second) / kPlanAlignment;
           ++c) {
        stamp[c] = l.node->output(0)->name();
      }
    }
  }
  EXPECT_GT(aliased_total, 200);  // the trials do exercise aliasing
}

}  // namespace
}  // namespace kiln
