// INT8 Conv and FusedConv on the CPU with oneDNN's int8 convolution: "i8-conv-cpu-onednn".
// Offered only for nodes the precision pass marked (int8_common.h has the contract). At Create
// the constant weights are quantized per output channel (or taken as the model's integers for a
// layer of a QDQ model); at Prepare the primitive is made for the shapes and the int8 weights are
// reordered into its layout. Each Run quantizes X (s8, scale amax/127, or the model's scale and
// zero point, which oneDNN subtracts as the source zero point, padding included) into the
// workspace, reorders it into the primitive's layout, and runs the primitive with int32
// accumulation; oneDNN's per-channel output scales
// (x_scale * w_scale[oc]) dequantize to f32. oneDNN 2.x adds the bias before the output scale,
// so a constant bias is stored pre-divided by the scale. A residual Z, or a bias that is not a
// constant, is written into Y first and added by a sum post-op; the activation is an eltwise
// post-op. Everything that allocates happens in Prepare; Run executes through oneDNN's C API
// with argument arrays built in Prepare.
#include <dnnl.hpp>

#include <algorithm>
#include <cstring>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/int8_common.h"
#include "kiln/backends/cpu/onednn_common.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

Status OneDnnCall(dnnl_status_t status, const char* what) {
  if (status == dnnl_success) return OkStatus();
  return MakeError(ErrorCode::kKernelFailed, "oneDNN {} failed (dnnl status {})", what,
                   static_cast<int>(status));
}

// The primitive for one shape with its memory descriptors and workspace layout:
// [quantized X in NCHW (s8, or f32: Int8ComputeType)][the same in the primitive's layout, if
// different][f32 Y in its layout, if
// different][scratchpad].
struct Int8ConvPlan {
  dnnl::convolution_forward::primitive_desc pd;
  memory::desc user_q, user_dst, user_wei;
  bool reorder_src = false, reorder_dst = false;
  size_t q_bytes = 0, src_bytes = 0, dst_bytes = 0, scratch_bytes = 0;
  size_t total() const { return q_bytes + src_bytes + dst_bytes + scratch_bytes; }
};

StatusOr<Int8ConvPlan> MakeInt8Plan(const ConvSpec& spec, const ConvGeometry& g, bool const_bias,
                                    bool preload, const std::vector<float>& scales,
                                    int32_t zero_point) {
  try {
    const OneDnnConvShapes sh = MakeOneDnnConvShapes(spec, g);
    auto s8 = memory::data_type::s8;
    const auto qt = Int8ComputeType();  // s8, or f32 holding the same integers
    auto f32 = memory::data_type::f32;
    Int8ConvPlan plan;
    plan.user_q = memory::desc(sh.src, qt, sh.act_tag);
    plan.user_dst = memory::desc(sh.dst, f32, sh.act_tag);
    // kiln's int8 weights, or in the f32 form the same integers times their output scales.
    plan.user_wei = memory::desc(sh.wei, qt, sh.wei_tag);
    memory::desc bias_md =
        const_bias ? memory::desc({g.mg * g.group}, f32, Tag::x) : memory::desc();
    dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(sh.src, qt, Tag::any), memory::desc(sh.wei, qt, Tag::any), bias_md,
        memory::desc(sh.dst, f32, Tag::any), sh.strides, sh.dilation, sh.pad_l, sh.pad_r);
    dnnl::post_ops ops;
    if (preload) ops.append_sum(1.f);
    float alpha, beta;
    if (auto alg = OneDnnEltwise(spec.act, &alpha, &beta)) {
      ops.append_eltwise(1.f, *alg, alpha, beta);
    }
    dnnl::primitive_attr attr;
    // Per output channel (dst dim 1). oneDNN 2.x has no output scales for f32 convolution: the
    // f32 form carries them in the weights (`scales` empty).
    if (!scales.empty()) attr.set_output_scales(1 << 1, scales);
    // The f32 form subtracts the zero point while quantizing (padding is 0 = the zero point).
    if (zero_point != 0 && qt == s8) attr.set_zero_points(DNNL_ARG_SRC, 0, {zero_point});
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // The primitive is laid out (its scratchpad sized) for the thread count it runs with: the
    // pool's, set here as Run sets it, not whatever this thread's OpenMP setting was (a thread
    // in a single-thread scope, a fresh one): equal builds plan equal workspaces.
    SetOneDnnThreads();
    plan.pd = dnnl::convolution_forward::primitive_desc(desc, attr, OneDnnEngine());
    plan.reorder_src = plan.pd.src_desc() != plan.user_q;
    plan.reorder_dst = plan.pd.dst_desc() != plan.user_dst;
    plan.q_bytes = Align64(plan.user_q.get_size());
    plan.src_bytes = plan.reorder_src ? Align64(plan.pd.src_desc().get_size()) : 0;
    plan.dst_bytes = plan.reorder_dst ? Align64(plan.pd.dst_desc().get_size()) : 0;
    plan.scratch_bytes = Align64(plan.pd.scratchpad_desc().get_size());
    return plan;
  } catch (const dnnl::error& e) {
    return MakeError(ErrorCode::kKernelFailed,
                     "oneDNN int8 convolution setup failed: {} (status {})", e.what(),
                     static_cast<int>(e.status));
  }
}

// Y (NCHW) = Z + bias[c] for the sum post-op; either may be null (not both).
void PreloadOutput(float* y, const float* z, const float* bias, int64_t planes, int64_t channels,
                   int64_t plane_size) {
  // OpenMP's threads, as the primitive's (see QuantizeActivations).
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    {
      float* yp = y + p * plane_size;
      const float* zp = z ? z + p * plane_size : nullptr;
      float b = bias ? bias[p % channels] : 0.f;
      if (zp) {
        for (int64_t i = 0; i < plane_size; ++i) yp[i] = zp[i] + b;
      } else {
        for (int64_t i = 0; i < plane_size; ++i) yp[i] = b;
      }
    }
  }
}

class Int8ConvKernel final : public Kernel {
 public:
  Int8ConvKernel(ConvSpec spec, Int8Activation act, Int8Weights weights,
                 std::vector<float> const_bias, bool runtime_bias, bool has_residual)
      : spec_(std::move(spec)),
        act_(act),
        x_scale_(act.scale),
        weights_(std::move(weights)),
        bias_q_(std::move(const_bias)),
        runtime_bias_(runtime_bias),
        has_residual_(has_residual) {
    // Output scale per channel; a constant bias is pre-divided by it (oneDNN 2.x adds the bias
    // to the int32 sum before scaling).
    scales_.resize(weights_.scales.size());
    for (size_t c = 0; c < scales_.size(); ++c) scales_[c] = x_scale_ * weights_.scales[c];
    if (Int8ComputeType() == memory::data_type::s8) {
      for (size_t c = 0; c < bias_q_.size(); ++c) bias_q_[c] /= scales_[c];
    } else {
      // The f32 form: weights q * scale (channel-major), no output scales, the bias as it is.
      const size_t inner = weights_.q.size() / std::max<size_t>(scales_.size(), 1);
      scaled_wei_.resize(weights_.q.size());
      for (size_t i = 0; i < weights_.q.size(); ++i) {
        scaled_wei_[i] = static_cast<float>(weights_.q[i]) * scales_[i / inner];
      }
    }
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(
        geo_, ResolveConvGeometry(spec_, inputs[0].dims, inputs[1].dims, outputs[0].dims));
    if (static_cast<size_t>(geo_.mg * geo_.group) != scales_.size()) {
      return MakeError(ErrorCode::kShapeMismatch, "int8 conv: weight has {} output channels; Y {}",
                       scales_.size(), geo_.mg * geo_.group);
    }
    KILN_ASSIGN_OR_RETURN(
        plan_, MakeInt8Plan(spec_, geo_, !bias_q_.empty(), preload(),
                            scaled_wei_.empty() ? scales_ : std::vector<float>{}, act_.zero_point));
    try {
      dnnl::engine& eng = OneDnnEngine();
      stream_ = dnnl::stream(eng);
      conv_ = dnnl::convolution_forward(plan_->pd);
      memory user_wei(plan_->user_wei, eng,
                      scaled_wei_.empty() ? static_cast<void*>(weights_.q.data())
                                          : static_cast<void*>(scaled_wei_.data()));
      packed_wei_ = memory(plan_->pd.weights_desc(), eng);
      dnnl::reorder(user_wei, packed_wei_).execute(stream_, user_wei, packed_wei_);
      stream_.wait();
      user_q_ = memory(plan_->user_q, eng, DNNL_MEMORY_NONE);
      user_dst_ = memory(plan_->user_dst, eng, DNNL_MEMORY_NONE);
      src_ = plan_->reorder_src ? memory(plan_->pd.src_desc(), eng, DNNL_MEMORY_NONE) : user_q_;
      dst_ = plan_->reorder_dst ? memory(plan_->pd.dst_desc(), eng, DNNL_MEMORY_NONE) : user_dst_;
      scratch_ = memory(plan_->pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
      if (!bias_q_.empty()) {
        bias_ =
            memory({{geo_.mg * geo_.group}, memory::data_type::f32, Tag::x}, eng, bias_q_.data());
      }
      if (plan_->reorder_src) src_reorder_ = dnnl::reorder(user_q_, src_);
      if (plan_->reorder_dst) {
        dst_reorder_ = dnnl::reorder(dst_, user_dst_);
        if (preload()) preload_reorder_ = dnnl::reorder(user_dst_, dst_);
      }
      conv_args_.clear();
      conv_args_.push_back({DNNL_ARG_SRC, src_.get()});
      conv_args_.push_back({DNNL_ARG_WEIGHTS, packed_wei_.get()});
      conv_args_.push_back({DNNL_ARG_DST, dst_.get()});
      conv_args_.push_back({DNNL_ARG_SCRATCHPAD, scratch_.get()});
      if (!bias_q_.empty()) conv_args_.push_back({DNNL_ARG_BIAS, bias_.get()});
    } catch (const dnnl::error& e) {
      return MakeError(ErrorCode::kKernelFailed, "oneDNN int8 convolution prepare failed: {}",
                       e.what());
    }
    return plan_->total();
  }

  Status Run(const KernelRunArgs& args) override {
    SetOneDnnThreads();
    auto* ws = static_cast<std::byte*>(args.workspace);
    const Int8ConvPlan& p = *plan_;
    void* q = ws;
    const float* x = args.inputs[0].as<const float>();
    if (Int8ComputeType() == memory::data_type::s8) {
      QuantizeActivations(x, args.inputs[0].num_elements(), act_, reinterpret_cast<int8_t*>(q));
    } else {
      QuantizeActivations(x, args.inputs[0].num_elements(), act_, reinterpret_cast<float*>(q));
    }
    float* y = args.outputs[0].as<float>();
    KILN_RETURN_IF_ERROR(SetHandle(user_q_, q));
    KILN_RETURN_IF_ERROR(SetHandle(user_dst_, y));
    if (p.reorder_src) KILN_RETURN_IF_ERROR(SetHandle(src_, ws + p.q_bytes));
    if (p.reorder_dst) KILN_RETURN_IF_ERROR(SetHandle(dst_, ws + p.q_bytes + p.src_bytes));
    KILN_RETURN_IF_ERROR(SetHandle(scratch_, ws + p.q_bytes + p.src_bytes + p.dst_bytes));
    if (p.reorder_src) KILN_RETURN_IF_ERROR(Reorder(src_reorder_, user_q_, src_));
    if (preload()) {
      const float* z = has_residual_ ? args.inputs[3].as<const float>() : nullptr;
      const float* b = runtime_bias_ ? args.inputs[2].as<const float>() : nullptr;
      int64_t m = geo_.mg * geo_.group;
      PreloadOutput(y, z, b, geo_.n * m, m, geo_.oh * geo_.ow);
      if (p.reorder_dst) KILN_RETURN_IF_ERROR(Reorder(preload_reorder_, user_dst_, dst_));
    }
    KILN_RETURN_IF_ERROR(
        OneDnnCall(dnnl_primitive_execute(conv_.get(), stream_.get(),
                                          static_cast<int>(conv_args_.size()), conv_args_.data()),
                   "int8 convolution"));
    if (p.reorder_dst) KILN_RETURN_IF_ERROR(Reorder(dst_reorder_, dst_, user_dst_));
    return OneDnnCall(dnnl_stream_wait(stream_.get()), "stream wait");
  }

 private:
  bool preload() const { return has_residual_ || runtime_bias_; }

  static Status SetHandle(memory& m, void* data) {
    return OneDnnCall(dnnl_memory_set_data_handle(m.get(), data), "set_data_handle");
  }
  Status Reorder(const dnnl::reorder& r, const memory& from, const memory& to) {
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
    return OneDnnCall(dnnl_primitive_execute(r.get(), stream_.get(), 2, a), "reorder");
  }

  ConvSpec spec_;
  Int8Activation act_;
  std::vector<float> scaled_wei_;  // the f32 form's weights (Int8ComputeType)
  float x_scale_;
  Int8Weights weights_;
  std::vector<float> bias_q_;  // constant bias / output scale; empty when none or not constant
  bool runtime_bias_, has_residual_;
  std::vector<float> scales_;
  ConvGeometry geo_;
  std::optional<Int8ConvPlan> plan_;
  dnnl::stream stream_;
  dnnl::convolution_forward conv_;
  dnnl::reorder src_reorder_, dst_reorder_, preload_reorder_;
  memory packed_wei_, user_q_, user_dst_, src_, dst_, scratch_, bias_;
  std::vector<dnnl_exec_arg_t> conv_args_;
};

class Int8ConvProviderBase : public CpuFloatProvider {
 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    std::optional<Int8Activation> act = Int8ActivationOf(*request.node);
    if (!act || !request.inputs[1].constant) return {};
    auto spec = ReadConvSpec(request);
    if (!spec.ok()) return {};
    auto g = MaxConvGeometry(*spec, request);
    if (!g.ok()) return {};
    bool const_bias = request.inputs.size() > 2 && request.inputs[2].constant;
    bool preload = (request.inputs.size() > 2 && !const_bias &&
                    request.inputs[2].dtype != DataType::kUndefined) ||
                   (request.inputs.size() > 3 && request.inputs[3].dtype != DataType::kUndefined);
    std::vector<float> scales(static_cast<size_t>(g->mg * g->group), 1.f);
    auto plan = MakeInt8Plan(*spec, *g, const_bias, preload, scales, act->zero_point);
    if (!plan.ok()) return {};
    return {{"i8-conv-cpu-onednn", {}, plan->total()}};
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    const Node& node = *request.node;
    std::optional<Int8Activation> act = Int8ActivationOf(node);
    const Tensor* w = request.inputs.size() > 1 ? request.inputs[1].constant : nullptr;
    if (!act || !w || w->dtype() != DataType::kFloat32 || w->dims().empty()) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a finite positive {} attribute (or the model's "
                       "scales) and a constant float weight (input 1)",
                       node.name(), tactic.name, kInt8InputAmaxAttr);
    }
    KILN_ASSIGN_OR_RETURN(ConvSpec spec, ReadConvSpec(request));
    int64_t channels = w->dims()[0];
    KILN_ASSIGN_OR_RETURN(Int8Weights q, Int8WeightsFor(node, *w));
    std::vector<float> bias;
    bool runtime_bias = false;
    if (request.inputs.size() > 2 && request.inputs[2].dtype != DataType::kUndefined) {
      if (const Tensor* b = request.inputs[2].constant) {
        if (b->num_elements() != channels) {
          return MakeError(ErrorCode::kShapeMismatch,
                           "node '{}': bias has {} values for {} channels", node.name(),
                           b->num_elements(), channels);
        }
        bias.assign(b->data<float>(), b->data<float>() + channels);
      } else {
        runtime_bias = true;
      }
    }
    bool has_residual =
        request.inputs.size() > 3 && request.inputs[3].dtype != DataType::kUndefined;
    return std::unique_ptr<Kernel>(std::make_unique<Int8ConvKernel>(
        std::move(spec), *act, std::move(q), std::move(bias), runtime_bias, has_residual));
  }
};

class Int8ConvProvider final : public Int8ConvProviderBase {
 public:
  std::string_view id() const override { return "cpu.conv.i8"; }
  std::string_view op_type() const override { return "Conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8ConvProvider);

class Int8FusedConvProvider final : public Int8ConvProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_conv.i8"; }
  std::string_view op_type() const override { return "FusedConv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8FusedConvProvider);

}  // namespace
}  // namespace kiln::cpu
