// Shape inputs (docs/architecture.md, "Shape inputs"): an engine built for one set of a shape
// input's values runs other values correctly, re-specializing only when they change, keeps its
// plan while the activations fit it, re-plans within its bounded arena when they do not, and
// refuses values past that bound with KILN-E5015 (the context stays usable).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/runtime/runtime.h"

namespace kiln {
namespace {

// x[2,3] f32, repeats[2] i64 (a shape input), s[2] i64 (a shape input):
//   t = Tile(x, repeats)    y = Relu(t)    z = Reshape(Neg(x), s)
std::unique_ptr<Graph> MakeGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("shape_inputs");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {2, 3});
  Value* repeats = g->AddInput("repeats", DataType::kInt64, {2});
  Value* s = g->AddInput("s", DataType::kInt64, {2});
  Value* t = g->AddValue("t");
  g->AddNode("Tile", "tile", {x, repeats}, {t});
  Value* y = g->AddValue("y");
  g->AddNode("Relu", "relu", {t}, {y});
  Value* n = g->AddValue("n");
  g->AddNode("Neg", "neg", {x}, {n});
  Value* z = g->AddValue("z");
  g->AddNode("Reshape", "reshape", {n, s}, {z});
  g->MarkOutput(y);
  g->MarkOutput(z);
  return g;
}

constexpr int64_t kShapeArena = 4096;

std::shared_ptr<const Engine> BuildShapeEngine(std::vector<int64_t> repeats = {1, 1}) {
  BuilderConfig config;
  config.profile.shape_values = {{"repeats", std::move(repeats)}, {"s", {3, 2}}};
  config.shape_arena_bytes = kShapeArena;
  BuildReport report;
  auto desc = BuildEngine({MakeGraph(), "shape_inputs", Hash128{}}, config, &report);
  EXPECT_TRUE(desc.ok()) << desc.status().ToString();
  if (!desc.ok()) return nullptr;
  // Through the file format, as a user's engine goes.
  auto bytes = SerializeEngine(**desc);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok());
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? *engine : nullptr;
}

const std::vector<float> kX = {-1.f, 2.f, -3.f, 4.f, 5.f, -6.f};

struct Run {
  std::vector<int64_t> y_dims, z_dims;
  std::vector<float> y, z;
};

// Binds the values (fresh buffers each call unless given), sizes the outputs from
// GetTensorShape and executes.
StatusOr<Run> RunWith(ExecutionContext& ctx, std::vector<int64_t>& repeats,
                      std::vector<int64_t>& s) {
  Run r;
  std::vector<float> x = kX;
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("x", x.data()));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("repeats", repeats.data()));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("s", s.data()));
  KILN_ASSIGN_OR_RETURN(r.y_dims, ctx.GetTensorShape("y"));
  KILN_ASSIGN_OR_RETURN(r.z_dims, ctx.GetTensorShape("z"));
  r.y.assign(static_cast<size_t>(NumElements(r.y_dims)), -100.f);
  r.z.assign(static_cast<size_t>(NumElements(r.z_dims)), -100.f);
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("y", r.y.data()));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("z", r.z.data()));
  KILN_RETURN_IF_ERROR(ctx.Execute());
  return r;
}

// relu(tile(x, repeats)) for x[2,3].
std::vector<float> TileReference(int64_t r0, int64_t r1) {
  std::vector<float> out;
  for (int64_t i = 0; i < 2 * r0; ++i) {
    for (int64_t j = 0; j < 3 * r1; ++j) out.push_back(std::max(0.f, kX[(i % 2) * 3 + j % 3]));
  }
  return out;
}

std::vector<float> NegX() {
  std::vector<float> n;
  for (float v : kX) n.push_back(-v);
  return n;
}

TEST(ShapeInputs, EngineRecordsTheBuildValuesAndABoundedArena) {
  auto engine = BuildShapeEngine();
  ASSERT_TRUE(engine);
  EXPECT_TRUE(engine->has_shape_inputs());
  ASSERT_EQ(engine->inputs().size(), 3u);
  EXPECT_FALSE(engine->inputs()[0].shape_values);
  ASSERT_TRUE(engine->inputs()[1].shape_values);
  EXPECT_EQ(engine->inputs()[1].shape_values->values, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(engine->inputs()[2].shape_values->values, (std::vector<int64_t>{3, 2}));
  EXPECT_GE(engine->shape_arena_bytes(), kShapeArena);
  EXPECT_GE(engine->planned_peak_bytes(), engine->shape_arena_bytes());
}

TEST(ShapeInputs, OtherValuesGiveTheirOwnShapesAndOutputs) {
  auto engine = BuildShapeEngine();
  ASSERT_TRUE(engine);
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  for (auto [r0, r1, s0, s1] : std::vector<std::array<int64_t, 4>>{
           {1, 1, 3, 2}, {2, 3, 2, 3}, {3, 1, -1, 1}, {1, 2, 6, -1}, {1, 1, 3, 2}}) {
    std::vector<int64_t> repeats = {r0, r1}, s = {s0, s1};
    auto run = RunWith(**ctx, repeats, s);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    EXPECT_EQ(run->y_dims, (std::vector<int64_t>{2 * r0, 3 * r1}));
    EXPECT_EQ(run->y, TileReference(r0, r1));
    const int64_t z0 = s0 < 0 ? 6 / s1 : s0, z1 = s1 < 0 ? 6 / s0 : s1;
    EXPECT_EQ(run->z_dims, (std::vector<int64_t>{z0, z1}));
    EXPECT_EQ(run->z, NegX());
  }
  // Four changes of values after the build's: each re-specialized once.
  EXPECT_EQ((*ctx)->shape_specializations(), 4);
}

TEST(ShapeInputs, SameValuesNeitherRespecializeNorReplan) {
  auto engine = BuildShapeEngine();
  ASSERT_TRUE(engine);
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  std::vector<int64_t> repeats = {1, 1}, s = {3, 2};
  // The build's values: the engine's plan as it is.
  ASSERT_TRUE(RunWith(**ctx, repeats, s).ok());
  EXPECT_EQ((*ctx)->shape_specializations(), 0);
  EXPECT_EQ((*ctx)->arena_replans(), 0);
  // Larger activations than the plan's: one re-specialization, one re-plan ...
  repeats = {4, 2};
  ASSERT_TRUE(RunWith(**ctx, repeats, s).ok());
  EXPECT_EQ((*ctx)->shape_specializations(), 1);
  EXPECT_EQ((*ctx)->arena_replans(), 1);
  // ... and none again for the same values, in the same buffer or another one.
  ASSERT_TRUE(RunWith(**ctx, repeats, s).ok());
  std::vector<int64_t> same = {4, 2};
  auto run = RunWith(**ctx, same, s);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->y, TileReference(4, 2));
  EXPECT_EQ((*ctx)->shape_specializations(), 1);
  EXPECT_EQ((*ctx)->arena_replans(), 1);
  // Values whose activations fit the plan again: re-specialized onto the plan, no re-plan.
  repeats = {1, 1};
  run = RunWith(**ctx, repeats, s);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->y, TileReference(1, 1));
  EXPECT_EQ((*ctx)->shape_specializations(), 2);
  EXPECT_EQ((*ctx)->arena_replans(), 1);
}

TEST(ShapeInputs, ValuesPastTheArenaAreACatalogErrorAndTheContextStaysUsable) {
  auto engine = BuildShapeEngine();
  ASSERT_TRUE(engine);
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  const size_t arena = static_cast<size_t>((*ctx)->allocated_bytes());
  // t = 2*3*100*100 floats: 240000 bytes, past the 4096-byte bound.
  std::vector<int64_t> repeats = {100, 100}, s = {3, 2};
  std::vector<float> x = kX, y(60000), z(6);
  ASSERT_TRUE((*ctx)->SetTensorAddress("x", x.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("repeats", repeats.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("s", s.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", y.data()).ok());
  ASSERT_TRUE((*ctx)->SetTensorAddress("z", z.data()).ok());
  Status st = (*ctx)->Execute();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kShapeValuesExceedArena) << st.ToString();
  EXPECT_NE(st.message().find("'repeats' = [100,100]"), std::string::npos) << st.ToString();
  // Nothing was allocated for it; values within the bound run.
  EXPECT_EQ(static_cast<size_t>((*ctx)->allocated_bytes()), arena);
  repeats = {2, 2};
  auto run = RunWith(**ctx, repeats, s);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->y, TileReference(2, 2));
}

TEST(ShapeInputs, ValuesThatDoNotFitTheOpAreAnErrorNamingTheLayer) {
  auto engine = BuildShapeEngine();
  ASSERT_TRUE(engine);
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  std::vector<int64_t> repeats = {1, 1}, s = {4, 2};  // 8 elements from 6
  auto run = RunWith(**ctx, repeats, s);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), ErrorCode::kShapeMismatch) << run.status().ToString();
  EXPECT_NE(run.status().ToString().find("reshape"), std::string::npos);
  s = {2, 3};
  run = RunWith(**ctx, repeats, s);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->z_dims, (std::vector<int64_t>{2, 3}));
}

TEST(ShapeInputs, BuilderChecksTheValuesAndDropsInputsNoRuleReads) {
  BuilderConfig config;
  config.profile.shape_values = {{"repeats", {1, 1, 1}}, {"s", {3, 2}}};
  BuildReport report;
  auto desc = BuildEngine({MakeGraph(), "m", Hash128{}}, config, &report);
  ASSERT_FALSE(desc.ok());
  EXPECT_EQ(desc.status().code(), ErrorCode::kInvalidProfile) << desc.status().ToString();

  // Values that are not integers for an integer input.
  config.profile.shape_values = {{"s", {}, {3, 2.5}}};
  desc = BuildEngine({MakeGraph(), "m", Hash128{}}, config, &report);
  ASSERT_FALSE(desc.ok());
  EXPECT_EQ(desc.status().code(), ErrorCode::kInvalidProfile) << desc.status().ToString();

  // A float input may be a shape input (Resize's scales); x, which no rule reads, is dropped.
  config.profile.shape_values = {{"x", {1, 2, 3, 4, 5, 6}}, {"repeats", {1, 1}}, {"s", {3, 2}}};
  desc = BuildEngine({MakeGraph(), "m", Hash128{}}, config, &report);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  ASSERT_EQ((*desc)->profile.shape_values.size(), 2u);
  EXPECT_EQ((*desc)->profile.shape_values[0].input, "repeats");
  EXPECT_EQ((*desc)->profile.shape_values[1].input, "s");

  // An integer input whose values no rule reads (Abs's operand) is no shape input.
  auto g = std::make_unique<Graph>();
  g->set_name("abs");
  g->set_opset(17);
  Value* idx = g->AddInput("idx", DataType::kInt64, {2});
  Value* out = g->AddValue("out");
  g->AddNode("Abs", "abs", {idx}, {out});
  g->MarkOutput(out);
  config.profile.shape_values = {{"idx", {0, -3}}};
  desc = BuildEngine({std::move(g), "abs", Hash128{}}, config, &report);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  EXPECT_TRUE((*desc)->profile.shape_values.empty());
  EXPECT_EQ((*desc)->plan.shape_arena_bytes, 0);
}

// Float shape inputs: Resize's scales and Range's bounds given as graph inputs.
std::shared_ptr<const Engine> BuildEngineOf(std::unique_ptr<Graph> g, OptimizationProfile profile) {
  BuilderConfig config;
  config.profile = std::move(profile);
  config.shape_arena_bytes = 1 << 16;
  BuildReport report;
  const std::string name = g->name();
  auto desc = BuildEngine({std::move(g), name, Hash128{}}, config, &report);
  EXPECT_TRUE(desc.ok()) << desc.status().ToString();
  if (!desc.ok()) return nullptr;
  auto bytes = SerializeEngine(**desc);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok());
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? *engine : nullptr;
}

// y = Resize(x [1, 1, 3, 4], scales) (nearest, asymmetric, floor): y[i][j] = x[i / s2][j / s3]
// with the quotients floored, for output dims floor(3 * s2) x floor(4 * s3). Built for the
// largest scales: the kernel's workspace (intermediates between its per-axis passes) is planned
// for the build's values, and values that need more are KILN-E5004 (the context stays usable).
TEST(ShapeInputs, ResizeScalesFromAFloatInputRespecializeWithTheirValues) {
  auto g = std::make_unique<Graph>();
  g->set_name("resize_scales");
  g->set_opset(19);
  Value* x = g->AddInput("x", DataType::kFloat32, {1, 1, 3, 4});
  Value* scales = g->AddInput("scales", DataType::kFloat32, {4});
  Value* y = g->AddValue("y");
  Node* n = g->AddNode("Resize", "resize", {x, nullptr, scales}, {y});
  n->mutable_attrs().Set("mode", std::string("nearest"));
  n->mutable_attrs().Set("coordinate_transformation_mode", std::string("asymmetric"));
  n->mutable_attrs().Set("nearest_mode", std::string("floor"));
  g->MarkOutput(y);
  OptimizationProfile profile;
  profile.shape_values = {{"scales", {}, {1, 1, 3, 2}}};
  auto engine = BuildEngineOf(std::move(g), profile);
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->inputs()[1].shape_values);
  EXPECT_EQ(engine->inputs()[1].shape_values->float_values, (std::vector<double>{1, 1, 3, 2}));
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<float> xs(12);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i * i % 7) - 2.5f;
  int changes = 0;
  std::vector<float> last = {1, 1, 3, 2};
  for (std::vector<float> sc : std::vector<std::vector<float>>{
           {1, 1, 3, 2}, {1, 1, 3, 1.5f}, {1, 1, 0.5f, 0.75f}, {1, 1, 2.5f, 1}, {1, 1, 2, 2}}) {
    changes += sc != last;
    last = sc;
    ASSERT_TRUE((*ctx)->SetTensorAddress("x", xs.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("scales", sc.data()).ok());
    auto dims = (*ctx)->GetTensorShape("y");
    ASSERT_TRUE(dims.ok()) << dims.status().ToString();
    const auto h = static_cast<int64_t>(std::floor(3 * static_cast<double>(sc[2])));
    const auto w = static_cast<int64_t>(std::floor(4 * static_cast<double>(sc[3])));
    ASSERT_EQ(*dims, (std::vector<int64_t>{1, 1, h, w}));
    std::vector<float> out(static_cast<size_t>(h * w), -100.f);
    ASSERT_TRUE((*ctx)->SetTensorAddress("y", out.data()).ok());
    Status st = (*ctx)->Execute();
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t j = 0; j < w; ++j) {
        const auto si = std::min<int64_t>(static_cast<int64_t>(std::floor(i / double{sc[2]})), 2);
        const auto sj = std::min<int64_t>(static_cast<int64_t>(std::floor(j / double{sc[3]})), 3);
        EXPECT_EQ(out[i * w + j], xs[si * 4 + sj]) << "scales " << sc[2] << "," << sc[3];
      }
    }
  }
  EXPECT_EQ((*ctx)->shape_specializations(), changes);
  // Past the planned workspace: a catalog error naming the layer, then smaller values run.
  std::vector<float> big = {1, 1, 5, 4}, small = {1, 1, 1, 0.5f};
  ASSERT_TRUE((*ctx)->SetTensorAddress("scales", big.data()).ok());
  auto dims = (*ctx)->GetTensorShape("y");
  ASSERT_FALSE(dims.ok());
  EXPECT_EQ(dims.status().code(), ErrorCode::kMemoryPlanViolated) << dims.status().ToString();
  EXPECT_NE(dims.status().ToString().find("resize"), std::string::npos);
  ASSERT_TRUE((*ctx)->SetTensorAddress("scales", small.data()).ok());
  dims = (*ctx)->GetTensorShape("y");
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  EXPECT_EQ(*dims, (std::vector<int64_t>{1, 1, 3, 2}));
  std::vector<float> out(6);
  ASSERT_TRUE((*ctx)->SetTensorAddress("y", out.data()).ok());
  ASSERT_TRUE((*ctx)->Execute().ok());
  EXPECT_EQ(out, (std::vector<float>{xs[0], xs[2], xs[4], xs[6], xs[8], xs[10]}));
}

// y = Range(start, limit, delta) on f32 scalars, and OneHot's depth from an f32 input.
TEST(ShapeInputs, RangeBoundsAndOneHotDepthFromFloatInputs) {
  auto g = std::make_unique<Graph>();
  g->set_name("range_onehot");
  g->set_opset(19);
  Value* start = g->AddInput("start", DataType::kFloat32, {});
  Value* limit = g->AddInput("limit", DataType::kFloat32, {});
  Value* delta = g->AddInput("delta", DataType::kFloat32, {});
  Value* idx = g->AddInput("idx", DataType::kInt64, {3});
  Value* depth = g->AddInput("depth", DataType::kFloat32, {});
  Value* values = g->AddInput("values", DataType::kFloat32, {2});
  Value* r = g->AddValue("r");
  g->AddNode("Range", "range", {start, limit, delta}, {r});
  Value* oh = g->AddValue("oh");
  g->AddNode("OneHot", "onehot", {idx, depth, values}, {oh});
  g->MarkOutput(r);
  g->MarkOutput(oh);
  OptimizationProfile profile;
  profile.shape_values = {
      {"start", {}, {0}}, {"limit", {}, {1}}, {"delta", {}, {0.25}}, {"depth", {}, {4}}};
  auto engine = BuildEngineOf(std::move(g), profile);
  ASSERT_TRUE(engine);
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<int64_t> ids = {0, 2, -1};
  std::vector<float> vals = {-1.f, 3.f};
  for (auto [s0, l0, d0, dep] : std::vector<std::array<float, 4>>{
           {0, 1, 0.25f, 4}, {-2, 3, 0.5f, 3}, {5, 1, -1.5f, 6}, {0, 1, 0.25f, 4}}) {
    float sv = s0, lv = l0, dv = d0, depv = dep;
    ASSERT_TRUE((*ctx)->SetTensorAddress("start", &sv).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("limit", &lv).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("delta", &dv).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("idx", ids.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("depth", &depv).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("values", vals.data()).ok());
    const auto n = static_cast<int64_t>(std::ceil((lv - sv) / dv));
    auto rd = (*ctx)->GetTensorShape("r");
    auto od = (*ctx)->GetTensorShape("oh");
    ASSERT_TRUE(rd.ok() && od.ok());
    const auto k = static_cast<int64_t>(depv);
    ASSERT_EQ(*rd, (std::vector<int64_t>{n}));
    ASSERT_EQ(*od, (std::vector<int64_t>{3, k}));
    std::vector<float> rout(static_cast<size_t>(n)), oout(static_cast<size_t>(3 * k));
    ASSERT_TRUE((*ctx)->SetTensorAddress("r", rout.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("oh", oout.data()).ok());
    Status st = (*ctx)->Execute();
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(rout[i], sv + static_cast<float>(i) * dv);
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t hot = ids[i] < 0 ? ids[i] + k : ids[i];
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(oout[i * k + j], j == hot ? 3.f : -1.f);
    }
  }
  EXPECT_EQ((*ctx)->shape_specializations(), 3);
}

}  // namespace
}  // namespace kiln
