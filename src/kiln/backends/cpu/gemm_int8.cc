// INT8 Gemm, FusedGemm, MatMul and FusedMatMul on the CPU with oneDNN's int8 matmul:
// "i8-gemm-cpu-onednn" and "i8-matmul-cpu-onednn". Offered only for nodes the precision pass
// marked (int8_common.h has the contract) whose B is a constant 2-D matrix. At Create, B is
// quantized per output column N (symmetric absmax), or taken as the model's integers for a layer
// of a QDQ model; at Prepare the primitive is made for the shapes and B is reordered into its
// packed layout. Each Run quantizes A (s8, scale amax/127, or the model's scale and zero point,
// which oneDNN subtracts as the source zero point) into the workspace and runs the primitive
// (int32 accumulation); per-column output scales
// alpha * a_scale * b_scale[n] dequantize to f32. oneDNN 2.x adds the bias before the output
// scale, so a constant row bias (FusedMatMul's bias, or Gemm's beta * C when C is [N], [1, N]
// or a scalar) is stored pre-divided by the scale. Any other C, or a bias that is not a constant,
// is written into Y first and added by a sum post-op; the activation is an eltwise post-op.
// MatMul's batch dims of A fold into M (B has none). Run allocates nothing: it executes through
// oneDNN's C API with argument arrays built in Prepare.
#include <dnnl.hpp>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/int8_common.h"
#include "kiln/backends/cpu/onednn_common.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

Status OneDnnCall(dnnl_status_t status, const char* what) {
  if (status == dnnl_success) return OkStatus();
  return MakeError(ErrorCode::kKernelFailed, "oneDNN {} failed (dnnl status {})", what,
                   static_cast<int>(status));
}

struct Int8GemmSpec {
  bool gemm = false;  // Gemm/FusedGemm (C with beta) rather than MatMul/FusedMatMul (bias)
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 1.f;
  FusedActivationSpec act;
};

StatusOr<Int8GemmSpec> ReadInt8GemmSpec(const KernelRequest& request) {
  const OpType op = OpTypeOf(*request.node);
  const AttributeMap& at = request.node->attrs();
  Int8GemmSpec s;
  s.gemm = op == OpType::kGemm || op == OpType::kFusedGemm;
  if (op != OpType::kMatMul) {
    // Gemm, MatMul and their fused forms share these defaults (ops.inc).
    s.trans_a = attrs::Gemm::transA(at) != 0;
    s.trans_b = attrs::Gemm::transB(at) != 0;
    s.alpha = attrs::Gemm::alpha(at);
  }
  if (s.gemm) s.beta = attrs::Gemm::beta(at);
  if (op == OpType::kFusedGemm || op == OpType::kFusedMatMul) {
    KILN_ASSIGN_OR_RETURN(s.act, ParseFusedActivation(at));
  }
  return s;
}

// M and K of A for these dims: Gemm's A is 2-D; MatMul's leading dims fold into M (a 1-D A is
// one row). A transposed A must be 2-D.
StatusOr<std::pair<int64_t, int64_t>> RowsAndDepth(const Int8GemmSpec& s,
                                                   std::span<const int64_t> a) {
  if (a.empty() || (s.gemm && a.size() != 2) || (s.trans_a && a.size() != 2)) {
    return MakeError(ErrorCode::kShapeMismatch, "int8 {}: A has rank {}",
                     s.gemm ? "Gemm" : "MatMul", a.size());
  }
  if (s.trans_a) return std::pair{a[1], a[0]};
  int64_t m = 1;
  for (size_t i = 0; i + 1 < a.size(); ++i) m *= a[i];
  return std::pair{m, a.back()};
}

// The primitive for one M, and the workspace layout [quantized A (s8 or f32)][scratchpad].
struct Int8GemmPlan {
  dnnl::matmul::primitive_desc pd;
  size_t a_bytes = 0, scratch_bytes = 0;
  size_t total() const { return a_bytes + scratch_bytes; }
};

StatusOr<Int8GemmPlan> MakeInt8GemmPlan(const Int8GemmSpec& s, int64_t m, int64_t k, int64_t n,
                                        bool const_bias, bool preload,
                                        const std::vector<float>& scales, int32_t zero_point) {
  try {
    const auto qt = Int8ComputeType();  // s8, or f32 holding the same integers
    auto f32 = memory::data_type::f32;
    // A keeps its storage order: [K, M] when transposed.
    memory::desc src({m, k}, qt, s.trans_a ? memory::dims{1, m} : memory::dims{k, 1});
    memory::desc wei({k, n}, qt, memory::format_tag::any);
    memory::desc bias =
        const_bias ? memory::desc({1, n}, f32, memory::format_tag::ab) : memory::desc();
    memory::desc dst({m, n}, f32, memory::format_tag::ab);
    dnnl::post_ops ops;
    if (preload) ops.append_sum(1.f);
    float alpha, beta;
    if (auto alg = OneDnnEltwise(s.act, &alpha, &beta)) ops.append_eltwise(1.f, *alg, alpha, beta);
    dnnl::primitive_attr attr;
    attr.set_output_scales(1 << 1, scales);  // per column N
    // The f32 form subtracts the zero point while quantizing.
    if (zero_point != 0 && qt == memory::data_type::s8) {
      attr.set_zero_points(DNNL_ARG_SRC, 0, {zero_point});
    }
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    Int8GemmPlan plan;
    // The primitive is laid out (its scratchpad sized) for the thread count it runs with: the
    // pool's, set here as Run sets it, not whatever this thread's OpenMP setting was (a thread
    // in a single-thread scope, a fresh one): equal builds plan equal workspaces.
    SetOneDnnThreads();
    plan.pd =
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bias, dst), attr, OneDnnEngine());
    plan.a_bytes = Align64(static_cast<size_t>(m * k) * memory::data_type_size(qt));
    plan.scratch_bytes = Align64(plan.pd.scratchpad_desc().get_size());
    return plan;
  } catch (const dnnl::error& e) {
    return MakeError(ErrorCode::kKernelFailed, "oneDNN int8 matmul setup failed: {} (status {})",
                     e.what(), static_cast<int>(e.status));
  }
}

// How the float addend reaches Y: none, a constant row bias inside the primitive, or a preload
// of Y plus a sum post-op (Gemm's C of another shape, a bias that is not constant).
struct AddendPlan {
  std::vector<float> row_bias;  // [N], unscaled (beta applied); empty when none
  bool preload = false;
};

StatusOr<AddendPlan> PlanAddend(const Int8GemmSpec& s, const KernelRequest& r, int64_t n) {
  AddendPlan p;
  if (r.inputs.size() < 3 || r.inputs[2].dtype == DataType::kUndefined) return p;
  if (s.gemm && s.beta == 0.f) return p;
  const Tensor* c = r.inputs[2].constant;
  float factor = s.gemm ? s.beta : 1.f;
  if (c) {
    const std::vector<int64_t>& d = c->dims();
    bool row = c->num_elements() == n && (d.size() == 1 || (d.size() == 2 && d[0] == 1));
    if (c->num_elements() == 1 || row) {
      const float* v = c->data<float>();
      p.row_bias.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) p.row_bias[j] = factor * v[row ? j : 0];
      return p;
    }
  }
  p.preload = true;
  return p;
}

class Int8GemmKernel final : public Kernel {
 public:
  Int8GemmKernel(Int8GemmSpec spec, Int8Activation act, int64_t k, int64_t n, Int8Weights weights,
                 AddendPlan addend)
      : spec_(spec),
        act_(act),
        a_scale_(act.scale),
        k_(k),
        n_(n),
        weights_(std::move(weights)),
        addend_(std::move(addend)) {
    scales_.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) scales_[j] = spec_.alpha * a_scale_ * weights_.scales[j];
    for (int64_t j = 0; j < static_cast<int64_t>(addend_.row_bias.size()); ++j) {
      addend_.row_bias[j] /= scales_[j];
    }
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(auto mk, RowsAndDepth(spec_, inputs[0].dims));
    m_ = mk.first;
    if (mk.second != k_ || outputs[0].num_elements() != m_ * n_) {
      return MakeError(
          ErrorCode::kShapeMismatch, "int8 {}: A is [{} x {}], B [{} x {}], Y has {} elements",
          spec_.gemm ? "Gemm" : "MatMul", m_, mk.second, k_, n_, outputs[0].num_elements());
    }
    if (addend_.preload) {
      // Gemm's C broadcasts to [M, N] as in the FP32 kernel; MatMul's bias is one row.
      const auto& c = inputs[2].dims;
      int64_t cm = c.size() == 2 ? c[0] : 1, cn = c.empty() ? 1 : c.back();
      if (c.size() > 2 || (cm != 1 && cm != m_) || (cn != 1 && cn != n_) ||
          (!spec_.gemm && cm != 1)) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "int8 {}: addend does not broadcast to [{}, {}]",
                         spec_.gemm ? "Gemm" : "MatMul", m_, n_);
      }
      c_row_stride_ = cm == 1 ? 0 : cn;
      c_col_stride_ = cn == 1 ? 0 : 1;
    }
    KILN_ASSIGN_OR_RETURN(plan_, MakeInt8GemmPlan(spec_, m_, k_, n_, !addend_.row_bias.empty(),
                                                  addend_.preload, scales_, act_.zero_point));
    try {
      dnnl::engine& eng = OneDnnEngine();
      stream_ = dnnl::stream(eng);
      matmul_ = dnnl::matmul(plan_->pd);
      memory::desc user_wei({k_, n_}, memory::data_type::s8,
                            spec_.trans_b ? memory::dims{1, k_} : memory::dims{n_, 1});
      memory user(user_wei, eng, weights_.q.data());
      packed_wei_ = memory(plan_->pd.weights_desc(), eng);
      dnnl::reorder(user, packed_wei_).execute(stream_, user, packed_wei_);
      stream_.wait();
      src_ = memory(plan_->pd.src_desc(), eng, DNNL_MEMORY_NONE);
      dst_ = memory(plan_->pd.dst_desc(), eng, DNNL_MEMORY_NONE);
      scratch_ = memory(plan_->pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
      args_.clear();
      args_.push_back({DNNL_ARG_SRC, src_.get()});
      args_.push_back({DNNL_ARG_WEIGHTS, packed_wei_.get()});
      args_.push_back({DNNL_ARG_DST, dst_.get()});
      args_.push_back({DNNL_ARG_SCRATCHPAD, scratch_.get()});
      if (!addend_.row_bias.empty()) {
        bias_ = memory({{1, n_}, memory::data_type::f32, memory::format_tag::ab}, eng,
                       addend_.row_bias.data());
        args_.push_back({DNNL_ARG_BIAS, bias_.get()});
      }
    } catch (const dnnl::error& e) {
      return MakeError(ErrorCode::kKernelFailed, "oneDNN int8 matmul prepare failed: {}", e.what());
    }
    return plan_->total();
  }

  Status Run(const KernelRunArgs& args) override {
    SetOneDnnThreads();
    auto* ws = static_cast<std::byte*>(args.workspace);
    void* q = ws;
    if (Int8ComputeType() == memory::data_type::s8) {
      QuantizeActivations(args.inputs[0].as<const float>(), m_ * k_, act_,
                          reinterpret_cast<int8_t*>(ws));
    } else {
      QuantizeActivations(args.inputs[0].as<const float>(), m_ * k_, act_,
                          reinterpret_cast<float*>(ws));
    }
    float* y = args.outputs[0].as<float>();
    if (addend_.preload) {
      const float* c = args.inputs[2].as<const float>();
      float factor = spec_.gemm ? spec_.beta : 1.f;
      // OpenMP's threads, as the primitive's (see QuantizeActivations).
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m_; ++i) {
        for (int64_t j = 0; j < n_; ++j) {
          y[i * n_ + j] = factor * c[i * c_row_stride_ + j * c_col_stride_];
        }
      }
    }
    KILN_RETURN_IF_ERROR(OneDnnCall(dnnl_memory_set_data_handle(src_.get(), q), "set_data_handle"));
    KILN_RETURN_IF_ERROR(OneDnnCall(dnnl_memory_set_data_handle(dst_.get(), y), "set_data_handle"));
    KILN_RETURN_IF_ERROR(OneDnnCall(
        dnnl_memory_set_data_handle(scratch_.get(), ws + plan_->a_bytes), "set_data_handle"));
    KILN_RETURN_IF_ERROR(
        OneDnnCall(dnnl_primitive_execute(matmul_.get(), stream_.get(),
                                          static_cast<int>(args_.size()), args_.data()),
                   "int8 matmul"));
    return OneDnnCall(dnnl_stream_wait(stream_.get()), "stream wait");
  }

 private:
  Int8GemmSpec spec_;
  Int8Activation act_;
  float a_scale_;
  int64_t k_, n_, m_ = 0;
  Int8Weights weights_;
  AddendPlan addend_;  // row_bias pre-divided by the output scales
  std::vector<float> scales_;
  int64_t c_row_stride_ = 0, c_col_stride_ = 0;
  std::optional<Int8GemmPlan> plan_;
  dnnl::stream stream_;
  dnnl::matmul matmul_;
  memory packed_wei_, src_, dst_, scratch_, bias_;
  std::vector<dnnl_exec_arg_t> args_;
};

// K and N of the constant B, or nullopt when B is not a constant 2-D float matrix.
std::optional<std::pair<int64_t, int64_t>> ConstantB(const Int8GemmSpec& s,
                                                     const KernelRequest& r) {
  if (r.inputs.size() < 2) return std::nullopt;
  const Tensor* b = r.inputs[1].constant;
  if (!b || b->dtype() != DataType::kFloat32 || b->dims().size() != 2) return std::nullopt;
  const auto& d = b->dims();
  return s.trans_b ? std::pair{d[1], d[0]} : std::pair{d[0], d[1]};
}

class Int8GemmProviderBase : public CpuFloatProvider {
 protected:
  virtual const char* tactic_name() const = 0;

  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    std::optional<Int8Activation> act = Int8ActivationOf(*request.node);
    if (!act) return {};
    auto spec = ReadInt8GemmSpec(request);
    if (!spec.ok() || spec->alpha == 0.f) return {};
    auto kn = ConstantB(*spec, request);
    if (!kn) return {};
    auto mk = RowsAndDepth(*spec, MaxDimsOf(request.inputs[0]));
    if (!mk.ok() || mk->second != kn->first) return {};
    auto addend = PlanAddend(*spec, request, kn->second);
    if (!addend.ok()) return {};
    std::vector<float> scales(static_cast<size_t>(kn->second), 1.f);
    auto plan = MakeInt8GemmPlan(*spec, mk->first, kn->first, kn->second, !addend->row_bias.empty(),
                                 addend->preload, scales, act->zero_point);
    if (!plan.ok()) return {};
    return {{tactic_name(), {}, plan->total()}};
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    const Node& node = *request.node;
    KILN_ASSIGN_OR_RETURN(Int8GemmSpec spec, ReadInt8GemmSpec(request));
    std::optional<Int8Activation> act = Int8ActivationOf(node);
    auto kn = ConstantB(spec, request);
    if (!act || !kn || spec.alpha == 0.f) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a finite positive {} attribute (or the model's "
                       "scales), a constant 2-D float B (input 1) and a non-zero alpha",
                       node.name(), tactic.name, kInt8InputAmaxAttr);
    }
    auto [k, n] = *kn;
    // Channels are B's columns N (Int8WeightLayoutOf).
    KILN_ASSIGN_OR_RETURN(Int8Weights q, Int8WeightsFor(node, *request.inputs[1].constant));
    KILN_ASSIGN_OR_RETURN(AddendPlan addend, PlanAddend(spec, request, n));
    return std::unique_ptr<Kernel>(
        std::make_unique<Int8GemmKernel>(spec, *act, k, n, std::move(q), std::move(addend)));
  }
};

class Int8GemmProvider final : public Int8GemmProviderBase {
 public:
  std::string_view id() const override { return "cpu.gemm.i8"; }
  std::string_view op_type() const override { return "Gemm"; }
  const char* tactic_name() const override { return "i8-gemm-cpu-onednn"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8GemmProvider);

class Int8FusedGemmProvider final : public Int8GemmProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_gemm.i8"; }
  std::string_view op_type() const override { return "FusedGemm"; }
  const char* tactic_name() const override { return "i8-gemm-cpu-onednn"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8FusedGemmProvider);

class Int8MatMulProvider final : public Int8GemmProviderBase {
 public:
  std::string_view id() const override { return "cpu.matmul.i8"; }
  std::string_view op_type() const override { return "MatMul"; }
  const char* tactic_name() const override { return "i8-matmul-cpu-onednn"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8MatMulProvider);

class Int8FusedMatMulProvider final : public Int8GemmProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_matmul.i8"; }
  std::string_view op_type() const override { return "FusedMatMul"; }
  const char* tactic_name() const override { return "i8-matmul-cpu-onednn"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8FusedMatMulProvider);

}  // namespace
}  // namespace kiln::cpu
