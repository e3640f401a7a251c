// Provenance of constants, the weight-op registry, and the weight program's record and replay
// (weight_program.h).
#include "kiln/ir/weight_program.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "kiln/core/hash.h"
#include "kiln/core/thread_pool.h"
#include "kiln/ir/graph.h"

namespace kiln {
namespace {

std::string TypeText(DataType dtype, const std::vector<int64_t>& dims) {
  return fmt::format("{}[{}]", ToString(dtype), fmt::join(dims, ","));
}

struct WeightOpRegistry {
  std::mutex mutex;
  std::map<std::string, WeightOpFn, std::less<>> ops;
  std::map<std::string, ElementwiseWeightOp, std::less<>> elementwise;
};
WeightOpRegistry& Registry() {
  static WeightOpRegistry* r = new WeightOpRegistry();  // never destroyed: used by static init
  return *r;
}

}  // namespace

WeightExprPtr InitializerExpr(const std::string& name, const Tensor& t) {
  auto e = std::make_shared<WeightExpr>();
  e->kind = WeightExpr::Kind::kInitializer;
  e->name = name;
  e->dtype = t.dtype();
  e->dims = t.dims();
  return e;
}

WeightExprPtr LiteralExpr(const Tensor& t) {
  auto e = std::make_shared<WeightExpr>();
  e->kind = WeightExpr::Kind::kLiteral;
  e->dtype = t.dtype();
  e->dims = t.dims();
  e->value = t;
  return e;
}

WeightExprPtr OpaqueExpr(std::string reason) {
  auto e = std::make_shared<WeightExpr>();
  e->kind = WeightExpr::Kind::kOpaque;
  e->name = std::move(reason);
  return e;
}

WeightExprPtr ProvenanceOf(const Value& v) {
  if (v.provenance()) return v.provenance();
  return OpaqueExpr(
      fmt::format("constant '{}' was made by code that records no weight step", v.name()));
}

std::vector<WeightExprPtr> StepOutputs(std::string op_type, std::string domain, AttributeMap attrs,
                                       std::vector<WeightExprPtr> inputs,
                                       std::span<const Tensor> outputs) {
  std::vector<WeightExprPtr> out;
  bool all_literal = true;
  for (const WeightExprPtr& in : inputs) {
    if (!in) continue;
    if (in->kind == WeightExpr::Kind::kOpaque) {
      out.assign(outputs.size(), in);
      return out;
    }
    if (in->kind != WeightExpr::Kind::kLiteral) all_literal = false;
  }
  if (all_literal) {
    for (const Tensor& t : outputs) out.push_back(LiteralExpr(t));
    return out;
  }
  auto step = std::make_shared<WeightStep>();
  step->op_type = std::move(op_type);
  step->domain = std::move(domain);
  step->attrs = std::move(attrs);
  step->inputs = std::move(inputs);
  step->num_outputs = static_cast<int>(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto e = std::make_shared<WeightExpr>();
    e->kind = WeightExpr::Kind::kStep;
    e->dtype = outputs[i].dtype();
    e->dims = outputs[i].dims();
    e->step = step;
    e->output = static_cast<int>(i);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<WeightExprPtr> FoldedNodeOutputs(const Node& node, std::span<const Tensor* const> known,
                                             std::span<const Tensor> outputs) {
  std::vector<WeightExprPtr> inputs;
  for (size_t i = 0; i < node.num_inputs(); ++i) {
    const Value* v = node.input(i);
    if (!v) {
      inputs.push_back(nullptr);
    } else if (v->is_constant()) {
      inputs.push_back(ProvenanceOf(*v));
    } else if (i < known.size() && known[i]) {
      inputs.push_back(LiteralExpr(*known[i]));  // a static shape: part of the architecture
    } else {
      inputs.push_back(
          OpaqueExpr(fmt::format("node '{}' was folded from a value it computes", node.name())));
    }
  }
  return StepOutputs(node.op_type(), node.domain(), node.attrs(), std::move(inputs), outputs);
}

bool RegisterWeightOp(std::string name, WeightOpFn fn,
                      std::optional<ElementwiseWeightOp> elementwise) {
  WeightOpRegistry& r = Registry();
  std::lock_guard lock(r.mutex);
  if (elementwise) r.elementwise.emplace(name, std::move(*elementwise));
  return r.ops.emplace(std::move(name), std::move(fn)).second;
}

const ElementwiseWeightOp* FindElementwiseWeightOp(std::string_view name) {
  WeightOpRegistry& r = Registry();
  std::lock_guard lock(r.mutex);
  auto it = r.elementwise.find(name);
  return it == r.elementwise.end() ? nullptr : &it->second;
}

const WeightOpFn* FindWeightOp(std::string_view name) {
  WeightOpRegistry& r = Registry();
  std::lock_guard lock(r.mutex);
  auto it = r.ops.find(name);
  return it == r.ops.end() ? nullptr : &it->second;
}

StatusOr<std::vector<Tensor>> RunWeightStep(const std::string& op_type, const std::string& domain,
                                            const AttributeMap& attrs,
                                            std::span<const Tensor* const> inputs, int num_outputs,
                                            const NodeEvaluator& evaluate) {
  std::vector<Tensor> outs;
  if (domain == kWeightOpDomain) {
    const WeightOpFn* fn = FindWeightOp(op_type);
    if (!fn) {
      return MakeError(ErrorCode::kInternal, "weight op '{}' is not registered in this kiln",
                       op_type);
    }
    KILN_ASSIGN_OR_RETURN(outs, (*fn)(attrs, inputs));
  } else {
    if (!evaluate) {
      return MakeError(ErrorCode::kInternal, "weight step {} needs an evaluator", op_type);
    }
    // A one-node graph, so the evaluator sees the node exactly as the build's folding did.
    Graph scratch;
    std::vector<Value*> ins, outputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      ins.push_back(inputs[i] ? scratch.AddConstant(fmt::format("in{}", i), *inputs[i]) : nullptr);
    }
    for (int i = 0; i < num_outputs; ++i) {
      outputs.push_back(scratch.AddValue(fmt::format("out{}", i)));
    }
    Node* node = scratch.AddNode(op_type, "weight_step", ins, outputs, attrs, domain);
    KILN_ASSIGN_OR_RETURN(outs, evaluate(*node, inputs));
  }
  if (static_cast<int>(outs.size()) != num_outputs) {
    return MakeError(ErrorCode::kInternal, "weight step {} gave {} outputs; expected {}", op_type,
                     outs.size(), num_outputs);
  }
  return outs;
}

StatusOr<std::vector<DerivedTensor>> DeriveWithWeightOp(const std::string& op,
                                                        const AttributeMap& attrs,
                                                        std::span<Value* const> inputs,
                                                        int num_outputs) {
  std::vector<const Tensor*> tensors;
  std::vector<WeightExprPtr> exprs;
  for (Value* v : inputs) {
    if (v && !v->is_constant()) {
      return MakeError(ErrorCode::kInternal, "weight op {}: input '{}' is not a constant", op,
                       v->name());
    }
    tensors.push_back(v ? v->constant() : nullptr);
    exprs.push_back(v ? ProvenanceOf(*v) : nullptr);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs,
                        RunWeightStep(op, std::string(kWeightOpDomain), attrs, tensors, num_outputs,
                                      NodeEvaluator()));
  std::vector<WeightExprPtr> out_exprs =
      StepOutputs(op, std::string(kWeightOpDomain), attrs, std::move(exprs), outs);
  std::vector<DerivedTensor> result;
  for (size_t i = 0; i < outs.size(); ++i) {
    result.push_back({std::move(outs[i]), std::move(out_exprs[i])});
  }
  return result;
}

int32_t WeightProgram::num_slots() const {
  int32_t n = static_cast<int32_t>(sources.size() + literals.size());
  for (const Step& s : steps) n += s.num_outputs;
  return n;
}

std::vector<InitializerInfo> CollectInitializers(const Graph& graph) {
  std::vector<InitializerInfo> out;
  for (const Value* v : graph.values()) {
    const WeightExprPtr& e = v->provenance();
    if (v->is_constant() && e && e->kind == WeightExpr::Kind::kInitializer &&
        e->name == v->name()) {
      out.push_back({v->name(), *v->constant()});
    }
  }
  return out;
}

namespace {

// Post-order walk over the targets' expressions: sources, literals and steps each once.
class ProgramRecorder {
 public:
  explicit ProgramRecorder(std::span<const InitializerInfo> initializers) {
    for (size_t i = 0; i < initializers.size(); ++i) order_[initializers[i].name] = i;
  }

  void Visit(const WeightExprPtr& e) {
    if (!e || seen_.count(e.get())) return;
    seen_.insert(e.get());
    switch (e->kind) {
      case WeightExpr::Kind::kInitializer:
        if (!source_of_.count(e->name)) {
          source_of_[e->name] = -1;
          sources_.push_back(e.get());
        }
        return;
      case WeightExpr::Kind::kLiteral:
        literals_.push_back(e.get());
        return;
      case WeightExpr::Kind::kStep:
        if (step_index_.count(e->step.get())) return;
        for (const WeightExprPtr& in : e->step->inputs) Visit(in);
        step_index_[e->step.get()] = static_cast<int32_t>(steps_.size());
        steps_.push_back(e->step.get());
        return;
      case WeightExpr::Kind::kOpaque:
        return;
    }
  }

  // Numbers the slots (sources in model order, literals, step outputs) and fills `program`.
  void Finish(WeightProgram& program) {
    std::stable_sort(sources_.begin(), sources_.end(),
                     [&](const WeightExpr* a, const WeightExpr* b) { return Rank(a) < Rank(b); });
    int32_t slot = 0;
    for (const WeightExpr* s : sources_) {
      source_of_[s->name] = slot++;
      program.sources.push_back({s->name, s->dtype, s->dims});
    }
    for (const WeightExpr* l : literals_) {
      literal_slot_[l] = slot++;
      program.literals.push_back(l->value);
    }
    for (const WeightStep* s : steps_) {
      step_slot_[s] = slot;
      slot += s->num_outputs;
    }
    for (const WeightStep* s : steps_) {
      WeightProgram::Step step;
      step.op_type = s->op_type;
      step.domain = s->domain;
      step.attrs = s->attrs;
      step.num_outputs = s->num_outputs;
      for (const WeightExprPtr& in : s->inputs) step.inputs.push_back(SlotOf(in.get()));
      program.steps.push_back(std::move(step));
    }
  }

  int32_t SlotOf(const WeightExpr* e) const {
    if (!e) return -1;
    switch (e->kind) {
      case WeightExpr::Kind::kInitializer:
        return source_of_.at(e->name);
      case WeightExpr::Kind::kLiteral:
        return literal_slot_.at(e);
      case WeightExpr::Kind::kStep:
        return step_slot_.at(e->step.get()) + e->output;
      case WeightExpr::Kind::kOpaque:
        break;
    }
    return -1;
  }

  bool IsSource(const std::string& name) const { return source_of_.count(name) != 0; }

 private:
  size_t Rank(const WeightExpr* e) const {
    auto it = order_.find(e->name);
    return it == order_.end() ? order_.size() : it->second;
  }

  std::unordered_map<std::string, size_t> order_;
  std::unordered_set<const WeightExpr*> seen_;
  std::vector<const WeightExpr*> sources_, literals_;
  std::vector<const WeightStep*> steps_;
  std::unordered_map<std::string, int32_t> source_of_;
  std::unordered_map<const WeightExpr*, int32_t> literal_slot_;
  std::unordered_map<const WeightStep*, int32_t> step_index_, step_slot_;
};

}  // namespace

WeightProgram RecordWeightProgram(const Graph& graph,
                                  std::span<const InitializerInfo> initializers) {
  WeightProgram program;
  program.recorded = true;
  ProgramRecorder recorder(initializers);
  std::vector<std::pair<const Value*, WeightExprPtr>> targets;
  for (const Value* v : graph.values()) {
    if (!v->is_constant()) continue;
    WeightExprPtr e = ProvenanceOf(*v);
    if (e->kind == WeightExpr::Kind::kLiteral) continue;
    if (e->kind == WeightExpr::Kind::kOpaque) {
      program.non_refittable.push_back({v->name(), e->name});
      continue;
    }
    recorder.Visit(e);
    targets.emplace_back(v, std::move(e));
  }
  recorder.Finish(program);
  for (const auto& [v, e] : targets)
    program.targets.push_back({v->name(), recorder.SlotOf(e.get())});
  for (const InitializerInfo& init : initializers) {
    // Index and shape types shape the engine (a Reshape's target, Gather indices): refit takes
    // new float weights, never new structure, so those must stay as they were.
    const DataType t = init.value.dtype();
    const bool structural = t == DataType::kInt64 || t == DataType::kInt32 || t == DataType::kBool;
    if (recorder.IsSource(init.name) && !structural) continue;
    program.fixed.push_back(
        {init.name, init.value.dtype(), init.value.dims(), HashBytes(init.value.bytes()).Hex()});
  }
  return program;
}

StatusOr<std::map<std::string, Tensor>> RunWeightProgram(
    const WeightProgram& program, const std::map<std::string, Tensor>& initializers,
    const NodeEvaluator& evaluate, WeightProgramStats* stats) {
  const auto check_start = std::chrono::steady_clock::now();
  if (!program.recorded) {
    return MakeError(ErrorCode::kRefitNotRecorded,
                     "the engine holds no weight program (it was built by a kiln without refit)");
  }
  if (!program.non_refittable.empty()) {
    const auto& first = program.non_refittable.front();
    return MakeError(ErrorCode::kRefitNotRefittable,
                     "{} engine constant(s) cannot be refit; the first, '{}': {}",
                     program.non_refittable.size(), first.constant, first.reason);
  }
  std::set<std::string> known;
  auto check = [&](const std::string& name, DataType dtype,
                   const std::vector<int64_t>& dims) -> StatusOr<const Tensor*> {
    known.insert(name);
    auto it = initializers.find(name);
    if (it == initializers.end()) {
      return MakeError(ErrorCode::kRefitWeightsMismatch,
                       "initializer '{}' ({}) that the engine was built from is missing from the "
                       "new weights",
                       name, TypeText(dtype, dims));
    }
    if (it->second.dtype() != dtype || it->second.dims() != dims) {
      return MakeError(ErrorCode::kRefitWeightsMismatch,
                       "initializer '{}' is {} in the new weights; the engine was built with {}",
                       name, TypeText(it->second.dtype(), it->second.dims()),
                       TypeText(dtype, dims));
    }
    return &it->second;
  };
  std::vector<Tensor> slots(static_cast<size_t>(program.num_slots()));
  for (size_t i = 0; i < program.sources.size(); ++i) {
    const WeightProgram::Source& s = program.sources[i];
    KILN_ASSIGN_OR_RETURN(const Tensor* t, check(s.name, s.dtype, s.dims));
    slots[i] = *t;
  }
  for (const WeightProgram::Fixed& f : program.fixed) {
    KILN_ASSIGN_OR_RETURN(const Tensor* t, check(f.name, f.dtype, f.dims));
    if (HashBytes(t->bytes()).Hex() != f.hash) {
      return MakeError(ErrorCode::kRefitNotRefittable,
                       "initializer '{}' changed, but the build read its value to shape the "
                       "engine (a fused pattern or a folded structure), so new values need a "
                       "rebuild",
                       f.name);
    }
  }
  for (const auto& [name, t] : initializers) {
    if (!known.count(name)) {
      return MakeError(ErrorCode::kRefitWeightsMismatch,
                       "the new weights have initializer '{}' ({}), which the engine was not built "
                       "from",
                       name, TypeText(t.dtype(), t.dims()));
    }
  }
  size_t slot = program.sources.size();
  for (const Tensor& l : program.literals) slots[slot++] = l;
  // Steps in levels (a step's level is one past its inputs' deepest step), each level's steps in
  // parallel: they read earlier levels only and write their own slots, so the bytes do not depend
  // on the order (a CNN's folds are all one level).
  const size_t n = program.steps.size();
  std::vector<size_t> first_slot(n);
  std::vector<int> level_of_slot(slots.size(), 0), level(n, 0);
  std::vector<std::vector<size_t>> levels;
  for (size_t i = 0; i < n; ++i) {
    const WeightProgram::Step& step = program.steps[i];
    first_slot[i] = slot;
    for (int32_t in : step.inputs) {
      if (in >= 0) level[i] = std::max(level[i], level_of_slot[static_cast<size_t>(in)] + 1);
    }
    for (int32_t k = 0; k < step.num_outputs; ++k) level_of_slot[slot++] = level[i];
    if (levels.size() <= static_cast<size_t>(level[i])) levels.resize(level[i] + 1);
    levels[level[i]].push_back(i);
  }
  std::vector<Status> errors(n);
  ThreadPool& pool = ThreadPool::Default();
  // One work item per step, or, for a large elementwise step (BERT's word embedding cast to FP16
  // is a fifth of its weights), one per range of elements: its output is allocated first and
  // each item writes its range, the bytes the whole step makes. Items run largest first, each
  // thread taking the next when it is free: a level's steps differ in size by orders of
  // magnitude, and equal counts per thread left one thread with most of the bytes.
  constexpr uint64_t kSplitBytes = 4 << 20;  // steps reading more are split ...
  constexpr uint64_t kPartBytes = 1 << 20;   // ... into ranges reading about this much
  struct Item {
    size_t step;
    const ElementwiseWeightOp* elementwise;  // a range of a split step, else nullptr
    int64_t begin, end;
    uint64_t cost;  // input bytes
  };
  std::vector<Item> items;
  std::vector<double> item_seconds;
  std::vector<double> step_seconds(n, 0.0);  // thread time per step, its items summed (stats)
  const auto steps_start = std::chrono::steady_clock::now();
  for (std::vector<size_t>& steps : levels) {
    items.clear();
    for (size_t i : steps) {
      const WeightProgram::Step& step = program.steps[i];
      uint64_t cost = 0;
      for (int32_t in : step.inputs) {
        if (in >= 0) cost += slots[static_cast<size_t>(in)].size_bytes();
      }
      const ElementwiseWeightOp* ew = step.domain == kWeightOpDomain && step.num_outputs == 1 &&
                                              step.inputs.size() == 1 && step.inputs[0] >= 0 &&
                                              cost >= kSplitBytes
                                          ? FindElementwiseWeightOp(step.op_type)
                                          : nullptr;
      if (!ew) {
        items.push_back({i, nullptr, 0, 0, cost});
        continue;
      }
      const Tensor& in = slots[static_cast<size_t>(step.inputs[0])];
      slots[first_slot[i]] = Tensor::ForOverwrite(ew->out_dtype(step.attrs, in), in.dims());
      const int64_t elements = in.num_elements();
      const int64_t parts = static_cast<int64_t>((cost + kPartBytes - 1) / kPartBytes);
      const int64_t per = (elements + parts - 1) / parts;
      for (int64_t b = 0; b < elements; b += per) {
        const int64_t e = std::min(elements, b + per);
        items.push_back({i, ew, b, e, cost * static_cast<uint64_t>(e - b) / elements});
      }
      if (stats) ++stats->split_steps;
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.cost > b.cost; });
    item_seconds.assign(items.size(), 0.0);
    std::atomic<size_t> next{0};
    pool.ParallelFor(
        std::min<int64_t>(pool.size(), static_cast<int64_t>(items.size())), [&](int64_t, int64_t) {
          std::vector<const Tensor*> ins;
          for (size_t j = next++; j < items.size(); j = next++) {
            const auto t0 = std::chrono::steady_clock::now();
            const Item& item = items[j];
            const size_t i = item.step;
            const WeightProgram::Step& step = program.steps[i];
            if (item.elementwise) {
              item.elementwise->run(step.attrs, slots[static_cast<size_t>(step.inputs[0])],
                                    slots[first_slot[i]], item.begin, item.end);
            } else {
              ins.clear();
              for (int32_t in : step.inputs) {
                ins.push_back(in < 0 ? nullptr : &slots[static_cast<size_t>(in)]);
              }
              auto outs = RunWeightStep(step.op_type, step.domain, step.attrs, ins,
                                        step.num_outputs, evaluate);
              if (!outs.ok()) {
                errors[i] = std::move(outs).status().AddContext(
                    fmt::format("replaying weight step {} ({})", step.op_type, step.domain));
                continue;
              }
              for (size_t k = 0; k < outs->size(); ++k)
                slots[first_slot[i] + k] = std::move((*outs)[k]);
            }
            item_seconds[j] =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
        });
    for (Status& e : errors) {
      if (!e.ok()) return std::move(e);
    }
    for (size_t j = 0; j < items.size(); ++j) step_seconds[items[j].step] += item_seconds[j];
  }
  if (stats) {
    stats->check_seconds = std::chrono::duration<double>(steps_start - check_start).count();
    stats->steps_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - steps_start).count();
    for (size_t i = 0; i < n; ++i) {
      const std::string& op = program.steps[i].op_type;
      stats->op_seconds[op] += step_seconds[i];
      ++stats->op_steps[op];
      if (step_seconds[i] > stats->longest_seconds) {
        stats->longest_seconds = step_seconds[i];
        stats->longest_op = op;
      }
    }
  }
  std::map<std::string, Tensor> result;
  for (const WeightProgram::Target& t : program.targets) {
    result[t.constant] = slots[static_cast<size_t>(t.slot)];
  }
  return result;
}

}  // namespace kiln
