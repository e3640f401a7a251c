// oneDNN's convolution primitive as a Conv/FusedConv tactic. oneDNN picks its fastest layout
// (nChw16c on AVX-512); the input and output are reordered from/to NCHW in the workspace on
// every run, and those reorders are part of the measured time and the reported workspace. The
// weights are reordered once, when shapes are prepared, into a copy the kernel owns.
// Bias, the FusedConv residual (a sum post-op) and the activation (an eltwise post-op) run
// inside the primitive. oneDNN throws; errors are converted here with oneDNN's own message.
//
// Threads: Debian's oneDNN uses OpenMP, so it runs on OpenMP's threads, not kiln's ThreadPool.
// Each Run sets the calling thread's OpenMP thread count to ThreadPool::Default().size(), so
// KILN_NUM_THREADS bounds oneDNN too (OpenMP's count is per calling thread).
#include <dnnl.hpp>

#include <cstring>
#include <vector>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/onednn_common.h"
#include "kiln/core/thread_pool.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

dnnl::engine& Engine() { return OneDnnEngine(); }

// Everything one shape needs: the primitive, its memory descriptors and workspace layout.
struct OneDnnPlan {
  dnnl::convolution_forward::primitive_desc pd;
  memory::desc user_src, user_dst, user_wei;
  bool reorder_src = false, reorder_dst = false;
  size_t src_bytes = 0, dst_bytes = 0, scratch_bytes = 0;
  size_t total() const { return src_bytes + dst_bytes + scratch_bytes; }
};

StatusOr<OneDnnPlan> MakePlan(const ConvSpec& spec, const ConvGeometry& g, bool has_bias,
                              bool has_residual) {
  try {
    const OneDnnConvShapes sh = MakeOneDnnConvShapes(spec, g);
    auto f32 = memory::data_type::f32;
    OneDnnPlan plan;
    plan.user_src = memory::desc(sh.src, f32, sh.act_tag);
    plan.user_dst = memory::desc(sh.dst, f32, sh.act_tag);
    plan.user_wei = memory::desc(sh.wei, f32, sh.wei_tag);
    memory::desc bias_md = has_bias ? memory::desc({g.mg * g.group}, f32, Tag::x) : memory::desc();
    dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(sh.src, f32, Tag::any), memory::desc(sh.wei, f32, Tag::any), bias_md,
        memory::desc(sh.dst, f32, Tag::any), sh.strides, sh.dilation, sh.pad_l, sh.pad_r);
    dnnl::post_ops ops;
    if (has_residual) ops.append_sum(1.f);
    float alpha, beta;
    if (auto alg = OneDnnEltwise(spec.act, &alpha, &beta))
      ops.append_eltwise(1.f, *alg, alpha, beta);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // The primitive is laid out (its scratchpad sized) for the thread count it runs with: the
    // pool's, set here as Run sets it, not whatever this thread's OpenMP setting was (a thread
    // in a single-thread scope, a fresh one): equal builds plan equal workspaces.
    SetOneDnnThreads();
    plan.pd = dnnl::convolution_forward::primitive_desc(desc, attr, Engine());
    plan.reorder_src = plan.pd.src_desc() != plan.user_src;
    plan.reorder_dst = plan.pd.dst_desc() != plan.user_dst;
    plan.src_bytes = plan.reorder_src ? Align64(plan.pd.src_desc().get_size()) : 0;
    plan.dst_bytes = plan.reorder_dst ? Align64(plan.pd.dst_desc().get_size()) : 0;
    plan.scratch_bytes = Align64(plan.pd.scratchpad_desc().get_size());
    return plan;
  } catch (const dnnl::error& e) {
    return MakeError(ErrorCode::kKernelFailed, "oneDNN convolution setup failed: {} (status {})",
                     e.what(), static_cast<int>(e.status));
  }
}

class OneDnnConvKernel final : public Kernel {
 public:
  OneDnnConvKernel(ConvSpec spec, const Tensor* weights, bool has_bias, bool has_residual)
      : spec_(std::move(spec)),
        weights_(*weights),
        has_bias_(has_bias),
        has_residual_(has_residual) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(
        geo_, ResolveConvGeometry(spec_, inputs[0].dims, inputs[1].dims, outputs[0].dims));
    KILN_ASSIGN_OR_RETURN(plan_, MakePlan(spec_, geo_, has_bias_, has_residual_));
    try {
      dnnl::engine& eng = Engine();
      stream_ = dnnl::stream(eng);
      dnnl::stream& stream = stream_;
      conv_ = dnnl::convolution_forward(plan_->pd);
      // Prepacked weights, owned by the kernel; packed on this thread alone (no OpenMP barrier:
      // see OneDnnSingleThreadScope).
      memory user_wei(plan_->user_wei, eng, const_cast<void*>(weights_.raw()));
      packed_wei_ = memory(plan_->pd.weights_desc(), eng);
      {
        OneDnnSingleThreadScope single;
        dnnl::reorder(user_wei, packed_wei_).execute(stream, user_wei, packed_wei_);
        stream.wait();
      }
      user_src_ = memory(plan_->user_src, eng, DNNL_MEMORY_NONE);
      user_dst_ = memory(plan_->user_dst, eng, DNNL_MEMORY_NONE);
      src_ = plan_->reorder_src ? memory(plan_->pd.src_desc(), eng, DNNL_MEMORY_NONE) : user_src_;
      dst_ = plan_->reorder_dst ? memory(plan_->pd.dst_desc(), eng, DNNL_MEMORY_NONE) : user_dst_;
      scratch_ = memory(plan_->pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
      if (has_bias_)
        bias_ =
            memory({{geo_.mg * geo_.group}, memory::data_type::f32, Tag::x}, eng, DNNL_MEMORY_NONE);
      if (plan_->reorder_src) src_reorder_ = dnnl::reorder(user_src_, src_);
      if (plan_->reorder_dst) {
        dst_reorder_ = dnnl::reorder(dst_, user_dst_);
        if (has_residual_) z_reorder_ = dnnl::reorder(user_dst_, dst_);
      }
      conv_args_ = {{DNNL_ARG_SRC, src_.get()},
                    {DNNL_ARG_WEIGHTS, packed_wei_.get()},
                    {DNNL_ARG_DST, dst_.get()},
                    {DNNL_ARG_SCRATCHPAD, scratch_.get()}};
      if (has_bias_) conv_args_.push_back({DNNL_ARG_BIAS, bias_.get()});
    } catch (const dnnl::error& e) {
      return MakeError(ErrorCode::kKernelFailed, "oneDNN convolution prepare failed: {}", e.what());
    }
    return plan_->total();
  }

  // Prepare's figure from the plan alone: no primitive (JIT code), no packed weights.
  StatusOr<size_t> QueryWorkspace(std::span<const TensorView> inputs,
                                  std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(ConvGeometry geo, ResolveConvGeometry(spec_, inputs[0].dims,
                                                                inputs[1].dims, outputs[0].dims));
    KILN_ASSIGN_OR_RETURN(OneDnnPlan plan, MakePlan(spec_, geo, has_bias_, has_residual_));
    return plan.total();
  }

  Status Run(const KernelRunArgs& args) override {
    SetOneDnnThreads();
    // oneDNN's C API with argument arrays built in Prepare: the C++ wrapper's execute() builds
    // a std::vector per call, and Run must not allocate.
    auto* ws = static_cast<std::byte*>(args.workspace);
    KILN_RETURN_IF_ERROR(SetHandle(user_src_, args.inputs[0].data));
    KILN_RETURN_IF_ERROR(SetHandle(user_dst_, args.outputs[0].data));
    if (plan_->reorder_src) KILN_RETURN_IF_ERROR(SetHandle(src_, ws));
    if (plan_->reorder_dst) KILN_RETURN_IF_ERROR(SetHandle(dst_, ws + plan_->src_bytes));
    KILN_RETURN_IF_ERROR(SetHandle(scratch_, ws + plan_->src_bytes + plan_->dst_bytes));
    if (has_bias_) KILN_RETURN_IF_ERROR(SetHandle(bias_, args.inputs[2].data));
    if (plan_->reorder_src) KILN_RETURN_IF_ERROR(Reorder(src_reorder_, user_src_, src_));
    if (has_residual_) {
      // The sum post-op adds what dst holds: put Z there first.
      std::memcpy(args.outputs[0].data, args.inputs[3].data, args.outputs[0].size_bytes());
      if (plan_->reorder_dst) KILN_RETURN_IF_ERROR(Reorder(z_reorder_, user_dst_, dst_));
    }
    KILN_RETURN_IF_ERROR(
        Check(dnnl_primitive_execute(conv_.get(), stream_.get(),
                                     static_cast<int>(conv_args_.size()), conv_args_.data()),
              "convolution"));
    if (plan_->reorder_dst) KILN_RETURN_IF_ERROR(Reorder(dst_reorder_, dst_, user_dst_));
    return Check(dnnl_stream_wait(stream_.get()), "stream wait");
  }

 private:
  static Status Check(dnnl_status_t status, const char* what) {
    if (status == dnnl_success) return OkStatus();
    return MakeError(ErrorCode::kKernelFailed, "oneDNN {} failed (dnnl status {})", what,
                     static_cast<int>(status));
  }
  static Status SetHandle(memory& m, void* data) {
    return Check(dnnl_memory_set_data_handle(m.get(), data), "set_data_handle");
  }
  Status Reorder(const dnnl::reorder& r, const memory& from, const memory& to) {
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
    return Check(dnnl_primitive_execute(r.get(), stream_.get(), 2, a), "reorder");
  }

  ConvSpec spec_;
  Tensor weights_;  // shares the constant's storage
  bool has_bias_, has_residual_;
  ConvGeometry geo_;
  std::optional<OneDnnPlan> plan_;
  dnnl::stream stream_;  // made once in Prepare: Run does not allocate
  dnnl::convolution_forward conv_;
  dnnl::reorder src_reorder_, dst_reorder_, z_reorder_;
  memory packed_wei_, user_src_, user_dst_, src_, dst_, scratch_, bias_;
  std::vector<dnnl_exec_arg_t> conv_args_;
};

}  // namespace

std::optional<TacticConfig> OneDnnConvTactic(const ConvSpec& spec, const ConvGeometry& max_geo) {
  auto plan = MakePlan(spec, max_geo, true, false);
  if (!plan.ok()) return std::nullopt;
  // The residual sum post-op adds no workspace.
  return TacticConfig{"f32-conv-cpu-onednn", {3, 0, 0}, plan->total()};
}

StatusOr<std::unique_ptr<Kernel>> CreateOneDnnConv(const KernelRequest& request,
                                                   const ConvSpec& spec) {
  const Tensor* w = request.inputs[1].constant;
  if (!w) {
    return MakeError(ErrorCode::kNoTactic, "node '{}': f32-conv-cpu-onednn needs constant weights",
                     request.node->name());
  }
  bool has_bias = request.inputs.size() > 2 && request.inputs[2].dtype != DataType::kUndefined;
  bool has_residual = request.inputs.size() > 3 && request.inputs[3].dtype != DataType::kUndefined;
  return std::unique_ptr<Kernel>(
      std::make_unique<OneDnnConvKernel>(spec, w, has_bias, has_residual));
}

}  // namespace kiln::cpu
