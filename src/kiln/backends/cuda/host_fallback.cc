// Host fallback: a layer the CUDA backend has no kernel for (an op without one, or element types
// its kernels do not take: float64, the unsigned integers...) runs the CPU backend's kernel inside
// the CUDA engine, as ONNX Runtime falls back to its CPU provider. Without it such a model does
// not build for the GPU at all (KILN-E3003); with it the model builds and runs, and the build
// report names every layer that runs on the host, so the cost is visible (two copies over PCIe
// and a host round trip per layer).
//
// One provider per op ("cuda.host.<Op>", runs_on_host()). The builder asks it only for a layer
// no CUDA provider has a tactic for (builder.cc ListCandidates), so a native kernel always wins;
// it never offers FP16/BF16 for an op that has CUDA kernels (the precision pass then keeps the
// layer FP32 on the device rather than moving it to the host), except for the ops the precision
// pass leaves untouched (Cast...), whose types are the model's. Its tactics are the CPU
// providers' tactics, named "host-<cpu tactic>".
//
// Running, all on the layer's stream: inputs are copied to pinned host buffers, the CPU kernel
// runs in a host function (cudaLaunchHostFunc, so the layer stays asynchronous and can be
// captured into a CUDA graph), and the outputs are copied back. A layer with data-dependent output
// dims (NonZero, NonMaxSuppression...) synchronises its stream instead, so the runtime can read
// the dims it reports when Run returns (such engines use no graphs). A host function cannot
// return an error: a CPU kernel that fails there is reported by the layer's next Run.
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

constexpr std::string_view kTacticPrefix = "host-";

bool HasReducedFloat(const KernelRequest& r) {
  auto reduced = [](const OperandDesc& d) {
    return d.dtype == DataType::kFloat16 || d.dtype == DataType::kBFloat16;
  };
  for (const auto& d : r.inputs) {
    if (reduced(d)) return true;
  }
  for (const auto& d : r.outputs) {
    if (reduced(d)) return true;
  }
  return false;
}

// Whether the op's rule gives the node data-dependent output dims (ops/data_dependent.cc), as
// the runtime decides it (runtime/engine.cc).
bool MakesDataDependentDims(const Node& node) {
  std::vector<ValueInfo> in_info(node.num_inputs());
  std::vector<const ValueInfo*> ins(node.num_inputs(), nullptr);
  for (size_t i = 0; i < in_info.size(); ++i) {
    if (!node.input(i)) continue;
    in_info[i] = InfoOf(*node.input(i));
    ins[i] = &in_info[i];
  }
  std::vector<ValueInfo> outs(node.num_outputs());
  if (!InferNode(node, ins, outs).ok()) return false;
  for (const ValueInfo& o : outs) {
    if (!o.data_dependent.empty()) return true;
  }
  return false;
}

// Pinned host memory that only grows (a shrink would free memory a queued host function may
// still read).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (data_) cudaFreeHost(data_);
  }
  Status Reserve(size_t bytes) {
    if (bytes <= size_) return OkStatus();
    if (data_) {
      KILN_CUDA_RETURN_IF_ERROR(cudaFreeHost(data_));  // synchronises with queued work
      data_ = nullptr;
      size_ = 0;
    }
    KILN_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data_, bytes));
    size_ = bytes;
    return OkStatus();
  }
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

class HostFallbackKernel final : public Kernel {
 public:
  HostFallbackKernel(std::unique_ptr<Kernel> cpu, bool data_dependent, std::string what)
      : cpu_(std::move(cpu)), data_dependent_(data_dependent), what_(std::move(what)) {}
  ~HostFallbackKernel() override {
    if (ran_) cudaDeviceSynchronize();  // a queued host function may still use this kernel
  }

  StatusOr<size_t> QueryWorkspace(std::span<const TensorView> inputs,
                                  std::span<const TensorView> outputs) override {
    return size_t{0};  // the host workspace is the kernel's own
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    // A host function of an earlier run may still read the buffers and dims below.
    if (ran_) KILN_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    KILN_RETURN_IF_ERROR(TakeError());
    SetUp(in_, inputs);
    SetUp(out_, outputs);
    for (Side* side : {&in_, &out_}) {
      for (size_t i = 0; i < side->size(); ++i) {
        Operand& o = (*side)[i];
        KILN_RETURN_IF_ERROR(o.buffer.Reserve(std::max<size_t>(o.bytes, 1)));
        o.view.data = o.present ? o.buffer.data() : nullptr;
      }
    }
    std::vector<TensorView> hin = Views(in_), hout = Views(out_);
    KILN_ASSIGN_OR_RETURN(size_t ws, cpu_->Prepare(hin, hout));
    KILN_RETURN_IF_ERROR(workspace_.Reserve(std::max<size_t>(ws, 1)));
    workspace_bytes_ = ws;
    host_in_ = std::move(hin);
    host_out_ = std::move(hout);
    prepared_ = true;
    return size_t{0};
  }

  Status Run(const KernelRunArgs& a) override {
    KILN_RETURN_IF_ERROR(TakeError());
    if (!prepared_) {
      return MakeError(ErrorCode::kInternal, "{}: Run before Prepare", what_);
    }
    cudaStream_t s = StreamOf(a);
    ran_ = true;
    for (size_t i = 0; i < in_.size() && i < a.inputs.size(); ++i) {
      if (!in_[i].present || in_[i].bytes == 0 || !a.inputs[i].data) continue;
      KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(in_[i].buffer.data(), a.inputs[i].data,
                                                in_[i].bytes, cudaMemcpyDeviceToHost, s));
    }
    if (data_dependent_) {
      KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      RunOnHost();
      KILN_RETURN_IF_ERROR(TakeError());
    } else {
      KILN_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(s, &HostFallbackKernel::HostFn, this));
    }
    for (size_t i = 0; i < out_.size() && i < a.outputs.size(); ++i) {
      if (!out_[i].present || out_[i].bytes == 0 || !a.outputs[i].data) continue;
      KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.outputs[i].data, out_[i].buffer.data(),
                                                out_[i].bytes, cudaMemcpyHostToDevice, s));
    }
    return OkStatus();
  }

  const std::vector<int64_t>* RunOutputDims(size_t i) const override {
    return cpu_->RunOutputDims(i);
  }

 private:
  struct Operand {
    std::vector<int64_t> dims;
    TensorView view;
    size_t bytes = 0;
    bool present = false;
    PinnedBuffer buffer;
  };
  using Side = std::vector<Operand>;

  static void SetUp(Side& side, std::span<const TensorView> views) {
    if (side.size() != views.size()) side = Side(views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      Operand& o = side[i];
      o.dims.assign(views[i].dims.begin(), views[i].dims.end());
      o.present = views[i].dtype != DataType::kUndefined;  // omitted optional operands have none
      o.view.dtype = views[i].dtype;
      o.view.dims = o.dims;
      o.bytes = o.present ? views[i].size_bytes() : 0;
    }
  }
  static std::vector<TensorView> Views(const Side& side) {
    std::vector<TensorView> v;
    v.reserve(side.size());
    for (const Operand& o : side) v.push_back(o.view);
    return v;
  }

  static void CUDART_CB HostFn(void* self) { static_cast<HostFallbackKernel*>(self)->RunOnHost(); }

  void RunOnHost() {
    KernelRunArgs args;
    args.inputs = host_in_;
    args.outputs = host_out_;
    args.workspace = workspace_.data();
    args.workspace_bytes = workspace_bytes_;
    Status st = cpu_->Run(args);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) {
        error_ = std::move(st).AddContext(fmt::format("{} (run on the host)", what_));
      }
    }
  }

  Status TakeError() {
    std::lock_guard<std::mutex> lock(mu_);
    Status e = std::move(error_);
    error_ = OkStatus();
    return e;
  }

  std::unique_ptr<Kernel> cpu_;
  const bool data_dependent_;
  const std::string what_;
  Side in_, out_;
  std::vector<TensorView> host_in_, host_out_;
  PinnedBuffer workspace_;
  size_t workspace_bytes_ = 0;
  bool prepared_ = false, ran_ = false;
  std::mutex mu_;
  Status error_;
};

class HostFallbackProvider final : public KernelProvider {
 public:
  explicit HostFallbackProvider(const OpSchema& op)
      : op_(op), id_(fmt::format("cuda.host.{}", op.name)) {}

  std::string_view id() const override { return id_; }
  std::string_view op_type() const override { return op_.name; }
  BackendKind backend() const override { return BackendKind::kCuda; }
  bool runs_on_host() const override { return true; }

  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    std::vector<TacticConfig> out;
    if (!r.node || ReducedWithNativeKernels(r)) return out;
    for (const KernelProvider* cpu : KernelRegistry::Get().Providers(BackendKind::kCpu, *r.node)) {
      for (TacticConfig t : cpu->Tactics(r)) {
        t.name = std::string(kTacticPrefix) + t.name;
        t.workspace_bytes = 0;
        out.push_back(std::move(t));
      }
    }
    return out;
  }

  bool Supports(const KernelRequest& r) const override {
    if (!r.node || ReducedWithNativeKernels(r)) return false;
    for (const KernelProvider* cpu : KernelRegistry::Get().Providers(BackendKind::kCpu, *r.node)) {
      if (cpu->Supports(r)) return true;
    }
    return false;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig& tactic) const override {
    if (!r.node || !tactic.name.starts_with(kTacticPrefix)) {
      return MakeError(ErrorCode::kNoTactic, "{}: '{}' is not a host tactic", id_, tactic.name);
    }
    TacticConfig cpu_tactic = tactic;
    cpu_tactic.name = tactic.name.substr(kTacticPrefix.size());
    for (const KernelProvider* cpu : KernelRegistry::Get().Providers(BackendKind::kCpu, *r.node)) {
      for (const TacticConfig& t : cpu->Tactics(r)) {
        if (t.name != cpu_tactic.name) continue;
        KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> k, cpu->Create(r, cpu_tactic));
        return std::unique_ptr<Kernel>(std::make_unique<HostFallbackKernel>(
            std::move(k), MakesDataDependentDims(*r.node),
            fmt::format("layer '{}' ({}, CPU tactic '{}')", r.node->name(), op_.name,
                        cpu_tactic.name)));
      }
    }
    return MakeError(ErrorCode::kNoTactic,
                     "{}: no CPU provider of {} offers tactic '{}' for layer '{}' any more", id_,
                     op_.name, cpu_tactic.name, r.node->name());
  }

 private:
  // An FP16/BF16 request for an op that has CUDA kernels: the layer stays FP32 on the device
  // rather than going FP16 here.
  bool ReducedWithNativeKernels(const KernelRequest& r) const {
    if (!HasReducedFloat(r)) return false;
    // An op the precision pass leaves untouched (Cast, comparisons, shape and index ops) has
    // the model's own types, never the pass's choice: a Cast from the model's FP16 to float8 or
    // int4 has no CUDA kernel and runs here.
    if (GetOpTraits(OpTypeOf(*r.node)).precision == PrecisionClass::kUntouched) return false;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, *r.node)) {
      if (!p->runs_on_host()) return true;
    }
    return false;
  }

  const OpSchema& op_;
  std::string id_;
};

struct RegisterHostFallbacks {
  RegisterHostFallbacks() {
    for (const OpSchema& s : AllOpSchemas()) {
      KernelRegistry::Get().Register(std::make_unique<HostFallbackProvider>(s));
    }
  }
};
const RegisterHostFallbacks kRegisterHostFallbacks;

}  // namespace
}  // namespace kiln::cuda
