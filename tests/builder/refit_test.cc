// Issue 20, "Done means": for every zoo model on the CPU backend, FP32, FP16 and INT8, an engine
// built with weights A and refit to weights B is the engine a fresh build with weights B makes
// (byte for byte: same tactics, same plan, same constants) and runs to the same outputs; wrong
// weights give a catalog error naming the first mismatch and leave the engine unchanged.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "kiln/app/live_refit.h"
#include "kiln/app/pipeline.h"
#include "kiln/builder/refit.h"
#include "kiln/core/file_io.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/quant_edge.h"
#include "kiln/precision/precision.h"
#include "scoped_env.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

fs::path ZooRoot() {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  return fs::path(root ? root : ".") / "zoo";
}

// The committed zoo (zoo/*/model.onnx), spelled out because the parameters are made before the
// environment names the source tree; ZooListIsComplete keeps the list honest.
const std::vector<std::string>& ZooModels() {
  static const std::vector<std::string> names = {
      "bert_tiny",   "efficientnet_tiny", "gpt_tiny",  "mobilenetv3_tiny",
      "resnet_tiny", "squeezenet_tiny",   "unet_tiny", "vit_tiny"};
  return names;
}

TEST(RefitZooList, ZooListIsComplete) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(ZooRoot())) {
    if (fs::exists(e.path() / "model.onnx")) found.push_back(e.path().filename().string());
  }
  std::sort(found.begin(), found.end());
  EXPECT_EQ(found, ZooModels());
}

OptimizationProfile ZooProfile(const fs::path& dir) {
  std::ifstream in(dir / "info.json");
  nlohmann::json info = nlohmann::json::parse(in);
  OptimizationProfile profile;
  if (!info.contains("profile")) return profile;
  for (const auto& [name, p] : info["profile"].items()) {
    profile.inputs.push_back({name, p["min"].get<std::vector<int64_t>>(),
                              p["opt"].get<std::vector<int64_t>>(),
                              p["max"].get<std::vector<int64_t>>()});
  }
  return profile;
}

std::map<std::string, Tensor> Initializers(const Graph& graph) {
  std::map<std::string, Tensor> out;
  for (InitializerInfo& i : CollectInitializers(graph)) out.emplace(i.name, std::move(i.value));
  return out;
}

// Weights B: every f32 initializer of more than one element scaled by U(0.8, 1.2) and moved by
// U(0, 0.02) per element (signs and positivity, a BatchNorm variance's, are kept); scalars are
// the model's constants (epsilons, GELU's factors) and stay.
std::map<std::string, Tensor> Perturbed(const std::map<std::string, Tensor>& a, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.8f, 1.2f), shift(0.f, 0.02f);
  std::map<std::string, Tensor> b;
  for (const auto& [name, t] : a) {
    if (t.dtype() != DataType::kFloat32 || t.num_elements() < 2) {
      b.emplace(name, t);
      continue;
    }
    Tensor p = Tensor::FromBytes(t.dtype(), t.dims(), t.bytes());
    float* d = p.mutable_data<float>();
    for (int64_t i = 0; i < p.num_elements(); ++i) d[i] = d[i] * scale(rng) + shift(rng);
    b.emplace(name, std::move(p));
  }
  return b;
}

// The model with its initializers replaced (what importing an ONNX file of weights B gives).
std::unique_ptr<Graph> ImportWith(const fs::path& model, const std::map<std::string, Tensor>& w) {
  auto graph = ImportOnnxFile(model.string());
  EXPECT_TRUE(graph.ok()) << graph.status().ToString();
  for (const auto& [name, t] : w) {
    Value* v = (*graph)->FindValue(name);
    v->set_constant(t);
    v->set_provenance(InitializerExpr(name, t));
  }
  return std::move(*graph);
}

enum class Precision { kFp32, kFp16, kInt8 };
const char* Name(Precision p) {
  return p == Precision::kFp32 ? "fp32" : p == Precision::kFp16 ? "fp16" : "int8";
}

BuilderConfig Config(const fs::path& dir, Precision p, const fs::path& calib_cache) {
  BuilderConfig config;
  config.backend = BackendKind::kCpu;
  config.profile = ZooProfile(dir);
  config.opt_level = 0;  // the heuristic tactic: builds A and B choose alike
  config.fp16 = p != Precision::kFp32;
  if (p == Precision::kInt8) {
    config.int8 = true;
    config.calibration_dir = dir.string();
    // The calibration (activation scales) of weights A is reused for B through the cache, as a
    // refit keeps the stored scales; the sensitivity fallback, which weighs the weights, is off.
    config.calibration_cache_path = calib_cache.string();
    config.int8_tolerance = std::numeric_limits<double>::infinity();
  }
  return config;
}

std::unique_ptr<EngineDesc> Build(std::unique_ptr<Graph> graph, const BuilderConfig& config) {
  BuildReport report;
  auto built = BuildEngine({std::move(graph), "model", HashString("model")}, config, &report);
  EXPECT_TRUE(built.ok()) << built.status().ToString();
  return built.ok() ? std::move(*built) : nullptr;
}

std::vector<std::byte> Bytes(const EngineDesc& e) {
  auto bytes = SerializeEngine(e);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<std::byte>();
}

std::map<std::string, Tensor> RunZooInput(std::shared_ptr<const EngineDesc> desc,
                                          const fs::path& dir) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok());
  auto engine = (*runtime)->CreateEngine(std::move(desc));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  std::map<std::string, Tensor> inputs;
  for (int i = 0;; ++i) {
    fs::path p = dir / "test_data_set_0" / fmt::format("input_{}.pb", i);
    if (!fs::exists(p)) break;
    std::string name;
    auto t = LoadTensorProto(p.string(), &name);
    EXPECT_TRUE(t.ok());
    inputs.emplace(name, std::move(*t));
  }
  auto runner = app::HostRunner::Create(*engine);
  EXPECT_TRUE(runner.ok());
  EXPECT_TRUE((*runner)->SetInputs(inputs).ok());
  Status s = (*runner)->Run();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return (*runner)->outputs();
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.raw(), b.raw(), a.size_bytes()) == 0;
}

class RefitZoo : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(RefitZoo, RefitToBIsAFreshBuildWithB) {
  const auto& [model, precision] = GetParam();
  const fs::path dir = ZooRoot() / model;
  const fs::path tmp = fs::temp_directory_path() /
                       fmt::format("kiln_refit_{}_{}_{}", model, Name(precision), ::getpid());
  fs::create_directories(tmp);
  const BuilderConfig config = Config(dir, precision, tmp / "calib.cache");

  auto a_graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(a_graph.ok());
  const std::map<std::string, Tensor> weights_a = Initializers(**a_graph);
  const std::map<std::string, Tensor> weights_b = Perturbed(weights_a, 20);

  std::unique_ptr<EngineDesc> a = Build(std::move(*a_graph), config);
  std::unique_ptr<EngineDesc> b = Build(ImportWith(dir / "model.onnx", weights_b), config);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->weight_program.recorded);
  EXPECT_TRUE(a->weight_program.non_refittable.empty())
      << a->weight_program.non_refittable.front().constant << ": "
      << a->weight_program.non_refittable.front().reason;
  EXPECT_FALSE(a->weight_program.targets.empty());
  const std::vector<std::byte> a_bytes = Bytes(*a);
  const std::vector<std::byte> b_bytes = Bytes(*b);
  ASSERT_NE(a_bytes, b_bytes) << "weights B changed nothing";
  if (precision == Precision::kInt8) {
    int int8_layers = 0;
    for (const LayerDesc& l : a->layers) int8_layers += l.tactic.name.rfind("i8-", 0) == 0;
    EXPECT_GT(int8_layers, 0) << "no INT8 layer: the INT8 case would test FP16 again";
  }

  // Through the file, as `kiln refit` does: the program survives serialization.
  const fs::path a_path = tmp / "a.kiln";
  ASSERT_TRUE(WriteEngineFile(*a, a_path.string()).ok());
  auto loaded = LoadEngineFileForEdit(a_path.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  RefitReport report;
  Status s = RefitEngine(**loaded, weights_b, HashString("model"), &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(report.constants_refit, static_cast<int64_t>(a->weight_program.targets.size()));
  EXPECT_GT(report.bytes_refit, 0);

  // Same layers and tactics as A (refit never touches them), and the very engine B's build made.
  ASSERT_EQ((*loaded)->layers.size(), a->layers.size());
  for (size_t i = 0; i < a->layers.size(); ++i) {
    EXPECT_EQ((*loaded)->layers[i].provider_id, a->layers[i].provider_id);
    EXPECT_EQ((*loaded)->layers[i].tactic.name, a->layers[i].tactic.name);
    EXPECT_EQ((*loaded)->layers[i].tactic.name, b->layers[i].tactic.name);
  }
  EXPECT_TRUE(Bytes(**loaded) == b_bytes) << "the refit engine differs from a fresh build with B";

  // And it runs to B's outputs, bit for bit, which are not A's.
  std::shared_ptr<const EngineDesc> refit = std::move(*loaded);
  auto out_refit = RunZooInput(refit, dir);
  auto out_b = RunZooInput(std::shared_ptr<const EngineDesc>(std::move(b)), dir);
  auto out_a = RunZooInput(std::shared_ptr<const EngineDesc>(std::move(a)), dir);
  ASSERT_FALSE(out_b.empty());
  bool any_differs_from_a = false;
  for (const auto& [name, t] : out_b) {
    ASSERT_TRUE(out_refit.count(name));
    EXPECT_TRUE(SameBytes(out_refit.at(name), t)) << "output " << name;
    any_differs_from_a |= !SameBytes(out_a.at(name), t);
  }
  EXPECT_TRUE(any_differs_from_a);
  fs::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, RefitZoo,
    ::testing::Combine(::testing::ValuesIn(ZooModels()),
                       ::testing::Values(Precision::kFp32, Precision::kFp16, Precision::kInt8)),
    [](const auto& info) { return std::get<0>(info.param) + "_" + Name(std::get<1>(info.param)); });

// ---- INT8 recalibration: refit to B, then the scales calibrated again on B with the same data,
// is a fresh INT8 build of B (its own calibration, no cache), byte for byte.

// Weight-stripped engines (issue 20): `kiln build --strip-weights` then `kiln refit E --weights M`
// gives the engine `kiln build M` writes, byte for byte; the stripped engine refuses to run.
class StripZoo : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(StripZoo, AStrippedEngineFilledWithItsModelIsTheFullBuild) {
  const auto& [model, precision] = GetParam();
  const fs::path dir = ZooRoot() / model;
  const fs::path tmp = fs::temp_directory_path() /
                       fmt::format("kiln_strip_{}_{}_{}", model, Name(precision), ::getpid());
  fs::create_directories(tmp);
  const BuilderConfig config = Config(dir, precision, tmp / "calib.cache");
  const fs::path onnx = dir / "model.onnx";

  // As `kiln build` does (the model hash is the file's), then stripped as --strip-weights does.
  auto built = app::BuildFromOnnxFile(onnx.string(), config);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EngineDesc& e = *built->desc;
  const std::vector<std::byte> full = Bytes(e);
  int64_t constants = 0;
  for (const Value* v : e.graph->values()) constants += v->is_constant() ? 1 : 0;
  ASSERT_TRUE(StripWeights(e).ok());
  const std::vector<std::byte> stripped = Bytes(e);
  ASSERT_FALSE(stripped.empty());
  EXPECT_LT(stripped.size(), full.size());
  const fs::path stripped_path = tmp / "stripped.kiln", full_path = tmp / "full.kiln";
  ASSERT_TRUE(WriteEngineFile(e, stripped_path.string()).ok());

  // It loads and verifies; exactly the program's targets are absent, every other constant (the
  // literals) is there with its bytes.
  auto loaded = LoadEngineFile(stripped_path.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE((*loaded)->header.weights_stripped);
  const size_t absent = AbsentConstants(**loaded).size();
  EXPECT_EQ(absent, e.weight_program.targets.size());
  EXPECT_GT(absent, 0u);
  int64_t present = 0;
  for (const Value* v : (*loaded)->graph->values()) {
    if (v->is_constant() && v->constant()->raw()) ++present;
  }
  EXPECT_EQ(present + static_cast<int64_t>(absent), constants);

  // The runtime refuses it with the catalog code and says what to do.
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok());
  auto refused = (*runtime)->LoadEngine(stripped_path.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kEngineWeightsStripped);
  EXPECT_NE(refused.status().message().find("kiln refit"), std::string::npos);

  // `kiln refit stripped.kiln --weights model.onnx -o full.kiln`: the full build's bytes.
  RefitReport report;
  Status s = RefitEngineFile(stripped_path.string(), onnx.string(), full_path.string(), &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(report.filled_stripped);
  EXPECT_EQ(report.constants_refit, static_cast<int64_t>(absent));
  auto written = ReadInputFile(full_path.string(), "engine", uint64_t{1} << 30);
  ASSERT_TRUE(written.ok());
  ASSERT_EQ(written->size(), full.size());
  EXPECT_TRUE(std::memcmp(written->data(), full.data(), full.size()) == 0)
      << "the filled engine differs from the full build";
  auto again = ReadInputFile(stripped_path.string(), "engine", uint64_t{1} << 30);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->size() == stripped.size() &&
              std::memcmp(again->data(), stripped.data(), stripped.size()) == 0)
      << "kiln refit -o changed its input";

  // And it runs to the full engine's outputs, bit for bit.
  auto filled = LoadEngineFile(full_path.string());
  auto original = LoadEngineBytes(full);
  ASSERT_TRUE(filled.ok() && original.ok());
  auto out_filled = RunZooInput(*filled, dir);
  auto out_full = RunZooInput(*original, dir);
  ASSERT_FALSE(out_full.empty());
  for (const auto& [name, t] : out_full) {
    ASSERT_TRUE(out_filled.count(name));
    EXPECT_TRUE(SameBytes(out_filled.at(name), t)) << "output " << name;
  }
  fs::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, StripZoo,
    ::testing::Combine(::testing::ValuesIn(ZooModels()),
                       ::testing::Values(Precision::kFp32, Precision::kFp16, Precision::kInt8)),
    [](const auto& info) { return std::get<0>(info.param) + "_" + Name(std::get<1>(info.param)); });

float InputAmax(const EngineDesc& e, const std::string& node) {
  return e.graph->FindNode(node)->attrs().GetFloat(std::string(precision::kInt8InputAmaxAttr), 0.f);
}

// A zoo model's INT8 engines with its own weights (A) and with perturbed ones (B), each build
// calibrating its own weights (no calibration cache).
struct Int8AAndB {
  BuilderConfig config;
  std::map<std::string, Tensor> weights_b;
  std::unique_ptr<EngineDesc> a, b;
};
Int8AAndB BuildInt8AAndB(const fs::path& dir) {
  Int8AAndB out;
  out.config = Config(dir, Precision::kInt8, "");
  out.config.calibration_cache_path.clear();
  auto a_graph = ImportOnnxFile((dir / "model.onnx").string());
  EXPECT_TRUE(a_graph.ok()) << a_graph.status().ToString();
  if (!a_graph.ok()) return out;
  out.weights_b = Perturbed(Initializers(**a_graph), 21);
  out.a = Build(std::move(*a_graph), out.config);
  out.b = Build(ImportWith(dir / "model.onnx", out.weights_b), out.config);
  return out;
}

class RecalibrateZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(RecalibrateZoo, RecalibratedRefitIsAFreshInt8BuildWithB) {
  const fs::path dir = ZooRoot() / GetParam();
  Int8AAndB builds = BuildInt8AAndB(dir);
  ASSERT_TRUE(builds.a && builds.b);
  const BuilderConfig& config = builds.config;
  const std::map<std::string, Tensor>& weights_b = builds.weights_b;
  std::unique_ptr<EngineDesc>& a = builds.a;
  std::unique_ptr<EngineDesc>& b = builds.b;
  std::vector<std::string> int8_layers;
  bool scales_differ = false;
  for (const LayerDesc& l : b->layers) {
    if (l.tactic.name.rfind("i8-", 0) != 0) continue;
    int8_layers.push_back(l.node->name());
    scales_differ |= InputAmax(*a, l.node->name()) != InputAmax(*b, l.node->name());
  }
  ASSERT_FALSE(int8_layers.empty());
  ASSERT_TRUE(scales_differ) << "B calibrates to A's scales: the test would prove nothing";
  const std::vector<std::byte> b_bytes = Bytes(*b);

  auto refit = LoadEngineBytesForEdit(Bytes(*a));
  ASSERT_TRUE(refit.ok()) << refit.status().ToString();
  RefitReport report;
  ASSERT_TRUE(RefitEngine(**refit, weights_b, HashString("model"), &report).ok());
  EXPECT_EQ(report.int8_scales, "stored");
  EXPECT_EQ(report.int8_layers, static_cast<int64_t>(int8_layers.size()));
  EXPECT_FALSE(Bytes(**refit) == b_bytes) << "A's stored scales should differ from B's";
  EXPECT_NE(report.ToText().find("stored activation scales"), std::string::npos);

  Status s = RecalibrateInt8(**refit, ImportWith(dir / "model.onnx", weights_b),
                             {dir.string(), config.calibration_method, 99.99}, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(report.int8_scales, "recalibrated");
  EXPECT_NE(report.ToText().find("recalibrated: minmax"), std::string::npos) << report.ToText();
  for (const std::string& n : int8_layers) {
    EXPECT_EQ(InputAmax(**refit, n), InputAmax(*b, n)) << n;
  }
  // The same engine as B's fresh build: the same layers with the same tactics and precisions,
  // the same constants (weights, requantized weights and scales) byte for byte, and (below) the
  // same outputs byte for byte. Not the whole serialized engine: oneDNN may lay out one
  // primitive for equal inputs with another scratchpad from one build to the next (seen in
  // clean-clone CI runs and about 1 run in 10 here: one int8 convolution's workspace 46528 or
  // 54976 bytes), which changes the memory plan and the report, not what is computed.
  const EngineDesc& r = **refit;
  ASSERT_EQ(r.layers.size(), b->layers.size());
  for (size_t i = 0; i < b->layers.size(); ++i) {
    EXPECT_EQ(r.layers[i].node->name(), b->layers[i].node->name()) << i;
    EXPECT_EQ(r.layers[i].tactic.name, b->layers[i].tactic.name) << b->layers[i].node->name();
    EXPECT_EQ(r.layers[i].precision_reason, b->layers[i].precision_reason)
        << b->layers[i].node->name();
  }
  int constants = 0;
  for (const Value* v : b->graph->values()) {
    if (!v->is_constant()) continue;
    ++constants;
    const Value* rv = r.graph->FindValue(v->name());
    ASSERT_TRUE(rv && rv->is_constant()) << v->name();
    EXPECT_TRUE(SameBytes(*rv->constant(), *v->constant())) << v->name();
  }
  EXPECT_GT(constants, 0);
  auto out_refit = RunZooInput(std::shared_ptr<const EngineDesc>(std::move(*refit)), dir);
  auto out_b = RunZooInput(std::shared_ptr<const EngineDesc>(std::move(b)), dir);
  for (const auto& [name, t] : out_b) EXPECT_TRUE(SameBytes(out_refit.at(name), t)) << name;
}

using testing_env::ScopedEnv;

// An engine built with the stem rewrite (passes/stem_space_to_depth.cc, here forced by
// KILN_STEM_SPACE_TO_DEPTH=1) recalibrates on the graph it was built from even where the
// refit's environment would not make the rewrite: the engine says it was made (its stem weight
// came from the pass's weight op), and the result is B's fresh build.
TEST(Recalibrate, AStemRewrittenAtBuildIsRewrittenForItsCalibration) {
  const fs::path dir = ZooRoot() / "resnet_tiny";
  std::optional<Int8AAndB> builds;
  {
    ScopedEnv force("KILN_STEM_SPACE_TO_DEPTH", "1");
    builds.emplace(BuildInt8AAndB(dir));
  }
  ASSERT_TRUE(builds->a && builds->b);
  int stems = 0;
  for (const Node* n : builds->b->graph->nodes()) {
    stems += n->attrs().GetInts("kernel_shape", {}) == std::vector<int64_t>{4, 4};
  }
  ASSERT_EQ(stems, 1) << "the build did not rewrite resnet_tiny's stem: the test proves nothing";
  auto refit = LoadEngineBytesForEdit(Bytes(*builds->a));
  ASSERT_TRUE(refit.ok()) << refit.status().ToString();
  RefitReport report;
  ASSERT_TRUE(RefitEngine(**refit, builds->weights_b, HashString("model"), &report).ok());
  ScopedEnv refuse("KILN_STEM_SPACE_TO_DEPTH", "0");
  Status st = RecalibrateInt8(**refit, ImportWith(dir / "model.onnx", builds->weights_b),
                              {dir.string(), builds->config.calibration_method, 99.99}, &report);
  ASSERT_TRUE(st.ok()) << st.ToString();
  int int8_layers = 0;
  for (const LayerDesc& l : builds->b->layers) {
    if (l.tactic.name.rfind("i8-", 0) != 0) continue;
    ++int8_layers;
    EXPECT_EQ(InputAmax(**refit, l.node->name()), InputAmax(*builds->b, l.node->name()))
        << l.node->name();
  }
  EXPECT_GT(int8_layers, 0);
  auto out_refit = RunZooInput(std::shared_ptr<const EngineDesc>(std::move(*refit)), dir);
  auto out_b = RunZooInput(std::shared_ptr<const EngineDesc>(std::move(builds->b)), dir);
  for (const auto& [name, t] : out_b) EXPECT_TRUE(SameBytes(out_refit.at(name), t)) << name;
}

INSTANTIATE_TEST_SUITE_P(Zoo, RecalibrateZoo,
                         ::testing::Values("resnet_tiny", "bert_tiny", "mobilenetv3_tiny",
                                           "vit_tiny"),
                         [](const auto& info) { return std::string(info.param); });

// An engine with INT8 edges (the CUDA convolutions and products write int8 for their INT8
// consumer, quant_edges.h): recalibration gives the consumer a new scale, so the producer must
// write with it, and the layers keep their edge notes. The CPU build has no edges; the test marks
// one between two INT8 layers of A's engine as a CUDA build would (the engine is not run here:
// the kernels behind a real edge are cuda_quant_test.cc's).
// consumer_note: put in the consumer's reason before its edge note, as the sensitivity
// fallback's note would be; recalibration marks it as the build's and keeps the edge note after it.
void CheckRecalibratedEdge(const std::string& consumer_note) {
  const fs::path dir = ZooRoot() / "resnet_tiny";
  Int8AAndB builds = BuildInt8AAndB(dir);
  ASSERT_TRUE(builds.a && builds.b);
  const BuilderConfig& config = builds.config;
  const std::map<std::string, Tensor>& weights_b = builds.weights_b;
  const EngineDesc* b = builds.b.get();
  auto edit = LoadEngineBytesForEdit(Bytes(*builds.a));
  ASSERT_TRUE(edit.ok()) << edit.status().ToString();
  EngineDesc& e = **edit;
  const std::string amax(precision::kInt8InputAmaxAttr);
  LayerDesc* producer = nullptr;
  LayerDesc* consumer = nullptr;
  for (LayerDesc& c : e.layers) {
    const Value* x = c.node->num_inputs() > 0 ? c.node->input(0) : nullptr;
    if (!c.node->attrs().Has(amax) || !x || !x->producer()) continue;
    for (LayerDesc& p : e.layers) {
      if (p.node == x->producer() && p.node->attrs().Has(amax)) producer = &p;
    }
    if (producer) {
      consumer = &c;
      break;
    }
  }
  ASSERT_TRUE(producer && consumer) << "resnet_tiny has no INT8 layer reading another's output";
  const std::string p_name = producer->node->name(), c_name = consumer->node->name();
  const float old_scale = consumer->node->attrs().GetFloat(amax, 0.f) / 127.f;
  e.graph->FindNode(p_name)->mutable_attrs().Set(std::string(kInt8OutputScaleAttr), old_scale);
  e.graph->FindNode(c_name)->mutable_attrs().Set(std::string(kInt8InputEdgeAttr), int64_t{1});
  producer->precision_reason += fmt::format("; writes int8 for '{}'", c_name);
  consumer->precision_reason += consumer_note + fmt::format("; reads int8 from '{}'", p_name);

  RefitReport report;
  ASSERT_TRUE(RefitEngine(e, weights_b, HashString("model"), &report).ok());
  Status s = RecalibrateInt8(e, ImportWith(dir / "model.onnx", weights_b),
                             {dir.string(), config.calibration_method, 99.99}, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const float new_amax = e.graph->FindNode(c_name)->attrs().GetFloat(amax, 0.f);
  ASSERT_EQ(new_amax, InputAmax(*b, c_name));
  ASSERT_NE(new_amax / 127.f, old_scale)
      << "B calibrates the consumer to A's scale: proves nothing";
  EXPECT_EQ(e.graph->FindNode(p_name)->attrs().GetFloat(kInt8OutputScaleAttr, 0.f),
            new_amax / 127.f);
  auto reason_of = [](const EngineDesc& d, const std::string& name) {
    for (const LayerDesc& l : d.layers) {
      if (l.node->name() == name) return l.precision_reason;
    }
    return std::string("?");
  };
  EXPECT_EQ(reason_of(e, p_name),
            reason_of(*b, p_name) + fmt::format("; writes int8 for '{}'", c_name));
  const std::string as_built =
      consumer_note.empty() ? "" : "; int8 sensitivity fallback as built (not re-measured)";
  EXPECT_EQ(reason_of(e, c_name),
            reason_of(*b, c_name) + as_built + fmt::format("; reads int8 from '{}'", p_name));
}

TEST(Recalibrate, AnInt8EdgesProducerWritesWithItsConsumersNewScale) { CheckRecalibratedEdge(""); }

// The note before the edge note may hold "; " itself: it is replaced whole, the edge note kept.
TEST(Recalibrate, ASensitivityNoteBeforeAnEdgeNoteIsMarkedAsBuilt) {
  CheckRecalibratedEdge("; int8 sensitivity: 'a; b' ran fp16, rel L2 0.06 > 0.05");
}

TEST(Recalibrate, AnEngineWithoutInt8LayersHasNothingToRecalibrate) {
  const fs::path dir = ZooRoot() / "resnet_tiny";
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok());
  auto engine = Build(std::move(*graph), Config(dir, Precision::kFp16, ""));
  ASSERT_TRUE(engine);
  const std::vector<std::byte> before = Bytes(*engine);
  auto model = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(model.ok());
  RefitReport report;
  ASSERT_TRUE(RecalibrateInt8(*engine, std::move(*model), {dir.string()}, &report).ok());
  EXPECT_EQ(report.int8_layers, 0);
  EXPECT_EQ(report.int8_scales, "");
  EXPECT_TRUE(Bytes(*engine) == before);
}

TEST(Recalibrate, WithoutCalibrationDataItIsRefusedAndNothingChanges) {
  const fs::path dir = ZooRoot() / "resnet_tiny";
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok());
  BuilderConfig config = Config(dir, Precision::kInt8, "");
  config.calibration_cache_path.clear();
  auto engine = Build(std::move(*graph), config);
  ASSERT_TRUE(engine);
  const std::vector<std::byte> before = Bytes(*engine);
  auto model = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(model.ok());
  Status s = RecalibrateInt8(*engine, std::move(*model), {""});
  EXPECT_EQ(s.code(), ErrorCode::kCalibrationInputInvalid) << s.ToString();
  EXPECT_TRUE(Bytes(*engine) == before);
}

// ---- wrong weights: a catalog error naming the first mismatch; the engine is unchanged.

class RefitWrongWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ZooRoot() / "resnet_tiny";
    auto graph = ImportOnnxFile((dir_ / "model.onnx").string());
    ASSERT_TRUE(graph.ok());
    weights_ = Initializers(**graph);
    engine_ = Build(std::move(*graph), Config(dir_, Precision::kFp32, ""));
    ASSERT_TRUE(engine_);
    before_ = Bytes(*engine_);
  }

  // Refit with `w` fails with `code`, names `what`, and leaves the engine as it was.
  void ExpectRefused(const std::map<std::string, Tensor>& w, ErrorCode code,
                     const std::string& what) {
    Status s = RefitEngine(*engine_, w, HashString("other"));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
    EXPECT_TRUE(Bytes(*engine_) == before_) << "a refused refit changed the engine";
  }

  // A refittable f32 weight (a source of the engine's program) and its neighbour in the program.
  std::string FirstSource() const { return engine_->weight_program.sources.front().name; }

  fs::path dir_;
  std::map<std::string, Tensor> weights_;
  std::unique_ptr<EngineDesc> engine_;
  std::vector<std::byte> before_;
};

TEST_F(RefitWrongWeights, MissingInitializerIsNamed) {
  auto w = weights_;
  w.erase(FirstSource());
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "'");
}

TEST_F(RefitWrongWeights, ExtraInitializerIsNamed) {
  auto w = weights_;
  w.emplace("not_in_the_model", Tensor(DataType::kFloat32, {3}));
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'not_in_the_model'");
}

TEST_F(RefitWrongWeights, OtherShapeIsNamedWithBothShapes) {
  auto w = weights_;
  const Tensor& t = w.at(FirstSource());
  std::vector<int64_t> dims = t.dims();
  dims[0] += 1;
  w[FirstSource()] = Tensor(t.dtype(), dims);
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "' is f32[");
}

TEST_F(RefitWrongWeights, OtherDtypeIsNamed) {
  auto w = weights_;
  w[FirstSource()] = w.at(FirstSource()).CastTo(DataType::kFloat16);
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "' is f16[");
}

TEST_F(RefitWrongWeights, AnotherArchitectureIsRefused) {
  auto other = ReadOnnxWeights((ZooRoot() / "bert_tiny" / "model.onnx").string());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ExpectRefused(other->initializers, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "'");
}

TEST(RefitStructure, ChangedIndexInitializerIsRefused) {
  // bert_tiny's position_ids (int64) shape the engine: refit requires them unchanged.
  const fs::path dir = ZooRoot() / "bert_tiny";
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok());
  auto w = Initializers(**graph);
  std::unique_ptr<EngineDesc> engine = Build(std::move(*graph), Config(dir, Precision::kFp32, ""));
  ASSERT_TRUE(engine);
  const auto& fixed = engine->weight_program.fixed;
  auto it = std::find_if(fixed.begin(), fixed.end(),
                         [](const WeightProgram::Fixed& f) { return f.name == "position_ids"; });
  ASSERT_NE(it, fixed.end());
  const std::vector<std::byte> before = Bytes(*engine);
  Tensor& ids = w.at("position_ids");
  ids = Tensor::FromBytes(ids.dtype(), ids.dims(), ids.bytes());
  ids.mutable_data<int64_t>()[1] = 0;
  Status s = RefitEngine(*engine, w, HashString("other"));
  EXPECT_EQ(s.code(), ErrorCode::kRefitNotRefittable) << s.ToString();
  EXPECT_NE(s.message().find("'position_ids'"), std::string::npos) << s.ToString();
  EXPECT_TRUE(Bytes(*engine) == before);
}

TEST_F(RefitWrongWeights, SameWeightsGiveTheSameEngine) {
  ASSERT_TRUE(RefitEngine(*engine_, weights_, HashString("model")).ok());
  EXPECT_TRUE(Bytes(*engine_) == before_);
}

TEST_F(RefitWrongWeights, RefusedFileRefitLeavesTheFile) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("kiln_refit_file_{}", ::getpid());
  fs::create_directories(tmp);
  const fs::path path = tmp / "e.kiln";
  ASSERT_TRUE(WriteEngineFile(*engine_, path.string()).ok());
  auto read = [&] { return ReadInputFile(path.string(), "engine", uint64_t{1} << 30); };
  auto before = read();
  ASSERT_TRUE(before.ok());
  Status s = RefitEngineFile(path.string(), (ZooRoot() / "vit_tiny" / "model.onnx").string(),
                             path.string());
  EXPECT_EQ(s.code(), ErrorCode::kRefitWeightsMismatch) << s.ToString();
  auto after = read();
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*before == *after);
  // The model's own weights refit the file in place (replaced whole).
  s = RefitEngineFile(path.string(), (dir_ / "model.onnx").string(), path.string());
  EXPECT_TRUE(s.ok()) << s.ToString();
  fs::remove_all(tmp);
}

// The same wrong weights fill no stripped engine: the same codes and names, and the engine (in
// memory and on disk) stays stripped and unchanged.
class StripWrongWeights : public RefitWrongWeights {
 protected:
  void SetUp() override {
    RefitWrongWeights::SetUp();
    ASSERT_TRUE(StripWeights(*engine_).ok());
    before_ = Bytes(*engine_);
  }
};

TEST_F(StripWrongWeights, MissingInitializerIsNamed) {
  auto w = weights_;
  w.erase(FirstSource());
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "'");
  EXPECT_TRUE(engine_->header.weights_stripped);
}

TEST_F(StripWrongWeights, OtherShapeAndDtypeAreNamed) {
  auto w = weights_;
  const Tensor& t = w.at(FirstSource());
  std::vector<int64_t> dims = t.dims();
  dims[0] += 1;
  w[FirstSource()] = Tensor(t.dtype(), dims);
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "' is f32[");
  w = weights_;
  w[FirstSource()] = w.at(FirstSource()).CastTo(DataType::kFloat16);
  ExpectRefused(w, ErrorCode::kRefitWeightsMismatch, "'" + FirstSource() + "' is f16[");
}

TEST_F(StripWrongWeights, AnotherArchitectureLeavesTheFile) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("kiln_strip_file_{}", ::getpid());
  fs::create_directories(tmp);
  const fs::path path = tmp / "e.kiln";
  ASSERT_TRUE(WriteEngineFile(*engine_, path.string()).ok());
  auto read = [&] { return ReadInputFile(path.string(), "engine", uint64_t{1} << 30); };
  auto before = read();
  ASSERT_TRUE(before.ok());
  Status s = RefitEngineFile(path.string(), (ZooRoot() / "vit_tiny" / "model.onnx").string(),
                             path.string());
  EXPECT_EQ(s.code(), ErrorCode::kRefitWeightsMismatch) << s.ToString();
  auto after = read();
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*before == *after);
  // Its own model fills it in place: a full engine that runs.
  ASSERT_TRUE(RefitEngineFile(path.string(), (dir_ / "model.onnx").string(), path.string()).ok());
  auto full = LoadEngineFile(path.string());
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_FALSE((*full)->header.weights_stripped);
  EXPECT_FALSE(RunZooInput(*full, dir_).empty());
  fs::remove_all(tmp);
}

TEST_F(StripWrongWeights, FilledInMemoryWithOtherWeightsItIsTheirBuild) {
  // A stripped engine from a cache filled with weights B is the engine a build with B makes.
  const auto weights_b = Perturbed(weights_, 7);
  auto b = Build(ImportWith(dir_ / "model.onnx", weights_b), Config(dir_, Precision::kFp32, ""));
  ASSERT_TRUE(b);
  ASSERT_TRUE(RefitEngine(*engine_, weights_b, HashString("model")).ok());
  EXPECT_FALSE(engine_->header.weights_stripped);
  EXPECT_TRUE(Bytes(*engine_) == Bytes(*b));
}

TEST(RefitProgram, RefitNeedsNoDeviceOfTheEnginesBackend) {
  // A CUDA engine is refit on a host without a GPU: refit only reads, replays on the host and
  // writes. (Its layers here are CPU ones under a CUDA header; refit never looks at them.)
  const fs::path dir = ZooRoot() / "squeezenet_tiny";
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok());
  std::unique_ptr<EngineDesc> e = Build(std::move(*graph), Config(dir, Precision::kFp16, ""));
  ASSERT_TRUE(e);
  e->header.backend = BackendKind::kCuda;
  e->header.device_arch = "sm_90";
  const fs::path tmp = fs::temp_directory_path() / fmt::format("kiln_refit_cuda_{}", ::getpid());
  fs::create_directories(tmp);
  ASSERT_TRUE(WriteEngineFile(*e, (tmp / "e.kiln").string()).ok());
  const std::string before = *ReadInputFile((tmp / "e.kiln").string(), "engine", 1 << 30);
  RefitReport report;
  Status s = RefitEngineFile((tmp / "e.kiln").string(), (dir / "model.onnx").string(),
                             (tmp / "same.kiln").string(), &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(report.constants_refit, 0);
  LoadOptions any;
  any.check_providers = false;
  auto refit = LoadEngineFile((tmp / "same.kiln").string(), any);
  ASSERT_TRUE(refit.ok()) << refit.status().ToString();
  EXPECT_EQ((*refit)->header.backend, BackendKind::kCuda);
  EXPECT_EQ((*refit)->header.device_arch, "sm_90");
  // Its own weights again: the same engine but for the model hash, which is now the file's.
  auto loaded = LoadEngineFileForEdit((tmp / "e.kiln").string(), any);
  ASSERT_TRUE(loaded.ok());
  (*loaded)->header.model_hash = (*refit)->header.model_hash;
  EXPECT_TRUE(Bytes(**loaded) == Bytes(**refit));
  EXPECT_EQ(before, *ReadInputFile((tmp / "e.kiln").string(), "engine", 1 << 30));
  fs::remove_all(tmp);
}

TEST(WeightFreeKey, SameForOtherWeightsDifferentForOtherStructure) {
  auto hash_of = [](const fs::path& model, const std::map<std::string, Tensor>* weights) {
    std::unique_ptr<Graph> g =
        weights ? ImportWith(model, *weights) : std::move(*ImportOnnxFile(model.string()));
    return WeightFreeModelHash(*g);
  };
  const fs::path bert = ZooRoot() / "bert_tiny" / "model.onnx";
  auto a = Initializers(*ImportWith(bert, {}));
  auto b = Perturbed(a, 5);
  EXPECT_EQ(hash_of(bert, &a), hash_of(bert, &b));  // only float weights differ
  EXPECT_NE(hash_of(bert, nullptr), hash_of(ZooRoot() / "gpt_tiny" / "model.onnx", nullptr));
  auto ids = a;  // an index initializer shapes the engine: part of the key
  Tensor& t = ids.at("position_ids");
  t = Tensor::FromBytes(t.dtype(), t.dims(), t.bytes());
  t.mutable_data<int64_t>()[1] = 0;
  EXPECT_NE(hash_of(bert, &a), hash_of(bert, &ids));
}

// The loader checks the weight program section (engine_file.cc ReadWeightProgram): a crafted
// program is KILN-E4005 naming the entry, never an out-of-range read at refit.
class RefitProgramFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path dir = ZooRoot() / "resnet_tiny";
    auto graph = ImportOnnxFile((dir / "model.onnx").string());
    ASSERT_TRUE(graph.ok());
    engine_ = Build(std::move(*graph), Config(dir, Precision::kFp32, ""));
    ASSERT_TRUE(engine_ && !engine_->weight_program.steps.empty());
  }
  void ExpectMalformed(const std::string& where) {
    auto loaded = LoadEngineBytes(Bytes(*engine_));
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), ErrorCode::kEngineMalformed) << loaded.status().ToString();
    EXPECT_NE(loaded.status().message().find(where), std::string::npos)
        << loaded.status().ToString();
  }
  std::unique_ptr<EngineDesc> engine_;
};

TEST_F(RefitProgramFile, RoundTrips) {
  auto loaded = LoadEngineBytes(Bytes(*engine_));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const WeightProgram& p = (*loaded)->weight_program;
  EXPECT_TRUE(p.recorded);
  EXPECT_EQ(p.sources.size(), engine_->weight_program.sources.size());
  EXPECT_EQ(p.steps.size(), engine_->weight_program.steps.size());
  EXPECT_EQ(p.targets.size(), engine_->weight_program.targets.size());
  EXPECT_TRUE(Bytes(**loaded) == Bytes(*engine_));
}

TEST_F(RefitProgramFile, StepReadingALaterSlotIsMalformed) {
  engine_->weight_program.steps.front().inputs.front() = engine_->weight_program.num_slots();
  ExpectMalformed("weight_program.steps[0]");
}

TEST_F(RefitProgramFile, UnknownOnnxOpIsMalformed) {
  engine_->weight_program.steps.front().domain = "";
  engine_->weight_program.steps.front().op_type = "NoSuchOp";
  ExpectMalformed("weight_program.steps[0]");
}

TEST_F(RefitProgramFile, TargetSlotOutOfRangeIsMalformed) {
  engine_->weight_program.targets.front().slot = engine_->weight_program.num_slots();
  ExpectMalformed("weight_program.targets[0]");
}

TEST_F(RefitProgramFile, RepeatedSourceIsMalformed) {
  engine_->weight_program.sources.push_back(engine_->weight_program.sources.front());
  ExpectMalformed("weight_program.sources[");
}

TEST(RefitProgram, EngineWithoutProgramIsRefused) {
  EngineDesc e;
  e.graph = std::make_unique<Graph>();
  Status s = RefitEngine(e, {}, HashString("x"));
  EXPECT_EQ(s.code(), ErrorCode::kRefitNotRecorded) << s.ToString();
}

TEST(RefitProgram, NonRefittableConstantIsNamedWithItsReason) {
  EngineDesc e;
  e.graph = std::make_unique<Graph>();
  e.graph->AddConstant("w_made_by_hand", Tensor(DataType::kFloat32, {2}));  // no provenance
  e.weight_program = RecordWeightProgram(*e.graph, {});
  ASSERT_EQ(e.weight_program.non_refittable.size(), 1u);
  Status s = RefitEngine(e, {}, HashString("x"));
  EXPECT_EQ(s.code(), ErrorCode::kRefitNotRefittable) << s.ToString();
  EXPECT_NE(s.message().find("'w_made_by_hand'"), std::string::npos) << s.ToString();
}

// ---- a loaded engine refit between executions

class LiveRefit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ZooRoot() / "resnet_tiny";
    auto graph = ImportOnnxFile((dir_ / "model.onnx").string());
    ASSERT_TRUE(graph.ok());
    weights_a_ = Initializers(**graph);
    weights_b_ = Perturbed(weights_a_, 7);
    const BuilderConfig config = Config(dir_, Precision::kFp32, "");
    std::shared_ptr<const EngineDesc> a = Build(std::move(*graph), config);
    std::shared_ptr<const EngineDesc> b =
        Build(ImportWith(dir_ / "model.onnx", weights_b_), config);
    ASSERT_TRUE(a && b);
    out_a_ = RunZooInput(a, dir_);
    out_b_ = RunZooInput(b, dir_);
    ASSERT_FALSE(SameBytes(out_a_.begin()->second, out_b_.begin()->second));
    auto runtime = Runtime::Create(BackendKind::kCpu);
    ASSERT_TRUE(runtime.ok());
    auto engine = (*runtime)->CreateEngine(a);
    ASSERT_TRUE(engine.ok());
    engine_ = *engine;
    for (int i = 0;; ++i) {
      fs::path p = dir_ / "test_data_set_0" / fmt::format("input_{}.pb", i);
      if (!fs::exists(p)) break;
      std::string name;
      auto t = LoadTensorProto(p.string(), &name);
      ASSERT_TRUE(t.ok());
      inputs_.emplace(name, std::move(*t));
    }
  }

  std::unique_ptr<app::HostRunner> Runner() {
    auto runner = app::HostRunner::Create(engine_);
    EXPECT_TRUE(runner.ok());
    EXPECT_TRUE((*runner)->SetInputs(inputs_).ok());
    return std::move(*runner);
  }

  // The one output of resnet_tiny after a run.
  static const Tensor& Output(app::HostRunner& r) {
    Status s = r.Run();
    EXPECT_TRUE(s.ok()) << s.ToString();
    return r.outputs().begin()->second;
  }

  fs::path dir_;
  std::map<std::string, Tensor> weights_a_, weights_b_, inputs_;
  std::map<std::string, Tensor> out_a_, out_b_;
  std::shared_ptr<const Engine> engine_;
};

TEST_F(LiveRefit, ContextsSeeTheNewWeightsAtTheirNextRun) {
  auto before = Runner();  // created before the refit
  EXPECT_TRUE(SameBytes(Output(*before), out_a_.begin()->second));
  RefitReport report;
  auto generation = app::RefitLoadedEngine(*engine_, weights_b_, &report);
  ASSERT_TRUE(generation.ok()) << generation.status().ToString();
  EXPECT_EQ(*generation, 1u);
  EXPECT_EQ(engine_->weights_generation(), 1u);
  EXPECT_GT(report.constants_refit, 0);
  // The same context, at its next run, and a context created afterwards: B's outputs exactly.
  EXPECT_TRUE(SameBytes(Output(*before), out_b_.begin()->second));
  auto after = Runner();
  EXPECT_TRUE(SameBytes(Output(*after), out_b_.begin()->second));
  // And back to A.
  ASSERT_TRUE(app::RefitLoadedEngine(*engine_, weights_a_).ok());
  EXPECT_TRUE(SameBytes(Output(*before), out_a_.begin()->second));
  EXPECT_TRUE(SameBytes(Output(*after), out_a_.begin()->second));
}

TEST_F(LiveRefit, WrongWeightsChangeNothing) {
  auto runner = Runner();
  auto w = weights_b_;
  w.erase(w.begin());
  auto generation = app::RefitLoadedEngine(*engine_, w);
  EXPECT_EQ(generation.status().code(), ErrorCode::kRefitWeightsMismatch);
  EXPECT_EQ(engine_->weights_generation(), 0u);
  EXPECT_TRUE(SameBytes(Output(*runner), out_a_.begin()->second));
  // A constant of another shape handed to the runtime directly is refused as well.
  const std::string name = engine_->desc().weight_program.targets.front().constant;
  auto refused = engine_->RefitWeights({{name, Tensor(DataType::kFloat32, {1})}});
  EXPECT_EQ(refused.status().code(), ErrorCode::kRefitWeightsMismatch);
  EXPECT_TRUE(SameBytes(Output(*runner), out_a_.begin()->second));
}

TEST_F(LiveRefit, NoRunSeesHalfUpdatedWeights) {
  // One thread runs its context in a loop while this one refits A <-> B: every run gives exactly
  // A's or B's outputs, never a mix, and both are seen.
  auto runner = Runner();
  std::atomic<bool> stop{false};
  std::atomic<int> runs{0};
  int as = 0, bs = 0, other = 0;  // the worker's alone until it is joined
  std::thread worker([&] {
    while (!stop.load()) {
      const Tensor& out = Output(*runner);
      ++runs;
      if (SameBytes(out, out_a_.begin()->second)) {
        ++as;
      } else if (SameBytes(out, out_b_.begin()->second)) {
        ++bs;
      } else {
        ++other;
      }
    }
  });
  for (int i = 0; i < 20; ++i) {
    Status s = app::RefitLoadedEngine(*engine_, i % 2 == 0 ? weights_b_ : weights_a_).status();
    EXPECT_TRUE(s.ok()) << s.ToString();
    // Two more runs: the second starts after the refit, so each generation is run at least once.
    const int runs_then = runs.load();
    while (runs.load() < runs_then + 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  worker.join();
  EXPECT_EQ(other, 0);
  EXPECT_GT(as, 0);
  EXPECT_GT(bs, 0);
}

// ---- a QDQ model's INT8 layers (explicit quantization): the int8 weights and the float bias
// refit; the model's scales and zero points shaped the engine (they are the layer's attributes),
// so new weights that change one are refused, naming the layer and the initializer.

class RefitQdq : public ::testing::Test {
 protected:
  static Value* Init(Graph& g, const std::string& name, Tensor t) {
    Value* v = g.AddConstant(name, t);
    v->set_provenance(InitializerExpr(name, t));
    return v;
  }
  static Value* Op(Graph& g, const std::string& op, std::vector<Value*> in,
                   AttributeMap attrs = {}) {
    Value* out = g.AddValue(g.UniqueName(op + "_out"));
    g.AddNode(op, g.UniqueName(op), std::move(in), {out}, std::move(attrs));
    return out;
  }
  static Tensor Ints(std::vector<int64_t> dims, uint32_t seed) {
    Tensor t(DataType::kInt8, std::move(dims));
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> d(-127, 127);
    for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<int8_t>()[i] = d(rng);
    return t;
  }
  static Tensor Floats(std::vector<int64_t> dims, std::vector<float> v) {
    return Tensor::FromVector<float>(DataType::kFloat32, std::move(dims), std::move(v));
  }

  // x [2, 5, 16] -> Q/DQ (scale xs, zero point xz) -> MatMul with DQ(w [16, 8] int8, ws [8]) -> +b.
  static std::unique_ptr<Graph> Model(const std::map<std::string, Tensor>& w) {
    auto g = std::make_unique<Graph>();
    Value* x = g->AddInput("x", DataType::kFloat32, {Dim(2), Dim(5), Dim(16)});
    Value* xs = Init(*g, "xs", w.at("xs"));
    Value* xz = Init(*g, "xz", w.at("xz"));
    Value* xq = Op(*g, "DequantizeLinear", {Op(*g, "QuantizeLinear", {x, xs, xz}), xs, xz});
    AttributeMap axis;
    axis.Set("axis", int64_t{1});
    Value* wq =
        Op(*g, "DequantizeLinear",
           {Init(*g, "w", w.at("w")), Init(*g, "ws", w.at("ws")), Init(*g, "wz", w.at("wz"))},
           std::move(axis));
    Value* y = Op(*g, "Add", {Op(*g, "MatMul", {xq, wq}), Init(*g, "b", w.at("b"))});
    g->MarkOutput(y);
    return g;
  }

  void SetUp() override {
    std::vector<float> ws, b;
    for (int c = 0; c < 8; ++c) {
      ws.push_back(0.002f + 0.0005f * static_cast<float>(c));
      b.push_back(0.1f * static_cast<float>(c) - 0.3f);
    }
    weights_a_ = {
        {"xs", Floats({}, {0.015f})}, {"xz", Tensor(DataType::kInt8, {})},  {"w", Ints({16, 8}, 1)},
        {"ws", Floats({8}, ws)},      {"wz", Tensor(DataType::kInt8, {8})}, {"b", Floats({8}, b)}};
    config_.backend = BackendKind::kCpu;
    config_.opt_level = 0;
    engine_ = Build(Model(weights_a_), config_);
    ASSERT_TRUE(engine_);
    int int8_layers = 0;
    for (const LayerDesc& l : engine_->layers) int8_layers += l.tactic.name.rfind("i8-", 0) == 0;
    ASSERT_EQ(int8_layers, 1) << "the Q/DQ MatMul is not one INT8 layer";
    ASSERT_TRUE(engine_->weight_program.non_refittable.empty())
        << engine_->weight_program.non_refittable.front().constant << ": "
        << engine_->weight_program.non_refittable.front().reason;
    before_ = Bytes(*engine_);
  }

  std::map<std::string, Tensor> weights_a_;
  BuilderConfig config_;
  std::unique_ptr<EngineDesc> engine_;
  std::vector<std::byte> before_;
};

TEST_F(RefitQdq, NewIntegerWeightsAndBiasAreAFreshBuild) {
  auto w = weights_a_;
  w["w"] = Ints({16, 8}, 2);
  w["b"] = Floats({8}, {1, 2, 3, 4, 5, 6, 7, 8});
  std::unique_ptr<EngineDesc> b = Build(Model(w), config_);
  ASSERT_TRUE(b);
  const std::vector<std::byte> b_bytes = Bytes(*b);
  ASSERT_NE(before_, b_bytes);
  Status s = RefitEngine(*engine_, w, HashString("model"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Bytes(*engine_) == b_bytes) << "the refit engine differs from a fresh build with B";
}

TEST_F(RefitQdq, ChangedScalesAndZeroPointsAreRefusedAndNamed) {
  struct Case {
    std::string name;
    Tensor value;
    std::string says;
  };
  std::vector<float> ws(8, 0.004f);
  Tensor xz(DataType::kInt8, {});
  xz.mutable_data<int8_t>()[0] = 3;
  std::vector<Case> cases;
  // The activation's scale and zero point are read by the build (the weight program's fixed
  // initializers); the weight scales are a source of the dequantized weight and the layer's.
  cases.push_back({"xs", Floats({}, {0.02f}), "'xs'"});
  cases.push_back({"xz", std::move(xz), "'xz'"});
  cases.push_back({"ws", Floats({8}, ws), "weight scale from initializer 'ws'"});
  for (Case& c : cases) {
    auto w = weights_a_;
    w[c.name] = std::move(c.value);
    Status s = RefitEngine(*engine_, w, HashString("model"));
    EXPECT_EQ(s.code(), ErrorCode::kRefitNotRefittable) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.ToString();
    EXPECT_TRUE(Bytes(*engine_) == before_) << "a refused refit changed the engine";
  }
  // The sources survive the engine file, as `kiln refit` reads it.
  const fs::path path = fs::temp_directory_path() / fmt::format("kiln_refit_qdq_{}", ::getpid());
  ASSERT_TRUE(WriteEngineFile(*engine_, path.string()).ok());
  auto loaded = LoadEngineFileForEdit(path.string());
  fs::remove(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  auto w = weights_a_;
  w["ws"] = Floats({8}, ws);
  Status s = RefitEngine(**loaded, w, HashString("model"));
  EXPECT_EQ(s.code(), ErrorCode::kRefitNotRefittable) << s.ToString();
  EXPECT_NE(s.message().find("weight scale from initializer 'ws'"), std::string::npos)
      << s.ToString();
}

// A large elementwise step (an FP16 or BF16 cast of a weight bigger than the split threshold) is
// replayed over several threads in ranges; its bytes equal the whole step's, including the values
// that saturate (beyond FP16's range), the infinities that stay and the NaNs, placed at range
// boundaries and everywhere else.
TEST(RunWeightProgram, SplitElementwiseStepsGiveTheWholeStepsBytes) {
  std::mt19937 rng(12052026);
  std::normal_distribution<float> normal(0.f, 3.f);
  const int64_t rows = ((3 << 20) + 12345) / 5;  // 12 MB of f32: split into ranges
  const int64_t n = rows * 5;
  Tensor w(DataType::kFloat32, {rows, 5});
  float* f = w.mutable_data<float>();
  for (int64_t i = 0; i < n; ++i) f[i] = normal(rng);
  for (int64_t i = 0; i < n; i += 262141) f[i] = 7e4f;  // beyond FP16: saturates to 65504
  for (int64_t i = 1; i < n; i += 524287) f[i] = -INFINITY;
  for (int64_t i = 2; i < n; i += 1048573) f[i] = NAN;
  f[n - 1] = -9e4f;
  for (DataType to : {DataType::kFloat16, DataType::kBFloat16}) {
    WeightProgram program;
    program.recorded = true;
    program.sources.push_back({"w", DataType::kFloat32, w.dims()});
    WeightProgram::Step step;
    step.op_type = "SaturatingCast";
    step.domain = std::string(kWeightOpDomain);
    step.attrs.Set("to", static_cast<int64_t>(to));
    step.inputs = {0};
    program.steps.push_back(step);
    program.targets.push_back({"c", 1});
    WeightProgramStats stats;
    auto got = RunWeightProgram(program, {{"w", w}}, NodeEvaluator(), &stats);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(stats.split_steps, 1);
    EXPECT_EQ(stats.op_steps["SaturatingCast"], 1);
    EXPECT_GT(stats.op_seconds["SaturatingCast"], 0.0);
    const Tensor* in[] = {&w};
    auto whole = RunWeightStep("SaturatingCast", std::string(kWeightOpDomain), step.attrs, in, 1,
                               NodeEvaluator());
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    const Tensor& c = got->at("c");
    ASSERT_EQ(c.dtype(), to);
    ASSERT_EQ(c.dims(), w.dims());
    ASSERT_EQ(std::memcmp(c.raw(), (*whole)[0].raw(), c.size_bytes()), 0) << ToString(to);
    if (to == DataType::kFloat16) {
      const uint16_t* h = c.data<uint16_t>();
      EXPECT_EQ(h[0], 0x7bffu);      // 7e4 saturated to 65504
      EXPECT_EQ(h[n - 1], 0xfbffu);  // -9e4 to -65504
      EXPECT_EQ(h[1], 0xfc00u);      // -inf stays
      EXPECT_EQ(h[2] & 0x7c00u, 0x7c00u);
      EXPECT_NE(h[2] & 0x03ffu, 0u);  // NaN stays NaN
    }
  }
}

}  // namespace
}  // namespace kiln
