// CUDA providers of DepthToSpace and SpaceToDepth: each is a reshape to 6-D and a transpose, so
// they reuse copy.cu's strided (and tiled) copy with the plan built in Prepare. Any dtype.
#include "kiln/backends/cuda/cuda_kernel.h"

namespace kiln::cuda {
namespace {

class SpaceDepthKernel final : public Kernel {
 public:
  SpaceDepthKernel(bool to_space, bool crd, int64_t block)
      : to_space_(to_space), crd_(crd), block_(block) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& x = in[0].dims;
    int64_t b = block_;
    if (x.size() != 4 || b < 1) {
      return MakeError(ErrorCode::kShapeMismatch, "{} of rank {} with blocksize {}",
                       to_space_ ? "DepthToSpace" : "SpaceToDepth", x.size(), b);
    }
    int64_t n = x[0], c = x[1], h = x[2], w = x[3];
    // The same reshapes and permutations as the CPU kernel (transpose.cc).
    std::vector<int64_t> dims, perm;
    if (!to_space_) {
      if (h % b != 0 || w % b != 0) {
        return MakeError(ErrorCode::kShapeMismatch, "SpaceToDepth of {}x{} by blocksize {}", h, w,
                         b);
      }
      dims = {n, c, h / b, b, w / b, b};
      perm = {0, 3, 5, 1, 2, 4};
    } else {
      if (c % (b * b) != 0) {
        return MakeError(ErrorCode::kShapeMismatch, "DepthToSpace of {} channels by blocksize {}",
                         c, b);
      }
      if (crd_) {
        dims = {n, c / (b * b), b, b, h, w};
        perm = {0, 1, 4, 2, 5, 3};
      } else {
        dims = {n, b, b, c / (b * b), h, w};
        perm = {0, 3, 4, 1, 5, 2};
      }
    }
    std::vector<int64_t> y(6);
    for (size_t j = 0; j < 6; ++j) y[j] = dims[perm[j]];
    KILN_ASSIGN_OR_RETURN(space_, TransposeSpace(dims, perm, y));
    if (space_.rank < 0) {
      return MakeError(ErrorCode::kUnimplemented, "copy needs more than {} separate dims",
                       kMaxRank);
    }
    if (NumElements(y) != out[0].num_elements()) {
      return MakeError(ErrorCode::kShapeMismatch, "output of {} elements, expected {}",
                       out[0].num_elements(), NumElements(y));
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(
        LaunchStridedCopy(SizeOf(a.inputs[0].dtype), a.inputs[0].data, a.outputs[0].data, space_,
                          a.outputs[0].num_elements(), StreamOf(a)),
        to_space_ ? "DepthToSpace copy" : "SpaceToDepth copy");
  }

 private:
  bool to_space_, crd_;
  int64_t block_;
  Strided space_;
};

CudaOpDef SpaceDepthDef(bool to_space) {
  return {
      .op_type = to_space ? "DepthToSpace" : "SpaceToDepth",
      .accepts =
          [](const KernelRequest& r) {
            return ToElem(InType(r, 0)).has_value() && r.inputs[0].shape.size() == 4;
          },
      .create = [to_space](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        int64_t b = r.node->attrs().GetInt("blocksize", 1);
        bool crd = r.node->attrs().GetString("mode", "DCR") == "CRD";
        return std::unique_ptr<Kernel>(std::make_unique<SpaceDepthKernel>(to_space, crd, b));
      },
  };
}
KILN_CUDA_OP_PROVIDER(DepthToSpaceProvider, SpaceDepthDef(true));
KILN_CUDA_OP_PROVIDER(SpaceToDepthProvider, SpaceDepthDef(false));

}  // namespace
}  // namespace kiln::cuda
