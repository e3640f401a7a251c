// The runtime, TensorRT's lifecycle: Runtime (a backend) -> Engine (an immutable, shareable
// loaded engine: desc, backend, providers looked up once, weights resident) -> ExecutionContext
// (per-thread state: kernels, ONE arena and ONE workspace allocated at creation, bindings) ->
// SetInputShape / SetTensorAddress -> Execute. Execute never allocates: shapes, kernel Prepare
// and every TensorView are settled when shapes are set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"
#include "kiln/engine/engine_file.h"

namespace kiln {

class ExecutionContext;

// An engine input or output as users see it (`kiln inspect`, `kiln run`).
struct TensorDesc {
  std::string name;
  DataType dtype = DataType::kUndefined;
  Shape shape;                          // symbolic where the engine is dynamic
  std::optional<InputProfile> profile;  // inputs with dynamic dims
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

  // Creates kernels and allocates the context's arena and workspace (the only allocations).
  StatusOr<std::unique_ptr<ExecutionContext>> CreateExecutionContext() const;

 private:
  friend class ExecutionContext;
  Engine() = default;

  enum class Storage : uint8_t { kArena, kConstant, kInput, kOutput };
  struct Slot {
    const Value* value = nullptr;
    Storage storage = Storage::kArena;
    int64_t offset = 0;         // arena values
    int64_t planned_bytes = 0;  // arena values: bytes at the profile's max shapes
    const void* constant = nullptr;
    int binding = -1;  // inputs and produced outputs
  };
  struct Layer {
    const LayerDesc* desc = nullptr;
    const KernelProvider* provider = nullptr;
    std::vector<int> inputs, outputs;  // slot ids; -1 for omitted operands
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

  std::shared_ptr<const EngineDesc> desc_;
  Backend* backend_ = nullptr;
  std::vector<Slot> slots_;
  std::unordered_map<const Value*, int> slot_of_;
  std::vector<Layer> layers_;
  std::vector<Binding> bindings_;  // inputs first, then outputs
  std::unordered_map<std::string, int> binding_of_;
  std::vector<OutputCopy> output_copies_;
  std::map<std::string, int64_t> max_bindings_;
  std::vector<TensorDesc> inputs_, outputs_;
  DeviceBuffer device_weights_;  // backends that cannot read host memory
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

  // Checks rank and static dims (KILN-E5003) and the profile bounds (KILN-E5002). Once every
  // input has a shape, infers every value's dims, prepares each kernel and checks the plan
  // (KILN-E5004). Inputs with fully static shapes are set at creation.
  Status SetInputShape(const std::string& name, std::span<const int64_t> dims);
  Status SetInputShape(const std::string& name, std::initializer_list<int64_t> dims) {
    return SetInputShape(name, std::span<const int64_t>(dims.begin(), dims.size()));
  }
  // Binds caller memory (backend memory: host on the CPU) to an input or output by name;
  // KILN-E5005 lists the valid names.
  Status SetTensorAddress(const std::string& name, void* data);
  // Binds with a dtype check (KILN-E5001); for an input, also sets its shape from the view.
  Status BindTensor(const std::string& name, const TensorView& view);

  // The dims of an input or output (outputs: known once every input shape is set).
  StatusOr<std::vector<int64_t>> GetTensorShape(const std::string& name) const;
  bool all_input_shapes_set() const { return shapes_ready_; }

  // Runs the layers in order on `stream` (nullptr on the CPU). No allocation.
  Status Execute(void* stream = nullptr);

  const Engine& engine() const { return *engine_; }
  // What this context allocated (arena + workspace) and the actual peak with the weights; the
  // context refuses to exist when the actual peak exceeds the planned one.
  int64_t allocated_bytes() const;
  int64_t actual_peak_bytes() const { return allocated_bytes() + engine_->weights_bytes(); }

 private:
  friend class Engine;
  explicit ExecutionContext(std::shared_ptr<const Engine> engine);
  Status Init();
  Status Propagate();
  StatusOr<int> FindBinding(const std::string& name) const;
  std::string BindingNames(bool inputs, bool outputs) const;
  void UpdateViewPointers(int slot);

  std::shared_ptr<const Engine> engine_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  DeviceBuffer arena_;
  DeviceBuffer workspace_;
  std::vector<std::vector<int64_t>> dims_;  // per slot
  std::vector<void*> ptrs_;                 // per slot
  std::vector<bool> input_shape_set_;       // per binding
  std::vector<void*> binding_ptrs_;         // per binding
  bool shapes_ready_ = false;
  // Flat TensorView storage for every layer's operands; rebuilt by Propagate, pointers patched
  // by SetTensorAddress. layer_views_[l] = {first input view, #inputs, first output, #outputs}.
  std::vector<TensorView> views_;
  struct LayerViews {
    size_t in_begin, in_count, out_begin, out_count;
  };
  std::vector<LayerViews> layer_views_;
  std::vector<std::vector<size_t>> views_of_slot_;  // view indices that show each slot
};

// Owns the choice of backend; loads engines for it (rejecting other targets with KILN-E4004).
class Runtime {
 public:
  static StatusOr<std::unique_ptr<Runtime>> Create(BackendKind kind);
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
