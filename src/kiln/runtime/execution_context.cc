// ExecutionContext: per-context kernels, arena and workspace; shape propagation with concrete
// dims when input shapes are set; an allocation-free Execute (eager, graph replay, or timed).
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "kiln/core/logging.h"
#include "kiln/core/params.h"
#include "kiln/ops/op_schema.h"
#include "kiln/plan/memory_plan.h"
#include "kiln/runtime/runtime.h"

namespace kiln {

namespace {
// A shape input's current values as text, for messages ("2,-1", "1,1,0.6,0.6").
std::string ShapeValuesTextOf(const Tensor& t) {
  std::vector<std::string> items;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    items.push_back(IsInteger(t.dtype()) ? fmt::format("{}", t.GetInt(i))
                                         : fmt::format("{}", t.GetDouble(i)));
  }
  return fmt::format("{}", fmt::join(items, ","));
}
}  // namespace

ExecutionContext::ExecutionContext(std::shared_ptr<const Engine> engine,
                                   const ExecutionOptions& options)
    : engine_(std::move(engine)), options_(options) {}

// Graphs and events go before the stream they were used on.
ExecutionContext::~ExecutionContext() {
  graphs_.clear();
  events_.clear();
}

int64_t ExecutionContext::allocated_bytes() const {
  return static_cast<int64_t>(arena_.size() + workspace_.size());
}

StatusOr<std::unique_ptr<Kernel>> ExecutionContext::CreateKernel(size_t l) const {
  return CreateKernelFor(l, /*concrete=*/false);
}

// `concrete`: value-dependent operands are described by the dims they have now (the engine's
// shapes hold for the build's shape input values only).
StatusOr<std::unique_ptr<Kernel>> ExecutionContext::CreateKernelFor(size_t l, bool concrete) const {
  const Engine& e = *engine_;
  const Engine::Layer& layer = e.layers_[l];
  KernelRequest request;
  request.node = layer.desc->node;
  auto describe = [&](const Value* v, int slot) {
    OperandDesc d;
    if (!v) return d;
    d.dtype = v->dtype();
    const Engine::Slot* s = slot >= 0 ? &e.slots_[slot] : nullptr;
    if (concrete && s && s->value_dependent) {
      d.shape = MakeShape(dims_[slot]);
      d.max_dims = dims_[slot];
    } else {
      d.shape = v->shape();
      if (auto dims = ConcreteDims(*v, e.max_bindings_); dims.ok()) d.max_dims = std::move(*dims);
    }
    // Weights come from this context's generation (a refit replaces them; the desc keeps the
    // ones it was loaded with); a shape input's values are the ones shapes follow now.
    d.constant = v->constant() && s ? &weights_->tensors[slot] : v->constant();
    if (s && s->shape_input >= 0) d.constant = &shape_values_[s->shape_input];
    return d;
  };
  for (size_t i = 0; i < request.node->num_inputs(); ++i) {
    request.inputs.push_back(describe(request.node->input(i), layer.inputs[i]));
  }
  for (size_t i = 0; i < request.node->num_outputs(); ++i) {
    request.outputs.push_back(describe(request.node->output(i), layer.outputs[i]));
  }
  auto kernel = layer.provider->Create(request, layer.desc->tactic);
  if (!kernel.ok()) {
    return std::move(kernel).status().AddContext(
        fmt::format("while creating layer '{}' with provider '{}' tactic '{}'",
                    request.node->name(), layer.provider->id(), layer.desc->tactic.name));
  }
  return std::move(*kernel);
}

Status ExecutionContext::Init() {
  const Engine& e = *engine_;
  weights_ = e.CurrentWeights();
  // Shape inputs start at the values the engine was built for (its plan holds for them). Own
  // storage: ReadShapeValues writes new values into it in place.
  for (const Engine::ShapeInput& in : e.shape_inputs_) {
    shape_values_.push_back(Tensor::FromBytes(in.build_values.dtype(), in.build_values.dims(),
                                              in.build_values.bytes()));
  }

  // Kernels: one per layer, from the stored provider and tactic; none for aliased views.
  for (size_t l = 0; l < e.layers_.size(); ++l) {
    if (e.layers_[l].view) {
      kernels_.push_back(nullptr);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel, CreateKernel(l));
    kernels_.push_back(std::move(kernel));
  }

  // The only device allocations this context ever makes; checked against the device first so
  // an engine for a bigger device fails with the sizes instead of an allocator's null.
  const uint64_t wanted = static_cast<uint64_t>(e.arena_bytes_) + e.workspace_bytes_;
  if (e.device_total_memory_ > 0 && wanted > e.device_total_memory_) {
    return MakeError(ErrorCode::kMemoryBudgetExceeded,
                     "an execution context needs {} bytes (arena {}, workspace {}) but the device "
                     "has {} bytes in total",
                     wanted, e.arena_bytes_, e.workspace_bytes_, e.device_total_memory_);
  }
  if (e.arena_bytes_ > 0) {
    KILN_ASSIGN_OR_RETURN(arena_, e.backend_->Allocate(static_cast<size_t>(e.arena_bytes_)));
  }
  if (e.workspace_bytes_ > 0) {
    KILN_ASSIGN_OR_RETURN(workspace_,
                          e.backend_->Allocate(static_cast<size_t>(e.workspace_bytes_)));
  }
  if (actual_peak_bytes() > e.planned_peak_bytes()) {
    return MakeError(ErrorCode::kMemoryPlanViolated,
                     "the context holds {} bytes (arena {}, workspace {}, weights {}) but the "
                     "engine planned a peak of {}",
                     actual_peak_bytes(), arena_.size(), workspace_.size(), e.weights_bytes(),
                     e.planned_peak_bytes());
  }

  KILN_LOG(Debug, RUNTIME,
           "execution context: arena {} + workspace {} + weights {} = {} bytes (planned peak {})",
           arena_.size(), workspace_.size(), e.weights_bytes(), actual_peak_bytes(),
           e.planned_peak_bytes());

  const size_t n = e.slots_.size();
  dims_.assign(n, {});
  ptrs_.assign(n, nullptr);
  views_of_slot_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    const Engine::Slot& s = e.slots_[i];
    if (s.storage == Engine::Storage::kArena) {
      ptrs_[i] = static_cast<std::byte*>(arena_.data()) + s.offset;
    } else if (s.storage == Engine::Storage::kConstant) {
      ptrs_[i] = const_cast<void*>(weights_->data[i]);  // kernels never write their inputs
      dims_[i] = s.value->constant()->dims();
    }
  }
  // Layers read a shape input from the context's copy of its values: host memory, or the end of
  // the arena on a backend that cannot read host memory.
  for (size_t k = 0; k < e.shape_inputs_.size(); ++k) {
    const Engine::ShapeInput& in = e.shape_inputs_[k];
    if (e.backend_->host_accessible()) {
      ptrs_[in.slot] = const_cast<void*>(shape_values_[k].raw());
    } else {
      ptrs_[in.slot] = static_cast<std::byte*>(arena_.data()) + arena_.size() -
                       e.shape_device_bytes_ + in.device_offset;
    }
  }
  KILN_RETURN_IF_ERROR(CopyShapeValuesToDevice());
  // The operand dims each value-dependent kernel was made for (the engine's, at first).
  kernel_dims_.assign(e.layers_.size(), {});
  for (size_t l = 0; l < e.layers_.size(); ++l) {
    if (!e.layers_[l].value_dependent || e.layers_[l].view) continue;
    for (const auto* ids : {&e.layers_[l].inputs, &e.layers_[l].outputs}) {
      for (int id : *ids) {
        auto dims = id >= 0 ? ConcreteDims(*e.slots_[id].value, e.max_bindings_)
                            : StatusOr<std::vector<int64_t>>(std::vector<int64_t>{});
        kernel_dims_[l].push_back(dims.ok() ? std::move(*dims) : std::vector<int64_t>{-1});
      }
    }
  }
  binding_ptrs_.assign(e.bindings_.size(), nullptr);
  input_shape_set_.assign(e.bindings_.size(), false);
  graph_key_.reserve(e.bindings_.size());
  KILN_ASSIGN_OR_RETURN(own_stream_, e.backend_->CreateStream());
  if (own_stream_) {
    KILN_ASSIGN_OR_RETURN(order_in_, e.backend_->CreateEvent());
    KILN_ASSIGN_OR_RETURN(order_out_, e.backend_->CreateEvent());
  }
  if (options_.layer_timing) KILN_RETURN_IF_ERROR(SetLayerTiming(true));

  // Inputs whose shapes are fully static need no SetInputShape.
  bool all_static = true;
  for (size_t b = 0; b < e.bindings_.size(); ++b) {
    const Engine::Binding& binding = e.bindings_[b];
    if (!binding.is_input) continue;
    auto dims = StaticDims(e.slots_[binding.slot].value->shape());
    if (!dims) {
      all_static = false;
      continue;
    }
    dims_[binding.slot] = *dims;
    input_shape_set_[b] = true;
  }
  return all_static ? Propagate() : OkStatus();
}

std::string Engine::BindingNames(bool inputs, bool outputs) const {
  std::vector<std::string> names;
  for (const Binding& b : bindings_) {
    if ((b.is_input && inputs) || (!b.is_input && outputs)) names.push_back("'" + b.name + "'");
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

StatusOr<int> Engine::FindBinding(const std::string& name) const {
  auto it = binding_of_.find(name);
  if (it == binding_of_.end()) {
    return MakeError(ErrorCode::kUnknownBinding,
                     "the engine has no input or output named '{}'; inputs: {}; outputs: {}", name,
                     BindingNames(true, false), BindingNames(false, true));
  }
  return it->second;
}

std::string ExecutionContext::BindingNames(bool inputs, bool outputs) const {
  return engine_->BindingNames(inputs, outputs);
}

StatusOr<int> ExecutionContext::FindBinding(const std::string& name) const {
  return engine_->FindBinding(name);
}

Status Engine::CheckInputShape(const std::string& name, std::span<const int64_t> dims) const {
  KILN_ASSIGN_OR_RETURN(int b, FindBinding(name));
  const Binding& binding = bindings_[b];
  if (!binding.is_input) {
    return MakeError(ErrorCode::kUnknownBinding,
                     "'{}' is an output (its shape follows from the inputs); inputs: {}", name,
                     BindingNames(true, false));
  }
  const Shape& shape = slots_[binding.slot].value->shape();
  if (dims.size() != shape.size()) {
    return MakeError(ErrorCode::kInputShapeInvalid,
                     "input '{}' has rank {} (shape {}); got [{}] of rank {}", name, shape.size(),
                     ToString(shape), fmt::join(dims, ","), dims.size());
  }
  const InputProfile* profile = desc_->profile.Find(name);
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return MakeError(ErrorCode::kInputShapeInvalid, "input '{}' dimension {} is negative ({})",
                       name, i, dims[i]);
    }
    if (auto fixed = shape[i].static_value()) {
      if (*fixed != dims[i]) {
        return MakeError(ErrorCode::kInputShapeInvalid,
                         "input '{}' dimension {} is fixed at {} (shape {}); got {}", name, i,
                         *fixed, ToString(shape), dims[i]);
      }
      continue;
    }
    if (!profile) {
      return MakeError(ErrorCode::kMissingProfile, "dynamic input '{}' has no profile", name);
    }
    if (dims[i] < profile->min[i] || dims[i] > profile->max[i]) {
      return MakeError(ErrorCode::kShapeOutsideProfile,
                       "input '{}' dimension {} ('{}') is {}, outside the profile's [{}, {}]", name,
                       i, shape[i].ToString(), dims[i], profile->min[i], profile->max[i]);
    }
  }
  // Within the profile and the static dims, both checked against the size limits at load
  // (Engine::Build), so the shape is too.
  return OkStatus();
}

Status ExecutionContext::SetInputShape(const std::string& name, std::span<const int64_t> dims) {
  KILN_RETURN_IF_ERROR(engine_->CheckInputShape(name, dims));
  const int b = engine_->binding_of_.at(name);  // CheckInputShape found it
  dims_[engine_->bindings_[b].slot].assign(dims.begin(), dims.end());
  input_shape_set_[b] = true;
  // Propagation waits until the shapes are used: inputs that share a symbol ("batch") may be
  // changed one after another, and only the final combination must agree.
  shapes_ready_ = false;
  return OkStatus();
}

Status ExecutionContext::InferShapes() {
  KILN_RETURN_IF_ERROR(ReadShapeValues());
  if (shapes_ready_) return OkStatus();
  for (size_t k = 0; k < engine_->bindings_.size(); ++k) {
    if (engine_->bindings_[k].is_input && !input_shape_set_[k]) {
      return MakeError(ErrorCode::kInputShapeInvalid,
                       "the shape of input '{}' is not set (inputs: {})",
                       engine_->bindings_[k].name, BindingNames(true, false));
    }
  }
  return Propagate();
}

Status ExecutionContext::Propagate(bool mid_run) {
  shapes_ready_ = false;
  // New input shapes: data-dependent dims read as their bounds until a layer reports them.
  if (!mid_run) dd_values_.clear();
  reported_.resize(engine_->layers_.size());
  // Kernels are prepared again below: graphs captured with the old preparation are stale.
  graphs_.clear();
  next_graph_slot_ = 0;
  const Engine& e = *engine_;

  // The same symbol must take one value across inputs ("batch" in two inputs).
  std::map<std::string, std::pair<int64_t, std::string>> symbols;
  for (const Engine::Binding& b : e.bindings_) {
    if (!b.is_input) continue;
    const Shape& shape = e.slots_[b.slot].value->shape();
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i].is_static()) continue;
      auto syms = shape[i].Symbols();
      if (syms.size() != 1 || !(shape[i] == Dim::Symbol(syms[0]))) continue;
      auto [it, inserted] = symbols.emplace(syms[0], std::make_pair(dims_[b.slot][i], b.name));
      if (!inserted && it->second.first != dims_[b.slot][i]) {
        return MakeError(ErrorCode::kInputShapeInvalid,
                         "dimension '{}' is {} in input '{}' but {} in input '{}'", syms[0],
                         it->second.first, it->second.second, dims_[b.slot][i], b.name);
      }
    }
  }

  // Concrete shape inference, layer by layer, with the ops layer's rules.
  std::vector<ValueInfo> info(e.slots_.size());
  std::vector<bool> known(e.slots_.size(), false);
  for (size_t i = 0; i < e.slots_.size(); ++i) {
    const Engine::Slot& s = e.slots_[i];
    if (s.storage == Engine::Storage::kInput || s.storage == Engine::Storage::kConstant) {
      info[i].dtype = s.value->dtype();
      info[i].shape = MakeShape(dims_[i]);
      info[i].constant =
          s.storage == Engine::Storage::kConstant ? &weights_->tensors[i] : s.value->constant();
      if (s.shape_input >= 0) info[i].shape_input_values = &shape_values_[s.shape_input];
      known[i] = true;
    }
  }
  for (const Engine::Layer& layer : e.layers_) {
    const Node& node = *layer.desc->node;
    std::vector<const ValueInfo*> ins;
    for (int id : layer.inputs) ins.push_back(id < 0 ? nullptr : &info[id]);
    std::vector<ValueInfo> outs(layer.outputs.size());
    KILN_RETURN_IF_ERROR_CTX(InferNode(node, ins, outs), "while inferring shapes of layer '{}'",
                             node.name());
    if (layer.data_dependent) {
      // Where each symbol sits, for ReadReportedDims (names as the rule gives them now).
      std::vector<ReportedDim>& where = reported_[&layer - e.layers_.data()];
      where.clear();
      for (size_t k = 0; k < outs.size(); ++k) {
        for (const auto& [symbol, bound] : outs[k].data_dependent) {
          for (size_t i = 0; i < outs[k].shape.size(); ++i) {
            if (outs[k].shape[i] == Dim::Symbol(symbol)) where.push_back({k, i, symbol});
          }
        }
      }
      KILN_RETURN_IF_ERROR(BindDataDependentDims(node, outs, dd_values_, &dd_bounds_));
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      int id = layer.outputs[k];
      if (id < 0) continue;
      const Value* v = e.slots_[id].value;
      auto dims = StaticDims(outs[k].shape);
      if (!dims) {
        return MakeError(ErrorCode::kInternal,
                         "layer '{}': output '{}' has shape {} even with concrete inputs",
                         node.name(), v->name(), ToString(outs[k].shape));
      }
      if (outs[k].dtype != v->dtype()) {
        return MakeError(ErrorCode::kInternal,
                         "layer '{}': output '{}' is {} at run time but {} "
                         "in the engine",
                         node.name(), v->name(), ToString(outs[k].dtype), ToString(v->dtype()));
      }
      // Value-dependent buffers are checked, and re-planned when they outgrow the plan, below.
      if (e.slots_[id].storage == Engine::Storage::kArena && !e.slots_[id].value_dependent) {
        int64_t bytes = static_cast<int64_t>(SizeOf(v->dtype()));
        for (int64_t d : *dims) {
          if (__builtin_mul_overflow(bytes, d, &bytes)) bytes = INT64_MAX;
        }
        if (bytes > e.slots_[id].planned_bytes) {
          return MakeError(ErrorCode::kMemoryPlanViolated,
                           "value '{}' needs {} bytes for shape [{}] but the plan reserved {}",
                           v->name(), bytes, fmt::join(*dims, ","), e.slots_[id].planned_bytes);
        }
      }
      dims_[id] = std::move(*dims);
      info[id] = std::move(outs[k]);
      info[id].shape = MakeShape(dims_[id]);
      known[id] = true;
    }
  }

  if (e.has_shape_inputs()) KILN_RETURN_IF_ERROR(Respecialize(mid_run));
  if (!mid_run) {
    binding_max_dims_.assign(e.bindings_.size(), {});
    for (size_t b = 0; b < e.bindings_.size(); ++b) {
      binding_max_dims_[b] = dims_[e.bindings_[b].slot];
    }
  }

  // Views: one flat array, spans per layer; data pointers from the slots and bindings.
  views_.clear();
  layer_views_.clear();
  for (auto& v : views_of_slot_) v.clear();
  auto add_view = [&](int id) {
    TensorView view;
    if (id >= 0) {
      view.dtype = e.slots_[id].value->dtype();
      view.dims = dims_[id];
      view.data = ptrs_[id];
      views_of_slot_[id].push_back(views_.size());
    }
    views_.push_back(view);
  };
  for (const Engine::Layer& layer : e.layers_) {
    LayerViews lv{views_.size(), layer.inputs.size(), 0, layer.outputs.size()};
    for (int id : layer.inputs) add_view(id);
    lv.out_begin = views_.size();
    for (int id : layer.outputs) add_view(id);
    layer_views_.push_back(lv);
  }

  // Kernels see their shapes once, here; their workspace must fit the planned region.
  for (size_t l = 0; l < e.layers_.size(); ++l) {
    const LayerViews& lv = layer_views_[l];
    std::span<const TensorView> ins(views_.data() + lv.in_begin, lv.in_count);
    std::span<const TensorView> outs(views_.data() + lv.out_begin, lv.out_count);
    const Node& node = *e.layers_[l].desc->node;
    if (e.layers_[l].view) {
      // The shape rules already hold the element count; a view that changed the byte count
      // would let the next layer read past its input's bytes.
      if (ins[0].size_bytes() != outs[0].size_bytes()) {
        return MakeError(ErrorCode::kInternal,
                         "view layer '{}' ({}) maps {} bytes onto {}: not the same bytes",
                         node.name(), node.op_type(), ins[0].size_bytes(), outs[0].size_bytes());
      }
      continue;
    }
    auto need = kernels_[l]->Prepare(ins, outs);
    if (!need.ok()) {
      return std::move(need).status().AddContext(
          fmt::format("while preparing layer '{}'", node.name()));
    }
    if (*need > workspace_.size()) {
      return MakeError(ErrorCode::kMemoryPlanViolated,
                       "layer '{}' ({}) needs {} bytes of workspace for these shapes; the plan "
                       "reserved {}",
                       node.name(), e.layers_[l].desc->tactic.name, *need, workspace_.size());
    }
  }
  shapes_ready_ = true;
  return OkStatus();
}

Status ExecutionContext::ReadShapeValues() {
  const Engine& e = *engine_;
  for (size_t k = 0; k < e.shape_inputs_.size(); ++k) {
    const void* bound = binding_ptrs_[e.shape_inputs_[k].binding];
    Tensor& now = shape_values_[k];
    if (!bound || std::memcmp(bound, now.raw(), now.size_bytes()) == 0) continue;
    // In place, into the context's own storage (Init made it; the slot points at it). Kernels
    // that kept a copy of the old values are made again by Respecialize.
    std::memcpy(const_cast<void*>(now.raw()), bound, now.size_bytes());
    shape_values_changed_ = true;
    shapes_ready_ = false;
  }
  return OkStatus();
}

Status ExecutionContext::CopyShapeValuesToDevice() {
  const Engine& e = *engine_;
  if (e.backend_->host_accessible() || e.shape_inputs_.empty()) return OkStatus();
  // Runs still in flight may read the old values.
  KILN_RETURN_IF_ERROR(e.backend_->Synchronize(own_stream_.get()));
  KILN_RETURN_IF_ERROR(e.backend_->Synchronize(nullptr));
  for (size_t k = 0; k < e.shape_inputs_.size(); ++k) {
    KILN_RETURN_IF_ERROR(e.backend_->CopyToDevice(ptrs_[e.shape_inputs_[k].slot],
                                                  shape_values_[k].raw(),
                                                  shape_values_[k].size_bytes(), nullptr));
  }
  return e.backend_->Synchronize(nullptr);
}

Status ExecutionContext::Respecialize(bool mid_run) {
  const Engine& e = *engine_;
  // Arena: each buffer's bytes for the shapes inferred now.
  std::vector<PlannedBuffer> buffers = e.arena_buffers_;
  bool fits = true;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int root = e.slot_of_.at(buffers[i].value);
    int64_t bytes = static_cast<int64_t>(SizeOf(buffers[i].value->dtype()));
    for (int64_t d : dims_[root]) {
      if (__builtin_mul_overflow(bytes, d, &bytes)) bytes = INT64_MAX;
    }
    bytes = bytes > INT64_MAX - kPlanAlignment
                ? INT64_MAX
                : (bytes + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
    fits = fits && bytes <= buffers[i].bytes;
    buffers[i].bytes = bytes;
  }
  auto* arena = static_cast<std::byte*>(arena_.data());
  if (mid_run) {
    // Earlier layers' outputs are in place: data-dependent dims that changed mid-run must fit
    // the buffers as they are placed now.
    const std::vector<PlannedBuffer>& placed =
        arena_replanned_ ? placed_buffers_ : e.arena_buffers_;
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].bytes > placed[i].bytes) {
        return MakeError(ErrorCode::kMemoryPlanViolated,
                         "value '{}' needs {} bytes after a data-dependent dim was reported, but "
                         "its buffer holds {}",
                         buffers[i].value->name(), buffers[i].bytes, placed[i].bytes);
      }
    }
  } else if (fits && arena_replanned_) {
    // Back within the engine's plan: its offsets again.
    for (size_t i = 0; i < e.slots_.size(); ++i) {
      if (e.slots_[i].storage == Engine::Storage::kArena) ptrs_[i] = arena + e.slots_[i].offset;
    }
    arena_replanned_ = false;
  } else if (!fits) {
    const int64_t limit =
        static_cast<int64_t>(arena_.size()) - static_cast<int64_t>(e.shape_device_bytes_);
    const int64_t need = PlaceBuffers(buffers);
    if (need > limit) {
      std::vector<std::string> values;
      for (size_t k = 0; k < e.shape_inputs_.size(); ++k) {
        values.push_back(fmt::format("'{}' = [{}]", e.bindings_[e.shape_inputs_[k].binding].name,
                                     ShapeValuesTextOf(shape_values_[k])));
      }
      return MakeError(ErrorCode::kShapeValuesExceedArena,
                       "shape input values {} need {} bytes of activations; engine '{}' bounds "
                       "them to {} bytes (its plan for the build's values needs {})",
                       fmt::join(values, ", "), need, e.desc_->header.model_name, limit,
                       e.desc_->plan.arena_bytes);
    }
    for (size_t i = 0; i < e.slots_.size(); ++i) {
      const Engine::Slot& s = e.slots_[i];
      if (s.storage == Engine::Storage::kArena) ptrs_[i] = arena + buffers[s.buffer].offset;
    }
    arena_replanned_ = true;
    placed_buffers_ = buffers;
    ++arena_replans_;
  }
  // Kernels of value-dependent layers whose operands changed (or that read new values).
  for (size_t l = 0; l < e.layers_.size(); ++l) {
    const Engine::Layer& layer = e.layers_[l];
    if (!layer.value_dependent || layer.view) continue;
    std::vector<std::vector<int64_t>> now;
    bool reads_values = false;
    for (const auto* ids : {&layer.inputs, &layer.outputs}) {
      for (int id : *ids) {
        now.push_back(id >= 0 ? dims_[id] : std::vector<int64_t>{});
        reads_values |= id >= 0 && e.slots_[id].shape_input >= 0;
      }
    }
    if (now == kernel_dims_[l] && !(reads_values && shape_values_changed_)) continue;
    KILN_ASSIGN_OR_RETURN(kernels_[l], CreateKernelFor(l, /*concrete=*/true));
    kernel_dims_[l] = std::move(now);
  }
  if (shape_values_changed_) {
    KILN_RETURN_IF_ERROR(CopyShapeValuesToDevice());
    shape_values_changed_ = false;
    ++shape_specializations_;
  }
  return OkStatus();
}

void ExecutionContext::UpdateViewPointers(int slot) {
  for (size_t v : views_of_slot_[slot]) views_[v].data = ptrs_[slot];
}

Status ExecutionContext::SetTensorAddress(const std::string& name, void* data) {
  KILN_ASSIGN_OR_RETURN(int b, FindBinding(name));
  if (!data) {
    return MakeError(ErrorCode::kInvalidArgument, "binding '{}' to a null address", name);
  }
  binding_ptrs_[b] = data;
  const Engine::Binding& binding = engine_->bindings_[b];
  // A shape input is read (host memory) when shapes are used; layers read the context's copy.
  if (engine_->slots_[binding.slot].storage != Engine::Storage::kConstant &&
      engine_->slots_[binding.slot].shape_input < 0) {
    ptrs_[binding.slot] = data;
    UpdateViewPointers(binding.slot);
  }
  return OkStatus();
}

Status ExecutionContext::BindTensor(const std::string& name, const TensorView& view) {
  KILN_ASSIGN_OR_RETURN(int b, FindBinding(name));
  const Engine::Binding& binding = engine_->bindings_[b];
  if (view.dtype != binding.dtype) {
    return MakeError(ErrorCode::kInputTypeMismatch, "{} '{}' is {} in the engine; got {}",
                     binding.is_input ? "input" : "output", name, ToString(binding.dtype),
                     ToString(view.dtype));
  }
  if (binding.is_input) KILN_RETURN_IF_ERROR(SetInputShape(name, view.dims));
  return SetTensorAddress(name, view.data);
}

StatusOr<std::vector<int64_t>> ExecutionContext::GetMaxTensorShape(const std::string& name) {
  KILN_ASSIGN_OR_RETURN(int b, FindBinding(name));
  const Engine::Binding& binding = engine_->bindings_[b];
  if (binding.is_input && input_shape_set_[b]) return dims_[binding.slot];
  if (Status s = InferShapes(); !s.ok()) {
    return std::move(s).AddContext(
        fmt::format("the shape of '{}' follows from every input shape", name));
  }
  return binding_max_dims_[b];
}

Status ExecutionContext::ReadReportedDims(size_t l, bool* changed) {
  const Engine& e = *engine_;
  const Engine::Layer& layer = e.layers_[l];
  const Node& node = *layer.desc->node;
  const std::vector<ReportedDim>& where = reported_[l];
  for (size_t k = 0; k < layer.outputs.size(); ++k) {
    const int id = layer.outputs[k];
    if (id < 0) continue;
    const std::vector<int64_t>* got = kernels_[l]->RunOutputDims(k);
    if (!got || got->size() != dims_[id].size()) {
      return MakeError(ErrorCode::kInternal,
                       "layer '{}' ({}): the kernel reported no dims of rank {} for output '{}'",
                       node.name(), node.op_type(), dims_[id].size(), e.slots_[id].value->name());
    }
    for (size_t i = 0; i < got->size(); ++i) {
      const int64_t v = (*got)[i];
      auto it = std::find_if(where.begin(), where.end(),
                             [&](const ReportedDim& r) { return r.output == k && r.dim == i; });
      if (it == where.end()) {
        if (v != dims_[id][i]) {
          return MakeError(ErrorCode::kInternal,
                           "layer '{}' ({}): output '{}' dimension {} is {} but its shape makes it "
                           "{}",
                           node.name(), node.op_type(), e.slots_[id].value->name(), i, v,
                           dims_[id][i]);
        }
        continue;
      }
      const int64_t bound = dd_bounds_.at(it->symbol);
      if (v < 0 || v > bound) {
        return MakeError(
            ErrorCode::kInternal,
            "layer '{}' ({}): reported {} for data-dependent dim '{}', outside [0, {}]",
            node.name(), node.op_type(), v, it->symbol, bound);
      }
      dd_values_[it->symbol] = v;
      if (v != dims_[id][i]) *changed = true;
    }
  }
  return OkStatus();
}

StatusOr<std::vector<int64_t>> ExecutionContext::GetTensorShape(const std::string& name) {
  KILN_ASSIGN_OR_RETURN(int b, FindBinding(name));
  const Engine::Binding& binding = engine_->bindings_[b];
  if (binding.is_input && input_shape_set_[b]) return dims_[binding.slot];
  if (Status s = InferShapes(); !s.ok()) {
    return std::move(s).AddContext(
        fmt::format("the shape of '{}' follows from every input shape", name));
  }
  return dims_[binding.slot];
}

Status ExecutionContext::AdoptWeights(void* stream) {
  const Engine& e = *engine_;
  // Runs already enqueued read the old bytes: they finish before those can be released.
  KILN_RETURN_IF_ERROR(e.backend_->Synchronize(stream ? stream : own_stream_.get()));
  std::shared_ptr<const Engine::WeightSet> next = e.CurrentWeights();
  std::shared_ptr<const Engine::WeightSet> previous = std::move(weights_);
  weights_ = next;
  // Kernels may pack or quantize their weights when created: those reading a weight are made
  // again, unless they renew them in place (a cuDNN convolution re-packs its channels-last copy on
  // the GPU; a matrix product reads them at run time). On any failure while making them the
  // context keeps the old generation whole.
  std::vector<std::pair<size_t, std::unique_ptr<Kernel>>> remade;
  std::vector<size_t> renewed;
  for (size_t l = 0; l < e.layers_.size(); ++l) {
    if (e.layers_[l].view) continue;
    bool reads_weight = false;
    for (int id : e.layers_[l].inputs) {
      reads_weight |= id >= 0 && e.slots_[id].storage == Engine::Storage::kConstant;
    }
    if (!reads_weight) continue;
    // (A context that never saw its shapes has no views to renew with: it makes the kernel.)
    if (kernels_[l]->renews_weights() && l < layer_views_.size()) {
      renewed.push_back(l);
      continue;
    }
    auto kernel = CreateKernel(l);
    if (!kernel.ok()) {
      weights_ = std::move(previous);
      return std::move(kernel).status().AddContext("while switching to refit weights");
    }
    remade.emplace_back(l, std::move(*kernel));
  }
  for (auto& [l, kernel] : remade) kernels_[l] = std::move(kernel);
  for (size_t i = 0; i < e.slots_.size(); ++i) {
    if (e.slots_[i].storage != Engine::Storage::kConstant) continue;
    ptrs_[i] = const_cast<void*>(weights_->data[i]);
    UpdateViewPointers(static_cast<int>(i));
  }
  for (size_t l : renewed) {
    const LayerViews& lv = layer_views_[l];
    Status renew = kernels_[l]->RenewWeights({views_.data() + lv.in_begin, lv.in_count},
                                             stream ? stream : own_stream_.get());
    if (renew.ok()) continue;
    // A kernel that could not renew in place is made from the new weights instead; if that fails
    // too, the context goes back to the old set's record, so that its next run adopts the new
    // weights again rather than run a kernel that still holds the old ones.
    auto kernel = CreateKernel(l);
    if (!kernel.ok()) {
      weights_ = std::move(previous);
      return std::move(renew).AddContext(
          fmt::format("while layer '{}' took the refit weights", e.layers_[l].desc->node->name()));
    }
    kernels_[l] = std::move(*kernel);
  }
  graphs_.clear();  // captured with the old weights' addresses
  next_graph_slot_ = 0;
  // New kernels see their shapes again before they run.
  if (shapes_ready_) {
    shapes_ready_ = false;
    KILN_RETURN_IF_ERROR(InferShapes());
  }
  return OkStatus();
}

Status ExecutionContext::Execute(void* stream) {
  // Every check here only reads; messages are built (and allocate) only on failure. New input
  // shapes are propagated first (that path allocates; steady-state runs never do), and refit
  // weights are taken between runs (that allocates too).
  if (engine_->weights_generation_.load(std::memory_order_acquire) != weights_->generation) {
    KILN_RETURN_IF_ERROR(AdoptWeights(stream));
  }
  KILN_RETURN_IF_ERROR(InferShapes());  // reads shape inputs' values; a no-op when unchanged
  for (size_t b = 0; b < binding_ptrs_.size(); ++b) {
    if (!binding_ptrs_[b]) {
      std::vector<std::string> unbound;
      for (size_t k = 0; k < binding_ptrs_.size(); ++k) {
        if (!binding_ptrs_[k]) unbound.push_back("'" + engine_->bindings_[k].name + "'");
      }
      return MakeError(ErrorCode::kInputCountMismatch,
                       "{} of the engine's {} inputs and outputs have no address: {}",
                       unbound.size(), binding_ptrs_.size(), fmt::join(unbound, ", "));
    }
  }
  Backend& backend = *engine_->backend_;
  void* s = stream;
  const bool legacy = !stream && own_stream_;
  // Data-dependent dims may change the later layers' shapes in the middle of a run: no graphs.
  const bool graphs = options_.cuda_graphs && !options_.layer_timing && !graphs_failed_ &&
                      backend.supports_graphs() && param::CudaGraphCacheSize() > 0 &&
                      !engine_->data_dependent_;
  if (legacy && graphs) {
    // A graph captured earlier replays on the legacy stream itself, in its order: no events
    // (they cost more than the launch; torch's default stream is the legacy one).
    if (void* exec = FindGraph()) {
      ++graph_launches_;
      return backend.LaunchGraph(exec, nullptr);
    }
  }
  if (legacy) {
    // The legacy stream cannot be captured into a graph; run on our stream between two events
    // so the work keeps the legacy stream's order.
    s = own_stream_.get();
    KILN_RETURN_IF_ERROR(backend.RecordEvent(order_in_.get(), nullptr));
    KILN_RETURN_IF_ERROR(backend.StreamWaitEvent(s, order_in_.get()));
  }
  Status run = (graphs && s) ? ExecuteGraph(s) : RunLayers(s, options_.layer_timing);
  if (legacy) {
    // Also after a failure: later legacy-stream work must not overtake what was enqueued.
    Status rec = backend.RecordEvent(order_out_.get(), s);
    if (rec.ok()) rec = backend.StreamWaitEvent(nullptr, order_out_.get());
    if (run.ok()) run = std::move(rec);
  }
  return run;
}

Status ExecutionContext::RunLayers(void* stream, bool timed) {
  Backend& backend = *engine_->backend_;
  const auto& layers = engine_->layers_;
  timed = timed && events_.size() == layers.size() + 1;
  timed_last_run_ = false;
  if (timed) KILN_RETURN_IF_ERROR(backend.RecordEvent(events_[0].get(), stream));
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].view) continue;  // no kernel, no event: LayerTimesMs reports 0
    const LayerViews& lv = layer_views_[l];
    KernelRunArgs args;
    args.inputs = std::span<const TensorView>(views_.data() + lv.in_begin, lv.in_count);
    args.outputs = std::span<const TensorView>(views_.data() + lv.out_begin, lv.out_count);
    args.workspace = workspace_.data();
    args.workspace_bytes = workspace_.size();
    args.stream = stream;
    ++kernel_launches_;
    Status s = kernels_[l]->Run(args);
    if (!s.ok()) {
      return std::move(s).AddContext(
          fmt::format("while running layer '{}' ({}, tactic '{}')", layers[l].desc->node->name(),
                      layers[l].provider->id(), layers[l].desc->tactic.name));
    }
    if (timed) KILN_RETURN_IF_ERROR(backend.RecordEvent(events_[l + 1].get(), stream));
    // reported_: where the rule put data-dependent dims at this inference (the load-time flag
    // may be set for a layer whose dims the concrete inputs make static: TopK's K from shapes).
    if (layers[l].data_dependent && !reported_[l].empty()) {
      // The later layers were prepared for the dims the last run (or the bounds) gave; other
      // dims re-infer and re-prepare them (this allocates) before they run.
      bool changed = false;
      KILN_RETURN_IF_ERROR(ReadReportedDims(l, &changed));
      if (changed) {
        ++dd_updates_;
        KILN_RETURN_IF_ERROR_CTX(Propagate(/*mid_run=*/true),
                                 "after layer '{}' reported its data-dependent dims",
                                 layers[l].desc->node->name());
      }
    }
  }
  for (const Engine::OutputCopy& c : engine_->output_copies_) {
    const Tensor* t = engine_->slots_[c.slot].value->constant();
    KILN_RETURN_IF_ERROR(
        backend.CopyToDevice(binding_ptrs_[c.binding], ptrs_[c.slot], t->size_bytes(), stream));
  }
  timed_last_run_ = timed;
  return OkStatus();
}

void* ExecutionContext::FindGraph() {
  // The key is the bound addresses (shapes are fixed until the next Propagate clears graphs_).
  graph_key_.clear();  // keeps its capacity: no allocation
  for (void* p : binding_ptrs_) graph_key_.push_back(p);
  for (GraphEntry& g : graphs_) {
    if (g.key == graph_key_) return g.exec.get();
  }
  return nullptr;
}

Status ExecutionContext::ExecuteGraph(void* stream) {
  Backend& backend = *engine_->backend_;
  if (void* exec = FindGraph()) {
    ++graph_launches_;
    return backend.LaunchGraph(exec, stream);
  }
  // First run with these addresses: capture the layers (recorded, not run), then launch.
  if (Status begin = backend.BeginCapture(stream); !begin.ok()) {
    graphs_failed_ = true;  // a stream that cannot be captured (the legacy one): run eagerly
    KILN_LOG(Warn, RUNTIME, "CUDA graph capture unavailable; this context runs layer by layer: {}",
             begin.ToString());
    return RunLayers(stream, /*timed=*/false);
  }
  Status run = RunLayers(stream, /*timed=*/false);
  StatusOr<DeviceHandle> exec = backend.EndCapture(stream);  // always ends the capture
  if (!run.ok() || !exec.ok()) {
    // A layer that cannot be captured (a library call that synchronises, say) must not make the
    // engine unusable: give up on graphs for this context and run eagerly from now on.
    graphs_failed_ = true;
    KILN_LOG(Warn, RUNTIME, "CUDA graph capture failed; this context runs layer by layer: {}",
             (!run.ok() ? run : exec.status()).ToString());
    return RunLayers(stream, /*timed=*/false);
  }
  ++graph_captures_;
  const size_t cap = static_cast<size_t>(std::max<int64_t>(1, param::CudaGraphCacheSize()));
  GraphEntry entry{graph_key_, std::move(*exec)};
  size_t slot = graphs_.size();
  if (slot < cap) {
    graphs_.push_back(std::move(entry));
  } else {
    slot = next_graph_slot_;  // replaces the oldest
    next_graph_slot_ = (next_graph_slot_ + 1) % cap;
    graphs_[slot] = std::move(entry);
  }
  ++graph_launches_;
  return backend.LaunchGraph(graphs_[slot].exec.get(), stream);
}

Status ExecutionContext::SetLayerTiming(bool on) {
  options_.layer_timing = on;
  timed_last_run_ = false;
  if (!on || events_.size() == engine_->layers_.size() + 1) return OkStatus();
  events_.clear();
  for (size_t i = 0; i <= engine_->layers_.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(DeviceHandle ev, engine_->backend_->CreateEvent());
    events_.push_back(std::move(ev));
  }
  return OkStatus();
}

StatusOr<std::vector<double>> ExecutionContext::LayerTimesMs() {
  if (!timed_last_run_) {
    return MakeError(ErrorCode::kLayerTimingOff,
                     "the last Execute ran without per-layer timing (layer_timing is {})",
                     options_.layer_timing ? "on, but no Execute followed" : "off");
  }
  std::vector<double> ms(engine_->layers_.size(), 0.0);
  size_t since = 0;  // the event recorded after the last layer that ran (views record none)
  for (size_t l = 0; l < ms.size(); ++l) {
    if (engine_->layers_[l].view) continue;
    KILN_ASSIGN_OR_RETURN(
        ms[l], engine_->backend_->EventElapsedMs(events_[since].get(), events_[l + 1].get()));
    since = l + 1;
  }
  return ms;
}

}  // namespace kiln
