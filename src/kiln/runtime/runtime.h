// The runtime, TensorRT's lifecycle: Runtime (a backend) -> Engine (an immutable, shareable
// loaded engine: desc, backend, providers looked up once, weights resident) -> ExecutionContext
// (per-thread state: kernels, ONE arena and ONE workspace allocated at creation, bindings) ->
// SetInputShape / SetTensorAddress -> Execute. Execute never allocates: shapes, kernel Prepare
// and every TensorView are settled when shapes are set.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"
#include "kiln/engine/engine_file.h"
#include "kiln/plan/memory_plan.h"

namespace kiln {

class ExecutionContext;

// How a context executes. Defaults are the fast path.
struct ExecutionOptions {
  // Backends with graphs (CUDA): the first Execute after the input shapes or the bound addresses
  // change captures the layers into a graph, later ones replay it (one launch instead of one per
  // layer). Off: every Execute launches layer by layer.
  bool cuda_graphs = true;
  // Records an event around every layer so LayerTimesMs() can report per-layer time. Layers then
  // run eagerly (a replayed graph has no per-layer marks).
  bool layer_timing = false;
};

// An engine input or output as users see it (`kiln inspect`, `kiln run`).
struct TensorDesc {
  std::string name;
  DataType dtype = DataType::kUndefined;
  Shape shape;                          // symbolic where the engine is dynamic
  std::optional<InputProfile> profile;  // inputs with dynamic dims
  // A shape input (docs/architecture.md, "Shape inputs"): the values the engine was built for.
  // Its address is host memory on every backend (as TensorRT's shape tensors); other values
  // re-specialize the context at the next Execute.
  std::optional<ShapeInputValues> shape_values;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // Checks what a hand-built desc may get wrong (providers, plan vs sizes) and makes the weights
  // resident on the backend (borrowed in place when the backend reads host memory).
  static StatusOr<std::shared_ptr<const Engine>> Create(std::shared_ptr<const EngineDesc> desc,
                                                        Backend* backend);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  const EngineDesc& desc() const { return *desc_; }
  Backend& backend() const { return *backend_; }
  const std::vector<TensorDesc>& inputs() const { return inputs_; }
  const std::vector<TensorDesc>& outputs() const { return outputs_; }
  // weights + arena + workspace as planned at build time.
  int64_t planned_peak_bytes() const { return desc_->plan.peak_bytes; }
  // Bytes of weights resident for this engine (shared by all its contexts).
  int64_t weights_bytes() const { return weights_bytes_; }
  // Aliased view layers (IsAliasedView): their output is their input's arena bytes, so contexts
  // create no kernel for them and launch nothing (no CUDA graph node either).
  bool is_view_layer(size_t layer) const { return layer < layers_.size() && layers_[layer].view; }
  size_t view_layers() const { return view_layers_; }
  // Shape inputs (TensorDesc::shape_values) and the arena contexts re-plan in for their values.
  bool has_shape_inputs() const { return !shape_inputs_.empty(); }
  // Layers with data-dependent output dims (docs/architecture.md, "Data-dependent shapes"):
  // contexts bind the dims their kernels report and re-infer what follows; no CUDA graphs.
  bool has_data_dependent_dims() const { return data_dependent_; }
  int64_t shape_arena_bytes() const { return has_shape_inputs() ? arena_bytes_ : 0; }

  // Checks `dims` for input `name` as ExecutionContext::SetInputShape does (KILN-E5005 an
  // unknown name, KILN-E5003 the rank or a static dim, KILN-E5002 outside the profile) without
  // a context: callers check a shape before they allocate a tensor for it (`kiln run --shapes`).
  Status CheckInputShape(const std::string& name, std::span<const int64_t> dims) const;

  // Creates kernels and allocates the context's arena and workspace (the only allocations). A
  // failure (KILN-E6003 when the device is out of memory) leaves the engine usable.
  StatusOr<std::unique_ptr<ExecutionContext>> CreateExecutionContext(
      const ExecutionOptions& options = {}) const;

  // Refit between executions (docs/refit.md): `constants` (by value name, each with the dtype and
  // dims of the constant it replaces; KILN-E4008 otherwise, and nothing changes) become the
  // engine's weights. The new set is complete (uploaded, on a device backend) before it is
  // published; every context switches to it at its next Execute, between two runs, never during
  // one (that Execute re-creates the kernels that read weights: it allocates, as after new
  // shapes). The weights a context still uses stay alive until it switches. Any thread; returns
  // the new weights generation. The engine's desc keeps the weights it was loaded with.
  StatusOr<uint64_t> RefitWeights(const std::map<std::string, Tensor>& constants) const;
  // 0 as loaded; +1 per RefitWeights.
  uint64_t weights_generation() const;

 private:
  friend class ExecutionContext;
  Engine() = default;

  // One generation of the weights: per slot (constants only), the host tensor kernels are
  // created from and the bytes layers read (the tensor's, or its copy on the device).
  struct WeightSet {
    uint64_t generation = 0;
    std::vector<Tensor> tensors;    // per slot; shares bytes with the desc where unchanged
    std::vector<const void*> data;  // per slot
    DeviceBuffer device;            // backends that cannot read host memory
  };
  StatusOr<std::shared_ptr<const WeightSet>> MakeWeightSet(std::vector<Tensor> tensors,
                                                           uint64_t generation) const;
  std::shared_ptr<const WeightSet> CurrentWeights() const;

  enum class Storage : uint8_t { kArena, kConstant, kInput, kOutput };
  struct Slot {
    const Value* value = nullptr;
    Storage storage = Storage::kArena;
    int64_t offset = 0;         // arena values
    int64_t planned_bytes = 0;  // arena values: bytes at the profile's max shapes
    int binding = -1;           // inputs and produced outputs
    int shape_input = -1;       // index into shape_inputs_
    // Shape or contents follow from a shape input's values (the input itself included).
    bool value_dependent = false;
    int buffer = -1;  // arena values: index into arena_buffers_ (an aliased view: its root's)
  };
  struct Layer {
    const LayerDesc* desc = nullptr;
    const KernelProvider* provider = nullptr;
    std::vector<int> inputs, outputs;  // slot ids; -1 for omitted operands
    bool view = false;                 // aliased view: nothing to run
    bool value_dependent = false;      // an operand is value-dependent: re-made for new shapes
    // Makes data-dependent dims (Graph::data_dependent_bounds): its kernel reports its output
    // dims after each run (Kernel::RunOutputDims).
    bool data_dependent = false;
  };
  // A shape input: its binding and slot, and the values the engine was built for.
  struct ShapeInput {
    int binding = -1;
    int slot = -1;
    Tensor build_values;
    int64_t device_offset = 0;  // in a context's device copy of the values
  };
  struct Binding {
    std::string name;
    bool is_input = false;
    int slot = -1;
    DataType dtype = DataType::kUndefined;
  };
  // An output that is not produced by a layer (it is an input or a constant): copied at the end.
  struct OutputCopy {
    int binding = -1;
    int slot = -1;
  };

  Status Build();
  Status BuildShapeInputs(int64_t* device_bytes);
  StatusOr<int> FindBinding(const std::string& name) const;
  std::string BindingNames(bool inputs, bool outputs) const;

  std::shared_ptr<const EngineDesc> desc_;
  Backend* backend_ = nullptr;
  std::vector<Slot> slots_;
  std::unordered_map<const Value*, int> slot_of_;
  std::vector<Layer> layers_;
  size_t view_layers_ = 0;
  bool data_dependent_ = false;
  std::vector<Binding> bindings_;  // inputs first, then outputs
  std::unordered_map<std::string, int> binding_of_;
  std::vector<OutputCopy> output_copies_;
  std::vector<ShapeInput> shape_inputs_;
  // Engines with shape inputs: every arena buffer's lifetime (first/last layer, aliased views'
  // readers included) and planned bytes, for contexts that re-plan for new values.
  std::vector<PlannedBuffer> arena_buffers_;
  int64_t shape_device_bytes_ = 0;  // a context's device copy of every shape input's values
  std::map<std::string, int64_t> max_bindings_;
  std::vector<TensorDesc> inputs_, outputs_;
  // The current weights; refit publishes a new set under the mutex (contexts check the
  // generation, an atomic, before each Execute, and take the set under the mutex when it moved).
  mutable std::mutex weights_mutex_;
  mutable std::mutex refit_mutex_;  // serialises RefitWeights
  mutable std::shared_ptr<const WeightSet> weights_;
  mutable std::atomic<uint64_t> weights_generation_{0};
  int64_t weights_bytes_ = 0;
  // What a context allocates: the arena up to the end of its last planned buffer (never more
  // than the plan's arena) and the plan's workspace.
  int64_t arena_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
  size_t device_total_memory_ = 0;
};

class ExecutionContext {
 public:
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;
  ~ExecutionContext();

  // Checks rank and static dims (KILN-E5003) and the profile bounds (KILN-E5002). Inputs with
  // fully static shapes are set at creation. The other values' dims follow in InferShapes.
  Status SetInputShape(const std::string& name, std::span<const int64_t> dims);
  Status SetInputShape(const std::string& name, std::initializer_list<int64_t> dims) {
    return SetInputShape(name, std::span<const int64_t>(dims.begin(), dims.size()));
  }
  // Binds caller memory (backend memory: host on the CPU) to an input or output by name;
  // KILN-E5005 lists the valid names.
  Status SetTensorAddress(const std::string& name, void* data);
  // Binds with a dtype check (KILN-E5001); for an input, also sets its shape from the view.
  Status BindTensor(const std::string& name, const TensorView& view);

  // Once every input has a shape: infers every value's dims, checks that inputs sharing a symbol
  // agree, prepares each kernel and checks the plan (KILN-E5004). Called by GetTensorShape and
  // Execute when shapes changed; a no-op otherwise.
  Status InferShapes();
  // The dims of an input or output (an output's after InferShapes). A data-dependent dim
  // (docs/architecture.md, "Data-dependent shapes") reads as its bound for these input shapes
  // until an Execute reports it, then as the last Execute's value.
  StatusOr<std::vector<int64_t>> GetTensorShape(const std::string& name);
  // The dims to allocate an output for: GetTensorShape's, with every data-dependent dim at its
  // bound for the current input shapes (an output's bytes must hold any value an Execute may
  // report). The same as GetTensorShape where the engine has no data-dependent dims.
  StatusOr<std::vector<int64_t>> GetMaxTensorShape(const std::string& name);
  // Data-dependent dims: how often an Execute found reported dims that differ from the ones its
  // layers were prepared for, and re-inferred the shapes after that layer (allocates).
  int64_t data_dependent_updates() const { return dd_updates_; }
  bool all_input_shapes_set() const { return shapes_ready_; }
  // Shape inputs: how often this context was re-specialized for new values (shapes inferred,
  // kernels reading them made again) and how often it re-planned its arena for them (values
  // whose activations did not fit the engine's plan). Same values: neither moves.
  int64_t shape_specializations() const { return shape_specializations_; }
  int64_t arena_replans() const { return arena_replans_; }

  // Enqueues the layers on `stream` (a cudaStream_t on CUDA). nullptr runs them on the context's
  // own stream (stream()), ordered by events after earlier work on CUDA's legacy default stream
  // and before later work there, as if they ran on it. On the CPU the work is done when Execute
  // returns. No allocation in steady state: only the first Execute
  // after new shapes (propagation) or new addresses (graph capture) allocates.
  Status Execute(void* stream = nullptr);

  // The context's own stream (nullptr where the backend has none).
  void* stream() const { return own_stream_.get(); }
  const ExecutionOptions& options() const { return options_; }
  // Per-layer timing: creates the events once (allocates; call it before the timed runs).
  Status SetLayerTiming(bool on);
  // Each layer's time in the last Execute, in layer order (waits for that Execute to finish).
  // Device time where the backend has device timers (engine().backend().device_timing()), host
  // time otherwise; exactly 0 for aliased view layers. KILN-E5007 when timing was off for the
  // last Execute.
  StatusOr<std::vector<double>> LayerTimesMs();
  // Graph statistics for tests and reports: captures made, graph launches, and whether graphs
  // were given up on in this context (a layer that cannot be captured; it then runs eagerly).
  int64_t graph_captures() const { return graph_captures_; }
  int64_t graph_launches() const { return graph_launches_; }
  bool graphs_disabled() const { return graphs_failed_; }
  // Kernel launches this context made (layer by layer, or while capturing a graph); aliased view
  // layers add none.
  int64_t kernel_launches() const { return kernel_launches_; }

  const Engine& engine() const { return *engine_; }
  // What this context allocated (arena + workspace) and the actual peak with the weights; the
  // context refuses to exist when the actual peak exceeds the planned one.
  int64_t allocated_bytes() const;
  int64_t actual_peak_bytes() const { return allocated_bytes() + engine_->weights_bytes(); }

 private:
  friend class Engine;
  ExecutionContext(std::shared_ptr<const Engine> engine, const ExecutionOptions& options);
  Status Init();
  // Creates layer `l`'s kernel from the weights this context uses.
  StatusOr<std::unique_ptr<Kernel>> CreateKernel(size_t l) const;
  // Switches to the engine's current weights (after RefitWeights): waits for `stream`, re-creates
  // the kernels that read weights, points the constant slots at the new bytes and re-prepares.
  Status AdoptWeights(void* stream);
  Status RunLayers(void* stream, bool timed);
  Status ExecuteGraph(void* stream);
  // The graph captured for the addresses bound now (graph_key_ rebuilt), or nullptr.
  void* FindGraph();
  // `mid_run`: called by RunLayers after a layer reported data-dependent dims that differ from
  // the current ones: keeps the bound values (dd_values_) and the arena placement.
  Status Propagate(bool mid_run = false);
  // After layer `l` ran: binds the data-dependent dims its kernel reports; `changed` when they
  // differ from the dims the later layers were prepared for.
  Status ReadReportedDims(size_t l, bool* changed);
  // Shape inputs: copies bound values that differ from the current ones (host memory; nothing
  // allocates) and marks the shapes stale.
  Status ReadShapeValues();
  // After inference with new values: arena offsets (the engine's plan when everything fits it,
  // else a plan for these sizes within the arena: KILN-E5015 past it) and the kernels of
  // value-dependent layers whose operands changed, made again.
  Status Respecialize(bool mid_run);
  // Backends that cannot read host memory: the shape inputs' values into their arena copy.
  Status CopyShapeValuesToDevice();
  StatusOr<std::unique_ptr<Kernel>> CreateKernelFor(size_t l, bool concrete) const;
  StatusOr<int> FindBinding(const std::string& name) const;
  std::string BindingNames(bool inputs, bool outputs) const;
  void UpdateViewPointers(int slot);

  std::shared_ptr<const Engine> engine_;
  std::shared_ptr<const Engine::WeightSet> weights_;  // the generation this context runs with
  std::vector<std::unique_ptr<Kernel>> kernels_;
  DeviceBuffer arena_;
  DeviceBuffer workspace_;
  std::vector<std::vector<int64_t>> dims_;  // per slot
  std::vector<void*> ptrs_;                 // per slot
  std::vector<bool> input_shape_set_;       // per binding
  std::vector<Tensor> shape_values_;        // per shape input: the values shapes follow now
  DeviceBuffer shape_device_;               // their device copy (backends without host access)
  bool shape_values_changed_ = false;
  bool arena_replanned_ = false;               // slots use a plan made by this context
  std::vector<PlannedBuffer> placed_buffers_;  // that plan's buffers (bytes per buffer)
  // Data-dependent dims: the values reported by the last Execute (symbol -> value; cleared when
  // the inputs' shapes change, so that the dims read as their bounds), the bounds for the
  // current input shapes, and each binding's dims at the bounds (GetMaxTensorShape).
  std::map<std::string, int64_t> dd_values_;
  std::map<std::string, int64_t> dd_bounds_;
  // Per layer: the (output, dim, symbol) of each data-dependent dim its rule gave (Propagate).
  struct ReportedDim {
    size_t output = 0, dim = 0;
    std::string symbol;
  };
  std::vector<std::vector<ReportedDim>> reported_;
  std::vector<std::vector<int64_t>> binding_max_dims_;
  int64_t dd_updates_ = 0;
  std::vector<std::vector<std::vector<int64_t>>> kernel_dims_;  // per layer: dims at creation
  int64_t shape_specializations_ = 0;
  int64_t arena_replans_ = 0;
  std::vector<void*> binding_ptrs_;  // per binding
  bool shapes_ready_ = false;
  // Flat TensorView storage for every layer's operands; rebuilt by Propagate, pointers patched
  // by SetTensorAddress. layer_views_[l] = {first input view, #inputs, first output, #outputs}.
  std::vector<TensorView> views_;
  struct LayerViews {
    size_t in_begin, in_count, out_begin, out_count;
  };
  std::vector<LayerViews> layer_views_;
  std::vector<std::vector<size_t>> views_of_slot_;  // view indices that show each slot

  ExecutionOptions options_;
  DeviceHandle own_stream_;
  // Execute(nullptr): legacy stream -> own stream -> legacy stream ordering.
  DeviceHandle order_in_, order_out_;
  // Layer timing: events_[l] before layer l, events_[n] after the last.
  std::vector<DeviceHandle> events_;
  bool timed_last_run_ = false;
  // Graphs for the current shapes, one per set of bound addresses (cleared when shapes change:
  // kernels are re-prepared then). graph_key_ is rebuilt in place (no allocation) per Execute.
  struct GraphEntry {
    std::vector<void*> key;
    DeviceHandle exec;
  };
  std::vector<GraphEntry> graphs_;
  std::vector<void*> graph_key_;
  size_t next_graph_slot_ = 0;
  bool graphs_failed_ = false;
  int64_t graph_captures_ = 0;
  int64_t graph_launches_ = 0;
  int64_t kernel_launches_ = 0;
};

// Owns the choice of backend; loads engines for it (rejecting other targets with KILN-E4004).
class Runtime {
 public:
  static StatusOr<std::unique_ptr<Runtime>> Create(BackendKind kind);
  // The runtime for an engine's target (`kiln run`): KILN-E5006, with the backend's own reason
  // and the engine's target, where that backend cannot run here (a CUDA engine, no GPU).
  static StatusOr<std::unique_ptr<Runtime>> CreateForEngine(const EngineHeader& header);
  BackendKind kind() const { return backend_->kind(); }
  const DeviceInfo& device() const { return device_; }

  StatusOr<std::shared_ptr<const Engine>> LoadEngine(const std::string& path) const;
  StatusOr<std::shared_ptr<const Engine>> DeserializeEngine(std::span<const std::byte> bytes) const;
  // For engines assembled in memory (the builder, tests); checks the target too.
  StatusOr<std::shared_ptr<const Engine>> CreateEngine(
      std::shared_ptr<const EngineDesc> desc) const;

 private:
  Runtime(Backend* backend, DeviceInfo device) : backend_(backend), device_(std::move(device)) {}
  LoadOptions Options() const;
  Backend* backend_;
  DeviceInfo device_;
};

}  // namespace kiln
