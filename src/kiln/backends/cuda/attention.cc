// Attention (kiln's fused op, src/kiln/ops/attention.cc) on CUDA: the provider around
// attention.cu's kernel. Prepare resolves the batch broadcasting and the mask's strides once;
// Run is one launch on the caller's stream with no workspace.
#include <cmath>
#include <limits>
#include <optional>

#include "kiln/backends/backend.h"
#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/fp8_quant.h"
#include "kiln/backends/kernel.h"
#include "kiln/ops/fused.h"

namespace kiln::cuda {
namespace {

// The device kernel's mask enum follows kiln/ops/fused.h's AttentionMask value for value.
static_assert(static_cast<int>(AttnMask::kNone) == static_cast<int>(AttentionMask::kNone) &&
              static_cast<int>(AttnMask::kAdditive) == static_cast<int>(AttentionMask::kAdditive) &&
              static_cast<int>(AttnMask::kBoolean) == static_cast<int>(AttentionMask::kBoolean) &&
              static_cast<int>(AttnMask::kCausal) == static_cast<int>(AttentionMask::kCausal));

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

// The builder keeps larger heads unfused by this bound (backend.h).
static_assert(kAttentionMaxHeadDim == kCudaAttentionMaxHeadDim);

class CudaAttentionKernel final : public Kernel {
 public:
  // out_amax: Y as E4M3 for an FP8 consumer of that amax (an FP8 edge); out_i8_scale: Y as int8
  // with that scale (an INT8 edge); mma variants only.
  CudaAttentionKernel(AttentionAttrs spec, BlasType type, int variant,
                      std::optional<float> out_amax, std::optional<float> out_i8_scale = {})
      : spec_(spec),
        type_(type),
        variant_(variant),
        out_amax_(out_amax),
        out_i8_scale_(out_i8_scale) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    if (in.size() < 3 || out.empty()) {
      return MakeError(ErrorCode::kShapeMismatch, "Attention needs Q, K, V and Y");
    }
    // Each operand as (batch dims, rows, row length, batch strides, row stride).
    struct View {
      std::vector<int64_t> batch, stride;
      int64_t rows = 0, cols = 0, row_stride = 0;
    };
    auto view = [&](const TensorView& t, int64_t parts) -> StatusOr<View> {
      const auto& x = t.dims;
      View v;
      if (spec_.layout == AttentionLayout::kBhsd) {
        (void)parts;  // qkv_packed is for bsd only (ReadAttentionAttrs)
        if (x.size() < 2) return MakeError(ErrorCode::kShapeMismatch, "Attention rank < 2");
        size_t r = x.size();
        v.batch.assign(x.begin(), x.end() - 2);
        v.rows = x[r - 2];
        v.cols = x[r - 1];
        v.row_stride = v.cols;
        v.stride.assign(r - 2, 0);
        int64_t st = v.rows * v.cols;
        for (size_t i = r - 2; i-- > 0;) {
          v.stride[i] = st;
          st *= x[i];
        }
        return v;
      }
      if (spec_.layout == AttentionLayout::kBshd && x.size() == 5) {
        // [B, S, G, R, D] (grouped-query attention): batch dims B, G and R; K and V have R = 1.
        v.rows = x[1];
        v.cols = x[4];
        v.row_stride = x[2] * x[3] * x[4];
        v.batch = {x[0], x[2], x[3]};
        v.stride = {x[1] * v.row_stride, x[3] * x[4], x[4]};
        return v;
      }
      const bool seq_first = spec_.layout == AttentionLayout::kSbd;
      const bool packed = spec_.layout == AttentionLayout::kBsd || seq_first;  // [., ., H*D]
      if (x.size() != (packed ? 3u : 4u)) {
        return MakeError(ErrorCode::kShapeMismatch, "Attention layout {} needs rank {} operands",
                         seq_first ? "sbd"
                         : packed  ? "bsd"
                                   : "bshd",
                         packed ? "3" : "4 or 5");
      }
      int64_t h = packed ? spec_.heads : x[2];
      int64_t e = packed ? x[2] : x[2] * x[3];
      if (packed && (h <= 0 || x[2] % (h * parts) != 0)) {
        return MakeError(ErrorCode::kShapeMismatch, "Attention: {} columns are not {} heads", x[2],
                         h);
      }
      v.cols = e / parts / h;
      if (seq_first) {  // [S, B, E]: row s of batch b at (s * B + b) * E
        v.batch = {x[1], h};
        v.rows = x[0];
        v.row_stride = x[1] * e;
        v.stride = {e, v.cols};
      } else {
        v.batch = {x[0], h};
        v.rows = x[1];
        v.row_stride = e;
        v.stride = {x[1] * e, v.cols};
      }
      return v;
    };
    const int64_t parts = spec_.qkv_packed ? 3 : 1;
    KILN_ASSIGN_OR_RETURN(View q, view(in[0], parts));
    KILN_ASSIGN_OR_RETURN(View k, view(in[1], parts));
    KILN_ASSIGN_OR_RETURN(View v, view(in[2], parts));
    KILN_ASSIGN_OR_RETURN(View y, view(out[0], 1));
    // Packed: K and V start a third and two thirds into each row.
    // (A third of the row length, 3*H*D: in layout sbd the row stride is B rows of it.)
    k_offset_ = spec_.qkv_packed ? in[1].dims[2] / 3 : 0;
    v_offset_ = spec_.qkv_packed ? 2 * (in[2].dims[2] / 3) : 0;
    size_t nb = y.batch.size();
    if (q.batch.size() != nb || k.batch.size() != nb || v.batch.size() != nb) {
      return MakeError(ErrorCode::kShapeMismatch, "Attention operands must share one rank >= 2");
    }
    AttentionParams p;
    p.type = type_;
    p.mask_kind = static_cast<AttnMask>(spec_.mask);
    p.sq = q.rows;
    p.d = q.cols;
    p.sk = k.rows;
    p.dv = v.cols;
    if (k.cols != p.d || v.rows != p.sk || y.rows != p.sq || y.cols != p.dv) {
      return MakeError(ErrorCode::kShapeMismatch, "Attention Q/K/V/Y dims disagree");
    }
    if (variant_ == 1 && (p.d % 16 != 0 || p.dv % 16 != 0)) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "the tensor-core attention tactic needs head dims that are multiples of 16; "
                       "got {} / {}",
                       p.d, p.dv);
    }
    if (p.d > kAttentionMaxHeadDim || p.dv > kAttentionMaxHeadDim ||
        nb > static_cast<size_t>(kAttentionMaxBatchDims)) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "Attention with head dims {} / {} and {} batch dims (at most {} and {})",
                       p.d, p.dv, nb, kAttentionMaxHeadDim, kAttentionMaxBatchDims);
    }
    p.batch_rank = static_cast<int>(nb);
    p.batch = 1;
    for (size_t i = 0; i < nb; ++i) {
      p.out_batch_dims[i] = y.batch[i];
      p.batch *= y.batch[i];
    }
    if (p.batch > 65535) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "Attention batch of {} (product of the batch dims) exceeds 65535", p.batch);
    }
    // Batch strides against Y's batch dims (numpy broadcasting: 0 where an operand has size 1).
    auto fill = [&](const View& x, int64_t* dst) -> Status {
      for (size_t i = 0; i < nb; ++i) {
        if (x.batch[i] != y.batch[i] && x.batch[i] != 1) {
          return MakeError(ErrorCode::kShapeMismatch,
                           "Attention batch dim {} of {} does not broadcast to {}", i, x.batch[i],
                           y.batch[i]);
        }
        dst[i] = x.batch[i] == 1 && y.batch[i] != 1 ? 0 : x.stride[i];
      }
      return OkStatus();
    };
    KILN_RETURN_IF_ERROR(fill(q, p.q_stride));
    KILN_RETURN_IF_ERROR(fill(k, p.k_stride));
    KILN_RETURN_IF_ERROR(fill(v, p.v_stride));
    KILN_RETURN_IF_ERROR(fill(y, p.y_stride));
    p.q_row = q.row_stride;
    p.k_row = k.row_stride;
    p.v_row = v.row_stride;
    p.y_row = y.row_stride;
    if (spec_.mask == AttentionMask::kAdditive || spec_.mask == AttentionMask::kBoolean) {
      if (in.size() < 4 || in[3].dtype == DataType::kUndefined) {
        return MakeError(ErrorCode::kShapeMismatch, "Attention mask input is missing");
      }
      std::vector<int64_t> scores = y.batch;  // the logical scores [batch..., Sq, Sk]
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
    p.mask_fill = spec_.mask_fill;
    if (variant_ >= 2 && (!AttentionMmaSupports(p) || k_offset_ % 8 != 0 || v_offset_ % 8 != 0)) {
      return MakeError(ErrorCode::kAttentionUnsupported,
                       "the mma attention tactic needs f16/bf16, equal head dims of 16, 32, 64 or "
                       "128 and 16-byte aligned rows; got head dims {} / {}",
                       p.d, p.dv);
    }
    params_ = p;
    prepared_ = true;
    return size_t{0};
  }

  Status Run(const KernelRunArgs& args) override {
    if (!prepared_) return MakeError(ErrorCode::kInternal, "Attention: Run before Prepare");
    AttentionParams p = params_;
    p.q = args.inputs[0].data;
    const int64_t es = type_ == BlasType::kF32 ? 4 : 2;
    p.k = static_cast<const char*>(args.inputs[1].data) + k_offset_ * es;
    p.v = static_cast<const char*>(args.inputs[2].data) + v_offset_ * es;
    p.mask = args.inputs.size() > 3 ? args.inputs[3].data : nullptr;
    if (out_amax_) {
      p.y_e4m3 = static_cast<uint8_t*>(args.outputs[0].data);
      p.y_inv_scale = Fp8InvScale(*out_amax_);
    } else if (out_i8_scale_) {
      p.y_i8 = static_cast<int8_t*>(args.outputs[0].data);
      p.y_inv_scale = 1.f / *out_i8_scale_;
    } else {
      p.y = args.outputs[0].data;
    }
    KILN_CUDA_RETURN_IF_ERROR(LaunchAttention(p, variant_, static_cast<cudaStream_t>(args.stream)));
    return OkStatus();
  }

 private:
  AttentionAttrs spec_;
  BlasType type_;
  int variant_;
  std::optional<float> out_amax_;
  std::optional<float> out_i8_scale_;
  AttentionParams params_;
  int64_t k_offset_ = 0, v_offset_ = 0;  // elements (qkv_packed)
  bool prepared_ = false;
};

class CudaAttentionProvider final : public KernelProvider {
 public:
  std::string_view id() const override { return "cuda.attention.flash"; }
  std::string_view op_type() const override { return "Attention"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const override {
    auto spec = ReadAttentionAttrs(request.node->attrs());
    if (!spec.ok() || request.inputs.size() < 3) return {};
    auto type = ToBlasType(request.inputs[0].dtype);
    if (!type) return {};
    // Head dims must fit the kernels' registers; unknown (symbolic) ones are checked in Prepare.
    // (In layouts bsd and sbd a row holds num_heads heads.)
    auto head_dim = [&](const Shape& s) -> int64_t {
      if (s.empty() || !s.back().is_static()) return -1;
      if (spec->layout == AttentionLayout::kBsd || spec->layout == AttentionLayout::kSbd) {
        int64_t h = spec->heads * (spec->qkv_packed ? 3 : 1);
        return s.back().value() % h == 0 ? s.back().value() / h : 0;
      }
      return s.back().value();
    };
    if (request.inputs[0].shape.empty() || request.inputs[2].shape.empty()) return {};
    int64_t dq = head_dim(request.inputs[0].shape), dvv = head_dim(request.inputs[2].shape);
    if (dq == 0 || dvv == 0 || dq > kAttentionMaxHeadDim || dvv > kAttentionMaxHeadDim) return {};
    bool tc = *type != BlasType::kF32 && dq > 0 && dvv > 0 && dq % 16 == 0 && dvv % 16 == 0;
    static constexpr const char* kNames[] = {"f32", "f16", "bf16"};
    const char* t = kNames[static_cast<int>(*type)];
    std::vector<TacticConfig> tactics;
    // mma.sync (S, P and O in registers) first: d == dv in {16, 32, 64, 128}; alignment is
    // checked in Prepare, which the builder's timing turns into a skipped tactic.
    bool mma =
        *type != BlasType::kF32 && dq == dvv && (dq == 16 || dq == 32 || dq == 64 || dq == 128);
    if (mma) {
      // Ranked by the sequence lengths (the default build times the first two): one key tile
      // (Swin's windows, short prompts) gains nothing from cp.async double buffering, where
      // small row blocks keep enough blocks in flight; long sequences (Whisper's 1500 frames)
      // want the K/V tiles prefetched and read once for many rows, and (head dims up to 64)
      // each fragment used for two m-tiles.
      auto seq_len = [&](const Shape& sh) -> int64_t {
        const int64_t r = static_cast<int64_t>(sh.size());
        int64_t axis = r - 2;  // bhsd, bsd
        if (spec->layout == AttentionLayout::kBshd) axis = 1;
        if (spec->layout == AttentionLayout::kSbd) axis = 0;
        if (axis < 0 || !sh[axis].is_static()) return -1;
        return sh[axis].value();
      };
      const int64_t sq = seq_len(request.inputs[0].shape);
      const int64_t sk = seq_len(request.inputs[1].shape);
      const TacticConfig pipe128{fmt::format("{}-attention-cuda-flash-mma-pipe-128x64", t), {5}, 0};
      const TacticConfig pipe64{fmt::format("{}-attention-cuda-flash-mma-pipe-64x64", t), {4}, 0};
      const TacticConfig mma64{fmt::format("{}-attention-cuda-flash-mma-64x64", t), {2}, 0};
      const TacticConfig mma32{fmt::format("{}-attention-cuda-flash-mma-32x64", t), {3}, 0};
      // Two m-tiles per warp: K/V fragments read once for 32 rows (head dims up to 64).
      const TacticConfig pipe2m{
          fmt::format("{}-attention-cuda-flash-mma-pipe2m-128x64", t), {6}, 0};
      // (Variant 7, a kernel that skipped a short sequence's last key groups, is gone: the
      // launcher sent its number to the SIMT kernel, so its tactic timed and checked that one, 10
      // to 50 times slower than the plain kernel in bench/cuda_kernels, and the kernel itself
      // never ran.)
      const bool one_tile = sk >= 0 && sk <= 64;
      const bool two_tiles = !one_tile && sk >= 0 && sk <= 128;
      const bool long_rows = !one_tile && (sq < 0 || sq >= 256);
      const bool two_m = dq <= 64;
      // The orders follow cuda_kernels_bench's attention cases (batch 32, H100, session 37): two
      // tiles (BERT's and GPT-2's 128 tokens) ran fastest pipelined with 4 warps, just ahead of
      // single-buffered (BERT 26.4 vs 27.0 us, GPT-2 17.0 vs 17.8), ViT's 197 tokens with two
      // m-tiles (43.5 vs 44.7 us pipelined), and Whisper's 1500 frames with two m-tiles (162 vs
      // 181 us with 8 warps). The plain pipelined kernel stays among the first two everywhere but
      // one tile, so a default build still times it.
      if (one_tile) {
        tactics.insert(tactics.end(), {mma64, mma32, pipe64, pipe128});
      } else if (two_tiles && !long_rows) {
        tactics.insert(tactics.end(), {pipe64, mma64, pipe128, mma32});
        if (two_m) tactics.push_back(pipe2m);
      } else {
        if (two_m) tactics.push_back(pipe2m);
        if (long_rows) tactics.push_back(pipe128);
        tactics.insert(tactics.end(), {pipe64, mma64, mma32});
        if (!long_rows) tactics.push_back(pipe128);
      }
    }
    if (tc) tactics.push_back({fmt::format("{}-attention-cuda-flash-wmma-64x64", t), {1}, 0});
    tactics.push_back({fmt::format("{}-attention-cuda-flash-simt-16x32", t), {0}, 0});
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(AttentionAttrs spec, ReadAttentionAttrs(request.node->attrs()));
    auto type = ToBlasType(request.inputs.empty() ? DataType::kUndefined : request.inputs[0].dtype);
    if (!type) {
      return MakeError(ErrorCode::kInvalidArgument, "cuda.attention: Q must be f32, f16 or bf16");
    }
    int variant = tactic.params.empty() ? 0 : static_cast<int>(tactic.params[0]);
    if (tactic.params.size() > 1 || variant < 0 || variant > 6 ||
        (variant >= 1 && *type == BlasType::kF32)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "cuda.attention: tactic '{}' has invalid params", tactic.name);
    }
    std::optional<float> out_amax;
    if (!request.outputs.empty() && request.outputs[0].dtype == kFp8EdgeType) {
      out_amax = Fp8OutputAmax(*request.node);
      if (!out_amax || variant < 2) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "cuda.attention: an E4M3 Y needs the mma kernels (tactic '{}') and a "
                         "finite positive {}",
                         tactic.name, kFp8OutputAmaxAttr);
      }
    }
    std::optional<float> out_i8_scale;
    if (!request.outputs.empty() && request.outputs[0].dtype == kInt8EdgeType) {
      const float s = request.node->attrs().GetFloat(kInt8OutputScaleAttr, 0.f);
      if (!std::isfinite(s) || s <= 0.f || variant < 2) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "cuda.attention: an int8 Y needs the mma kernels (tactic '{}') and a "
                         "finite positive {}",
                         tactic.name, kInt8OutputScaleAttr);
      }
      out_i8_scale = s;
    }
    return std::unique_ptr<Kernel>(
        std::make_unique<CudaAttentionKernel>(spec, *type, variant, out_amax, out_i8_scale));
  }

  // An FP8 edge's producer (ops/quant_edge.h): the mma kernels store Y's FP16/BF16 pairs as E4M3.
  bool WritesFp8Output(const KernelRequest& request, const TacticConfig& tactic) const override {
    auto type = ToBlasType(request.inputs.empty() ? DataType::kUndefined : request.inputs[0].dtype);
    return type && *type != BlasType::kF32 && tactic.params.size() == 1 && tactic.params[0] >= 2 &&
           tactic.params[0] <= 6;
  }
  // An INT8 edge's producer: the same kernels store the pairs as int8.
  bool WritesInt8Output(const KernelRequest& request, const TacticConfig& tactic) const override {
    return WritesFp8Output(request, tactic);
  }
};
KILN_REGISTER_KERNEL_PROVIDER(CudaAttentionProvider);

}  // namespace
}  // namespace kiln::cuda
