// Liveness, greedy best-fit offset assignment and peak figures for the activation arena.
#include "kiln/plan/memory_plan.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <unordered_map>

#include "kiln/ir/sizes.h"

namespace kiln {

const Value* ViewInput(const Node& node) {
  if (node.num_inputs() < 1 || node.num_outputs() != 1) {
    return nullptr;
  }
  const Value* in = node.input(0);
  const Value* out = node.output(0);
  if (!in || !out || in->dtype() != out->dtype() || in->dtype() == DataType::kUndefined) {
    return nullptr;
  }
  return in;
}

std::string ViewTacticName(const Node& node) {
  std::string op(node.op_type());
  for (char& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const Value* out = node.num_outputs() ? node.output(0) : nullptr;
  return fmt::format("{}-{}-view", out ? ToString(out->dtype()) : "any", op);
}

Status CheckProfileSizes(const Graph& graph, const OptimizationProfile& profile) {
  for (const InputProfile& p : profile.inputs) {
    const Value* in = graph.FindValue(p.input);
    const DataType dtype = in ? in->dtype() : DataType::kUndefined;
    for (const auto& [which, dims] :
         {std::pair<const char*, const std::vector<int64_t>*>{"min", &p.min},
          {"opt", &p.opt},
          {"max", &p.max}}) {
      KILN_RETURN_IF_ERROR(
          CheckedTensorSize(*dims, dtype, ErrorCode::kProfileTooLarge,
                            fmt::format("the profile's {} shape of input '{}'", which, p.input))
              .status());
    }
  }
  return OkStatus();
}

namespace {
// An upper bound of `d` over every shape of the profile, given each symbol's max: the terms
// with a positive coefficient at the max, those with a negative one dropped (a symbol is >= 0),
// constants as they are. Evaluating d at the max of every symbol is not a bound when d has a
// negative term: T - M at the max of both is 0 while T_max - M_min is not. nullopt when a term
// mentions a symbol without a binding (an opaque division: the caller keeps the exact value).
std::optional<int64_t> UpperBound(const Dim& d, const std::map<std::string, int64_t>& bindings) {
  if (d.is_static()) return d.value();
  int64_t bound = 0;
  for (const auto& [monomial, coeff] : d.terms()) {
    int64_t product = 1;
    for (const std::string& sym : monomial) {
      auto it = bindings.find(sym);
      if (it == bindings.end()) return std::nullopt;
      product = SatMul(product, it->second);
    }
    if (monomial.empty() || coeff > 0) bound = SatAdd(bound, SatMul(coeff, product));
  }
  return bound;
}
}  // namespace

StatusOr<std::map<std::string, int64_t>> MaxShapeBindings(const Graph& graph,
                                                          const OptimizationProfile& profile) {
  KILN_RETURN_IF_ERROR(CheckProfileSizes(graph, profile));
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
  // Data-dependent dims at their bounds' largest value. A bound may name another data-dependent
  // dim (NonZero of NonZero's output): resolved in as many rounds as the chain is long.
  std::map<std::string, const Dim*> open;
  for (const auto& [symbol, bound] : graph.data_dependent_bounds()) open.emplace(symbol, &bound);
  while (!open.empty()) {
    bool progress = false;
    for (auto it = open.begin(); it != open.end();) {
      if (std::optional<int64_t> b = UpperBound(*it->second, bindings)) {
        bindings[it->first] = std::max<int64_t>(0, *b);
        it = open.erase(it);
        progress = true;
      } else {
        ++it;
      }
    }
    if (!progress) {
      const auto& [symbol, bound] = *open.begin();
      return MakeError(ErrorCode::kMissingProfile,
                       "data-dependent dim '{}' is bounded by {}, which stays symbolic at the "
                       "profile's max shapes",
                       symbol, bound->ToString());
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
  // Sized for the largest shape the profile allows, not only for every symbol at its max.
  for (size_t i = 0; i < dims.size(); ++i) {
    if (std::optional<int64_t> b = UpperBound(v.shape()[i], bindings)) {
      dims[i] = std::max(dims[i], *b);
    }
  }
  if (v.dtype() == DataType::kUndefined) {
    return MakeError(ErrorCode::kInternal, "value '{}' has no element type", v.name());
  }
  const std::string what = fmt::format("value '{}' at the profile's max shapes", v.name());
  KILN_ASSIGN_OR_RETURN(TensorSize size,
                        CheckedTensorSize(dims, v.dtype(), ErrorCode::kProfileTooLarge, what));
  return CheckedAlignUp(size.bytes, kPlanAlignment, ErrorCode::kProfileTooLarge, what);
}

StatusOr<int64_t> WeightsBytes(const Graph& graph) {
  int64_t total = 0;
  for (const Value* v : graph.values()) {
    if (!v->is_constant()) continue;
    const std::string what = fmt::format("constant '{}'", v->name());
    KILN_ASSIGN_OR_RETURN(int64_t bytes,
                          CheckedAlignUp(static_cast<int64_t>(v->constant()->size_bytes()),
                                         kPlanAlignment, ErrorCode::kTensorTooLarge, what));
    KILN_ASSIGN_OR_RETURN(
        total, CheckedTotalBytes(total, bytes, ErrorCode::kTensorTooLarge, "the model's weights"));
  }
  return total;
}

namespace {
bool Overlaps(const PlannedBuffer& a, const PlannedBuffer& b) {
  return a.first <= b.last && b.first <= a.last;
}

// The plan's one workspace serves every layer: the largest, aligned.
Status AddWorkspace(const PlanLayer& layer, MemoryPlan& plan) {
  KILN_ASSIGN_OR_RETURN(
      int64_t ws, CheckedAlignUp(layer.workspace_bytes, kPlanAlignment, ErrorCode::kProfileTooLarge,
                                 fmt::format("the workspace of layer '{}'", layer.node->name())));
  plan.workspace_bytes = std::max(plan.workspace_bytes, ws);
  return OkStatus();
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

// A buffer's name for tie-breaks; buffers without a value keep their input order.
const std::string& NameOf(const PlannedBuffer& b) {
  static const std::string kNone;
  return b.value ? b.value->name() : kNone;
}
}  // namespace

int64_t PlaceBuffers(std::span<PlannedBuffer> buffers) {
  // Greedy placement in a few orders, keeping the smallest arena (the first order on ties, so
  // plans only change where another order does better). Largest first packs most graphs well;
  // the others help where aliased views made some buffers live long (a ViT's patch reshape).
  using Order = bool (*)(const PlannedBuffer&, const PlannedBuffer&);
  static constexpr Order kOrders[] = {
      [](const PlannedBuffer& a, const PlannedBuffer& b) {  // largest first
        if (a.bytes != b.bytes) return a.bytes > b.bytes;
        if (a.first != b.first) return a.first < b.first;
        return NameOf(a) < NameOf(b);
      },
      [](const PlannedBuffer& a, const PlannedBuffer& b) {  // longest-lived first
        if (a.last - a.first != b.last - b.first) return a.last - a.first > b.last - b.first;
        if (a.bytes != b.bytes) return a.bytes > b.bytes;
        return NameOf(a) < NameOf(b);
      },
      [](const PlannedBuffer& a, const PlannedBuffer& b) {  // most bytes x layers first
        const int64_t ea = SatMul(a.bytes, a.last - a.first + 1),
                      eb = SatMul(b.bytes, b.last - b.first + 1);
        if (ea != eb) return ea > eb;
        if (a.first != b.first) return a.first < b.first;
        return NameOf(a) < NameOf(b);
      },
  };
  // Sorted by index so that each order's placement can be written back in input order.
  std::vector<size_t> index(buffers.size());
  std::vector<int64_t> best_offsets;
  int64_t best_arena = 0;
  std::vector<PlannedBuffer> trial;
  trial.reserve(buffers.size());
  for (Order order : kOrders) {
    for (size_t i = 0; i < index.size(); ++i) index[i] = i;
    std::stable_sort(index.begin(), index.end(),
                     [&](size_t a, size_t b) { return order(buffers[a], buffers[b]); });
    trial.clear();
    std::vector<int64_t> offsets(buffers.size());
    int64_t arena = 0;
    for (size_t i : index) {
      PlannedBuffer b = buffers[i];
      b.offset = ChooseOffset(b, trial);
      offsets[i] = b.offset;
      arena = std::max(arena, b.offset + b.bytes);
      trial.push_back(b);
    }
    if (order == kOrders[0] || arena < best_arena) {
      best_arena = arena;
      best_offsets = std::move(offsets);
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].offset = best_offsets[i];
  return best_arena;
}

StatusOr<MemoryPlanDetail> PlanMemoryDetailed(const Graph& graph, std::span<const PlanLayer> layers,
                                              const OptimizationProfile& profile) {
  KILN_ASSIGN_OR_RETURN(auto bindings, MaxShapeBindings(graph, profile));
  MemoryPlanDetail detail;
  MemoryPlan& plan = detail.plan;

  // Liveness: a value is live from the layer that produces it to its last consumer. An aliased
  // view output has no buffer of its own: reads of it keep its root's buffer alive.
  std::unordered_map<const Value*, size_t> index;          // value -> position in buffers
  std::unordered_map<const Value*, const Value*> root_of;  // aliased view output -> root
  auto resolve = [&root_of](const Value* v) {
    auto it = root_of.find(v);
    return it == root_of.end() ? v : it->second;
  };
  std::vector<PlannedBuffer> buffers;
  for (size_t l = 0; l < layers.size(); ++l) {
    const Node* node = layers[l].node;
    if (!node) return MakeError(ErrorCode::kInternal, "layer {} has no node", l);
    if (const Value* in = layers[l].view ? ViewInput(*node) : nullptr) {
      const Value* out = node->output(0);
      const Value* root = resolve(in);
      auto it = index.find(root);
      if (it != index.end() && !out->is_graph_output() && !out->is_graph_input() &&
          !out->is_constant() && !index.count(out) && !root_of.count(out)) {
        // The same elements of the same type. Only dims written with symbols that the profile
        // bounds apart (two inputs' "seq" with different maxes) can make the view look larger
        // at the max shapes than its root: then it keeps its copy, sized on its own.
        KILN_ASSIGN_OR_RETURN(int64_t bytes, PlannedBytes(*out, bindings));
        if (bytes <= buffers[it->second].bytes) {
          root_of[out] = root;
          detail.aliases[out->name()] = root->name();
          buffers[it->second].last = static_cast<int>(l);
          KILN_RETURN_IF_ERROR(AddWorkspace(layers[l], plan));
          continue;
        }
      }
    }
    for (const Value* out : node->outputs()) {
      if (!out || out->is_graph_output() || out->is_graph_input() || out->is_constant()) continue;
      if (index.count(out) || root_of.count(out)) {
        return MakeError(ErrorCode::kInternal, "value '{}' is produced by two layers", out->name());
      }
      KILN_ASSIGN_OR_RETURN(int64_t bytes, PlannedBytes(*out, bindings));
      index[out] = buffers.size();
      buffers.push_back({out, bytes, static_cast<int>(l), static_cast<int>(l), 0});
    }
    for (const Value* in : node->inputs()) {
      auto it = in ? index.find(resolve(in)) : index.end();
      if (it != index.end()) buffers[it->second].last = static_cast<int>(l);
    }
    KILN_RETURN_IF_ERROR(AddWorkspace(layers[l], plan));
  }
  // A value read by a layer before the layer that produces it would be read uninitialised.
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const Value* in : layers[l].node->inputs()) {
      auto it = in ? index.find(resolve(in)) : index.end();
      if (it != index.end() && buffers[it->second].first >= static_cast<int>(l)) {
        return MakeError(ErrorCode::kInternal,
                         "layer {} ('{}') reads '{}' before it is produced (layers not in "
                         "topological order)",
                         l, layers[l].node->name(), in->name());
      }
    }
  }

  // Every offset below is at most the sum of all buffers: bounding the sum bounds them all.
  int64_t all_buffers = 0;
  for (const PlannedBuffer& b : buffers) {
    KILN_ASSIGN_OR_RETURN(all_buffers,
                          CheckedTotalBytes(all_buffers, b.bytes, ErrorCode::kProfileTooLarge,
                                            "the activations at the profile's max shapes"));
  }

  plan.arena_bytes = PlaceBuffers(buffers);
  for (const PlannedBuffer& b : buffers) plan.offsets[b.value->name()] = b.offset;
  detail.buffers = std::move(buffers);
  for (const auto& [alias, root] : detail.aliases) plan.offsets[alias] = plan.offsets.at(root);
  KILN_ASSIGN_OR_RETURN(plan.weights_bytes, WeightsBytes(graph));
  KILN_ASSIGN_OR_RETURN(int64_t with_arena,
                        CheckedTotalBytes(plan.weights_bytes, plan.arena_bytes,
                                          ErrorCode::kProfileTooLarge, "the plan's peak"));
  KILN_ASSIGN_OR_RETURN(plan.peak_bytes,
                        CheckedTotalBytes(with_arena, plan.workspace_bytes,
                                          ErrorCode::kProfileTooLarge, "the plan's peak"));
  return detail;
}

StatusOr<MemoryPlan> PlanMemory(const Graph& graph, std::span<const PlanLayer> layers,
                                const OptimizationProfile& profile) {
  KILN_ASSIGN_OR_RETURN(MemoryPlanDetail detail, PlanMemoryDetailed(graph, layers, profile));
  return std::move(detail.plan);
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
