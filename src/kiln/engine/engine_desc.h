// The in-memory form of an engine: what the builder assembles, what a .kiln file stores and what
// the runtime executes. Serialization (engine_file.h) turns it into bytes and back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/weight_program.h"
#include "kiln/plan/memory_plan.h"
#include "kiln/plan/profile.h"

namespace kiln {

// One executable layer: a node of the (optimized) graph with its chosen implementation.
struct LayerDesc {
  const Node* node = nullptr;    // in EngineDesc::graph
  std::string provider_id;       // KernelProvider::id(), e.g. "cpu.conv.im2col"
  TacticConfig tactic;           // name, params, workspace estimate
  double measured_ms = -1;       // timing at build (-1: heuristic choice, not timed)
  std::string precision_reason;  // why this layer runs in its precision (report)
};

struct EngineHeader {
  uint32_t format_version = 2;  // kEngineFormatVersion (engine_file.h), the one written
  std::string kiln_version;
  BackendKind backend = BackendKind::kCpu;
  std::string device_arch;  // "x86_64", "sm_90"
  std::string library_versions;
  std::string model_hash;   // hex of the ONNX bytes' hash
  std::string config_hash;  // hex of the build config's hash
  std::string model_name;
  // The weights the program makes are absent (StripWeights, engine_file.h): the engine describes
  // layers, tactics, plan and program only, and runs after a refit fills it.
  bool weights_stripped = false;
};

struct EngineDesc {
  EngineHeader header;
  std::unique_ptr<Graph> graph;   // optimized graph; constants hold the weights
  std::vector<LayerDesc> layers;  // execution order (topological)
  OptimizationProfile profile;    // one profile for now
  MemoryPlan plan;
  std::string build_report_json;  // the build report, for `kiln inspect`
  // How each constant was made from the model's initializers: what refit replays.
  WeightProgram weight_program;
};

}  // namespace kiln
