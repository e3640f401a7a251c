// Zero-copy view layers in the runtime: engines whose Reshape/Unsqueeze/Squeeze/Flatten layers
// share their input's arena bytes compute exactly what the same engine with copies computes,
// launch no kernel for those layers (eagerly, timed, after a file round trip), and keep the
// copies where the bytes belong to the caller or the weights. Also the builder's marking and
// the zoo's transformer engines.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <random>

#include "kiln/app/pipeline.h"
#include "kiln/builder/builder.h"
#include "kiln/engine/engine_plan.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/plan/memory_plan.h"
#include "kiln/runtime/runtime.h"
#include "tests/engine/test_engines.h"

namespace kiln {
namespace {

Value* Node1(Graph& g, const std::string& op, const std::string& out, std::vector<Value*> ins,
             AttributeMap attrs = {}) {
  Value* v = g.AddValue(out);
  g.AddNode(op, "n_" + out, std::move(ins), {v}, std::move(attrs));
  return v;
}

Value* Ints(Graph& g, const std::string& name, std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return g.AddConstant(name, Tensor::FromVector<int64_t>(DataType::kInt64, {n}, values));
}

// x[batch,4] f32 (profile batch 1/3/8), w[2,2] = {0.5, -1, 2, -0.25}:
//   a  = Relu(x)                 r1 = Reshape(a, [-1])       (view of a: aliased)
//   r2 = Unsqueeze(r1, [0])      (view of a: aliased)         b = Relu(r2)
//   s  = Squeeze(b, [0])         (view of b: aliased)
//   xi = Reshape(x, [-1])        (view of the graph input: copies)
//   c  = Add(s, xi)              c4 = Reshape(c, [-1, 4])     (view of c: aliased)
//   wv = Reshape(w, [4])         (view of a constant: copies)
//   d  = Add(c4, wv)             f = Flatten(d, axis 1)       (view of d: aliased)
//   y  = Identity(f)             (into the graph output: copies, through a workspace)
// y = relu(x) + x + w, element by element.
std::unique_ptr<Graph> MakeViewGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("views");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("batch"), 4});
  Value* w = g->AddConstant(
      "w", Tensor::FromVector<float>(DataType::kFloat32, {2, 2}, {0.5f, -1.f, 2.f, -0.25f}));
  Value* a = Node1(*g, "Relu", "a", {x});
  Value* r1 = Node1(*g, "Reshape", "r1", {a, Ints(*g, "flat", {-1})});
  Value* r2 = Node1(*g, "Unsqueeze", "r2", {r1, Ints(*g, "axes0", {0})});
  Value* b = Node1(*g, "Relu", "b", {r2});
  Value* s = Node1(*g, "Squeeze", "s", {b, Ints(*g, "axes0b", {0})});
  Value* xi = Node1(*g, "Reshape", "xi", {x, Ints(*g, "flat_x", {-1})});
  Value* c = Node1(*g, "Add", "c", {s, xi});
  Value* c4 = Node1(*g, "Reshape", "c4", {c, Ints(*g, "rows", {-1, 4})});
  Value* wv = Node1(*g, "Reshape", "wv", {w, Ints(*g, "four", {4})});
  Value* d = Node1(*g, "Add", "d", {c4, wv});
  AttributeMap axis;
  axis.Set("axis", int64_t{1});
  Value* f = Node1(*g, "Flatten", "f", {d}, std::move(axis));
  Value* y = Node1(*g, "Identity", "y", {f});
  g->MarkOutput(y);
  return g;
}

OptimizationProfile ViewProfile() {
  OptimizationProfile p;
  p.inputs.push_back({"x", {1, 4}, {3, 4}, {8, 4}});
  return p;
}

std::vector<float> ViewReference(const std::vector<float>& x) {
  const float w[4] = {0.5f, -1.f, 2.f, -0.25f};
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::max(x[i], 0.f) + x[i] + w[i % 4];
  return y;
}

// The test engine, with the planner's aliasing on or off (off: every view copies).
std::shared_ptr<const EngineDesc> ViewEngineDesc(bool alias) {
  auto e = testing::AssembleTestEngine(MakeViewGraph(), ViewProfile());
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!alias) {
    auto plan = PlanMemory(**e, /*alias_views=*/false);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    (*e)->plan = *plan;
  }
  return std::shared_ptr<const EngineDesc>(std::move(*e));
}

std::shared_ptr<const Engine> MakeEngine(std::shared_ptr<const EngineDesc> desc) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok()) << runtime.status().ToString();
  auto engine = (*runtime)->CreateEngine(std::move(desc));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? *engine : nullptr;
}

std::vector<float> RandomX(int64_t batch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> x(static_cast<size_t>(batch) * 4);
  for (float& v : x) v = u(rng);
  return x;
}

Status RunViews(ExecutionContext& ctx, std::vector<float>& x, std::vector<float>& y) {
  const int64_t batch = static_cast<int64_t>(x.size() / 4);
  KILN_RETURN_IF_ERROR(ctx.SetInputShape("x", {batch, 4}));
  y.assign(x.size(), -100.f);
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("x", x.data()));
  KILN_RETURN_IF_ERROR(ctx.SetTensorAddress("y", y.data()));
  return ctx.Execute();
}

std::vector<std::string> ViewLayerNames(const Engine& engine) {
  std::vector<std::string> names;
  for (size_t l = 0; l < engine.desc().layers.size(); ++l) {
    if (engine.is_view_layer(l)) names.push_back(engine.desc().layers[l].node->name());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ViewAlias, PlanSharesBuffersOnlyBetweenIntermediates) {
  auto desc = ViewEngineDesc(true);
  const MemoryPlan& plan = desc->plan;
  EXPECT_EQ(plan.offsets.at("r1"), plan.offsets.at("a"));
  EXPECT_EQ(plan.offsets.at("r2"), plan.offsets.at("a"));
  EXPECT_EQ(plan.offsets.at("s"), plan.offsets.at("b"));
  EXPECT_EQ(plan.offsets.at("c4"), plan.offsets.at("c"));
  EXPECT_EQ(plan.offsets.at("f"), plan.offsets.at("d"));
  // The copies: a view of the input and of the weights have buffers of their own.
  EXPECT_NE(plan.offsets.at("xi"), plan.offsets.at("s"));
  EXPECT_NE(plan.offsets.at("xi"), plan.offsets.at("b"));
  EXPECT_TRUE(plan.offsets.count("wv"));

  auto copies = ViewEngineDesc(false);
  EXPECT_LE(plan.arena_bytes, copies->plan.arena_bytes);
  EXPECT_LE(plan.peak_bytes, copies->plan.peak_bytes);
  EXPECT_NE(copies->plan.offsets.at("r1"), copies->plan.offsets.at("a"));
  for (size_t l = 0; l < desc->layers.size(); ++l) EXPECT_FALSE(IsAliasedView(*copies, l));
}

TEST(ViewAlias, SameOutputsWithAndWithoutAliasingAndNoLaunchesForViews) {
  auto aliased = MakeEngine(ViewEngineDesc(true));
  auto copying = MakeEngine(ViewEngineDesc(false));
  ASSERT_TRUE(aliased && copying);
  const size_t layers = aliased->desc().layers.size();
  ASSERT_EQ(layers, 12u);
  EXPECT_EQ(aliased->view_layers(), 5u);
  EXPECT_EQ(ViewLayerNames(*aliased),
            (std::vector<std::string>{"n_c4", "n_f", "n_r1", "n_r2", "n_s"}));
  EXPECT_EQ(copying->view_layers(), 0u);

  auto ctx_a = aliased->CreateExecutionContext();
  auto ctx_c = copying->CreateExecutionContext();
  ASSERT_TRUE(ctx_a.ok() && ctx_c.ok());
  // Both contexts exist, so each holds no more than its plan; the aliased one never more.
  EXPECT_LE((*ctx_a)->actual_peak_bytes(), aliased->planned_peak_bytes());
  EXPECT_LE((*ctx_a)->allocated_bytes(), (*ctx_c)->allocated_bytes());

  int64_t runs = 0;
  for (int64_t batch : {3, 8, 1, 8}) {
    std::vector<float> x = RandomX(batch, static_cast<uint32_t>(batch + runs));
    std::vector<float> ya, yc;
    ASSERT_TRUE(RunViews(**ctx_a, x, ya).ok());
    ASSERT_TRUE(RunViews(**ctx_c, x, yc).ok());
    ++runs;
    EXPECT_EQ(ya, yc) << "batch " << batch;
    EXPECT_EQ(ya, ViewReference(x)) << "batch " << batch;
    // The input was only read: the copies of the input's views did not write into it.
    EXPECT_EQ(x, RandomX(batch, static_cast<uint32_t>(batch + runs - 1)));
  }
  EXPECT_EQ((*ctx_a)->kernel_launches(), runs * 7);
  EXPECT_EQ((*ctx_c)->kernel_launches(), runs * 12);
}

TEST(ViewAlias, LayerTimesAreZeroForViews) {
  auto engine = MakeEngine(ViewEngineDesc(true));
  ASSERT_TRUE(engine);
  ExecutionOptions options;
  options.layer_timing = true;
  auto ctx = engine->CreateExecutionContext(options);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<float> x = RandomX(8, 7), y;
  ASSERT_TRUE(RunViews(**ctx, x, y).ok());
  EXPECT_EQ(y, ViewReference(x));
  auto ms = (*ctx)->LayerTimesMs();
  ASSERT_TRUE(ms.ok()) << ms.status().ToString();
  ASSERT_EQ(ms->size(), 12u);
  for (size_t l = 0; l < ms->size(); ++l) {
    if (engine->is_view_layer(l)) {
      EXPECT_EQ((*ms)[l], 0.0) << engine->desc().layers[l].node->name();
    } else {
      EXPECT_GE((*ms)[l], 0.0) << engine->desc().layers[l].node->name();
    }
  }
  EXPECT_EQ((*ctx)->kernel_launches(), 7);
}

TEST(ViewAlias, SurvivesTheEngineFileAndSerializesDeterministically) {
  auto desc = ViewEngineDesc(true);
  auto bytes = SerializeEngine(*desc);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto again = SerializeEngine(*ViewEngineDesc(true));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*bytes, *again);  // byte-identical engines

  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto loaded = (*runtime)->DeserializeEngine(*bytes);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->view_layers(), 5u);
  auto ctx = (*loaded)->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  std::vector<float> x = RandomX(5, 11), y;
  ASSERT_TRUE(RunViews(**ctx, x, y).ok());
  EXPECT_EQ(y, ViewReference(x));
  EXPECT_EQ((*ctx)->kernel_launches(), 7);
}

TEST(ViewAlias, AnEngineWhoseViewOverlapsOtherBytesIsRejected) {
  // A hand-made plan that claims a view (same offsets) whose output is larger than its input's
  // buffer at the max shapes cannot come from the planner; the runtime refuses it.
  auto g = std::make_unique<Graph>();
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {4, 16});
  Value* a = Node1(*g, "Relu", "a", {x});
  Value* r = Node1(*g, "Reshape", "r", {a, Ints(*g, "shape", {64})});
  g->MarkOutput(Node1(*g, "Relu", "y", {r}));
  auto e = testing::AssembleTestEngine(std::move(g), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ((*e)->plan.offsets.at("r"), (*e)->plan.offsets.at("a"));
  // Give r twice a's elements in the engine only (512 bytes on a's 256), in an arena that has
  // room for them, so that only the view check can object.
  const_cast<Value*>((*e)->graph->FindValue("r"))->set_shape({128});
  (*e)->plan.arena_bytes = 4096;
  (*e)->plan.peak_bytes = (*e)->plan.weights_bytes + 4096 + (*e)->plan.workspace_bytes;
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(*e)));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), ErrorCode::kEngineMalformed) << engine.status().ToString();
  EXPECT_NE(engine.status().message().find("view layer 'n_r'"), std::string::npos)
      << engine.status().message();
}

// The builder marks aliased views in the engine and its report: tactic "<dtype>-<op>-view",
// time 0. Passes off, so the chain stays as written.
TEST(ViewAlias, BuilderMarksAliasedViews) {
  BuilderConfig config;
  config.optimize = false;
  config.profile = ViewProfile();
  BuildReport report;
  auto built = BuildEngine({MakeViewGraph(), "views", {}}, config, &report);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  std::map<std::string, std::string> tactic_of;
  for (const LayerDesc& l : (*built)->layers) {
    tactic_of[l.node->name()] = l.tactic.name;
    if (l.tactic.name.ends_with("-view")) EXPECT_EQ(l.measured_ms, 0) << l.node->name();
  }
  EXPECT_EQ(tactic_of["n_r1"], "f32-reshape-view");
  EXPECT_EQ(tactic_of["n_r2"], "f32-unsqueeze-view");
  EXPECT_EQ(tactic_of["n_s"], "f32-squeeze-view");
  EXPECT_EQ(tactic_of["n_c4"], "f32-reshape-view");
  EXPECT_EQ(tactic_of["n_f"], "f32-flatten-view");
  for (const char* copy : {"n_xi", "n_wv", "n_y"}) {
    EXPECT_FALSE(tactic_of[copy].ends_with("-view")) << copy << ": " << tactic_of[copy];
  }
  int views_in_report = 0;
  for (const LayerReport& l : report.layer_reports) {
    if (l.tactic.ends_with("-view")) {
      ++views_in_report;
      EXPECT_EQ(l.time_ms, 0) << l.name;
    }
  }
  EXPECT_EQ(views_in_report, 5);

  auto engine = MakeEngine(std::shared_ptr<const EngineDesc>(std::move(*built)));
  ASSERT_TRUE(engine);
  EXPECT_EQ(engine->view_layers(), 5u);
  for (size_t l = 0; l < engine->desc().layers.size(); ++l) {
    EXPECT_EQ(engine->is_view_layer(l), engine->desc().layers[l].tactic.name.ends_with("-view"));
  }
  auto ctx = engine->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok());
  std::vector<float> x = RandomX(8, 3), y;
  ASSERT_TRUE(RunViews(**ctx, x, y).ok());
  EXPECT_EQ(y, ViewReference(x));
}

// The zoo's transformers: their FP32 CPU engines alias views, and give bit-identical outputs to
// the same engine with every view copying (zoo conformance checks them against the references).
std::filesystem::path ZooDir() {
  const char* dir = std::getenv("KILN_SOURCE_DIR");
  return std::filesystem::path(dir ? dir : ".") / "zoo";
}

class ZooViews : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooViews, AliasedEngineMatchesTheCopyingOne) {
  std::filesystem::path dir = ZooDir() / GetParam();
  if (!std::filesystem::exists(dir / "model.onnx")) GTEST_SKIP() << "no " << dir;
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  std::map<std::string, Tensor> feed;
  BuilderConfig config;
  config.search_tactics = false;  // the heuristic's tactics: this test is about the plan
  for (size_t i = 0; i < (*graph)->inputs().size(); ++i) {
    const Value* in = (*graph)->inputs()[i];
    auto t = LoadTensorProto((dir / "test_data_set_0" / fmt::format("input_{}.pb", i)).string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    if (!IsStatic(in->shape())) {
      // Dynamic dims from 1 up to the data's: fixed dims would fold the exporters' shape
      // subgraphs and, with them, most views (the builder specializes min == max dims).
      std::vector<int64_t> min = t->dims();
      for (size_t d = 0; d < min.size(); ++d) {
        if (!in->shape()[d].is_static()) min[d] = 1;
      }
      config.profile.inputs.push_back({in->name(), min, t->dims(), t->dims()});
    }
    feed[in->name()] = std::move(*t);
  }
  std::map<std::string, Tensor> outputs[2];
  int64_t launches[2] = {0, 0};
  int64_t arena[2] = {0, 0};
  size_t views = 0, layers = 0;
  for (int alias = 0; alias < 2; ++alias) {
    auto built = app::BuildFromOnnxFile((dir / "model.onnx").string(), config);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    if (!alias) {
      auto plan = PlanMemory(*built->desc, /*alias_views=*/false);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      built->desc->plan = *plan;
    }
    auto engine = MakeEngine(std::shared_ptr<const EngineDesc>(std::move(built->desc)));
    ASSERT_TRUE(engine);
    if (alias) views = engine->view_layers();
    layers = engine->desc().layers.size();
    arena[alias] = engine->desc().plan.arena_bytes;
    auto runner = app::HostRunner::Create(engine);
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    ASSERT_TRUE((*runner)->SetInputs(feed).ok());
    ASSERT_TRUE((*runner)->Run().ok());
    outputs[alias] = (*runner)->outputs();
    launches[alias] = (*runner)->context().kernel_launches();
  }
  std::cout << "[ info ] " << GetParam() << ": " << views << " of " << layers
            << " layers are aliased views; activations " << arena[0] << " -> " << arena[1]
            << " bytes\n";
  EXPECT_GT(views, 0u) << GetParam() << " has no aliased view layer";
  EXPECT_LE(arena[1], arena[0]);
  EXPECT_EQ(launches[0] - launches[1], static_cast<int64_t>(views));
  ASSERT_EQ(outputs[0].size(), outputs[1].size());
  for (const auto& [name, t] : outputs[0]) {
    EXPECT_EQ(outputs[1].at(name).ToFloatVector(), t.ToFloatVector()) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooViews, ::testing::Values("bert_tiny", "gpt_tiny", "vit_tiny"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
