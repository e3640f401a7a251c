// Data-dependent shapes (docs/architecture.md, "Data-dependent shapes"): NonZero, Unique,
// Compress and NonMaxSuppression give output dims that their kernels report at run time; the
// plan sizes them at their bounds; layers after them run at the reported dims; one context runs
// different counts (0 included) one after another. Op values are checked against references
// written here independently (plain loops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ops/op_schema.h"
#include "kiln/runtime/runtime.h"

namespace kiln {
namespace {

// x[batch, 4] f32:
//   nz = NonZero(x) [2, n]      t = Transpose(nz) [n, 2]     col = Gather(t, 1, axis 1) [n]
//   vals = Gather(table, col) [n]  (table: 10, 20, 30, 40)   s = Shape(vals) [1]
std::unique_ptr<Graph> MakeGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("nonzero");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("batch"), 4});
  Value* nz = g->AddValue("nz");
  g->AddNode("NonZero", "nonzero", {x}, {nz});
  Value* t = g->AddValue("t");
  AttributeMap perm;
  perm.Set("perm", std::vector<int64_t>{1, 0});
  g->AddNode("Transpose", "transpose", {nz}, {t}, perm);
  Value* one = g->AddConstant("one", Tensor::FromVector<int64_t>(DataType::kInt64, {}, {1}));
  Value* col = g->AddValue("col");
  AttributeMap axis1;
  axis1.Set("axis", int64_t{1});
  g->AddNode("Gather", "gather_col", {t, one}, {col}, axis1);
  Value* table = g->AddConstant(
      "table", Tensor::FromVector<float>(DataType::kFloat32, {4}, {10.f, 20.f, 30.f, 40.f}));
  Value* vals = g->AddValue("vals");
  g->AddNode("Gather", "gather_vals", {table, col}, {vals});
  g->MarkOutput(nz);
  g->MarkOutput(vals);
  return g;
}

std::shared_ptr<const Engine> BuildNonZeroEngine() {
  BuilderConfig config;
  config.profile.inputs = {{"x", {1, 4}, {2, 4}, {4, 4}}};
  BuildReport report;
  auto desc = BuildEngine({MakeGraph(), "nonzero", Hash128{}}, config, &report);
  EXPECT_TRUE(desc.ok()) << desc.status().ToString();
  if (!desc.ok()) return nullptr;
  auto bytes = SerializeEngine(**desc);  // through the file format, as a user's engine goes
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok());
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? *engine : nullptr;
}

struct NonZeroRun {
  std::vector<int64_t> nz_dims, vals_dims;
  std::vector<int64_t> nz;
  std::vector<float> vals;
};

// Outputs sized with GetMaxTensorShape (the bounds), read back at GetTensorShape's dims.
StatusOr<NonZeroRun> RunNonZero(ExecutionContext& ctx, std::vector<float> x) {
  const int64_t batch = static_cast<int64_t>(x.size()) / 4;
  KILN_RETURN_IF_ERROR(ctx.SetInputShape("x", {batch, 4}));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("x", x.data()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> nz_max, ctx.GetMaxTensorShape("nz"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> vals_max, ctx.GetMaxTensorShape("vals"));
  std::vector<int64_t> nz(static_cast<size_t>(nz_max[0] * nz_max[1]), -7);
  std::vector<float> vals(static_cast<size_t>(vals_max[0]), -7.f);
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("nz", nz.data()));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("vals", vals.data()));
  KILN_RETURN_IF_ERROR(ctx.Execute());
  NonZeroRun r;
  KILN_ASSIGN_OR_RETURN(r.nz_dims, ctx.GetTensorShape("nz"));
  KILN_ASSIGN_OR_RETURN(r.vals_dims, ctx.GetTensorShape("vals"));
  r.nz.assign(nz.begin(), nz.begin() + r.nz_dims[0] * r.nz_dims[1]);
  r.vals.assign(vals.begin(), vals.begin() + r.vals_dims[0]);
  return r;
}

// The reference: coordinates row-major, and table[column] per non-zero.
void ExpectNonZero(const NonZeroRun& r, const std::vector<float>& x) {
  std::vector<int64_t> rows, cols;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0.f) {
      rows.push_back(static_cast<int64_t>(i / 4));
      cols.push_back(static_cast<int64_t>(i % 4));
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  EXPECT_EQ(r.nz_dims, (std::vector<int64_t>{2, n}));
  EXPECT_EQ(r.vals_dims, (std::vector<int64_t>{n}));
  std::vector<int64_t> want = rows;
  want.insert(want.end(), cols.begin(), cols.end());
  EXPECT_EQ(r.nz, want);
  std::vector<float> want_vals;
  for (int64_t c : cols) want_vals.push_back(10.f * static_cast<float>(c + 1));
  EXPECT_EQ(r.vals, want_vals);
}

TEST(DataDependent, GraphRecordsTheCountAndItsBound) {
  auto g = MakeGraph();
  ASSERT_TRUE(InferShapes(*g).ok());
  const Value* nz = g->FindValue("nz");
  ASSERT_EQ(nz->shape().size(), 2u);
  EXPECT_EQ(nz->shape()[0], Dim(2));
  ASSERT_FALSE(nz->shape()[1].is_static());
  const std::string sym = nz->shape()[1].Symbols().at(0);
  EXPECT_TRUE(IsDataDependentSymbol(sym));
  ASSERT_EQ(g->data_dependent_bounds().count(sym), 1u);
  EXPECT_EQ(g->data_dependent_bounds().at(sym), Dim::Symbol("batch") * Dim(4));
  // Downstream shapes carry the symbol; nothing treats it as static.
  EXPECT_EQ(g->FindValue("vals")->shape(), (Shape{nz->shape()[1]}));
}

TEST(DataDependent, NonZeroTransposeGatherAcrossCountsOnOneContext) {
  auto engine = BuildNonZeroEngine();
  ASSERT_TRUE(engine);
  EXPECT_TRUE(engine->has_data_dependent_dims());
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  const std::vector<std::vector<float>> inputs = {
      {1, 0, 2, 0, 0, 0, 3, 4},                          // 4 of 8
      {0, 5, 0, 0, 6, 7, 8, 9},                          // 5 of 8, same shapes
      {0, 0, 0, 0, 0, 0, 0, 0},                          // none
      {1, 1, 1, 1, 1, 1, 1, 1},                          // all: the bound
      {0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0},  // batch 4
      {0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0},  // same again
      {-1, 0, 0, 0},                                     // batch 1
  };
  for (const auto& x : inputs) {
    auto r = RunNonZero(**ctx, x);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectNonZero(*r, x);
  }
  // Counts that differ from the prepared ones re-infer; the repeated input does not.
  EXPECT_GE((*ctx)->data_dependent_updates(), 5);
  EXPECT_LE((*ctx)->data_dependent_updates(), 6);
}

TEST(DataDependent, MaxShapeIsTheBoundAndThePlanHoldsIt) {
  auto engine = BuildNonZeroEngine();
  ASSERT_TRUE(engine);
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  ASSERT_TRUE((*ctx)->SetInputShape("x", {3, 4}).ok());
  auto max = (*ctx)->GetMaxTensorShape("nz");
  ASSERT_TRUE(max.ok()) << max.status().ToString();
  EXPECT_EQ(*max, (std::vector<int64_t>{2, 12}));
  // Before any Execute the dim reads as its bound.
  EXPECT_EQ(*(*ctx)->GetTensorShape("vals"), (std::vector<int64_t>{12}));
}

// A constant input: the node is not folded (its output shape is not static) and runs at
// execution; an all-static engine (no profile) still plans the count at its bound.
// A CPU engine of `g` (no profile: its static shapes) and a context of it.
StatusOr<std::unique_ptr<ExecutionContext>> CpuContext(std::unique_ptr<Graph> g) {
  BuilderConfig config;
  BuildReport report;
  const std::string name = g->name();
  KILN_ASSIGN_OR_RETURN(auto desc, BuildEngine({std::move(g), name, Hash128{}}, config, &report));
  KILN_ASSIGN_OR_RETURN(auto runtime, Runtime::Create(BackendKind::kCpu));
  KILN_ASSIGN_OR_RETURN(auto engine,
                        runtime->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(desc))));
  return engine->CreateExecutionContext();
}

TEST(DataDependent, ConstantInputRunsAtExecutionWithStaticInputs) {
  auto g = std::make_unique<Graph>();
  g->set_name("const_nonzero");
  g->set_opset(17);
  Value* c = g->AddConstant(
      "c", Tensor::FromVector<int32_t>(DataType::kInt32, {2, 3}, {0, 4, 0, 5, 0, 6}));
  Value* x = g->AddInput("x", DataType::kFloat32, {3});
  Value* nz = g->AddValue("nz");
  g->AddNode("NonZero", "nonzero", {c}, {nz});
  Value* y = g->AddValue("y");
  g->AddNode("Relu", "relu", {x}, {y});
  g->MarkOutput(nz);
  g->MarkOutput(y);
  auto ctx = CpuContext(std::move(g));
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_EQ(*(*ctx)->GetMaxTensorShape("nz"), (std::vector<int64_t>{2, 6}));
  std::vector<int64_t> nz_out(12, -1);
  std::vector<float> xs = {-1, 2, 3}, ys(3);
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", xs.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", ys.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("nz", nz_out.data()).ok());
  for (int run = 0; run < 2; ++run) {
    ASSERT_TRUE((*ctx)->Execute().ok());
    EXPECT_EQ(*(*ctx)->GetTensorShape("nz"), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(std::vector<int64_t>(nz_out.begin(), nz_out.begin() + 6),
              (std::vector<int64_t>{0, 1, 1, 1, 0, 2}));
  }
  EXPECT_EQ((*ctx)->data_dependent_updates(), 1);  // the bound, then 3 once
  EXPECT_EQ(ys, (std::vector<float>{0, 2, 3}));
}

// LoopGuard, the tail of a Loop unrolled to a bound (onnx/lower_control_flow.cc): `active` [5]
// says which of 4 iterations ran; the stacked rows [4, 2] are cut to those (Gather of the
// iterations it reports) and the state passes through. active[4] true (the loop wanted a fifth)
// fails the run with KILN-E5016, and the context runs again afterwards.
TEST(DataDependent, LoopGuardCutsRowsAndFailsPastItsBound) {
  auto g = std::make_unique<Graph>();
  g->set_name("loop_guard");
  g->set_opset(17);
  Value* active = g->AddInput("active", DataType::kBool, {5});
  Value* state = g->AddInput("state", DataType::kFloat32, {3});
  Value* rows = g->AddConstant("rows", Tensor::FromVector<float>(DataType::kFloat32, {4, 2},
                                                                 {0, 1, 10, 11, 20, 21, 30, 31}));
  Value* iters = g->AddValue("iters");
  Value* state_out = g->AddValue("state_out");
  AttributeMap attrs;
  attrs.Set("loop", std::string("my_loop"));
  g->AddNode("LoopGuard", "guard", {active, state}, {iters, state_out}, attrs);
  Value* ys_value = g->AddValue("ys");
  g->AddNode("Gather", "rows_run", {rows, iters}, {ys_value});
  g->MarkOutput(ys_value);
  g->MarkOutput(state_out);
  auto ctx = CpuContext(std::move(g));
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_EQ(*(*ctx)->GetMaxTensorShape("ys"), (std::vector<int64_t>{4, 2}));
  std::vector<float> ys(8, -1.f), st_in = {1.5f, -2.f, 3.f}, st_out(3, 0.f);
  bool flags[5];
  ASSERT_TRUE((*ctx)->SetTensorAddress("active", flags).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("state", st_in.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("state_out", st_out.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("ys", ys.data()).ok());
  auto run = [&](int ran, bool wants_more) {
    for (int t = 0; t < 5; ++t) flags[t] = t < ran;
    flags[4] = wants_more;
    return (*ctx)->Execute();
  };
  for (int ran : {2, 0, 4, 1}) {
    SCOPED_TRACE(ran);
    std::fill(st_out.begin(), st_out.end(), 0.f);
    Status s = run(ran, false);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(*(*ctx)->GetTensorShape("ys"), (std::vector<int64_t>{ran, 2}));
    std::vector<float> want;
    for (int t = 0; t < ran; ++t) {
      want.push_back(10.f * t);
      want.push_back(10.f * t + 1);
    }
    EXPECT_EQ(std::vector<float>(ys.begin(), ys.begin() + 2 * ran), want);
    EXPECT_EQ(st_out, st_in);
  }
  Status past = run(4, true);
  EXPECT_EQ(past.code(), ErrorCode::kLoopTripLimit) << past.ToString();
  EXPECT_NE(past.message().find("Loop 'my_loop'"), std::string::npos) << past.ToString();
  EXPECT_NE(past.message().find("--max-loop-trips"), std::string::npos) << past.ToString();
  Status again = run(3, false);
  EXPECT_TRUE(again.ok()) << again.ToString();
  EXPECT_EQ(*(*ctx)->GetTensorShape("ys"), (std::vector<int64_t>{3, 2}));
}

// TopK with a K that is only known at run time (a plain graph input, no shape values): the
// count is data-dependent, bounded by the axis length; a layer after it sees the reported K.
TEST(DataDependent, TopKWithARunTimeK) {
  auto g = std::make_unique<Graph>();
  g->set_name("topk");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {2, 5});
  Value* k = g->AddInput("k", DataType::kInt64, {1});
  Value* vals = g->AddValue("vals");
  Value* idx = g->AddValue("idx");
  AttributeMap axis1;
  axis1.Set("axis", int64_t{1});
  g->AddNode("TopK", "topk", {x, k}, {vals, idx}, axis1);
  Value* neg = g->AddValue("neg");
  g->AddNode("Neg", "neg", {vals}, {neg});
  g->MarkOutput(neg);
  g->MarkOutput(idx);
  BuilderConfig config;
  BuildReport report;
  auto desc = BuildEngine({std::move(g), "topk", Hash128{}}, config, &report);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*desc)));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_TRUE((*engine)->has_data_dependent_dims());
  auto ctx = (*engine)->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<float> xs = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  std::vector<float> neg_out(10);
  std::vector<int64_t> idx_out(10), kv(1);
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", xs.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("k", kv.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("neg", neg_out.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("idx", idx_out.data()).ok());
  EXPECT_EQ(*(*ctx)->GetMaxTensorShape("neg"), (std::vector<int64_t>{2, 5}));
  for (int64_t kk : {3, 1, 0, 5, 3}) {
    kv[0] = kk;
    ASSERT_TRUE((*ctx)->Execute().ok()) << "k " << kk;
    EXPECT_EQ(*(*ctx)->GetTensorShape("neg"), (std::vector<int64_t>{2, kk}));
    // Reference: per row, indices by descending value, ties by lower index.
    std::vector<float> want_neg;
    std::vector<int64_t> want_idx;
    for (int r = 0; r < 2; ++r) {
      std::vector<int64_t> order = {0, 1, 2, 3, 4};
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return xs[r * 5 + a] > xs[r * 5 + b]; });
      for (int64_t j = 0; j < kk; ++j) {
        want_neg.push_back(-xs[r * 5 + order[j]]);
        want_idx.push_back(order[j]);
      }
    }
    EXPECT_EQ(std::vector<float>(neg_out.begin(), neg_out.begin() + 2 * kk), want_neg);
    EXPECT_EQ(std::vector<int64_t>(idx_out.begin(), idx_out.begin() + 2 * kk), want_idx);
  }
  kv[0] = 6;  // past the axis: a catalog error naming K, and the context stays usable
  Status bad = (*ctx)->Execute();
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.ToString().find("K is 6"), std::string::npos) << bad.ToString();
  kv[0] = 2;
  EXPECT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(*(*ctx)->GetTensorShape("idx"), (std::vector<int64_t>{2, 2}));
}

// Shape inputs and data-dependent dims together: Tile by a shape input, then NonZero. Other
// repeats re-plan the arena at the bounds of those shapes; a reported count then re-infers the
// later layers within that placement (Propagate(mid_run)).
TEST(DataDependent, AfterAShapeInputTheArenaIsReplannedAtTheBound) {
  auto g = std::make_unique<Graph>();
  g->set_name("tile_nonzero");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {2, 3});
  Value* repeats = g->AddInput("repeats", DataType::kInt64, {2});
  Value* t = g->AddValue("t");
  g->AddNode("Tile", "tile", {x, repeats}, {t});
  Value* nz = g->AddValue("nz");
  g->AddNode("NonZero", "nonzero", {t}, {nz});
  Value* tr = g->AddValue("tr");
  AttributeMap perm;
  perm.Set("perm", std::vector<int64_t>{1, 0});
  g->AddNode("Transpose", "transpose", {nz}, {tr}, perm);
  g->MarkOutput(tr);
  BuilderConfig config;
  config.profile.shape_values = {{"repeats", {1, 1}}};
  config.shape_arena_bytes = 1 << 16;
  BuildReport report;
  auto desc = BuildEngine({std::move(g), "tile_nonzero", Hash128{}}, config, &report);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*desc)));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto ctx = (*engine)->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<float> xs = {0, 1, 0, 2, 0, 3};  // non-zero at (0,1), (1,0), (1,2)
  std::vector<int64_t> out(2 * 2 * 6 * 4 * 3, -1);
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", xs.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("tr", out.data()).ok());
  for (auto [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 3}, {1, 2}, {2, 3}}) {
    std::vector<int64_t> rep = {r0, r1};
    ASSERT_TRUE((*ctx)->SetTensorAddress("repeats", rep.data()).ok());
    auto max = (*ctx)->GetMaxTensorShape("tr");
    ASSERT_TRUE(max.ok()) << max.status().ToString();
    EXPECT_EQ(*max, (std::vector<int64_t>{6 * r0 * r1, 2}));
    Status s = (*ctx)->Execute();
    ASSERT_TRUE(s.ok()) << s.ToString();
    // Reference: the tiled tensor's non-zeros, row-major, as [n, 2] rows (row, column).
    std::vector<int64_t> want;
    for (int64_t i = 0; i < 2 * r0; ++i) {
      for (int64_t j = 0; j < 3 * r1; ++j) {
        if (xs[static_cast<size_t>((i % 2) * 3 + j % 3)] != 0.f) want.insert(want.end(), {i, j});
      }
    }
    const int64_t n = static_cast<int64_t>(want.size() / 2);
    EXPECT_EQ(*(*ctx)->GetTensorShape("tr"), (std::vector<int64_t>{n, 2}));
    EXPECT_EQ(std::vector<int64_t>(out.begin(), out.begin() + 2 * n), want);
  }
  EXPECT_GE((*ctx)->arena_replans(), 1);
  EXPECT_GE((*ctx)->data_dependent_updates(), 4);
}

// Two data-dependent layers in a row: Unique of NonZero's output. The second bound (2 * n) names
// the first dim, so the plan resolves n first; one run re-infers after each layer.
TEST(DataDependent, UniqueOfNonZeroChainsTheBounds) {
  auto g = std::make_unique<Graph>();
  g->set_name("chain");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("batch"), 3});
  Value* nz = g->AddValue("nz");
  g->AddNode("NonZero", "nonzero", {x}, {nz});
  Value* y = g->AddValue("y");
  Value* counts = g->AddValue("counts");
  Value* none1 = nullptr;
  Value* none2 = nullptr;
  g->AddNode("Unique", "unique", {nz}, {y, none1, none2, counts});
  g->MarkOutput(y);
  g->MarkOutput(counts);
  BuilderConfig config;
  config.profile.inputs = {{"x", {1, 3}, {2, 3}, {5, 3}}};
  BuildReport report;
  auto desc = BuildEngine({std::move(g), "chain", Hash128{}}, config, &report);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  auto bytes = SerializeEngine(**desc);
  ASSERT_TRUE(bytes.ok());
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto ctx = (*engine)->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  for (const std::vector<float>& xs : std::vector<std::vector<float>>{
           {0, 1, 0, 0, 0, 2},                    // (0,1), (1,2): values 0, 1, 2
           {0, 0, 0, 0, 0, 0, 0, 0, 0},           // none
           {4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5},  // (0,0), (3,2): 0, 2, 3
       }) {
    const int64_t batch = static_cast<int64_t>(xs.size()) / 3;
    ASSERT_TRUE((*ctx)->SetInputShape("x", {batch, 3}).ok());
    auto max = (*ctx)->GetMaxTensorShape("y");
    ASSERT_TRUE(max.ok()) << max.status().ToString();
    EXPECT_EQ(*max, (std::vector<int64_t>{2 * 3 * batch}));
    std::vector<int64_t> y_out(static_cast<size_t>((*max)[0])), c_out(y_out.size());
    ASSERT_TRUE((*ctx)->SetTensorAddress("x", const_cast<float*>(xs.data())).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("y", y_out.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("counts", c_out.data()).ok());
    Status s = (*ctx)->Execute();
    ASSERT_TRUE(s.ok()) << s.ToString();
    // Reference: the coordinates' distinct values, sorted, and how often each occurs.
    std::map<int64_t, int64_t> seen;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (xs[i] == 0.f) continue;
      ++seen[static_cast<int64_t>(i / 3)];
      ++seen[static_cast<int64_t>(i % 3)];
    }
    std::vector<int64_t> want_y, want_c;
    for (auto [v, c] : seen) {
      want_y.push_back(v);
      want_c.push_back(c);
    }
    const auto n = static_cast<int64_t>(want_y.size());
    EXPECT_EQ(*(*ctx)->GetTensorShape("y"), (std::vector<int64_t>{n}));
    EXPECT_EQ(std::vector<int64_t>(y_out.begin(), y_out.begin() + n), want_y);
    EXPECT_EQ(std::vector<int64_t>(c_out.begin(), c_out.begin() + n), want_c);
  }
}

// ---- op values through the CPU evaluator (the path constant folding uses too)

StatusOr<std::vector<Tensor>> Eval(const std::string& op, std::vector<Tensor> ins,
                                   AttributeMap attrs, size_t outputs) {
  Graph g;
  g.set_opset(17);
  std::vector<Value*> in_values, out_values;
  for (size_t i = 0; i < ins.size(); ++i) {
    in_values.push_back(
        ins[i].dtype() == DataType::kUndefined
            ? nullptr
            : g.AddInput("in" + std::to_string(i), ins[i].dtype(), MakeShape(ins[i].dims())));
  }
  for (size_t i = 0; i < outputs; ++i) out_values.push_back(g.AddValue("out" + std::to_string(i)));
  Node* node = g.AddNode(op, "node", in_values, out_values, std::move(attrs));
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : ins) ptrs.push_back(t.dtype() == DataType::kUndefined ? nullptr : &t);
  return cpu::EvaluateNode(*node, ptrs);
}

std::vector<int64_t> Ints(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.num_elements(); ++i) v.push_back(t.GetInt(i));
  return v;
}
std::vector<double> Doubles(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.num_elements(); ++i) v.push_back(t.GetDouble(i));
  return v;
}

TEST(DataDependent, NonZeroOfRank3AndAnEmptyInput) {
  std::vector<float> x(24, 0.f);
  x[1] = 1;
  x[13] = -2;
  x[23] = 0.5;
  auto out = Eval("NonZero", {Tensor::FromVector<float>(DataType::kFloat32, {2, 3, 4}, x)}, {}, 1);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(Ints((*out)[0]), (std::vector<int64_t>{0, 1, 1, 0, 0, 2, 1, 1, 3}));
  // -0 is zero, NaN is not; bool and 8-byte integers by value.
  auto f =
      Eval("NonZero",
           {Tensor::FromVector<float>(DataType::kFloat32, {4}, {-0.f, NAN, 0.f, 1e-30f})}, {}, 1);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(Ints((*f)[0]), (std::vector<int64_t>{1, 3}));
  auto b =
      Eval("NonZero", {Tensor::FromVector<uint8_t>(DataType::kBool, {2, 2}, {1, 0, 0, 1})}, {}, 1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(Ints((*b)[0]), (std::vector<int64_t>{0, 1, 0, 1}));
  auto i64 =
      Eval("NonZero",
           {Tensor::FromVector<int64_t>(DataType::kInt64, {3}, {int64_t{1} << 40, 0, -1})}, {}, 1);
  ASSERT_TRUE(i64.ok()) << i64.status().ToString();
  EXPECT_EQ(Ints((*i64)[0]), (std::vector<int64_t>{0, 2}));
  auto empty = Eval("NonZero", {Tensor(DataType::kInt32, {0, 5})}, {}, 1);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ((*empty)[0].dims(), (std::vector<int64_t>{2, 0}));
}

// Unique's reference: a first-occurrence scan (O(n^2)), then sorted when asked.
struct UniqueRef {
  std::vector<std::vector<double>> y;  // slices
  std::vector<int64_t> indices, inverse, counts;
};
UniqueRef UniqueReference(const std::vector<std::vector<double>>& slices, bool sorted) {
  UniqueRef r;
  for (size_t i = 0; i < slices.size(); ++i) {
    auto it = std::find(r.y.begin(), r.y.end(), slices[i]);
    if (it == r.y.end()) {
      r.y.push_back(slices[i]);
      r.indices.push_back(static_cast<int64_t>(i));
      r.counts.push_back(0);
      it = r.y.end() - 1;
    }
    const int64_t k = it - r.y.begin();
    r.inverse.push_back(k);
    ++r.counts[static_cast<size_t>(k)];
  }
  if (sorted) {
    std::vector<int64_t> order(r.y.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int64_t>(k);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return r.y[a] < r.y[b]; });
    UniqueRef s;
    std::vector<int64_t> pos(order.size());
    for (size_t k = 0; k < order.size(); ++k) {
      s.y.push_back(r.y[order[k]]);
      s.indices.push_back(r.indices[order[k]]);
      s.counts.push_back(r.counts[order[k]]);
      pos[order[k]] = static_cast<int64_t>(k);
    }
    for (int64_t v : r.inverse) s.inverse.push_back(pos[v]);
    return s;
  }
  return r;
}

TEST(DataDependent, UniqueFlattenedSortedAndUnsorted) {
  const std::vector<float> x = {2, 1, 1, 3, 4, 3, -1, 2, 0, 0, 7, 1};
  for (int64_t sorted : {0, 1}) {
    AttributeMap a;
    a.Set("sorted", sorted);
    auto out = Eval("Unique", {Tensor::FromVector<float>(DataType::kFloat32, {3, 4}, x)}, a, 4);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    std::vector<std::vector<double>> slices;
    for (float v : x) slices.push_back({v});
    UniqueRef ref = UniqueReference(slices, sorted != 0);
    std::vector<double> y;
    for (auto& s : ref.y) y.push_back(s[0]);
    EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{static_cast<int64_t>(y.size())}));
    EXPECT_EQ(Doubles((*out)[0]), y) << "sorted " << sorted;
    EXPECT_EQ(Ints((*out)[1]), ref.indices);
    EXPECT_EQ(Ints((*out)[2]), ref.inverse);
    EXPECT_EQ(Ints((*out)[3]), ref.counts);
  }
}

TEST(DataDependent, UniqueAlongEachAxis) {
  // [3, 2, 3] int64 with repeated slices along axes 0 and 2.
  const std::vector<int64_t> x = {1, 2, 1, 3, 4, 3, 5, 6, 5, 7, 8, 7, 1, 2, 1, 3, 4, 3};
  const std::vector<int64_t> dims = {3, 2, 3};
  for (int64_t axis : {0, 1, 2, -1}) {
    for (int64_t sorted : {0, 1}) {
      AttributeMap a;
      a.Set("sorted", sorted);
      a.Set("axis", axis);
      auto out = Eval("Unique", {Tensor::FromVector<int64_t>(DataType::kInt64, dims, x)}, a, 4);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      const int64_t ax = axis < 0 ? axis + 3 : axis;
      std::vector<std::vector<double>> slices(static_cast<size_t>(dims[ax]));
      for (int64_t i = 0; i < 18; ++i) {
        const int64_t c[3] = {i / 6, i / 3 % 2, i % 3};
        slices[static_cast<size_t>(c[ax])].push_back(static_cast<double>(x[i]));
      }
      UniqueRef ref = UniqueReference(slices, sorted != 0);
      std::vector<int64_t> ydims = dims;
      ydims[ax] = static_cast<int64_t>(ref.y.size());
      ASSERT_EQ((*out)[0].dims(), ydims) << "axis " << axis;
      // Y's slices along the axis are the reference's, in its order.
      for (int64_t i = 0; i < (*out)[0].num_elements(); ++i) {
        const int64_t c[3] = {i / (ydims[1] * ydims[2]), i / ydims[2] % ydims[1], i % ydims[2]};
        int64_t within = 0;  // position of element i inside its slice (row-major, axis dropped)
        for (int64_t d = 0; d < 3; ++d) {
          if (d != ax) within = within * dims[d] + c[d];
        }
        EXPECT_EQ((*out)[0].GetInt(i), ref.y[c[ax]][within]) << "axis " << axis << " i " << i;
      }
      EXPECT_EQ(Ints((*out)[1]), ref.indices) << "axis " << axis;
      EXPECT_EQ(Ints((*out)[2]), ref.inverse) << "axis " << axis;
      EXPECT_EQ(Ints((*out)[3]), ref.counts) << "axis " << axis;
    }
  }
}

TEST(DataDependent, CompressWithAndWithoutAxisAndAShortCondition) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [3, 4]
  auto cond = [](std::vector<uint8_t> c) {
    return Tensor::FromVector<uint8_t>(DataType::kBool, {static_cast<int64_t>(c.size())}, c);
  };
  auto X = Tensor::FromVector<float>(DataType::kFloat32, {3, 4}, x);
  struct Case {
    std::optional<int64_t> axis;
    std::vector<uint8_t> c;
    std::vector<int64_t> dims;
    std::vector<double> want;
  };
  for (const Case& k : std::vector<Case>{
           {0, {0, 1, 1}, {2, 4}, {5, 6, 7, 8, 9, 10, 11, 12}},
           {1, {1, 0, 0, 1}, {3, 2}, {1, 4, 5, 8, 9, 12}},
           {-1, {0, 1}, {3, 1}, {2, 6, 10}},  // shorter than the axis
           {std::nullopt, {0, 1, 0, 0, 0, 1}, {2}, {2, 6}},
           {1, {0, 0, 0, 0}, {3, 0}, {}},
       }) {
    AttributeMap a;
    if (k.axis) a.Set("axis", *k.axis);
    auto out = Eval("Compress", {X, cond(k.c)}, a, 1);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ((*out)[0].dims(), k.dims);
    EXPECT_EQ(Doubles((*out)[0]), k.want);
  }
  // A condition that selects past the axis: a catalog error, no crash.
  AttributeMap a;
  a.Set("axis", int64_t{0});
  auto bad = Eval("Compress", {X, cond({0, 0, 0, 1})}, a, 1);
  EXPECT_FALSE(bad.ok());
}

// NonMaxSuppression's reference: the greedy loop on IoU written out in double.
std::vector<int64_t> NmsReference(const std::vector<float>& boxes, const std::vector<float>& scores,
                                  int64_t batches, int64_t classes, int64_t count, int64_t max_out,
                                  double iou_th, std::optional<double> score_th, bool center) {
  auto corners = [&](int64_t b, int64_t i) {
    const float* p = &boxes[static_cast<size_t>((b * count + i) * 4)];
    if (center) {
      return std::array<double, 4>{p[0] - p[2] / 2.0, p[1] - p[3] / 2.0, p[0] + p[2] / 2.0,
                                   p[1] + p[3] / 2.0};
    }
    return std::array<double, 4>{std::min(p[1], p[3]), std::min(p[0], p[2]), std::max(p[1], p[3]),
                                 std::max(p[0], p[2])};
  };
  std::vector<int64_t> out;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t c = 0; c < classes; ++c) {
      std::vector<std::pair<double, int64_t>> cand;
      for (int64_t i = 0; i < count; ++i) {
        const double s = scores[static_cast<size_t>((b * classes + c) * count + i)];
        if (!score_th || s > *score_th) cand.push_back({-s, i});
      }
      std::sort(cand.begin(), cand.end());
      std::vector<int64_t> kept;
      for (auto [neg, i] : cand) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool ok = true;
        for (int64_t k : kept) {
          auto p = corners(b, i), q = corners(b, k);
          const double w = std::min(p[2], q[2]) - std::max(p[0], q[0]);
          const double h = std::min(p[3], q[3]) - std::max(p[1], q[1]);
          if (w <= 0 || h <= 0) continue;
          const double inter = w * h;
          const double uni = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter;
          if (inter / uni > iou_th) ok = false;
        }
        if (!ok) continue;
        kept.push_back(i);
        out.insert(out.end(), {b, c, i});
      }
    }
  }
  return out;
}

TEST(DataDependent, NonMaxSuppressionMatchesTheGreedyReference) {
  // 2 batches, 2 classes, 6 boxes with overlaps; corners given in either order.
  const std::vector<float> corner_boxes = {
      0, 0,  1, 1,  0, 0.1f,  1,    1.1f,  0, -0.1f, 1,    0.9f,
      0, 10, 1, 11, 1, 10.1f, 0,    11.1f, 0, 100,   1,    101,  // batch 0
      5, 5,  6, 6,  5, 5,     6.5f, 6.5f,  0, 0,     2,    2,
      1, 1,  3, 3,  9, 9,     8,    8,     0, 0,     0.5f, 0.5f};
  const std::vector<float> scores = {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f, 0.1f, 0.2f,
                                     0.3f, 0.4f,  0.5f, 0.6f,  0.8f, 0.7f, 0.6f, 0.5f,
                                     0.4f, 0.3f,  0.3f, 0.3f,  0.9f, 0.1f, 0.2f, 0.3f};
  for (bool center : {false, true}) {
    for (auto [max_out, iou, score] : std::vector<std::tuple<int64_t, float, float>>{
             {3, 0.5f, 0.0f}, {10, 0.2f, 0.35f}, {1, 0.0f, 0.0f}, {0, 0.5f, 0.0f}}) {
      AttributeMap a;
      a.Set("center_point_box", int64_t{center ? 1 : 0});
      auto out = Eval("NonMaxSuppression",
                      {Tensor::FromVector<float>(DataType::kFloat32, {2, 6, 4}, corner_boxes),
                       Tensor::FromVector<float>(DataType::kFloat32, {2, 2, 6}, scores),
                       Tensor::FromVector<int64_t>(DataType::kInt64, {1}, {max_out}),
                       Tensor::FromVector<float>(DataType::kFloat32, {1}, {iou}),
                       Tensor::FromVector<float>(DataType::kFloat32, {1}, {score})},
                      a, 1);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      std::vector<int64_t> want =
          NmsReference(corner_boxes, scores, 2, 2, 6, max_out, iou, score, center);
      EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{static_cast<int64_t>(want.size() / 3), 3}));
      EXPECT_EQ(Ints((*out)[0]), want) << "center " << center << " max " << max_out;
    }
  }
}

TEST(DataDependent, NonMaxSuppressionBoundUsesAConstantMaxOutput) {
  Graph g;
  g.set_opset(17);
  Value* boxes = g.AddInput("boxes", DataType::kFloat32, {Dim::Symbol("b"), 50, 4});
  Value* scores = g.AddInput("scores", DataType::kFloat32, {Dim::Symbol("b"), 3, 50});
  Value* k = g.AddConstant("k", Tensor::FromVector<int64_t>(DataType::kInt64, {1}, {10}));
  Value* sel = g.AddValue("sel");
  g.AddNode("NonMaxSuppression", "nms", {boxes, scores, k}, {sel});
  g.MarkOutput(sel);
  ASSERT_TRUE(InferShapes(g).ok());
  const std::string sym = sel->shape()[0].Symbols().at(0);
  EXPECT_EQ(g.data_dependent_bounds().at(sym), Dim::Symbol("b") * Dim(30));
}

// Exporters pass k = INT64_MAX ("every box") with a box count known only at run time (boxes
// kept by an earlier data-dependent op): the bound is the box count, not k (which would overflow
// the plan).
TEST(DataDependent, NonMaxSuppressionBoundWithAHugeKAndASymbolicBoxCount) {
  Graph g;
  g.set_opset(17);
  Value* boxes = g.AddInput("boxes", DataType::kFloat32, {1, Dim::Symbol("n"), 4});
  Value* scores = g.AddInput("scores", DataType::kFloat32, {1, 2, Dim::Symbol("n")});
  Value* k = g.AddConstant("k", Tensor::FromVector<int64_t>(DataType::kInt64, {1},
                                                            {std::numeric_limits<int64_t>::max()}));
  Value* sel = g.AddValue("sel");
  g.AddNode("NonMaxSuppression", "nms", {boxes, scores, k}, {sel});
  g.MarkOutput(sel);
  ASSERT_TRUE(InferShapes(g).ok());
  const std::string sym = sel->shape()[0].Symbols().at(0);
  EXPECT_EQ(g.data_dependent_bounds().at(sym), Dim::Symbol("n") * Dim(2));
}

}  // namespace
}  // namespace kiln
