// The backend interface (ggml-backend style, kept small). A Backend owns device memory and
// streams; a KernelProvider offers implementations of one op on one backend as named tactics; a
// Kernel is one layer's instance of a tactic. Lifecycle per layer: create (weights may be
// prepacked) -> Prepare(shapes) gives workspace bytes -> Run (never allocates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"
#include "kiln/ops/op_schema.h"

namespace kiln {

enum class BackendKind : uint8_t { kCpu = 0, kCuda = 1 };
std::string_view ToString(BackendKind kind);  // "cpu", "cuda"

// One operand as a kernel provider sees it when choosing tactics: element type, shape (symbolic
// dims allowed), the largest dims it will see (from the optimization profile) and, for weights,
// the constant contents.
struct OperandDesc {
  DataType dtype = DataType::kUndefined;
  Shape shape;
  std::vector<int64_t> max_dims;
  const Tensor* constant = nullptr;  // host copy of a constant operand, else nullptr
};

// An operand's largest dims: max_dims, else its static shape; empty when unknown.
inline std::vector<int64_t> LargestDims(const OperandDesc& o) {
  if (!o.max_dims.empty()) return o.max_dims;
  if (auto d = StaticDims(o.shape)) return *d;
  return {};
}

// A layer to implement: the node (op type and attributes) and its operands.
struct KernelRequest {
  const Node* node = nullptr;
  std::vector<OperandDesc> inputs;  // omitted optional inputs have dtype kUndefined
  std::vector<OperandDesc> outputs;
  // How many of its tactics the builder will look at (0: all). A provider that does costly work
  // per tactic while listing them (cuDNN finalises a plan for each) stops after this many good
  // ones.
  int max_tactics = 0;
};

// Whether a request has an operand of a storage-only type (dtype.h: float8, float4, int4...).
// Providers serve those only where they say so (the CPU's OpKernelDef::storage_types); the rest
// offer no tactic, so such a layer fails at build instead of computing on the wrong bytes.
inline bool HasStorageOnlyOperand(const KernelRequest& r) {
  for (const auto& d : r.inputs) {
    if (IsStorageOnly(d.dtype)) return true;
  }
  for (const auto& d : r.outputs) {
    if (IsStorageOnly(d.dtype)) return true;
  }
  return false;
}

// One tactic: a provider's configuration. `name` is the full, self-explanatory tactic name
// (STYLE.md rule 5), e.g. "f32-conv-cpu-im2col-gemm" or "f32-gemm-cpu-blocked-8x8";
// `params` are the provider's knobs (block sizes...), stored in the engine.
struct TacticConfig {
  std::string name;
  std::vector<int64_t> params;
  // Workspace estimate at the max profile shape (for memory budgeting before timing).
  size_t workspace_bytes = 0;
  // The kernel family, where a provider offers more than one (CUDA INT8: cuBLASLt's algorithms
  // and kiln's own kernel): a search that takes a provider's first N tactics takes the first N
  // of each family (builder/tactic_search.h, TakeTactics). Empty: the provider's one family.
  // Only the listing reads it; engines and the timing cache do not store it.
  std::string family;
};

struct KernelRunArgs {
  std::span<const TensorView> inputs;  // omitted optional inputs have data == nullptr
  std::span<const TensorView> outputs;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;  // backend stream (cudaStream_t), nullptr on the CPU
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  Kernel() = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // Called when operand shapes are set (context creation, new input shapes), never during
  // execute. Returns the workspace bytes Run needs for these shapes.
  virtual StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                                   std::span<const TensorView> outputs) {
    return size_t{0};
  }
  // The bytes Prepare would return for these shapes, without preparing to run: the builder asks
  // every layer at the profile's max shapes for the memory plan. Kernels whose Prepare does
  // one-off work (code generation, weight packing) override it with their shape arithmetic.
  virtual StatusOr<size_t> QueryWorkspace(std::span<const TensorView> inputs,
                                          std::span<const TensorView> outputs) {
    return Prepare(inputs, outputs);
  }
  virtual Status Run(const KernelRunArgs& args) = 0;
  // Kernels of ops with data-dependent output dims (NonZero, Unique, Compress,
  // NonMaxSuppression; docs/architecture.md "Data-dependent shapes"): the dims output i got in
  // the last Run, known when Run returns (a device kernel synchronises). Their Run writes each
  // output densely at those dims and never trusts an output view's dims: they are the dims'
  // bounds or an earlier run's, while the bytes behind the view hold the bounds. nullptr for
  // every other kernel.
  virtual const std::vector<int64_t>* RunOutputDims(size_t i) const { return nullptr; }
  // Refit (runtime.h Engine::RefitWeights): whether the kernel can take new weights in place,
  // RenewWeights called with its layer's views (constants at the new bytes) before its next
  // Prepare and Run. Kernels that read their constants only through Run's views, or can remake
  // what they derived from them (a packed copy) from the new bytes, say yes; the rest (the
  // default) are created again from the new weights.
  virtual bool renews_weights() const { return false; }
  // Work it enqueues goes on `stream`, before the next run's.
  virtual Status RenewWeights(std::span<const TensorView> inputs, void* stream) {
    return OkStatus();
  }
};

// A Kernel made from functions: simple kernels with no state beyond what the functions capture.
class FnKernel final : public Kernel {
 public:
  using RunFn = std::function<Status(const KernelRunArgs&)>;
  using PrepareFn =
      std::function<StatusOr<size_t>(std::span<const TensorView>, std::span<const TensorView>)>;
  explicit FnKernel(RunFn run, PrepareFn prepare = nullptr)
      : run_(std::move(run)), prepare_(std::move(prepare)) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    return prepare_ ? prepare_(inputs, outputs) : StatusOr<size_t>(size_t{0});
  }
  Status Run(const KernelRunArgs& args) override { return run_(args); }

 private:
  RunFn run_;
  PrepareFn prepare_;
};

class KernelProvider {
 public:
  virtual ~KernelProvider() = default;
  // Unique per backend: "cpu.conv.im2col". Stored in engines; never rename a released one.
  virtual std::string_view id() const = 0;
  virtual std::string_view op_type() const = 0;
  virtual BackendKind backend() const = 0;
  // Tactics for this request, the heuristic's best guess first; empty when unsupported
  // (dtype, attribute or shape this provider cannot run).
  virtual std::vector<TacticConfig> Tactics(const KernelRequest& request) const = 0;
  // Whether Tactics would offer anything for this request, answered from what the provider
  // supports (op, dtypes, rank, attributes) without the work listing tactics may do: the
  // precision pass asks it of every layer in every reduced precision. Providers whose Tactics
  // is costly (cuDNN finalises plans) override it; a tactic that then fails to build is the
  // tactic phase's to handle.
  virtual bool Supports(const KernelRequest& request) const { return !Tactics(request).empty(); }
  virtual StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                                   const TacticConfig& tactic) const = 0;
  // The activation layout this provider runs, as the node's `kiln_layout` attribute names it
  // ("" = ONNX's N,C,spatial; "NHWC" = channels last, set by the layout pass). Providers that
  // read the attribute override this; the rest never see tagged nodes.
  virtual bool SupportsLayout(std::string_view kiln_layout) const { return kiln_layout.empty(); }
  // Whether this provider runs another backend's kernel on the host for a device backend (the
  // CUDA backend's host fallback, backends/cuda/host_fallback.cc): offered only where no native
  // provider serves the layer, and reported as such.
  virtual bool runs_on_host() const { return false; }
  // FP8 edges (ops/quant_edge.h): whether this provider's kernel for `tactic` can also write
  // output 0 as E4M3 quantized for a consumer (the node's kFp8OutputAmaxAttr), and read input 0
  // as E4M3 already quantized with the node's own kFp8InputAmaxAttr. The builder joins a producer
  // and its only consumer when both say yes (builder/quant_edges.h); the request is the one the
  // tactic was chosen for, in the layer's float types.
  virtual bool WritesFp8Output(const KernelRequest& /*request*/,
                               const TacticConfig& /*tactic*/) const {
    return false;
  }
  virtual bool ReadsFp8Input(const KernelRequest& /*request*/,
                             const TacticConfig& /*tactic*/) const {
    return false;
  }
  // INT8 edges, the same with int8 values (kInt8OutputScaleAttr: the producer quantizes with
  // that scale by the INT8 contract; the consumer reads its A as int8 [M, K] rows).
  virtual bool WritesInt8Output(const KernelRequest& /*request*/,
                                const TacticConfig& /*tactic*/) const {
    return false;
  }
  virtual bool ReadsInt8Input(const KernelRequest& /*request*/,
                              const TacticConfig& /*tactic*/) const {
    return false;
  }
  // INT8 and FP8 copies (ops/quant_edge.h): whether this provider's kernel for `tactic` can also
  // write output 0 once more, as int8 quantized with the node's kInt8CopyScaleAttr (as E4M3 with
  // its kFp8CopyAmaxAttr), to the op's QuantCopyOutputIndex output.
  virtual bool WritesInt8Copy(const KernelRequest& /*request*/,
                              const TacticConfig& /*tactic*/) const {
    return false;
  }
  virtual bool WritesFp8Copy(const KernelRequest& /*request*/,
                             const TacticConfig& /*tactic*/) const {
    return false;
  }
};

// The node's `kiln_layout` attribute ("NHWC"), or "" for ONNX's channels-first layout.
std::string NodeLayout(const Node& node);

class KernelRegistry {
 public:
  static KernelRegistry& Get();
  void Register(std::unique_ptr<KernelProvider> provider);
  // Providers of an op on a backend, sorted by id. Keyed on OpType (ops.inc); the name form looks
  // the op up first and finds nothing for an op kiln does not declare.
  std::vector<const KernelProvider*> Providers(BackendKind backend, OpType op) const;
  std::vector<const KernelProvider*> Providers(BackendKind backend, std::string_view op_type) const;
  // Providers of the node's op that also run its layout (NodeLayout); what builders and
  // evaluators should use.
  std::vector<const KernelProvider*> Providers(BackendKind backend, const Node& node) const;
  // Providers(backend, op) without those that run another backend's kernel on the host
  // (KernelProvider::runs_on_host: the CUDA backend's host fallback).
  std::vector<const KernelProvider*> NativeProviders(BackendKind backend, OpType op) const;
  const KernelProvider* Find(BackendKind backend, std::string_view provider_id) const;
  std::vector<const KernelProvider*> All() const;
  // Providers whose op_type() is no op of ops.inc (a misspelling): never offered to a layer.
  // backends.OpCoverage checks that there are none.
  std::vector<const KernelProvider*> Undeclared() const;

 private:
  std::vector<std::unique_ptr<KernelProvider>> providers_;
  void BuildIndexLocked() const;
  // backend -> OpType -> providers sorted by id: built on first use after a registration, since
  // every layer of every build asks (a scan of all providers was 3% of a warm build).
  using OpIndex = std::vector<std::vector<const KernelProvider*>>;
  mutable std::mutex index_mu_;
  mutable std::map<BackendKind, OpIndex> index_;
  mutable std::vector<const KernelProvider*> undeclared_;
  mutable bool index_built_ = false;
};

template <typename T>
struct KernelProviderRegistrar {
  KernelProviderRegistrar() { KernelRegistry::Get().Register(std::make_unique<T>()); }
};

}  // namespace kiln

// Registers a KernelProvider subclass; put it in the kernel's own file (STYLE.md rule 4).
#define KILN_REGISTER_KERNEL_PROVIDER(Provider) \
  static ::kiln::KernelProviderRegistrar<Provider> KILN_CONCAT_(kiln_provider_, __COUNTER__)
