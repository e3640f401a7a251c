// The memory plan: where every intermediate activation lives in one arena, sized for the
// optimization profile's MAX shapes, with buffers whose lifetimes do not overlap sharing bytes.
// Graph inputs/outputs are bound by the caller and constants live in the weights section, so
// neither takes arena space. Layers run one after another, so one workspace region serves all.
// View layers (ops with the op table's kView trait: the output is the input's bytes under another
// shape) are aliased: their output shares the input's buffer and the runtime launches nothing for
// them. The caller says which layers are views (PlanLayer::view); the planner knows no op names.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/plan/profile.h"

namespace kiln {

// Every buffer and weight is placed on this boundary (vector loads, cache lines, mmap borrowing).
inline constexpr int64_t kPlanAlignment = 64;
// Sizes are rounded up to it with CheckedAlignUp (ir/sizes.h).

// Where each non-constant, non-binding value lives in the activation arena (max-profile sizes).
struct MemoryPlan {
  std::map<std::string, int64_t> offsets;  // value name -> byte offset in the arena
  int64_t arena_bytes = 0;                 // activations after liveness reuse
  int64_t workspace_bytes = 0;             // largest layer workspace (one shared region)
  int64_t weights_bytes = 0;
  int64_t peak_bytes = 0;  // weights + max(arena, shape_arena) + workspace
  // Engines with shape inputs: the arena a context allocates (at least arena_bytes), in which it
  // re-plans the activations when a shape input's values need more than the plan above gives
  // them. 0 otherwise.
  int64_t shape_arena_bytes = 0;
};

// One layer as the planner sees it: the node it runs, its tactic's workspace estimate, and
// whether its output may share its data input's bytes: the node's op is a view (the op table's
// kView trait: Identity, Reshape, Flatten, Squeeze, Unsqueeze; all kiln tensors are dense and
// row-major) and aliasing is on (the builder's KILN_ALIAS_VIEWS=0 switch turns it off).
// engine/engine_plan.h's PlanLayerFor fills it from the op table.
struct PlanLayer {
  const Node* node = nullptr;
  int64_t workspace_bytes = 0;
  bool view = false;
};

// The value whose bytes a view layer's output may share: the node's data input (input 0), when
// the node has one output, of the data input's type. nullptr otherwise. Asked of views only.
const Value* ViewInput(const Node& node);

// The tactic name a view layer carries in the engine once aliased ("f16-reshape-view"): reports,
// `kiln inspect --layers` and per-layer timings show that nothing runs for it.
std::string ViewTacticName(const Node& node);

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
  std::vector<PlannedBuffer> buffers;  // in the order layers produce them
  // View outputs that share a buffer: value name -> the chain's root (the arena value whose
  // buffer it is). plan.offsets gives both the same offset; the root's buffer stays live until
  // the last reader of any value in the chain. A view keeps its copy (and is absent here) when
  // its root is not an arena value (a graph input or output, a constant) or when its output is a
  // graph output: those bytes belong to the caller or to the weights.
  std::map<std::string, std::string> aliases;
};

// Checks every profile shape (min, opt, max) of every input against the size limits
// (ir/sizes.h); KILN-E3008 names the input, the shape and the value. MaxShapeBindings runs it,
// so every plan (the builder's, an engine's at load) starts from checked shapes.
Status CheckProfileSizes(const Graph& graph, const OptimizationProfile& profile);

// symbol -> max value, from each dynamic graph input's profile: a dim that is a bare symbol
// ("batch") binds that symbol to the profile's max at that index. A symbol bound by several
// inputs takes the largest max (the plan must fit every one of them). KILN-E3001 names a dynamic
// input without a profile; KILN-E3000 a profile whose rank differs from its input's.
// Data-dependent dims (Graph::data_dependent_bounds) bind to their bound's upper bound there, so
// the plan sizes their buffers for the largest value a kernel can report.
StatusOr<std::map<std::string, int64_t>> MaxShapeBindings(const Graph& graph,
                                                          const OptimizationProfile& profile);

// The concrete dims of `v` under `bindings`; KILN-E3001 names the value and the symbol left.
StatusOr<std::vector<int64_t>> ConcreteDims(const Value& v,
                                            const std::map<std::string, int64_t>& bindings);

// Bytes of `v` at `bindings`, rounded up to kPlanAlignment; errors name the value (KILN-E3008
// past the size limits of ir/sizes.h).
StatusOr<int64_t> PlannedBytes(const Value& v, const std::map<std::string, int64_t>& bindings);

// Sum of every constant's bytes, each aligned (the layout of an engine file's weights section);
// KILN-E2015 past kMaxTotalBytes.
StatusOr<int64_t> WeightsBytes(const Graph& graph);

// Plans the arena for `layers` (execution order). Offsets: buffers sorted by size (largest
// first, ties by first use then name) and each placed in the smallest gap between already
// placed buffers whose lifetimes overlap its own (lowest offset on ties), else on top of them.
// The same greedy placement is also tried longest-lived first and by bytes x layers; the
// smallest arena is kept (largest first on ties).
// View layers are aliased where they may be (MemoryPlanDetail::aliases).
StatusOr<MemoryPlanDetail> PlanMemoryDetailed(const Graph& graph, std::span<const PlanLayer> layers,
                                              const OptimizationProfile& profile);
StatusOr<MemoryPlan> PlanMemory(const Graph& graph, std::span<const PlanLayer> layers,
                                const OptimizationProfile& profile);
// The peak without any reuse (every buffer its own bytes), for the build report's comparison.
int64_t NaivePeak(const MemoryPlanDetail& detail);

// Places buffers of known bytes and lifetimes (first/last set, offsets ignored) in one arena, as
// PlanMemoryDetailed does: best fit over a few orders, the smallest arena kept. Sets each
// buffer's offset (in place, the input order kept) and returns the arena's bytes. Buffers need
// no value (the runtime re-plans slots of an engine, docs/architecture.md "Shape inputs"); ties
// between orders then fall to the input order.
int64_t PlaceBuffers(std::span<PlannedBuffer> buffers);

// KILN-E3002 with the required and available bytes when plan.peak_bytes > budget_bytes.
Status CheckBudget(const MemoryPlan& plan, int64_t budget_bytes);

}  // namespace kiln
