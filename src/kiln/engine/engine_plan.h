// The memory plan of an assembled engine: plan/memory_plan.h applied to an EngineDesc's layers,
// and the question the runtime asks of a planned engine (is this layer an aliased view?). Here,
// not in plan/, because the planner knows graphs and layers, not engines.
#pragma once

#include <cstddef>

#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"
#include "kiln/plan/memory_plan.h"

namespace kiln {

// A layer as the planner sees it: `view` is set when the node's op has the kView trait (ops.inc)
// and `alias_views` allows aliasing. The builder and PlanMemory(EngineDesc) both use it.
PlanLayer PlanLayerFor(const Node& node, int64_t workspace_bytes, bool alias_views);

// The plan for an assembled engine (its layers' nodes and tactic workspaces).
StatusOr<MemoryPlan> PlanMemory(const EngineDesc& engine, bool alias_views = true);

// Whether layer `index` of a planned engine is an aliased view: a view node whose output has
// the same arena offset as its data input. The runtime launches nothing for it (the copy would
// move bytes onto themselves); this reads the plan, so engines need no extra field for it.
bool IsAliasedView(const EngineDesc& engine, size_t index);

}  // namespace kiln
