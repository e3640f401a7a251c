// CUDA providers of LayerNormalization, SkipLayerNormalization, (Skip)RMSNormalization,
// Softmax/LogSoftmax and BatchNormalization (kernels in norm.cu). Row geometry comes from Prepare;
// f32, f16 and bf16 storage with FP32 statistics. LayerNormalization has two tactics the builder
// times: "row" (any parameter type, statistics outputs) and "warp-vec" (LaunchSkipLayerNorm
// without a skip).
#include <cmath>

#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/fp8_quant.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/quant_edge.h"

namespace kiln::cuda {
namespace {

int64_t NormAxis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

// ---- LayerNormalization -----------------------------------------------------------------------
class LayerNormKernel final : public Kernel {
 public:
  LayerNormKernel(int64_t axis, float eps, Elem t, Elem param_t)
      : axis_(axis), eps_(eps), t_(t), param_t_(param_t) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    int64_t axis = NormAxis(axis_, x.size());
    if (axis < 0 || axis > static_cast<int64_t>(x.size())) {
      return MakeError(ErrorCode::kShapeMismatch, "LayerNormalization axis {} of rank {}", axis_,
                       x.size());
    }
    n_ = 1;
    for (size_t i = static_cast<size_t>(axis); i < x.size(); ++i) n_ *= x[i];
    rows_ = n_ == 0 ? 0 : in[0].num_elements() / n_;
    for (size_t i = 1; i < 3 && i < in.size(); ++i) {
      if (in[i].data && in[i].num_elements() != n_) {
        return MakeError(ErrorCode::kUnimplemented,
                         "LayerNormalization on CUDA needs Scale/B of the full normalized size "
                         "({} elements); input {} has {}",
                         n_, i, in[i].num_elements());
      }
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    const void* scale = Present(a, 1) ? a.inputs[1].data : nullptr;
    const void* bias = Present(a, 2) ? a.inputs[2].data : nullptr;
    float* mean = a.outputs.size() > 1 ? a.outputs[1].as<float>() : nullptr;
    float* inv = a.outputs.size() > 2 ? a.outputs[2].as<float>() : nullptr;
    return Launched(LaunchLayerNorm(t_, param_t_, a.inputs[0].data, scale, bias, a.outputs[0].data,
                                    mean, inv, rows_, n_, eps_, StreamOf(a)),
                    "LayerNormalization kernel");
  }

 private:
  int64_t axis_;
  float eps_;
  Elem t_, param_t_;
  int64_t rows_ = 0, n_ = 0;
};

CudaOpDef LayerNormDef() {
  return {
      .op_type = "LayerNormalization",
      .variant = "row",
      .accepts =
          [](const KernelRequest& r) {
            if (!IsFloatStorage(InType(r, 0))) return false;
            DataType p = DataType::kUndefined;
            for (size_t i = 1; i < r.inputs.size() && i < 3; ++i) {
              DataType t = InType(r, i);
              if (t == DataType::kUndefined) continue;
              if (!IsFloatStorage(t) || (p != DataType::kUndefined && t != p)) return false;
              p = t;
            }
            for (size_t i = 1; i < r.outputs.size(); ++i) {
              DataType t = OutType(r, i);
              if (t != DataType::kFloat32 && t != DataType::kUndefined) return false;
            }
            return true;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        DataType p = InType(r, 0);
        if (InType(r, 1) != DataType::kUndefined) p = InType(r, 1);
        if (InType(r, 2) != DataType::kUndefined) p = InType(r, 2);
        return std::unique_ptr<Kernel>(std::make_unique<LayerNormKernel>(
            r.node->attrs().GetInt("axis", -1), r.node->attrs().GetFloat("epsilon", 1e-5f),
            *ToElem(InType(r, 0)), *ToElem(p)));
      },
  };
}
KILN_CUDA_OP_PROVIDER(LayerNormProvider, LayerNormDef());

// ---- LayerNormalization (warp-vec) and SkipLayerNormalization ---------------------------------
// One kernel for both: LayerNormalization is SkipLayerNormalization without a skip input. Inputs
// (x, skip?, scale?, bias?) as `skip_index` says; outputs (y, sum?, yq?). On an INT8
// or FP8 edge (ops/quant_edge.h) y is int8 or E4M3 (y_quantized) or yq is y's copy so quantized;
// q_inv is their inverse scale, q_e4m3 picks E4M3.
class SkipLayerNormKernel final : public Kernel {
 public:
  SkipLayerNormKernel(int64_t axis, float eps, Elem t, bool has_skip, bool y_quantized = false,
                      float q_inv = 0.f, bool q_e4m3 = false)
      : axis_(axis),
        eps_(eps),
        t_(t),
        has_skip_(has_skip),
        y_quantized_(y_quantized),
        q_inv_(q_inv),
        q_e4m3_(q_e4m3) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    int64_t axis = NormAxis(axis_, x.size());
    if (axis < 0 || axis > static_cast<int64_t>(x.size())) {
      return MakeError(ErrorCode::kShapeMismatch, "{} axis {} of rank {}", OpName(), axis_,
                       x.size());
    }
    if (has_skip_ && !SameDims(in[0].dims, in[1].dims)) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "SkipLayerNormalization on CUDA needs Skip of X's shape ({} vs {} "
                       "elements)",
                       in[1].num_elements(), in[0].num_elements());
    }
    n_ = 1;
    for (size_t i = static_cast<size_t>(axis); i < x.size(); ++i) n_ *= x[i];
    rows_ = n_ == 0 ? 0 : in[0].num_elements() / n_;
    for (size_t i = first_param(); i < first_param() + 2 && i < in.size(); ++i) {
      if (in[i].data && in[i].num_elements() != n_) {
        return MakeError(ErrorCode::kUnimplemented,
                         "{} on CUDA needs Scale/B of the full normalized size ({} elements); "
                         "input {} has {}",
                         OpName(), n_, i, in[i].num_elements());
      }
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    const void* skip = has_skip_ ? a.inputs[1].data : nullptr;
    const void* scale = Present(a, first_param()) ? a.inputs[first_param()].data : nullptr;
    const void* bias = Present(a, first_param() + 1) ? a.inputs[first_param() + 1].data : nullptr;
    void* sum = has_skip_ && a.outputs.size() > 1 ? a.outputs[1].data : nullptr;
    void* y = y_quantized_ ? nullptr : a.outputs[0].data;
    void* yq = y_quantized_ ? a.outputs[0].data
                            : (q_inv_ > 0.f && a.outputs.size() > 2 ? a.outputs[2].data : nullptr);
    return Launched(LaunchSkipLayerNorm(t_, a.inputs[0].data, skip, scale, bias, y, sum, rows_, n_,
                                        eps_, StreamOf(a), yq, q_inv_, q_e4m3_),
                    has_skip_ ? "SkipLayerNormalization kernel" : "LayerNormalization kernel");
  }

 private:
  size_t first_param() const { return has_skip_ ? 2 : 1; }
  const char* OpName() const { return has_skip_ ? "SkipLayerNormalization" : "LayerNormalization"; }
  int64_t axis_;
  float eps_;
  Elem t_;
  bool has_skip_;
  bool y_quantized_;
  float q_inv_;
  bool q_e4m3_;
  int64_t rows_ = 0, n_ = 0;
};

// Every float operand of one storage type (the precision pass casts parameters to the layer's
// type), optional parameters absent; `other_output` (if any) may accept an output of another type.
bool OneFloatType(const KernelRequest& r,
                  bool (*other_output)(const KernelRequest&, size_t) = nullptr) {
  DataType t = InType(r, 0);
  if (!IsFloatStorage(t)) return false;
  for (size_t i = 1; i < r.inputs.size(); ++i) {
    DataType u = InType(r, i);
    if (u != DataType::kUndefined && u != t) return false;
  }
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    DataType u = OutType(r, i);
    if (u != DataType::kUndefined && u != t && !(other_output && other_output(r, i))) return false;
  }
  return true;
}

CudaOpDef LayerNormVecDef() {
  return {
      .op_type = "LayerNormalization",
      .variant = "warp-vec",
      // No statistics outputs (the "row" tactic writes those).
      .accepts = [](const KernelRequest& r) { return r.outputs.size() == 1 && OneFloatType(r); },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<SkipLayerNormKernel>(
            r.node->attrs().GetInt("axis", -1), r.node->attrs().GetFloat("epsilon", 1e-5f),
            *ToElem(InType(r, 0)), false));
      },
  };
}
KILN_CUDA_OP_PROVIDER(LayerNormVecProvider, LayerNormVecDef());

// How a SkipLayerNormalization writes `output` (0: Y, 2: Yq) quantized for an INT8 or FP8 edge
// or copy (ops/quant_edge.h): the request has it as int8 or E4M3 and the node the matching
// attribute, finite and positive. inv is 0 where it is not so written.
struct ByteOutput {
  float inv = 0.f;
  bool e4m3 = false;
};
ByteOutput SkipLnByteOutput(const KernelRequest& r, size_t output) {
  const DataType t = OutType(r, output);
  const bool int8 = t == kInt8EdgeType, fp8 = t == kFp8EdgeType;
  if (!int8 && !fp8) return {};
  const char* attr = output == 0 ? (int8 ? kInt8OutputScaleAttr : kFp8OutputAmaxAttr)
                                 : (int8 ? kInt8CopyScaleAttr : kFp8CopyAmaxAttr);
  const float v = r.node->attrs().GetFloat(attr, 0.f);
  if (!std::isfinite(v) || v <= 0.f) return {};
  return {int8 ? 1.f / v : Fp8InvScale(v), fp8};
}

// Float operands of one type, but for Y as an edge's int8/E4M3 or Yq, a copy, which goes with a
// float Y (Y itself quantized is the other way).
bool SkipLnTypes(const KernelRequest& r) {
  const bool types = OneFloatType(r, [](const KernelRequest& q, size_t i) {
    return (i == 0 || i == 2) && SkipLnByteOutput(q, i).inv > 0.f;
  });
  return types && (OutType(r, 2) == DataType::kUndefined || OutType(r, 0) == InType(r, 0));
}

bool SkipLnAccepts(const KernelRequest& r) {
  return r.inputs.size() >= 3 && InType(r, 1) != DataType::kUndefined && SkipLnTypes(r);
}

StatusOr<std::unique_ptr<Kernel>> CreateSkipLn(const KernelRequest& r) {
  const ByteOutput y = SkipLnByteOutput(r, 0);
  const ByteOutput q = y.inv > 0.f ? y : SkipLnByteOutput(r, 2);
  return std::unique_ptr<Kernel>(std::make_unique<SkipLayerNormKernel>(
      r.node->attrs().GetInt("axis", -1), r.node->attrs().GetFloat("epsilon", 1e-5f),
      *ToElem(InType(r, 0)), true, y.inv > 0.f, q.inv, q.e4m3));
}

CudaOpDef SkipLayerNormDef() {
  return {
      .op_type = "SkipLayerNormalization",
      .variant = "warp-vec",
      .accepts = SkipLnAccepts,
      .create = CreateSkipLn,
  };
}

// SkipLayerNormalization also writes Y as int8 (E4M3) for an INT8 (FP8) edge's reader, or a copy
// of Y so quantized (output 2) beside the float Y that the residual reads (ops/quant_edge.h): the
// quantization the reader's own pass would do, in the normalization's store.
class SkipLayerNormProvider final : public CudaOpProvider {
 public:
  SkipLayerNormProvider() : CudaOpProvider(SkipLayerNormDef()) {}
  // E4M3, a storage-only type for the generic providers (CudaOpProvider::Create refuses it), is
  // an output this kernel writes.
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig&) const final {
    if (!r.node || !SkipLnAccepts(r)) {
      return MakeError(ErrorCode::kUnimplemented, "node '{}': {} has no CUDA kernel for this case",
                       r.node ? r.node->name() : "", id());
    }
    return CreateSkipLn(r);
  }
  bool WritesInt8Output(const KernelRequest& r, const TacticConfig&) const final {
    return IsFloatStorage(OutType(r, 0)) && OutType(r, 2) == DataType::kUndefined;
  }
  bool WritesFp8Output(const KernelRequest& r, const TacticConfig& t) const final {
    return WritesInt8Output(r, t);
  }
  bool WritesInt8Copy(const KernelRequest& r, const TacticConfig&) const final {
    return IsFloatStorage(OutType(r, 0));
  }
  bool WritesFp8Copy(const KernelRequest& r, const TacticConfig& t) const final {
    return WritesInt8Copy(r, t);
  }
};
KILN_REGISTER_KERNEL_PROVIDER(SkipLayerNormProvider);

// ---- RMSNormalization and SkipRMSNormalization ------------------------------------------------
// One kernel for both: inputs (x, skip?, scale), outputs (y, sum?) as `has_skip` says.
class RmsNormKernel final : public Kernel {
 public:
  RmsNormKernel(int64_t axis, float eps, Elem t, bool has_skip)
      : axis_(axis), eps_(eps), t_(t), has_skip_(has_skip) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    int64_t axis = NormAxis(axis_, x.size());
    if (axis < 0 || axis > static_cast<int64_t>(x.size())) {
      return MakeError(ErrorCode::kShapeMismatch, "{} axis {} of rank {}", OpName(), axis_,
                       x.size());
    }
    if (has_skip_ && !SameDims(in[0].dims, in[1].dims)) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "SkipRMSNormalization on CUDA needs Skip of X's shape ({} vs {} elements)",
                       in[1].num_elements(), in[0].num_elements());
    }
    n_ = 1;
    for (size_t i = static_cast<size_t>(axis); i < x.size(); ++i) n_ *= x[i];
    rows_ = n_ == 0 ? 0 : in[0].num_elements() / n_;
    if (in[scale_index()].num_elements() != n_) {
      return MakeError(ErrorCode::kUnimplemented,
                       "{} on CUDA needs Scale of the full normalized size ({} elements); it has "
                       "{}",
                       OpName(), n_, in[scale_index()].num_elements());
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    const void* skip = has_skip_ ? a.inputs[1].data : nullptr;
    void* sum = has_skip_ && a.outputs.size() > 1 ? a.outputs[1].data : nullptr;
    return Launched(LaunchRmsNorm(t_, a.inputs[0].data, skip, a.inputs[scale_index()].data,
                                  a.outputs[0].data, sum, rows_, n_, eps_, StreamOf(a)),
                    has_skip_ ? "SkipRMSNormalization kernel" : "RMSNormalization kernel");
  }

 private:
  size_t scale_index() const { return has_skip_ ? 2 : 1; }
  const char* OpName() const { return has_skip_ ? "SkipRMSNormalization" : "RMSNormalization"; }
  int64_t axis_;
  float eps_;
  Elem t_;
  bool has_skip_;
  int64_t rows_ = 0, n_ = 0;
};

CudaOpDef RmsNormDef() {
  return {
      .op_type = "RMSNormalization",
      .variant = "row",
      .accepts =
          [](const KernelRequest& r) {
            return r.inputs.size() == 2 && r.node->attrs().GetInt("stash_type", 1) == 1 &&
                   OneFloatType(r);
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<RmsNormKernel>(
            r.node->attrs().GetInt("axis", -1), r.node->attrs().GetFloat("epsilon", 1e-5f),
            *ToElem(InType(r, 0)), false));
      },
  };
}
KILN_CUDA_OP_PROVIDER(RmsNormProvider, RmsNormDef());

CudaOpDef SkipRmsNormDef() {
  return {
      .op_type = "SkipRMSNormalization",
      .variant = "row",
      .accepts = [](const KernelRequest& r) { return r.inputs.size() == 3 && OneFloatType(r); },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<RmsNormKernel>(
            attrs::SkipRMSNormalization::axis(*r.node),
            attrs::SkipRMSNormalization::epsilon(*r.node), *ToElem(InType(r, 0)), true));
      },
  };
}
KILN_CUDA_OP_PROVIDER(SkipRmsNormProvider, SkipRmsNormDef());

// ---- Softmax / LogSoftmax ---------------------------------------------------------------------
class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(int64_t axis, bool log, Elem t) : axis_(axis), log_(log), t_(t) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    int64_t axis = NormAxis(axis_, x.size());
    if (axis < 0 || axis >= static_cast<int64_t>(x.size())) {
      return MakeError(ErrorCode::kShapeMismatch, "Softmax axis {} of rank {}", axis_, x.size());
    }
    outer_ = n_ = inner_ = 1;
    for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
      (i < axis ? outer_ : (i == axis ? n_ : inner_)) *= x[i];
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(LaunchSoftmax(t_, log_, a.inputs[0].data, a.outputs[0].data, outer_, n_, inner_,
                                  StreamOf(a)),
                    "Softmax kernel");
  }

 private:
  int64_t axis_;
  bool log_;
  Elem t_;
  int64_t outer_ = 1, n_ = 1, inner_ = 1;
};

CudaOpDef SoftmaxDef(const char* op, bool log) {
  return {
      .op_type = op,
      .accepts = [](const KernelRequest& r) { return IsFloatStorage(InType(r, 0)); },
      .create = [log](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<SoftmaxKernel>(
            r.node->attrs().GetInt("axis", -1), log, *ToElem(InType(r, 0))));
      },
  };
}
KILN_CUDA_OP_PROVIDER(SoftmaxProvider, SoftmaxDef("Softmax", false));
KILN_CUDA_OP_PROVIDER(LogSoftmaxProvider, SoftmaxDef("LogSoftmax", true));

// ---- BatchNormalization -----------------------------------------------------------------------
class BatchNormKernel final : public Kernel {
 public:
  BatchNormKernel(float eps, bool nhwc, Elem t, Elem param_t)
      : eps_(eps), nhwc_(nhwc), t_(t), param_t_(param_t) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    if (x.size() < 2) return MakeError(ErrorCode::kShapeMismatch, "BatchNormalization of rank < 2");
    channels_ = nhwc_ ? x.back() : x[1];
    for (size_t i = 1; i < 5; ++i) {
      if (in[i].num_elements() != channels_) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "BatchNormalization input {} has {} elements; expected {}", i,
                         in[i].num_elements(), channels_);
      }
    }
    inner_ = 1;
    if (!nhwc_) {
      for (size_t i = 2; i < x.size(); ++i) inner_ *= x[i];
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(
        LaunchBatchNorm(t_, param_t_, a.inputs[0].data, a.inputs[1].data, a.inputs[2].data,
                        a.inputs[3].data, a.inputs[4].data, a.outputs[0].data,
                        a.outputs[0].num_elements(), channels_, inner_, eps_, StreamOf(a)),
        "BatchNormalization kernel");
  }

 private:
  float eps_;
  bool nhwc_;
  Elem t_, param_t_;
  int64_t channels_ = 1, inner_ = 1;
};

CudaOpDef BatchNormDef() {
  return {
      .op_type = "BatchNormalization",
      .channels_last = true,
      .accepts =
          [](const KernelRequest& r) {
            if (r.inputs.size() != 5 || r.outputs.size() != 1) return false;
            if (attrs::BatchNormalization::training_mode(*r.node) != 0) return false;
            if (!IsFloatStorage(InType(r, 0))) return false;
            for (size_t i = 2; i < 5; ++i) {
              if (InType(r, i) != InType(r, 1)) return false;
            }
            return IsFloatStorage(InType(r, 1));
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        bool nhwc = r.node->attrs().GetString("kiln_layout", "NCHW") == "NHWC";
        return std::unique_ptr<Kernel>(
            std::make_unique<BatchNormKernel>(attrs::BatchNormalization::epsilon(*r.node), nhwc,
                                              *ToElem(InType(r, 0)), *ToElem(InType(r, 1))));
      },
  };
}
KILN_CUDA_OP_PROVIDER(BatchNormProvider, BatchNormDef());

}  // namespace
}  // namespace kiln::cuda
