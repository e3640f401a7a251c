// Channels-last (kiln_layout = "NHWC") Conv/FusedConv/ConvTranspose/pools on the CPU: the NCHW
// CPU kernel between two transposes. The CPU is the reference backend, so graphs the layout
// pass rewrote for CUDA must still run (and be compared) here; speed is not the point.
#include <cstring>

#include "kiln/backends/kernel.h"
#include "kiln/ops/nn.h"

namespace kiln::cpu {
namespace {

constexpr std::string_view kSuffix = "-nhwc-transposed";

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

// Inputs that carry the activation in the node's layout.
bool IsActivation(std::string_view op, size_t i) { return i == 0 || (op == "FusedConv" && i == 3); }

std::vector<int64_t> ToNchw(const std::vector<int64_t>& d) {
  if (d.size() != 4) return d;
  return {d[0], d[3], d[1], d[2]};
}

// Copies a 4-D tensor between layouts; `to_nchw` reads N,H,W,C dims `d` and writes N,C,H,W.
void Permute(const std::byte* src, std::byte* dst, std::span<const int64_t> nhwc, size_t es,
             bool to_nchw) {
  int64_t n = nhwc[0], h = nhwc[1], w = nhwc[2], c = nhwc[3];
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t iw = 0; iw < w; ++iw) {
          int64_t a = ((in * h + ih) * w + iw) * c + ic;  // NHWC index
          int64_t b = ((in * c + ic) * h + ih) * w + iw;  // NCHW index
          if (to_nchw) {
            std::memcpy(dst + b * es, src + a * es, es);
          } else {
            std::memcpy(dst + a * es, src + b * es, es);
          }
        }
}

// The channels-first twin of a tagged node, kept alive with the kernels made from it.
struct NchwTwin {
  std::unique_ptr<Graph> graph = std::make_unique<Graph>();
  const Node* node = nullptr;
  KernelRequest request;
};

std::unique_ptr<NchwTwin> MakeTwin(const KernelRequest& request) {
  auto twin = std::make_unique<NchwTwin>();
  const Node& src = *request.node;
  std::vector<Value*> ins, outs;
  for (size_t i = 0; i < src.num_inputs(); ++i) {
    ins.push_back(src.input(i) ? twin->graph->AddValue("in" + std::to_string(i)) : nullptr);
  }
  for (size_t i = 0; i < src.num_outputs(); ++i) {
    outs.push_back(twin->graph->AddValue("out" + std::to_string(i)));
  }
  AttributeMap attrs = src.attrs();
  attrs.Erase("kiln_layout");
  twin->node = twin->graph->AddNode(src.op_type(), src.name(), ins, outs, std::move(attrs));
  twin->request = request;
  twin->request.node = twin->node;
  for (size_t i = 0; i < twin->request.inputs.size(); ++i) {
    if (!IsActivation(src.op_type(), i)) continue;
    OperandDesc& d = twin->request.inputs[i];
    d.shape = ChannelsLastToFirst(d.shape);
    d.max_dims = ToNchw(d.max_dims);
  }
  for (OperandDesc& d : twin->request.outputs) {
    d.shape = ChannelsLastToFirst(d.shape);
    d.max_dims = ToNchw(d.max_dims);
  }
  return twin;
}

class NhwcAdapterKernel final : public Kernel {
 public:
  NhwcAdapterKernel(std::unique_ptr<NchwTwin> twin, std::unique_ptr<Kernel> inner)
      : twin_(std::move(twin)), inner_(std::move(inner)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const std::string& op = twin_->node->op_type();
    in_dims_.assign(inputs.size(), {});
    out_dims_.assign(outputs.size(), {});
    std::vector<TensorView> in_views(inputs.begin(), inputs.end());
    std::vector<TensorView> out_views(outputs.begin(), outputs.end());
    size_t staged = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!IsActivation(op, i) || (!inputs[i].data && inputs[i].dims.empty())) continue;
      if (inputs[i].dims.size() != 4) {
        return MakeError(ErrorCode::kShapeMismatch, "node '{}': NHWC input {} must be 4-D",
                         twin_->node->name(), i);
      }
      in_dims_[i] = ToNchw({inputs[i].dims.begin(), inputs[i].dims.end()});
      in_views[i].dims = in_dims_[i];
      staged += Align64(inputs[i].size_bytes());
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      out_dims_[i] = ToNchw({outputs[i].dims.begin(), outputs[i].dims.end()});
      out_views[i].dims = out_dims_[i];
      staged += Align64(outputs[i].size_bytes());
    }
    KILN_ASSIGN_OR_RETURN(inner_ws_, inner_->Prepare(in_views, out_views));
    return Align64(inner_ws_) + staged;
  }

  Status Run(const KernelRunArgs& args) override {
    const std::string& op = twin_->node->op_type();
    auto* ws = static_cast<std::byte*>(args.workspace);
    std::byte* next = ws + Align64(inner_ws_);
    std::vector<TensorView> in_views(args.inputs.begin(), args.inputs.end());
    std::vector<TensorView> out_views(args.outputs.begin(), args.outputs.end());
    for (size_t i = 0; i < in_views.size(); ++i) {
      if (!IsActivation(op, i) || !args.inputs[i].data) continue;
      const TensorView& x = args.inputs[i];
      Permute(static_cast<const std::byte*>(x.data), next, x.dims, SizeOf(x.dtype), true);
      in_views[i].data = next;
      in_views[i].dims = in_dims_[i];
      next += Align64(x.size_bytes());
    }
    for (size_t i = 0; i < out_views.size(); ++i) {
      out_views[i].data = next;
      out_views[i].dims = out_dims_[i];
      next += Align64(args.outputs[i].size_bytes());
    }
    KernelRunArgs inner = args;
    inner.inputs = in_views;
    inner.outputs = out_views;
    inner.workspace = inner_ws_ ? ws : nullptr;
    inner.workspace_bytes = inner_ws_;
    KILN_RETURN_IF_ERROR(inner_->Run(inner));
    for (size_t i = 0; i < out_views.size(); ++i) {
      const TensorView& y = args.outputs[i];
      Permute(static_cast<const std::byte*>(out_views[i].data), static_cast<std::byte*>(y.data),
              y.dims, SizeOf(y.dtype), false);
    }
    return OkStatus();
  }

 private:
  std::unique_ptr<NchwTwin> twin_;
  std::unique_ptr<Kernel> inner_;
  std::vector<std::vector<int64_t>> in_dims_, out_dims_;
  size_t inner_ws_ = 0;
};

template <const char* kOp>
class NhwcAdapterProvider final : public KernelProvider {
 public:
  std::string_view id() const override { return id_; }
  std::string_view op_type() const override { return kOp; }
  BackendKind backend() const override { return BackendKind::kCpu; }
  bool SupportsLayout(std::string_view layout) const override { return layout == "NHWC"; }

  // The first NCHW tactic that applies (this is the reference path, not a tuned one).
  std::vector<TacticConfig> Tactics(const KernelRequest& request) const override {
    // Callers that list providers by op type alone also ask here about untagged nodes.
    if (NodeLayout(*request.node) != "NHWC") return {};
    std::unique_ptr<NchwTwin> twin = MakeTwin(request);
    for (const KernelProvider* p : KernelRegistry::Get().Providers(backend(), *twin->node)) {
      std::vector<TacticConfig> tactics = p->Tactics(twin->request);
      if (tactics.empty()) continue;
      TacticConfig t = tactics.front();
      t.name += kSuffix;
      // The staged NCHW copies of the activations and outputs come on top of the inner kernel's.
      for (size_t i = 0; i < request.inputs.size(); ++i) {
        if (!IsActivation(kOp, i) || request.inputs[i].max_dims.empty()) continue;
        t.workspace_bytes +=
            Align64(NumElements(request.inputs[i].max_dims) * SizeOf(request.inputs[i].dtype));
      }
      for (const OperandDesc& o : request.outputs) {
        if (!o.max_dims.empty())
          t.workspace_bytes += Align64(NumElements(o.max_dims) * SizeOf(o.dtype));
      }
      return {t};
    }
    return {};
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const override {
    if (!tactic.name.ends_with(kSuffix) || NodeLayout(*request.node) != "NHWC") {
      return MakeError(ErrorCode::kInvalidArgument, "{}: tactic '{}' is not an adapter tactic", id_,
                       tactic.name);
    }
    TacticConfig inner_tactic = tactic;
    inner_tactic.name.resize(tactic.name.size() - kSuffix.size());
    std::unique_ptr<NchwTwin> twin = MakeTwin(request);
    for (const KernelProvider* p : KernelRegistry::Get().Providers(backend(), *twin->node)) {
      std::vector<TacticConfig> tactics = p->Tactics(twin->request);
      if (tactics.empty()) continue;
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> inner, p->Create(twin->request, inner_tactic));
      return std::unique_ptr<Kernel>(
          std::make_unique<NhwcAdapterKernel>(std::move(twin), std::move(inner)));
    }
    return MakeError(ErrorCode::kNoTactic, "{}: no NCHW CPU kernel for node '{}'", id_,
                     request.node->name());
  }

 private:
  std::string id_ = std::string("cpu.nhwc_adapter.") + kOp;
};

constexpr char kConv[] = "Conv";
constexpr char kFusedConv[] = "FusedConv";
constexpr char kConvTranspose[] = "ConvTranspose";
constexpr char kMaxPool[] = "MaxPool";
constexpr char kAveragePool[] = "AveragePool";
constexpr char kGlobalAveragePool[] = "GlobalAveragePool";
KILN_REGISTER_KERNEL_PROVIDER(NhwcAdapterProvider<kConv>);
KILN_REGISTER_KERNEL_PROVIDER(NhwcAdapterProvider<kFusedConv>);
KILN_REGISTER_KERNEL_PROVIDER(NhwcAdapterProvider<kConvTranspose>);
KILN_REGISTER_KERNEL_PROVIDER(NhwcAdapterProvider<kMaxPool>);
KILN_REGISTER_KERNEL_PROVIDER(NhwcAdapterProvider<kAveragePool>);
KILN_REGISTER_KERNEL_PROVIDER(NhwcAdapterProvider<kGlobalAveragePool>);

}  // namespace
}  // namespace kiln::cpu
