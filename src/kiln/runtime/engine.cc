// Engine: the immutable, shareable side of the runtime (slots, bindings, providers, weights),
// and Runtime, which loads engines for one backend.
#include <fmt/ranges.h>

#include <cstring>

#include "kiln/engine/engine_plan.h"
#include "kiln/ir/sizes.h"
#include "kiln/ops/op_schema.h"
#include "kiln/plan/memory_plan.h"
#include "kiln/runtime/runtime.h"

namespace kiln {

Engine::~Engine() = default;

StatusOr<std::shared_ptr<const Engine>> Engine::Create(std::shared_ptr<const EngineDesc> desc,
                                                       Backend* backend) {
  if (!desc || !desc->graph) return MakeError(ErrorCode::kInvalidArgument, "no engine to run");
  if (!backend) return MakeError(ErrorCode::kInvalidArgument, "no backend to run the engine on");
  if (backend->kind() != desc->header.backend) {
    return MakeError(ErrorCode::kEngineTargetMismatch,
                     "the engine was built for backend '{}'; this runtime runs backend '{}'",
                     ToString(desc->header.backend), ToString(backend->kind()));
  }
  if (desc->header.weights_stripped) {
    return MakeError(ErrorCode::kEngineWeightsStripped,
                     "engine '{}' was written without its weights ({} constant(s) absent); it "
                     "runs once it is given the weights of its model: `kiln refit ENGINE.kiln "
                     "--weights MODEL.onnx` (writes the full engine) or `kiln run ENGINE.kiln "
                     "--weights MODEL.onnx`",
                     desc->header.model_name, desc->weight_program.targets.size());
  }
  std::shared_ptr<Engine> engine(new Engine());
  engine->desc_ = std::move(desc);
  engine->backend_ = backend;
  KILN_RETURN_IF_ERROR(engine->Build());
  return std::shared_ptr<const Engine>(std::move(engine));
}

Status Engine::Build() {
  const Graph& graph = *desc_->graph;
  const MemoryPlan& plan = desc_->plan;
  KILN_ASSIGN_OR_RETURN(max_bindings_, MaxShapeBindings(graph, desc_->profile));

  // Bindings: inputs first, then outputs, in the graph's order.
  for (const Value* v : graph.inputs()) {
    // Shapes within the static dims and the profile (checked by MaxShapeBindings) are then
    // within the size limits: CheckInputShape relies on it.
    KILN_RETURN_IF_ERROR(CheckShapeSize(v->shape(), v->dtype(), ErrorCode::kEngineMalformed,
                                        fmt::format("engine input '{}'", v->name())));
    binding_of_[v->name()] = static_cast<int>(bindings_.size());
    bindings_.push_back({v->name(), true, -1, v->dtype()});
    TensorDesc d{v->name(), v->dtype(), v->shape(), std::nullopt, std::nullopt};
    if (const InputProfile* p = desc_->profile.Find(v->name())) d.profile = *p;
    if (const ShapeInputValues* sv = desc_->profile.FindShapeValues(v->name())) {
      d.shape_values = *sv;
    }
    inputs_.push_back(std::move(d));
  }
  for (const Value* v : graph.outputs()) {
    outputs_.push_back({v->name(), v->dtype(), v->shape(), std::nullopt, std::nullopt});
    if (binding_of_.count(v->name())) continue;  // an input passed through: one tensor, one name
    binding_of_[v->name()] = static_cast<int>(bindings_.size());
    bindings_.push_back({v->name(), false, -1, v->dtype()});
  }

  // Slots: every value that a layer reads or writes, with where its bytes live.
  uint64_t device_weight_bytes = 0;
  auto slot_for = [&](const Value* v) -> StatusOr<int> {
    if (!v) return -1;
    if (auto it = slot_of_.find(v); it != slot_of_.end()) return it->second;
    Slot s;
    s.value = v;
    if (v->is_graph_input()) {
      s.storage = Storage::kInput;
      s.binding = binding_of_.at(v->name());
    } else if (v->is_constant()) {
      s.storage = Storage::kConstant;
      s.offset = static_cast<int64_t>(device_weight_bytes);
      KILN_ASSIGN_OR_RETURN(
          int64_t bytes,
          CheckedAlignUp(static_cast<int64_t>(v->constant()->size_bytes()), kPlanAlignment,
                         ErrorCode::kEngineMalformed, fmt::format("constant '{}'", v->name())));
      device_weight_bytes += static_cast<uint64_t>(bytes);
    } else if (v->is_graph_output()) {
      s.storage = Storage::kOutput;
      s.binding = binding_of_.at(v->name());
    } else {
      auto off = plan.offsets.find(v->name());
      if (off == plan.offsets.end()) {
        return MakeError(ErrorCode::kEngineMalformed, "the memory plan has no offset for '{}'",
                         v->name());
      }
      s.offset = off->second;
      KILN_ASSIGN_OR_RETURN(s.planned_bytes, PlannedBytes(*v, max_bindings_));
      // Written so that no offset read from a file can overflow the comparison.
      if (s.offset % kPlanAlignment != 0 || s.offset < 0 || s.planned_bytes > plan.arena_bytes ||
          s.offset > plan.arena_bytes - s.planned_bytes) {
        return MakeError(ErrorCode::kEngineMalformed,
                         "the memory plan puts '{}' ({} bytes at the max shapes) at offset {}: "
                         "unaligned or outside the {}-byte arena",
                         v->name(), s.planned_bytes, s.offset, plan.arena_bytes);
      }
      arena_bytes_ = std::max(arena_bytes_, s.offset + s.planned_bytes);
    }
    int id = static_cast<int>(slots_.size());
    slots_.push_back(s);
    slot_of_[v] = id;
    return id;
  };
  for (const Value* v : graph.inputs()) KILN_RETURN_IF_ERROR(slot_for(v));

  for (const LayerDesc& l : desc_->layers) {
    if (!l.node) return MakeError(ErrorCode::kEngineMalformed, "a layer has no node");
    Layer layer;
    layer.desc = &l;
    layer.provider = KernelRegistry::Get().Find(backend_->kind(), l.provider_id);
    if (!layer.provider || layer.provider->op_type() != l.node->op_type()) {
      return MakeError(ErrorCode::kEngineMalformed,
                       "layer '{}' ({}): provider '{}' is not registered for backend '{}'",
                       l.node->name(), l.node->op_type(), l.provider_id,
                       ToString(backend_->kind()));
    }
    for (const Value* v : l.node->inputs()) {
      KILN_ASSIGN_OR_RETURN(int id, slot_for(v));
      layer.inputs.push_back(id);
    }
    for (const Value* v : l.node->outputs()) {
      KILN_ASSIGN_OR_RETURN(int id, slot_for(v));
      layer.outputs.push_back(id);
    }
    // A layer makes data-dependent dims when its op's rule says so (ops/data_dependent.cc).
    {
      std::vector<ValueInfo> in_info(l.node->num_inputs());
      std::vector<const ValueInfo*> ins(l.node->num_inputs(), nullptr);
      for (size_t i = 0; i < in_info.size(); ++i) {
        if (!l.node->input(i)) continue;
        in_info[i] = InfoOf(*l.node->input(i));
        ins[i] = &in_info[i];
      }
      std::vector<ValueInfo> outs(l.node->num_outputs());
      if (InferNode(*l.node, ins, outs).ok()) {
        for (const ValueInfo& o : outs) layer.data_dependent |= !o.data_dependent.empty();
      }
      data_dependent_ |= layer.data_dependent;
    }
    // The plan put the view's output on its input's bytes: the copy would be a no-op.
    layer.view = IsAliasedView(*desc_, layers_.size());
    if (layer.view) {
      const Slot& in = slots_[layer.inputs[0]];
      const Slot& out = slots_[layer.outputs[0]];
      if (in.storage != Storage::kArena || out.storage != Storage::kArena ||
          in.offset != out.offset || out.planned_bytes > in.planned_bytes) {
        return MakeError(ErrorCode::kEngineMalformed,
                         "view layer '{}' ({}): '{}' ({} bytes) aliases '{}' ({} bytes) but the "
                         "two are not the same arena bytes",
                         l.node->name(), l.node->op_type(), out.value->name(), out.planned_bytes,
                         in.value->name(), in.planned_bytes);
      }
      ++view_layers_;
    }
    layers_.push_back(std::move(layer));
  }
  // Outputs that no layer writes (constants) are copied into their binding after the layers.
  for (size_t b = 0; b < bindings_.size(); ++b) {
    KILN_ASSIGN_OR_RETURN(int id, slot_for(graph.FindValue(bindings_[b].name)));
    bindings_[b].slot = id;
    if (slots_[id].storage == Storage::kConstant) {
      output_copies_.push_back({static_cast<int>(b), id});
    }
  }

  KILN_RETURN_IF_ERROR(BuildShapeInputs(&shape_device_bytes_));

  // Weights: borrowed where the backend reads host memory, else uploaded once for all contexts.
  weights_bytes_ = static_cast<int64_t>(device_weight_bytes);
  // Checked sums: the plan's figures come from a file and must not wrap past the comparison.
  StatusOr<int64_t> needed =
      CheckedTotalBytes(weights_bytes_, arena_bytes_, ErrorCode::kEngineMalformed, "the plan");
  if (needed.ok()) {
    needed =
        CheckedTotalBytes(*needed, plan.workspace_bytes, ErrorCode::kEngineMalformed, "the plan");
  }
  if (!needed.ok()) return needed.status();
  if (has_shape_inputs() && plan.shape_arena_bytes > arena_bytes_) {
    // The arena contexts allocate for shape inputs replaces the plan's in the peak.
    needed = CheckedTotalBytes(weights_bytes_, plan.shape_arena_bytes, ErrorCode::kEngineMalformed,
                               "the plan");
    if (needed.ok()) {
      needed =
          CheckedTotalBytes(*needed, plan.workspace_bytes, ErrorCode::kEngineMalformed, "the plan");
    }
  }
  if (!needed.ok()) return needed.status();
  if (plan.peak_bytes < *needed) {
    return MakeError(ErrorCode::kEngineMalformed,
                     "the plan's peak ({} bytes) is less than its weights {} + arena {} + "
                     "workspace {}",
                     plan.peak_bytes, weights_bytes_, arena_bytes_, plan.workspace_bytes);
  }
  workspace_bytes_ = plan.workspace_bytes;
  if (has_shape_inputs()) arena_bytes_ = std::max(arena_bytes_, plan.shape_arena_bytes);
  if (auto info = backend_->Info(); info.ok()) device_total_memory_ = info->total_memory;
  std::vector<Tensor> tensors(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].storage == Storage::kConstant) tensors[i] = *slots_[i].value->constant();
  }
  KILN_ASSIGN_OR_RETURN(weights_, MakeWeightSet(std::move(tensors), 0));
  return OkStatus();
}

// Shape inputs: their slots and build values; which slots and layers follow from their values;
// and every arena buffer's lifetime, for contexts that re-plan the arena for other values.
Status Engine::BuildShapeInputs(int64_t* device_bytes) {
  *device_bytes = 0;
  for (const ShapeInputValues& sv : desc_->profile.shape_values) {
    auto b = binding_of_.find(sv.input);
    if (b == binding_of_.end() || !bindings_[b->second].is_input) {
      return MakeError(ErrorCode::kEngineMalformed, "shape values for '{}', not an engine input",
                       sv.input);
    }
    ShapeInput in;
    in.binding = b->second;
    in.slot = bindings_[in.binding].slot;
    const Value* v = slots_[in.slot].value;
    auto dims = StaticDims(v->shape());
    if (!dims || !ShapeValuesFit(sv, v->dtype(), *dims)) {
      return MakeError(ErrorCode::kEngineMalformed,
                       "shape values for '{}': [{}] for type {} and shape {}", sv.input,
                       ShapeValuesText(sv), ToString(v->dtype()), ToString(v->shape()));
    }
    in.build_values = ShapeValuesTensor(sv, v->dtype(), *dims);
    in.device_offset = *device_bytes;
    KILN_ASSIGN_OR_RETURN(
        int64_t bytes,
        CheckedAlignUp(static_cast<int64_t>(in.build_values.size_bytes()), kPlanAlignment,
                       ErrorCode::kEngineMalformed, fmt::format("shape input '{}'", sv.input)));
    *device_bytes += bytes;
    slots_[in.slot].shape_input = static_cast<int>(shape_inputs_.size());
    slots_[in.slot].value_dependent = true;
    shape_inputs_.push_back(std::move(in));
  }
  if (shape_inputs_.empty()) return OkStatus();
  for (Layer& layer : layers_) {
    for (int id : layer.inputs) layer.value_dependent |= id >= 0 && slots_[id].value_dependent;
    for (int id : layer.outputs) {
      if (id >= 0 && layer.value_dependent) slots_[id].value_dependent = true;
    }
  }
  // Lifetimes as the planner computes them (plan/memory_plan.cc): from the producing layer to the
  // last reader; an aliased view's output is its root's buffer.
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const int at = static_cast<int>(l);
    if (layer.view) {
      Slot& out = slots_[layer.outputs[0]];
      out.buffer = slots_[layer.inputs[0]].buffer;
      if (out.buffer >= 0) arena_buffers_[out.buffer].last = at;
      continue;
    }
    for (int id : layer.outputs) {
      if (id < 0 || slots_[id].storage != Storage::kArena || slots_[id].buffer >= 0) continue;
      slots_[id].buffer = static_cast<int>(arena_buffers_.size());
      arena_buffers_.push_back(
          {slots_[id].value, slots_[id].planned_bytes, at, at, slots_[id].offset});
    }
    for (int id : layer.inputs) {
      if (id >= 0 && slots_[id].buffer >= 0) arena_buffers_[slots_[id].buffer].last = at;
    }
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<const Engine::WeightSet>> Engine::MakeWeightSet(
    std::vector<Tensor> tensors, uint64_t generation) const {
  auto set = std::make_shared<WeightSet>();
  set->generation = generation;
  set->tensors = std::move(tensors);
  set->data.assign(slots_.size(), nullptr);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].storage == Storage::kConstant) set->data[i] = set->tensors[i].raw();
  }
  if (!backend_->host_accessible() && weights_bytes_ > 0) {
    KILN_ASSIGN_OR_RETURN(set->device, backend_->Allocate(static_cast<size_t>(weights_bytes_)));
    auto* base = static_cast<std::byte*>(set->device.data());
    std::vector<Backend::HostPiece> pieces;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].storage != Storage::kConstant) continue;
      pieces.push_back(
          {static_cast<size_t>(slots_[i].offset), set->data[i], set->tensors[i].size_bytes()});
      set->data[i] = base + slots_[i].offset;
    }
    // One staged upload of the whole set (pinned memory, copies overlapped with the transfers):
    // copy by copy from pageable memory it was a third of a BERT-base FP16 refit on the H200.
    KILN_RETURN_IF_ERROR(backend_->UploadPieces(base, static_cast<size_t>(weights_bytes_), pieces));
  }
  return std::shared_ptr<const WeightSet>(std::move(set));
}

std::shared_ptr<const Engine::WeightSet> Engine::CurrentWeights() const {
  std::lock_guard lock(weights_mutex_);
  return weights_;
}

uint64_t Engine::weights_generation() const {
  return weights_generation_.load(std::memory_order_acquire);
}

StatusOr<uint64_t> Engine::RefitWeights(const std::map<std::string, Tensor>& constants) const {
  // One refit at a time: the next starts from the set this one publishes.
  std::lock_guard refit_lock(refit_mutex_);
  std::shared_ptr<const WeightSet> current = CurrentWeights();
  std::vector<Tensor> tensors = current->tensors;  // shares every unchanged tensor's bytes
  for (const auto& [name, t] : constants) {
    const Value* v = desc_->graph->FindValue(name);
    auto it = v ? slot_of_.find(v) : slot_of_.end();
    if (it == slot_of_.end() || slots_[it->second].storage != Storage::kConstant) {
      // A constant no layer reads has no slot: nothing runs with it, so there is nothing to swap.
      if (v && v->is_constant() && v->dtype() == t.dtype() && v->constant()->dims() == t.dims()) {
        continue;
      }
      return MakeError(ErrorCode::kRefitWeightsMismatch,
                       "'{}' is not a weight of engine '{}' with that dtype and shape", name,
                       desc_->header.model_name);
    }
    const Tensor& old = tensors[it->second];
    if (old.dtype() != t.dtype() || old.dims() != t.dims()) {
      return MakeError(ErrorCode::kRefitWeightsMismatch,
                       "weight '{}' is {}[{}] in engine '{}'; the refit gives {}[{}]", name,
                       ToString(old.dtype()), fmt::join(old.dims(), ","), desc_->header.model_name,
                       ToString(t.dtype()), fmt::join(t.dims(), ","));
    }
    tensors[it->second] = t;
  }
  const uint64_t generation = current->generation + 1;
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightSet> next,
                        MakeWeightSet(std::move(tensors), generation));
  {
    std::lock_guard lock(weights_mutex_);
    weights_ = std::move(next);
  }
  weights_generation_.store(generation, std::memory_order_release);
  return generation;
}

StatusOr<std::unique_ptr<ExecutionContext>> Engine::CreateExecutionContext(
    const ExecutionOptions& options) const {
  // Everything a context allocates is its own: a failure here (out of device memory) frees what
  // was made so far with `ctx` and leaves the engine as it was.
  std::unique_ptr<ExecutionContext> ctx(new ExecutionContext(shared_from_this(), options));
  KILN_RETURN_IF_ERROR_CTX(ctx->Init(), "while creating an execution context for '{}'",
                           desc_->header.model_name);
  return ctx;
}

// ---------------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<Runtime>> Runtime::Create(BackendKind kind) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(kind));
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, backend->Info());
  return std::unique_ptr<Runtime>(new Runtime(backend, std::move(info)));
}

StatusOr<std::unique_ptr<Runtime>> Runtime::CreateForEngine(const EngineHeader& header) {
  auto runtime = Create(header.backend);
  if (runtime.ok() || header.backend == BackendKind::kCpu) return runtime;
  return MakeError(ErrorCode::kEngineNeedsGpu,
                   "engine '{}' was built for backend '{}' on arch '{}' ({}); this machine "
                   "cannot run that backend ({}: {})",
                   header.model_name, ToString(header.backend), header.device_arch,
                   header.library_versions, runtime.status().Id(), runtime.status().message());
}

LoadOptions Runtime::Options() const {
  LoadOptions o;
  o.expected_backend = backend_->kind();
  o.expected_arch = device_.arch;
  return o;
}

StatusOr<std::shared_ptr<const Engine>> Runtime::LoadEngine(const std::string& path) const {
  KILN_ASSIGN_OR_RETURN(auto desc, LoadEngineFile(path, Options()));
  return Engine::Create(std::move(desc), backend_);
}

StatusOr<std::shared_ptr<const Engine>> Runtime::DeserializeEngine(
    std::span<const std::byte> bytes) const {
  KILN_ASSIGN_OR_RETURN(auto desc, LoadEngineBytes(bytes, Options()));
  return Engine::Create(std::move(desc), backend_);
}

StatusOr<std::shared_ptr<const Engine>> Runtime::CreateEngine(
    std::shared_ptr<const EngineDesc> desc) const {
  if (!desc) return MakeError(ErrorCode::kInvalidArgument, "no engine to run");
  KILN_RETURN_IF_ERROR(CheckEngineTarget(desc->header, backend_->kind(), device_.arch));
  return Engine::Create(std::move(desc), backend_);
}

}  // namespace kiln
