// Host-side scaffolding for kiln's own CUDA kernels: a provider described by two functions (so an
// op family registers many ops from one table, each with KILN_REGISTER_KERNEL_PROVIDER), tactic
// naming, dtype mapping, launch-error conversion and the broadcast/stride coalescing that keeps
// the kernels' index arithmetic short. The kernels themselves are in the *.cu files, behind
// cuda_launch.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backends/cuda/cuda_launch.h"
#include "kiln/backends/kernel.h"

namespace kiln::cuda {

// kiln dtype -> kernel element type; nullopt for kUndefined.
std::optional<Elem> ToElem(DataType t);
inline bool IsFloatStorage(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16;
}
// "LeakyRelu" -> "leaky-relu".
std::string KebabCase(std::string_view op);
// "<dtype>-<op>-cuda[-variant]": "f16-layernorm-cuda-warp-row" (STYLE.md rule 5).
std::string TacticName(DataType dtype, std::string_view op, std::string_view variant = "");

inline cudaStream_t StreamOf(const KernelRunArgs& a) { return static_cast<cudaStream_t>(a.stream); }
// KILN-E6002 naming the kernel that failed to launch (OK on cudaSuccess).
Status Launched(cudaError_t err, std::string_view what);

// Operand descriptors of a request.
inline DataType InType(const KernelRequest& r, size_t i) {
  return i < r.inputs.size() ? r.inputs[i].dtype : DataType::kUndefined;
}
inline DataType OutType(const KernelRequest& r, size_t i) {
  return i < r.outputs.size() ? r.outputs[i].dtype : DataType::kUndefined;
}
inline bool Present(const KernelRunArgs& a, size_t i) {
  return i < a.inputs.size() && a.inputs[i].data != nullptr;
}
// Integer contents of a constant operand (int32/int64), nullopt when not a constant.
std::optional<std::vector<int64_t>> ConstantInts(const KernelRequest& r, size_t i);

// Row-major element strides.
std::vector<int64_t> DenseStrides(std::span<const int64_t> dims);
// The iteration space of `out_dims` with, per input, its (numpy-broadcast) element strides;
// size-1 dims dropped and adjacent dims merged where every operand allows. Up to 3 inputs.
// Fails (KILN-E6001) when more than kMaxRank dims remain.
StatusOr<Strided> BroadcastSpace(std::span<const std::span<const int64_t>> inputs,
                                 std::span<const int64_t> out_dims);
// Merges adjacent dims of a one-operand space (Transpose, Slice, Expand) and drops size-1 dims.
Strided CoalesceOne(std::span<const int64_t> dims, std::span<const int64_t> strides,
                    int64_t offset);
// Transpose of x by perm (empty: reversed) as a space over the output dims y.
StatusOr<Strided> TransposeSpace(std::span<const int64_t> x, std::span<const int64_t> perm,
                                 std::span<const int64_t> y);
// Slice with known starts/axes/steps (axes, steps empty: defaults), ONNX clamping; the output
// dims y come from shape inference (so ends are not needed).
StatusOr<Strided> SliceSpace(std::span<const int64_t> starts, std::span<const int64_t> axes,
                             std::span<const int64_t> steps, std::span<const int64_t> x,
                             std::span<const int64_t> y);
// True when dims are the same.
bool SameDims(std::span<const int64_t> a, std::span<const int64_t> b);

// Reduce* ops. The axes a reduction of `dims` takes: ONNX's `axes` (negative from the end), all
// of them when it is empty, none when it is empty and noop_with_empty_axes is set (a copy).
StatusOr<std::vector<bool>> ReducedAxes(std::span<const int64_t> dims,
                                        std::span<const int64_t> axes, bool noop_with_empty_axes);
// The kept and the reduced dims of a reduction as two Strided walks over the dense input, with
// the number of outputs and of elements per output. KILN-E1006 (unimplemented) when either
// side has more than kMaxRank separate runs of dims.
struct StridedReduction {
  Strided kept, red;
  int64_t outputs = 1, count = 1;
};
StatusOr<StridedReduction> PlanStridedReduction(std::span<const int64_t> dims,
                                                const std::vector<bool>& reduce);
// A Reduce* request's axes (input 1) are absent or a build-time constant: Run reads no host data.
bool ReduceAxesAreConstant(const KernelRequest& r);

inline StatusOr<std::unique_ptr<Kernel>> MakeFnKernel(FnKernel::RunFn run,
                                                      FnKernel::PrepareFn prepare = nullptr) {
  return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(std::move(run), std::move(prepare)));
}

// One op's CUDA kernel described by functions: which requests it serves and how to create the
// kernel. One tactic, named from the dtype of input `name_operand` (-1: output 0).
struct CudaOpDef {
  std::string op_type;  // "Add"
  std::string variant;  // tactic and id suffix ("" or "row"...)
  int name_operand = 0;
  bool channels_last = false;  // also runs nodes tagged kiln_layout = "NHWC" (the pools)
  std::function<bool(const KernelRequest&)> accepts;
  std::function<StatusOr<std::unique_ptr<Kernel>>(const KernelRequest&)> create;
};

// A provider "cuda.<kebab op>[.<variant>]" from a CudaOpDef.
class CudaOpProvider : public KernelProvider {
 public:
  explicit CudaOpProvider(CudaOpDef def);
  std::string_view id() const override { return id_; }
  std::string_view op_type() const override { return def_.op_type; }
  BackendKind backend() const override { return BackendKind::kCuda; }
  std::vector<TacticConfig> Tactics(const KernelRequest& request) const override;
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const override;
  // The node layouts this provider runs: ONNX's ("") and, for channels_last ops, "NHWC".
  // Written without `override` on purpose: it overrides KernelProvider::SupportsLayout where
  // the interface has it (the layout pass's branch) and is a plain member where it does not.
  bool SupportsLayout(std::string_view kiln_layout) const {
    return kiln_layout.empty() || (def_.channels_last && kiln_layout == "NHWC");
  }

 private:
  CudaOpDef def_;
  std::string id_;
};

}  // namespace kiln::cuda

// Defines provider class `Class` from a CudaOpDef expression and registers it; one per line.
#define KILN_CUDA_OP_PROVIDER(Class, def_expr)              \
  class Class final : public ::kiln::cuda::CudaOpProvider { \
   public:                                                  \
    Class() : ::kiln::cuda::CudaOpProvider(def_expr) {}     \
  };                                                        \
  KILN_REGISTER_KERNEL_PROVIDER(Class)
