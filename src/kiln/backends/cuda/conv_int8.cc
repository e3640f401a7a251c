// INT8 Conv and FusedConv on CUDA as an implicit GEMM (implicit_gemm_conv.h) on kiln's own 8-bit
// tensor-core kernels: "i8-conv-cuda-mma-<tile>" (int8_mma_gemm.cu's LaunchInt8MmaConv, sm_80+)
// and, on Hopper, "i8-conv-cuda-wgmma-<tile>" (int8_wgmma_gemm.cu's LaunchInt8WgmmaConv); the
// same for FusedConv ("i8-fused-conv-..."). KILN_CUDA_INT8_KERNEL picks the families as for the
// matrix products (cublaslt_util.h: both by default, wgmma on Hopper only). Offered for the nodes
// quant_conv_plan.h describes (channels-last, 2-D, group 1, an INT8 activation with zero point 0)
// where the CUDA quant tactics are on (QuantTacticsEnabled).
// Anything else keeps cuDNN's FP16 convolution.
//
// Create quantizes the constant weight per output channel (or takes a QDQ model's integers),
// packs it as the kernel's B [Kp, R * S * Cp] and uploads it with the per-channel output scales.
// Each Run is two launches on the caller's stream: X quantized into the workspace as
// [N, H, W, Cp] int8 (channels zero padded to a multiple of 16), then the convolution with the
// epilogue fused: y = act(acc * x_scale * w_scale[k] + bias[k] + Z) in the layer's float type. A
// pointwise layer (1x1, stride 1, no padding) is a plain matrix product on the quantized X and
// takes every tile of the matrix kernel (wgmma's TMA ones included); others the gathering tiles.
// On INT8 edges (builder/quant_edges.h) the layer reads its producer's int8 X in place (no
// quantization launch) and/or writes int8 for its consumer (the epilogue quantizes Y).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/cuda/quant_conv_plan.h"
#include "kiln/backends/cuda/quant_gemm_plan.h"
#include "kiln/backends/int8_quant.h"
#include "kiln/backends/kernel.h"
#include "kiln/ir/sizes.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/quant_edge.h"

namespace kiln::cuda {
namespace {

// The workspace: [alignment slack][X quantized: N * H * W * Cp bytes].
size_t ConvWorkspace(int64_t n, int64_t h, int64_t w, int64_t cp) {
  return kWorkspaceAlign + AlignUpSize(static_cast<size_t>(n * h * w * cp), kWorkspaceAlign);
}

class Int8ConvKernel final : public Kernel {
 public:
  // b: the packed weights [kp, depth] on the device; col_scale their kp scales.
  // wgmma: the Hopper warpgroup kernel's tile, else the mma.sync kernel's.
  Int8ConvKernel(QuantizedConv q, int64_t kp, int64_t depth, OwnedDeviceMemory b,
                 OwnedDeviceMemory col_scale, bool wgmma, int tile, std::string name)
      : q_(std::move(q)),
        kp_(kp),
        depth_(depth),
        b_(std::move(b)),
        col_scale_(std::move(col_scale)),
        wgmma_(wgmma),
        tile_(tile),
        name_(std::move(name)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    if (inputs.size() < 2 || outputs.size() != 1) {
      return MakeError(ErrorCode::kInternal, "{}: needs X, W and one output", name_);
    }
    KILN_ASSIGN_OR_RETURN(conv_, ImplicitGemmFor(q_, inputs[0].dims, outputs[0].dims));
    if (q_.pointwise != IsPointwise(conv_)) {
      return MakeError(ErrorCode::kInternal,
                       "{}: the layer's window says pointwise={}, its shapes not", name_,
                       q_.pointwise);
    }
    if (q_.has_z) {
      const auto& z = inputs[3].dims;
      if (!std::equal(z.begin(), z.end(), outputs[0].dims.begin(), outputs[0].dims.end())) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "{}: the residual Z [{}] must have Y's dims [{}] (NHWC)", name_,
                         fmt::join(z, ","), fmt::join(outputs[0].dims, ","));
      }
    }
    empty_ = conv_.rows() == 0;
    if (empty_ || q_.in_int8) return size_t{0};  // an int8 X is read where it is
    workspace_ = ConvWorkspace(conv_.batch, conv_.h, conv_.w, conv_.cp);
    return workspace_;
  }

  Status Run(const KernelRunArgs& args) override {
    if (empty_) return OkStatus();
    if (conv_.rows() == 0) return MakeError(ErrorCode::kInternal, "{}: Run before Prepare", name_);
    cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
    const int8_t* x_q = static_cast<const int8_t*>(args.inputs[0].data);
    if (!q_.in_int8) {
      if (args.workspace == nullptr || args.workspace_bytes < workspace_) {
        return MakeError(ErrorCode::kInternal, "{}: workspace of {} bytes; {} needed", name_,
                         args.workspace_bytes, workspace_);
      }
      auto* q = reinterpret_cast<int8_t*>(
          AlignUpSize(reinterpret_cast<uintptr_t>(args.workspace), kWorkspaceAlign));
      Int8QuantizeParams qp;
      qp.x = args.inputs[0].data;
      qp.type = q_.type;
      qp.q = q;
      qp.rows = conv_.batch * conv_.h * conv_.w;
      qp.depth = q_.c;
      qp.ldq = conv_.cp;
      qp.row_stride = q_.c;
      qp.col_stride = 1;
      qp.inv_scale = 1.f / q_.input.scale;
      KILN_CUDA_RETURN_IF_ERROR(LaunchInt8Quantize(qp, stream));
      x_q = q;
    }

    Int8MmaGemmParams g;
    g.a = x_q;
    g.lda = conv_.cp;
    g.b = static_cast<const int8_t*>(b_.get());
    g.ldb = depth_;
    g.np = kp_;
    g.depth = depth_;
    g.tile = tile_;
    g.y_quantized = q_.out_scale > 0.f;
    if (g.y_quantized) g.y_inv_scale = 1.f / q_.out_scale;
    Int8EpilogueParams& e = g.epi;
    e.col_scale = static_cast<const float*>(col_scale_.get());
    e.y = args.outputs[0].data;
    e.type = q_.type;
    e.rows = conv_.rows();
    e.cols = q_.k;
    if (q_.has_bias) {
      e.c = args.inputs[2].data;
      e.c_row_stride = 0;
      e.c_col_stride = 1;
      e.beta = 1.f;
    }
    if (q_.has_z) e.z = args.inputs[3].data;
    e.act = static_cast<BlasAct>(q_.act.kind);
    e.act_min = q_.act.min;
    e.act_max = q_.act.max;
    // Pointwise: A is the quantized X as a matrix, the plain kernel's (every tile).
    if (wgmma_) {
      KILN_CUDA_RETURN_IF_ERROR(q_.pointwise ? LaunchInt8WgmmaGemm(g, stream)
                                             : LaunchInt8WgmmaConv(g, conv_, stream));
    } else {
      KILN_CUDA_RETURN_IF_ERROR(q_.pointwise ? LaunchInt8MmaGemm(g, stream)
                                             : LaunchInt8MmaConv(g, conv_, stream));
    }
    return OkStatus();
  }

 private:
  QuantizedConv q_;
  int64_t kp_, depth_;
  OwnedDeviceMemory b_;          // int8 [Kp, R * S * Cp]
  OwnedDeviceMemory col_scale_;  // float [Kp]: x_scale * w_scale[k] (0 in the padding)
  bool wgmma_;
  int tile_;
  std::string name_;
  ImplicitGemmConv conv_;
  bool empty_ = false;
  size_t workspace_ = 0;
};

class Int8ConvProviderBase : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }
  bool SupportsLayout(std::string_view layout) const final { return layout == "NHWC"; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    std::optional<QuantizedConv> q = ResolveQuantizedConv(request);
    // The gate after the layer is known to be INT8, so that only INT8 builds hear about it.
    if (!q || !QuantTacticsEnabled()) return {};
    const Int8Families families = Int8FamiliesFromEnv();
    const std::vector<int64_t> x = LargestDims(request.inputs[0]);
    const std::vector<int64_t> y = LargestDims(request.outputs[0]);
    if (x.size() != 4 || y.size() != 4) return {};
    // N * OH * OW at the profile's largest (saturated: a product past int64 fits no tile).
    const int64_t rows = SatMul(SatMul(y[0], y[1]), y[2]);
    std::vector<TacticConfig> wgmma, mma;
    auto own = [&](std::vector<TacticConfig>& out, const char* family, int64_t tag, int tile,
                   const char* tile_name) {
      TacticConfig t;
      t.name = fmt::format("i8-{}-cuda-{}-{}", what(), family, tile_name);
      t.params = {tag, tile};
      t.family = family;
      t.workspace_bytes = q->in_int8 ? 0 : ConvWorkspace(x[0], x[1], x[2], PaddedChannels(q->c));
      out.push_back(std::move(t));
    };
    if (families.wgmma && Int8WgmmaAvailable()) {
      for (int tile : Int8WgmmaTilesOffered(
               q->pointwise ? WgmmaTileUse::kPointwiseConv : WgmmaTileUse::kGatherConv, rows,
               q->k)) {
        if (!Int8TileFitsRows(rows, Int8WgmmaTileRows(tile))) continue;
        own(wgmma, "wgmma", kWgmmaTag, tile, Int8WgmmaTileName(tile));
      }
    }
    if (families.mma && MmaCapable()) {
      for (int tile = 0; tile < Int8MmaTileCount(); ++tile) {
        if (!Int8TileFitsRows(rows, Int8MmaTileRows(tile))) continue;
        own(mma, "mma", kMmaTag, tile, Int8MmaTileName(tile));
      }
    }
    return InterleaveFamilies({&wgmma, &mma});
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    const Node& node = *request.node;
    std::optional<QuantizedConv> q = ResolveQuantizedConv(request);
    if (!q) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a channels-last (NHWC) 2-D convolution with group 1, "
                       "a finite positive {} attribute (or the model's scales with zero point 0), "
                       "a constant float weight and X, Y, bias and Z of one float type (on INT8 "
                       "edges an int8 X of a multiple of 16 channels, an int8 Y with {}, or both)",
                       node.name(), tactic.name, kInt8InputAmaxAttr, kInt8OutputScaleAttr);
    }
    const bool wgmma = OwnTactic(tactic) && tactic.params[0] == kWgmmaTag;
    if (!OwnTactic(tactic) || !TileRuns(*q, wgmma, tactic.params[1])) {
      return MakeError(
          ErrorCode::kInvalidArgument,
          "{}: tactic '{}' is not one of this provider's (wgmma or mma tag, and a "
          "tile of that kernel below {}{})",
          id(), tactic.name, wgmma ? Int8WgmmaTileCount() : Int8MmaTileCount(),
          wgmma && !q->pointwise ? " that gathers: this layer has a window or stride" : "");
    }
    if (wgmma && !Int8WgmmaAvailable()) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a compute capability 9.0 GPU and a kiln built with "
                       "sm_90a code (KILN_CUDA_ARCHS with 90a-real)",
                       node.name(), tactic.name);
    }
    if (!wgmma && !MmaCapable()) {
      return MakeError(ErrorCode::kNoTactic, "node '{}': {} needs a compute capability 8.0 GPU",
                       node.name(), tactic.name);
    }
    const Tensor w_f32 = request.inputs[1].constant->CastTo(DataType::kFloat32);
    KILN_ASSIGN_OR_RETURN(Int8Weights w, Int8WeightsFor(node, w_f32));
    const Int8PackedConv packed = PackInt8Conv(*q, w);
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory b,
                          UploadToDevice(packed.packed.data(), packed.packed.size()));
    KILN_ASSIGN_OR_RETURN(
        OwnedDeviceMemory scales,
        UploadToDevice(packed.col_scale.data(), packed.col_scale.size() * sizeof(float)));
    return std::unique_ptr<Kernel>(std::make_unique<Int8ConvKernel>(
        *q, packed.kp, packed.depth, std::move(b), std::move(scales), wgmma,
        static_cast<int>(tactic.params[1]), tactic.name));
  }

  // An INT8 edge's producer (it quantizes Y in its epilogue) or consumer (an int8 X of a
  // multiple of 16 channels, read in place), or both: a chain of convolutions passes int8 along.
  bool WritesInt8Output(const KernelRequest& request, const TacticConfig& tactic) const final {
    return OwnTactic(tactic) && ResolveQuantizedConv(request).has_value();
  }
  bool ReadsInt8Input(const KernelRequest& request, const TacticConfig& tactic) const final {
    std::optional<QuantizedConv> q = ResolveQuantizedConv(request);
    return OwnTactic(tactic) && q && PaddedChannels(q->c) == q->c;
  }

 protected:
  virtual const char* what() const = 0;

 private:
  // A pointwise layer runs on every tile of the wgmma matrix kernel; others on the gathering
  // ones. The mma.sync kernel gathers in every tile.
  static bool TileRuns(const QuantizedConv& q, bool wgmma, int64_t tile) {
    if (tile < 0 || tile >= (wgmma ? Int8WgmmaTileCount() : Int8MmaTileCount())) return false;
    return !wgmma || q.pointwise || Int8WgmmaTileGathers(static_cast<int>(tile));
  }
  static bool OwnTactic(const TacticConfig& t) {
    return t.params.size() == 2 && (t.params[0] == kWgmmaTag || t.params[0] == kMmaTag);
  }
};

class Int8ConvProvider final : public Int8ConvProviderBase {
 public:
  std::string_view id() const override { return "cuda.conv.i8"; }
  std::string_view op_type() const override { return "Conv"; }

 protected:
  const char* what() const override { return "conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8ConvProvider);

class Int8FusedConvProvider final : public Int8ConvProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_conv.i8"; }
  std::string_view op_type() const override { return "FusedConv"; }

 protected:
  const char* what() const override { return "fused-conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8FusedConvProvider);

}  // namespace
}  // namespace kiln::cuda
