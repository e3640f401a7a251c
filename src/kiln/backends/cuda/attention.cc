// Attention (kiln's fused op, src/kiln/ops/attention.cc) on CUDA: the provider around
// attention.cu's kernel. Prepare resolves the batch broadcasting and the mask's strides once;
// Run is one launch on the caller's stream with no workspace.
#include <cmath>
#include <limits>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/kernel.h"

namespace kiln::cuda {
namespace {

struct AttentionSpec {
  AttnMask mask = AttnMask::kNone;
  float scale = 1.f;
  bool default_scale = true;
  float fill = -std::numeric_limits<float>::infinity();
};

StatusOr<AttentionSpec> ReadAttentionSpec(const Node& node) {
  const AttributeMap& at = node.attrs();
  AttentionSpec s;
  std::string kind = at.GetString("mask_kind", "none");
  if (kind == "none") {
    s.mask = AttnMask::kNone;
  } else if (kind == "additive") {
    s.mask = AttnMask::kAdditive;
  } else if (kind == "boolean") {
    s.mask = AttnMask::kBoolean;
  } else if (kind == "causal") {
    s.mask = AttnMask::kCausal;
  } else {
    return MakeError(ErrorCode::kInvalidAttribute, "Attention mask_kind '{}' is unknown", kind);
  }
  s.default_scale = !at.Has("scale");
  s.scale = at.GetFloat("scale", 1.f);
  s.fill = at.GetFloat("mask_fill", -std::numeric_limits<float>::infinity());
  return s;
}

std::optional<BlasType> AttentionType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return BlasType::kF32;
    case DataType::kFloat16:
      return BlasType::kF16;
    case DataType::kBFloat16:
      return BlasType::kBF16;
    default:
      return std::nullopt;
  }
}

// Element strides of an operand whose dims are right-aligned against `out` (numpy broadcasting):
// the stride of each out dim, 0 where the operand has size 1 or lacks the dim.
std::vector<int64_t> BroadcastStrides(std::span<const int64_t> dims, std::span<const int64_t> out) {
  std::vector<int64_t> s(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < dims.size() && k < out.size(); ++k) {
    size_t di = dims.size() - 1 - k, oi = out.size() - 1 - k;
    s[oi] = dims[di] == 1 ? 0 : stride;
    stride *= dims[di];
  }
  return s;
}

class CudaAttentionKernel final : public Kernel {
 public:
  CudaAttentionKernel(AttentionSpec spec, BlasType type, int variant)
      : spec_(spec), type_(type), variant_(variant) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& y = out[0].dims;
    size_t r = in[0].dims.size();
    if (r < 2 || y.size() != r || in[1].dims.size() != r || in[2].dims.size() != r) {
      return MakeError(ErrorCode::kShapeMismatch, "Attention operands must share one rank >= 2");
    }
    AttentionParams p;
    p.type = type_;
    p.mask_kind = spec_.mask;
    p.sq = in[0].dims[r - 2];
    p.d = in[0].dims[r - 1];
    p.sk = in[1].dims[r - 2];
    p.dv = in[2].dims[r - 1];
    if (in[1].dims[r - 1] != p.d || in[2].dims[r - 2] != p.sk || y[r - 2] != p.sq ||
        y[r - 1] != p.dv) {
      return MakeError(ErrorCode::kShapeMismatch, "Attention Q/K/V/Y dims disagree");
    }
    if (variant_ == 1 && (p.d % 16 != 0 || p.dv % 16 != 0)) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "the tensor-core attention tactic needs head dims that are multiples of 16; "
                       "got {} / {}",
                       p.d, p.dv);
    }
    if (p.d > kAttentionMaxHeadDim || p.dv > kAttentionMaxHeadDim ||
        r - 2 > static_cast<size_t>(kAttentionMaxBatchDims)) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "Attention with head dims {} / {} and {} batch dims (at most {} and {})",
                       p.d, p.dv, r - 2, kAttentionMaxHeadDim, kAttentionMaxBatchDims);
    }
    p.batch_rank = static_cast<int>(r - 2);
    std::span<const int64_t> out_batch(y.data(), r - 2);
    p.batch = 1;
    for (size_t i = 0; i < r - 2; ++i) {
      p.out_batch_dims[i] = y[i];
      p.batch *= y[i];
    }
    if (p.batch > 65535) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "Attention batch of {} (product of the batch dims) exceeds 65535", p.batch);
    }
    auto fill = [&](const TensorView& t, int64_t* dst, int64_t matrix) {
      auto s = BroadcastStrides(std::span<const int64_t>(t.dims.data(), r - 2), out_batch);
      for (size_t i = 0; i < r - 2; ++i) dst[i] = s[i] * matrix;
    };
    fill(in[0], p.q_stride, p.sq * p.d);
    fill(in[1], p.k_stride, p.sk * p.d);
    fill(in[2], p.v_stride, p.sk * p.dv);
    if (spec_.mask == AttnMask::kAdditive || spec_.mask == AttnMask::kBoolean) {
      if (in.size() < 4 || in[3].dtype == DataType::kUndefined) {
        return MakeError(ErrorCode::kShapeMismatch, "Attention mask input is missing");
      }
      std::vector<int64_t> scores(y.begin(), y.end() - 2);
      scores.push_back(p.sq);
      scores.push_back(p.sk);
      if (in[3].dims.size() > scores.size()) {
        return MakeError(ErrorCode::kShapeMismatch, "Attention mask has rank {} > {}",
                         in[3].dims.size(), scores.size());
      }
      auto s = BroadcastStrides(in[3].dims, scores);
      for (size_t i = 0; i < scores.size(); ++i) p.m_stride[i] = s[i];
    }
    p.scale = spec_.default_scale ? 1.f / std::sqrt(static_cast<float>(p.d)) : spec_.scale;
    p.mask_fill = spec_.fill;
    params_ = p;
    prepared_ = true;
    return size_t{0};
  }

  Status Run(const KernelRunArgs& args) override {
    if (!prepared_) return MakeError(ErrorCode::kInternal, "Attention: Run before Prepare");
    AttentionParams p = params_;
    p.q = args.inputs[0].data;
    p.k = args.inputs[1].data;
    p.v = args.inputs[2].data;
    p.mask = args.inputs.size() > 3 ? args.inputs[3].data : nullptr;
    p.y = args.outputs[0].data;
    KILN_CUDA_RETURN_IF_ERROR(LaunchAttention(p, variant_, static_cast<cudaStream_t>(args.stream)));
    return OkStatus();
  }

 private:
  AttentionSpec spec_;
  BlasType type_;
  int variant_;
  AttentionParams params_;
  bool prepared_ = false;
};

class CudaAttentionProvider final : public KernelProvider {
 public:
  std::string_view id() const override { return "cuda.attention.flash"; }
  std::string_view op_type() const override { return "Attention"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const override {
    if (!ReadAttentionSpec(*request.node).ok() || request.inputs.size() < 3) return {};
    auto type = AttentionType(request.inputs[0].dtype);
    if (!type) return {};
    // Head dims must fit the kernels' registers; unknown (symbolic) ones are checked in Prepare.
    bool tc = *type != BlasType::kF32;
    for (int i : {0, 2}) {
      const Shape& s = request.inputs[i].shape;
      if (s.empty()) return {};
      const Dim& last = s.back();
      if (last.is_static() && last.value() > kAttentionMaxHeadDim) return {};
      tc = tc && last.is_static() && last.value() % 16 == 0;
    }
    static constexpr const char* kNames[] = {"f32", "f16", "bf16"};
    const char* t = kNames[static_cast<int>(*type)];
    std::vector<TacticConfig> tactics;
    if (tc) tactics.push_back({fmt::format("{}-attention-cuda-flash-wmma-64x64", t), {1}, 0});
    tactics.push_back({fmt::format("{}-attention-cuda-flash-simt-16x32", t), {0}, 0});
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(AttentionSpec spec, ReadAttentionSpec(*request.node));
    auto type =
        AttentionType(request.inputs.empty() ? DataType::kUndefined : request.inputs[0].dtype);
    if (!type) {
      return MakeError(ErrorCode::kInvalidArgument, "cuda.attention: Q must be f32, f16 or bf16");
    }
    int variant = tactic.params.empty() ? 0 : static_cast<int>(tactic.params[0]);
    if (tactic.params.size() > 1 || variant < 0 || variant > 1 ||
        (variant == 1 && *type == BlasType::kF32)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "cuda.attention: tactic '{}' has invalid params", tactic.name);
    }
    return std::unique_ptr<Kernel>(std::make_unique<CudaAttentionKernel>(spec, *type, variant));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(CudaAttentionProvider);

}  // namespace
}  // namespace kiln::cuda
