// The memory plan: where every intermediate activation lives in one arena, sized for the
// optimization profile's MAX shapes, with buffers whose lifetimes do not overlap sharing bytes.
// Graph inputs/outputs are bound by the caller and constants live in the weights section, so
// neither takes arena space. Layers run one after another, so one workspace region serves all.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"
#include "kiln/ir/graph.h"

namespace kiln {

// Every buffer and weight is placed on this boundary (vector loads, cache lines, mmap borrowing).
inline constexpr int64_t kPlanAlignment = 64;
inline int64_t AlignUp(int64_t n, int64_t a = kPlanAlignment) { return (n + a - 1) / a * a; }

// One layer as the planner sees it: the node it runs and its tactic's workspace estimate.
struct PlanLayer {
  const Node* node = nullptr;
  int64_t workspace_bytes = 0;
};

// One arena buffer: the value, its bytes at the max shapes (aligned), the first and last layer
// index (inclusive) during which it must stay intact, and its assigned offset.
struct PlannedBuffer {
  const Value* value = nullptr;
  int64_t bytes = 0;
  int first = 0;
  int last = 0;
  int64_t offset = 0;
};

struct MemoryPlanDetail {
  MemoryPlan plan;
  std::vector<PlannedBuffer> buffers;  // in placement order (largest first)
};

// symbol -> max value, from each dynamic graph input's profile: a dim that is a bare symbol
// ("batch") binds that symbol to the profile's max at that index. A symbol bound by several
// inputs takes the largest max (the plan must fit every one of them). KILN-E3001 names a dynamic
// input without a profile; KILN-E3000 a profile whose rank differs from its input's.
StatusOr<std::map<std::string, int64_t>> MaxShapeBindings(const Graph& graph,
                                                          const OptimizationProfile& profile);

// The concrete dims of `v` under `bindings`; KILN-E3001 names the value and the symbol left.
StatusOr<std::vector<int64_t>> ConcreteDims(const Value& v,
                                            const std::map<std::string, int64_t>& bindings);

// Bytes of `v` at `bindings`, rounded up to kPlanAlignment; errors name the value.
StatusOr<int64_t> PlannedBytes(const Value& v, const std::map<std::string, int64_t>& bindings);

// Sum of every constant's bytes, each aligned (the layout of an engine file's weights section).
int64_t WeightsBytes(const Graph& graph);

// Plans the arena for `layers` (execution order). Offsets: buffers sorted by size (largest
// first, ties by first use then name) and each placed in the smallest gap between already
// placed buffers whose lifetimes overlap its own (lowest offset on ties), else on top of them.
StatusOr<MemoryPlanDetail> PlanMemoryDetailed(const Graph& graph, std::span<const PlanLayer> layers,
                                              const OptimizationProfile& profile);
StatusOr<MemoryPlan> PlanMemory(const Graph& graph, std::span<const PlanLayer> layers,
                                const OptimizationProfile& profile);
// The same for an assembled engine (its layers' nodes and tactic workspaces).
StatusOr<MemoryPlan> PlanMemory(const EngineDesc& engine);

// The peak without any reuse (every buffer its own bytes), for the build report's comparison.
int64_t NaivePeak(const MemoryPlanDetail& detail);

// KILN-E3002 with the required and available bytes when plan.peak_bytes > budget_bytes.
Status CheckBudget(const MemoryPlan& plan, int64_t budget_bytes);

}  // namespace kiln
