// An engine's memory plan, from its layers' nodes and tactic workspaces.
#include "kiln/engine/engine_plan.h"

#include <vector>

#include "kiln/ops/op_table.h"

namespace kiln {

PlanLayer PlanLayerFor(const Node& node, int64_t workspace_bytes, bool alias_views) {
  return {&node, workspace_bytes, alias_views && HasTrait(node, op_traits::kView)};
}

StatusOr<MemoryPlan> PlanMemory(const EngineDesc& engine, bool alias_views) {
  if (!engine.graph) return MakeError(ErrorCode::kInternal, "engine has no graph");
  std::vector<PlanLayer> layers;
  layers.reserve(engine.layers.size());
  for (const LayerDesc& l : engine.layers) {
    if (!l.node) return MakeError(ErrorCode::kInternal, "engine layer has no node");
    layers.push_back(
        PlanLayerFor(*l.node, static_cast<int64_t>(l.tactic.workspace_bytes), alias_views));
  }
  return PlanMemory(*engine.graph, layers, engine.profile);
}

bool IsAliasedView(const EngineDesc& engine, size_t index) {
  if (index >= engine.layers.size() || !engine.layers[index].node) return false;
  const Node& node = *engine.layers[index].node;
  const Value* in = HasTrait(node, op_traits::kView) ? ViewInput(node) : nullptr;
  if (!in) return false;
  // Only intermediates have offsets: a view of a graph input or constant, or one that writes a
  // graph output, is never aliased.
  auto a = engine.plan.offsets.find(in->name());
  auto b = engine.plan.offsets.find(node.output(0)->name());
  return a != engine.plan.offsets.end() && b != engine.plan.offsets.end() && a->second == b->second;
}

}  // namespace kiln
