// Liveness, greedy best-fit offset assignment and peak figures for the activation arena.
#include "kiln/plan/memory_plan.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_map>

namespace kiln {

StatusOr<std::map<std::string, int64_t>> MaxShapeBindings(const Graph& graph,
                                                          const OptimizationProfile& profile) {
  std::map<std::string, int64_t> bindings;
  for (const Value* in : graph.inputs()) {
    if (IsStatic(in->shape())) continue;
    const InputProfile* p = profile.Find(in->name());
    if (!p) {
      return MakeError(ErrorCode::kMissingProfile,
                       "graph input '{}' has dynamic shape {} but the profile has no entry for it",
                       in->name(), ToString(in->shape()));
    }
    const size_t rank = in->shape().size();
    if (p->min.size() != rank || p->opt.size() != rank || p->max.size() != rank) {
      return MakeError(
          ErrorCode::kInvalidProfile,
          "profile of input '{}' has ranks {}/{}/{} (min/opt/max); the input has rank {}",
          in->name(), p->min.size(), p->opt.size(), p->max.size(), rank);
    }
    for (size_t i = 0; i < rank; ++i) {
      const Dim& d = in->shape()[i];
      std::vector<std::string> symbols = d.Symbols();
      // Only a bare symbol can be inverted; products like 2*seq get their value from elsewhere.
      if (symbols.size() != 1 || !(d == Dim::Symbol(symbols[0]))) continue;
      auto [it, inserted] = bindings.emplace(symbols[0], p->max[i]);
      if (!inserted) it->second = std::max(it->second, p->max[i]);
    }
  }
  return bindings;
}

StatusOr<std::vector<int64_t>> ConcreteDims(const Value& v,
                                            const std::map<std::string, int64_t>& bindings) {
  if (!v.has_shape()) {
    return MakeError(ErrorCode::kInternal, "value '{}' has no inferred shape to plan memory for",
                     v.name());
  }
  std::vector<int64_t> dims;
  dims.reserve(v.shape().size());
  for (const Dim& d : v.shape()) {
    Dim c = d.Substitute(bindings);
    if (!c.is_static()) {
      return MakeError(
          ErrorCode::kMissingProfile,
          "value '{}' has shape {}: dimension '{}' stays symbolic at the profile's max "
          "shapes (no input profile binds {})",
          v.name(), ToString(v.shape()), c.ToString(), fmt::join(c.Symbols(), ", "));
    }
    if (c.value() < 0) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "value '{}' has shape {}: dimension '{}' is {} at the profile's max shapes",
                       v.name(), ToString(v.shape()), d.ToString(), c.value());
    }
    dims.push_back(c.value());
  }
  return dims;
}

StatusOr<int64_t> PlannedBytes(const Value& v, const std::map<std::string, int64_t>& bindings) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ConcreteDims(v, bindings));
  if (v.dtype() == DataType::kUndefined) {
    return MakeError(ErrorCode::kInternal, "value '{}' has no element type", v.name());
  }
  int64_t bytes = static_cast<int64_t>(SizeOf(v.dtype()));
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > (int64_t{1} << 60)) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "value '{}' would need more than 2^60 bytes at the profile's max shapes",
                       v.name());
    }
  }
  return AlignUp(bytes);
}

int64_t WeightsBytes(const Graph& graph) {
  int64_t total = 0;
  for (const Value* v : graph.values()) {
    if (v->is_constant()) total += AlignUp(static_cast<int64_t>(v->constant()->size_bytes()));
  }
  return total;
}

namespace {
bool Overlaps(const PlannedBuffer& a, const PlannedBuffer& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Best fit among the gaps left by `placed` buffers that are live at the same time as `b`.
int64_t ChooseOffset(const PlannedBuffer& b, const std::vector<PlannedBuffer>& placed) {
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end)
  for (const PlannedBuffer& p : placed) {
    if (Overlaps(b, p)) busy.emplace_back(p.offset, p.offset + p.bytes);
  }
  std::sort(busy.begin(), busy.end());
  int64_t best = -1;
  int64_t best_gap = 0;
  int64_t cursor = 0;
  for (const auto& [start, end] : busy) {
    int64_t gap = start - cursor;
    if (gap >= b.bytes && (best < 0 || gap < best_gap)) {
      best = cursor;
      best_gap = gap;
    }
    cursor = std::max(cursor, end);
  }
  return best >= 0 ? best : cursor;
}
}  // namespace

StatusOr<MemoryPlanDetail> PlanMemoryDetailed(const Graph& graph, std::span<const PlanLayer> layers,
                                              const OptimizationProfile& profile) {
  KILN_ASSIGN_OR_RETURN(auto bindings, MaxShapeBindings(graph, profile));
  MemoryPlanDetail detail;
  MemoryPlan& plan = detail.plan;

  // Liveness: a value is live from the layer that produces it to its last consumer.
  std::unordered_map<const Value*, size_t> index;  // value -> position in buffers
  std::vector<PlannedBuffer> buffers;
  for (size_t l = 0; l < layers.size(); ++l) {
    const Node* node = layers[l].node;
    if (!node) return MakeError(ErrorCode::kInternal, "layer {} has no node", l);
    for (const Value* out : node->outputs()) {
      if (!out || out->is_graph_output() || out->is_graph_input() || out->is_constant()) continue;
      if (index.count(out)) {
        return MakeError(ErrorCode::kInternal, "value '{}' is produced by two layers", out->name());
      }
      KILN_ASSIGN_OR_RETURN(int64_t bytes, PlannedBytes(*out, bindings));
      index[out] = buffers.size();
      buffers.push_back({out, bytes, static_cast<int>(l), static_cast<int>(l), 0});
    }
    for (const Value* in : node->inputs()) {
      auto it = in ? index.find(in) : index.end();
      if (it != index.end()) buffers[it->second].last = static_cast<int>(l);
    }
    plan.workspace_bytes = std::max(plan.workspace_bytes, AlignUp(layers[l].workspace_bytes));
  }
  // A value read by a layer before the layer that produces it would be read uninitialised.
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const Value* in : layers[l].node->inputs()) {
      auto it = in ? index.find(in) : index.end();
      if (it != index.end() && buffers[it->second].first >= static_cast<int>(l)) {
        return MakeError(ErrorCode::kInternal,
                         "layer {} ('{}') reads '{}' before it is produced (layers not in "
                         "topological order)",
                         l, layers[l].node->name(), in->name());
      }
    }
  }

  std::stable_sort(buffers.begin(), buffers.end(),
                   [](const PlannedBuffer& a, const PlannedBuffer& b) {
                     if (a.bytes != b.bytes) return a.bytes > b.bytes;
                     if (a.first != b.first) return a.first < b.first;
                     return a.value->name() < b.value->name();
                   });
  std::vector<PlannedBuffer> placed;
  placed.reserve(buffers.size());
  for (PlannedBuffer b : buffers) {
    b.offset = ChooseOffset(b, placed);
    plan.arena_bytes = std::max(plan.arena_bytes, b.offset + b.bytes);
    plan.offsets[b.value->name()] = b.offset;
    placed.push_back(b);
  }
  detail.buffers = std::move(placed);
  plan.weights_bytes = WeightsBytes(graph);
  plan.peak_bytes = plan.weights_bytes + plan.arena_bytes + plan.workspace_bytes;
  return detail;
}

StatusOr<MemoryPlan> PlanMemory(const Graph& graph, std::span<const PlanLayer> layers,
                                const OptimizationProfile& profile) {
  KILN_ASSIGN_OR_RETURN(MemoryPlanDetail detail, PlanMemoryDetailed(graph, layers, profile));
  return std::move(detail.plan);
}

StatusOr<MemoryPlan> PlanMemory(const EngineDesc& engine) {
  if (!engine.graph) return MakeError(ErrorCode::kInternal, "engine has no graph");
  std::vector<PlanLayer> layers;
  layers.reserve(engine.layers.size());
  for (const LayerDesc& l : engine.layers) {
    layers.push_back({l.node, static_cast<int64_t>(l.tactic.workspace_bytes)});
  }
  return PlanMemory(*engine.graph, layers, engine.profile);
}

int64_t NaivePeak(const MemoryPlanDetail& detail) {
  int64_t sum = 0;
  for (const PlannedBuffer& b : detail.buffers) sum += b.bytes;
  return detail.plan.weights_bytes + sum + detail.plan.workspace_bytes;
}

Status CheckBudget(const MemoryPlan& plan, int64_t budget_bytes) {
  if (plan.peak_bytes <= budget_bytes) return OkStatus();
  return MakeError(ErrorCode::kMemoryBudgetExceeded,
                   "the plan needs {} bytes ({:.1f} MiB: weights {}, activations {}, workspace {}) "
                   "but the budget is {} bytes ({:.1f} MiB)",
                   plan.peak_bytes, plan.peak_bytes / 1048576.0, plan.weights_bytes,
                   plan.arena_bytes, plan.workspace_bytes, budget_bytes, budget_bytes / 1048576.0);
}

}  // namespace kiln
