// A miniature builder for tests: shape inference, provider choice, memory plan.
#include "tests/engine/test_engines.h"

#include <algorithm>

#include "kiln/backends/kernel.h"
#include "kiln/engine/engine_plan.h"
#include "kiln/ops/op_schema.h"
#include "kiln/plan/memory_plan.h"

namespace kiln::testing {

int TestKernelsAnchor();

namespace {
OperandDesc Describe(const Value* v, const std::map<std::string, int64_t>& max_bindings) {
  OperandDesc d;
  if (!v) return d;
  d.dtype = v->dtype();
  d.shape = v->shape();
  if (auto dims = ConcreteDims(*v, max_bindings); dims.ok()) d.max_dims = *dims;
  d.constant = v->constant();
  return d;
}
}  // namespace

StatusOr<std::unique_ptr<EngineDesc>> AssembleTestEngine(std::unique_ptr<Graph> graph,
                                                         OptimizationProfile profile,
                                                         bool prefer_test_providers) {
  (void)TestKernelsAnchor();
  KILN_RETURN_IF_ERROR(InferShapes(*graph));
  KILN_ASSIGN_OR_RETURN(auto bindings, MaxShapeBindings(*graph, profile));
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph->TopologicalOrder());
  auto engine = std::make_unique<EngineDesc>();
  for (const Node* node : order) {
    KernelRequest request;
    request.node = node;
    for (const Value* v : node->inputs()) request.inputs.push_back(Describe(v, bindings));
    for (const Value* v : node->outputs()) request.outputs.push_back(Describe(v, bindings));
    LayerDesc layer;
    layer.node = node;
    // Test providers first: tests must not change when real kernels for the same ops land.
    auto providers = KernelRegistry::Get().Providers(BackendKind::kCpu, node->op_type());
    std::stable_partition(providers.begin(), providers.end(), [&](const KernelProvider* p) {
      return p->id().starts_with("test.") == prefer_test_providers;
    });
    for (const KernelProvider* p : providers) {
      auto tactics = p->Tactics(request);
      if (tactics.empty()) continue;
      layer.provider_id = std::string(p->id());
      layer.tactic = tactics[0];
      layer.precision_reason = "fp32: test engine";
      break;
    }
    if (layer.provider_id.empty()) {
      return MakeError(ErrorCode::kNoTactic, "no CPU provider for node '{}' ({})", node->name(),
                       node->op_type());
    }
    engine->layers.push_back(std::move(layer));
  }
  engine->header.backend = BackendKind::kCpu;
  engine->header.device_arch = "x86_64";
  engine->header.library_versions = "cpu";
  engine->header.model_hash = "00112233445566778899aabbccddeeff";
  engine->header.config_hash = "ffeeddccbbaa99887766554433221100";
  engine->header.model_name = graph->name();
  engine->profile = std::move(profile);
  engine->graph = std::move(graph);
  KILN_ASSIGN_OR_RETURN(engine->plan, PlanMemory(*engine));
  engine->build_report_json = R"({"layers":)" + std::to_string(engine->layers.size()) + "}";
  return engine;
}

std::unique_ptr<Graph> MakeChainGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("chain");
  g->set_opset(17);
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("batch"), 4});
  Value* w = g->AddConstant(
      "w", Tensor::FromVector<float>(DataType::kFloat32, {4}, {-1.f, 0.5f, 2.f, -3.f}));
  Value* a = g->AddValue("a");
  Value* b = g->AddValue("b");
  Value* y = g->AddValue("y");
  AttributeMap attrs;
  attrs.Set("i", int64_t{-7});
  attrs.Set("f", 0.25f);
  attrs.Set("s", std::string("text"));
  attrs.Set("ints", std::vector<int64_t>{1, -2, 3});
  attrs.Set("floats", std::vector<float>{1.5f, -2.5f});
  attrs.Set("strings", std::vector<std::string>{"p", "", "q"});
  attrs.Set("t", Tensor::FromVector<int64_t>(DataType::kInt64, {2}, {42, -42}));
  g->AddNode("Relu", "relu1", {x}, {a}, std::move(attrs));
  g->AddNode("Add", "add", {a, w}, {b});
  g->AddNode("Relu", "relu2", {b}, {y});
  g->MarkOutput(y);
  return g;
}

OptimizationProfile ChainProfile() {
  OptimizationProfile p;
  p.inputs.push_back({"x", {1, 4}, {2, 4}, {8, 4}});
  return p;
}

std::unique_ptr<Graph> MakeDiamondGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("diamond");
  Value* x = g->AddInput("x", DataType::kFloat32, {2, 3});
  Value* a = g->AddValue("a");
  Value* b = g->AddValue("b");
  Value* c = g->AddValue("c");
  Value* d = g->AddValue("d");
  g->AddNode("Relu", "relu_a", {x}, {a});
  g->AddNode("Add", "add_b", {a, x}, {b});
  g->AddNode("Add", "add_c", {a, b}, {c});
  g->AddNode("Relu", "relu_d", {c}, {d});
  g->MarkOutput(d);
  g->MarkOutput(b);
  return g;
}

std::unique_ptr<Graph> MakeWorkspaceGraph() {
  auto g = std::make_unique<Graph>();
  g->set_name("workspace");
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 8});
  Value* a = g->AddValue("a");
  Value* y = g->AddValue("y");
  g->AddNode("Identity", "copy", {x}, {a});
  g->AddNode("Relu", "relu", {a}, {y});
  g->MarkOutput(y);
  return g;
}

OptimizationProfile WorkspaceProfile() {
  OptimizationProfile p;
  p.inputs.push_back({"x", {1, 8}, {4, 8}, {16, 8}});
  return p;
}

}  // namespace kiln::testing
