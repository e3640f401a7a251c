// CUDA providers of Pad and Tile (kernel in pad.cu): any dtype (these move bytes). Pad's pads and
// axes are used as host values when they are build-time constants and read by the kernel when
// they are run-time tensors; Tile needs no repeats at run time (the output dims, from shape
// inference, already say how often).
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

bool AnyType(const KernelRequest& r) { return ToElem(InType(r, 0)).has_value(); }
bool IndexType(DataType t) { return t == DataType::kInt64 || t == DataType::kInt32; }

// Rank 0 (a scalar Tile) is a copy of one element.
Status CopyScalar(const KernelRunArgs& a) {
  if (a.outputs[0].size_bytes() == 0) return OkStatus();
  KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.outputs[0].data, a.inputs[0].data,
                                            a.outputs[0].size_bytes(), cudaMemcpyDeviceToDevice,
                                            StreamOf(a)));
  return OkStatus();
}

class PadKernel final : public Kernel {
 public:
  // `pads`/`axes`: the constant values when known at build time (axes empty: all axes).
  PadKernel(PadMode mode, std::string mode_name, bool tile,
            std::optional<std::vector<int64_t>> pads, std::optional<std::vector<int64_t>> axes)
      : mode_(mode),
        mode_name_(std::move(mode_name)),
        tile_(tile),
        pads_(std::move(pads)),
        axes_(std::move(axes)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& x = in[0].dims;
    const auto& y = out[0].dims;
    if (x.size() != y.size() || x.size() > static_cast<size_t>(kMaxRank)) {
      return MakeError(ErrorCode::kUnimplemented, "{} of rank {} to rank {} on CUDA (rank <= {})",
                       tile_ ? "Tile" : "Pad", x.size(), y.size(), kMaxRank);
    }
    d_ = PadDesc{};
    d_.rank = static_cast<int32_t>(x.size());
    d_.mode = mode_;
    for (size_t a = 0; a < x.size(); ++a) {
      d_.in[a] = x[a];
      d_.out[a] = y[a];
      // The CPU reference refuses to pad an empty axis by edge/wrap/reflect: nothing to copy.
      if (x[a] == 0 && y[a] > 0 && mode_ != PadMode::kConstant) {
        return MakeError(ErrorCode::kKernelFailed, "{} mode {} on an empty axis",
                         tile_ ? "Tile" : "Pad", mode_name_);
      }
    }
    if (tile_ || !pads_) return size_t{0};
    size_t rank = x.size();
    std::vector<int64_t> axes = axes_.value_or(std::vector<int64_t>{});
    if (axes.empty()) {
      for (size_t a = 0; a < rank; ++a) axes.push_back(static_cast<int64_t>(a));
    }
    if (pads_->size() != 2 * axes.size()) {
      return MakeError(ErrorCode::kShapeMismatch, "Pad has {} pads for {} axes", pads_->size(),
                       axes.size());
    }
    for (size_t j = 0; j < axes.size(); ++j) {
      int64_t ax = axes[j] < 0 ? axes[j] + static_cast<int64_t>(rank) : axes[j];
      if (ax < 0 || ax >= static_cast<int64_t>(rank)) {
        return MakeError(ErrorCode::kShapeMismatch, "Pad axis {} of rank {}", axes[j], rank);
      }
      d_.begin[ax] = (*pads_)[j];
    }
    return size_t{0};
  }

  Status Run(const KernelRunArgs& a) override {
    if (d_.rank == 0) return CopyScalar(a);
    PadDesc d = d_;
    if (!tile_) {
      if (!pads_) {
        const TensorView& pads = a.inputs[1];
        bool has_axes = Present(a, 3);
        d.pads = pads.data;
        d.idx64 = pads.dtype == DataType::kInt64;
        d.axes = has_axes ? a.inputs[3].data : nullptr;
        d.count =
            static_cast<int32_t>(has_axes ? a.inputs[3].num_elements() : pads.num_elements() / 2);
        if (d.count > kMaxRank) {
          return MakeError(ErrorCode::kShapeMismatch, "Pad with {} axes", d.count);
        }
      }
      if (mode_ == PadMode::kConstant && Present(a, 2) && a.inputs[2].num_elements() > 0) {
        d.fill = a.inputs[2].data;
      }
    }
    return Launched(LaunchPad(SizeOf(a.inputs[0].dtype), d, a.inputs[0].data, a.outputs[0].data,
                              a.outputs[0].num_elements(), StreamOf(a)),
                    tile_ ? "Tile kernel" : "Pad kernel");
  }

 private:
  PadMode mode_;
  std::string mode_name_;
  bool tile_;
  std::optional<std::vector<int64_t>> pads_, axes_;
  PadDesc d_;
};

CudaOpDef PadDef() {
  return {
      .op_type = "Pad",
      .accepts =
          [](const KernelRequest& r) {
            if (!AnyType(r) || r.inputs.size() < 2 || !IndexType(InType(r, 1))) return false;
            std::string mode = attrs::Pad::mode(*r.node);
            if (mode != "constant" && mode != "edge" && mode != "wrap" && mode != "reflect") {
              return false;
            }
            // Run-time pads and axes must share one index type (the kernel reads both alike).
            bool axes = r.inputs.size() > 3 && InType(r, 3) != DataType::kUndefined;
            if (axes && !IndexType(InType(r, 3))) return false;
            bool both_runtime = axes && !ConstantInts(r, 1) && !ConstantInts(r, 3);
            if (both_runtime && InType(r, 3) != InType(r, 1)) return false;
            if (axes && ConstantInts(r, 1).has_value() != ConstantInts(r, 3).has_value()) {
              return false;  // one constant, one not: no such models seen; the CPU runs them
            }
            bool fill = r.inputs.size() > 2 && InType(r, 2) != DataType::kUndefined;
            return !fill || InType(r, 2) == InType(r, 0);
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::string name = attrs::Pad::mode(*r.node);
        PadMode mode = name == "edge"      ? PadMode::kEdge
                       : name == "wrap"    ? PadMode::kWrap
                       : name == "reflect" ? PadMode::kReflect
                                           : PadMode::kConstant;
        bool has_axes = r.inputs.size() > 3 && InType(r, 3) != DataType::kUndefined;
        auto pads = ConstantInts(r, 1);
        std::optional<std::vector<int64_t>> axes =
            has_axes ? ConstantInts(r, 3)
                     : std::optional<std::vector<int64_t>>(std::vector<int64_t>{});
        if (!pads || !axes) {
          pads.reset();
          axes.reset();
        }
        return std::unique_ptr<Kernel>(
            std::make_unique<PadKernel>(mode, name, false, std::move(pads), std::move(axes)));
      },
  };
}
KILN_CUDA_OP_PROVIDER(PadProvider, PadDef());

CudaOpDef TileDef() {
  return {
      .op_type = "Tile",
      .accepts = AnyType,
      .create = [](const KernelRequest&) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(
            std::make_unique<PadKernel>(PadMode::kWrap, "wrap", true, std::nullopt, std::nullopt));
      },
  };
}
KILN_CUDA_OP_PROVIDER(TileProvider, TileDef());

}  // namespace
}  // namespace kiln::cuda
