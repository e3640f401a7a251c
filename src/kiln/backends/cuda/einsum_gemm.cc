// CUDA Einsum tactics for the equations that are a (batched) matrix product after transposes:
// "bhid,bhjd->bhij", "bhij,bhjd->bhid", "bij,bjk->bik", "ik,jk->ij"... Two operands without
// '...' or repeated labels, every label a batch (both operands and the output), M (first operand
// and output), N (second and output) or K (both operands, summed) label, each group contiguous and
// in one order everywhere, batch labels leading. Such an equation is run by the cuBLASLt
// FusedMatMul kernel (cublaslt_matmul.cc) on [batch, M|K, K|M] x [batch, K|N, N|K] views of the
// operands with its transA/transB; an output written [batch, N, M] swaps the operands. Tactics and
// their parameters are FusedMatMul's, renamed; other equations are left to cuda.einsum.direct.
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/einsum.h"

namespace kiln::cuda {
namespace {

constexpr std::string_view kInnerProvider = "cuda.fused_matmul.cublaslt";

// Axis groups of a matrix-product equation (axes of ops/einsum.h's iteration space).
struct GemmForm {
  std::vector<int64_t> batch, m, n, k;  // each in the order the operands store them
  bool a_km = false;                    // the first operand stores [batch, K, M]
  bool b_nk = false;                    // the second stores [batch, N, K]
  bool y_nm = false;                    // the output is [batch, N, M]
};

// Whether `term` is prefix ++ x ++ y (false in *swapped) or prefix ++ y ++ x (true).
bool SplitsAs(const std::vector<int64_t>& term, const std::vector<int64_t>& prefix,
              const std::vector<int64_t>& x, const std::vector<int64_t>& y, bool* swapped) {
  auto concat = [](std::vector<int64_t> a, const std::vector<int64_t>& b,
                   const std::vector<int64_t>& c) {
    a.insert(a.end(), b.begin(), b.end());
    a.insert(a.end(), c.begin(), c.end());
    return a;
  };
  if (term == concat(prefix, x, y)) {
    *swapped = false;
    return true;
  }
  if (term == concat(prefix, y, x)) {
    *swapped = true;
    return true;
  }
  return false;
}

std::optional<GemmForm> MatchGemm(const EinsumEquation& e) {
  if (e.operand_axes.size() != 2 || e.ellipsis_rank != 0) return std::nullopt;
  const std::vector<int64_t>& a = e.operand_axes[0];
  const std::vector<int64_t>& b = e.operand_axes[1];
  const std::vector<int64_t>& y = e.output_axes;
  auto has = [](const std::vector<int64_t>& v, int64_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  for (const auto* term : {&a, &b}) {  // a repeated label is a diagonal, not a GEMM
    std::vector<int64_t> sorted = *term;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return std::nullopt;
  }
  GemmForm f;
  for (int64_t x : a) {
    if (has(b, x) && has(y, x)) {
      f.batch.push_back(x);
    } else if (has(y, x)) {
      f.m.push_back(x);
    } else if (has(b, x)) {
      f.k.push_back(x);
    } else {
      return std::nullopt;  // summed over the first operand alone
    }
  }
  for (int64_t x : b) {
    if (!has(a, x)) {
      if (!has(y, x)) return std::nullopt;
      f.n.push_back(x);
    }
  }
  if (!SplitsAs(a, f.batch, f.m, f.k, &f.a_km)) return std::nullopt;
  bool b_kn_swapped = false;
  if (!SplitsAs(b, f.batch, f.k, f.n, &b_kn_swapped)) return std::nullopt;
  f.b_nk = b_kn_swapped;
  if (!SplitsAs(y, f.batch, f.m, f.n, &f.y_nm)) return std::nullopt;
  return f;
}

StatusOr<EinsumEquation> ParseRequest(const KernelRequest& r) {
  std::vector<int64_t> ranks;
  for (const OperandDesc& d : r.inputs) ranks.push_back(static_cast<int64_t>(d.shape.size()));
  return ParseEinsum(r.node->attrs().GetString("equation", ""), ranks);
}

// The FusedMatMul operands' dims for einsum operands of dims `a` and `b`: the product of each
// group's extents, as [batch, rows, cols] in storage order; the output [batch, M, N] or
// [batch, N, M]. Inner operand 0 is the einsum's first operand unless the output is [N, M].
struct InnerDims {
  std::vector<int64_t> in0, in1, out;
};
InnerDims InnerDimsFor(const GemmForm& f, const EinsumEquation& e, std::span<const int64_t> a,
                       std::span<const int64_t> b) {
  std::vector<int64_t> extent(static_cast<size_t>(e.num_axes()), 1);
  for (size_t k = 0; k < a.size(); ++k) extent[static_cast<size_t>(e.operand_axes[0][k])] = a[k];
  for (size_t k = 0; k < b.size(); ++k) extent[static_cast<size_t>(e.operand_axes[1][k])] = b[k];
  auto product = [&](const std::vector<int64_t>& axes) {
    int64_t p = 1;
    for (int64_t x : axes) p *= extent[static_cast<size_t>(x)];
    return p;
  };
  const int64_t bt = product(f.batch), m = product(f.m), n = product(f.n), k = product(f.k);
  std::vector<int64_t> av = f.a_km ? std::vector<int64_t>{bt, k, m} : std::vector{bt, m, k};
  std::vector<int64_t> bv = f.b_nk ? std::vector<int64_t>{bt, n, k} : std::vector{bt, k, n};
  if (f.y_nm) return {std::move(bv), std::move(av), {bt, n, m}};
  return {std::move(av), std::move(bv), {bt, m, n}};
}

// transA/transB of the FusedMatMul: Y = A B, or Y^T = B^T A^T for an [N, M] output.
AttributeMap InnerAttrs(const GemmForm& f) {
  AttributeMap at;
  const bool ta = f.y_nm ? !f.b_nk : f.a_km;
  const bool tb = f.y_nm ? !f.a_km : f.b_nk;
  at.Set("transA", int64_t{ta ? 1 : 0});
  at.Set("transB", int64_t{tb ? 1 : 0});
  return at;
}

// A one-node FusedMatMul graph and its request for the einsum request `r` with operand dims a, b.
struct InnerLayer {
  Graph graph;
  KernelRequest request;
};
std::unique_ptr<InnerLayer> MakeInner(const KernelRequest& r, const GemmForm& f,
                                      const EinsumEquation& e, std::span<const int64_t> a,
                                      std::span<const int64_t> b) {
  const DataType t = OutType(r, 0);
  const InnerDims d = InnerDimsFor(f, e, a, b);
  auto l = std::make_unique<InnerLayer>();
  Value* x0 = l->graph.AddInput("a", t, MakeShape(d.in0));
  Value* x1 = l->graph.AddInput("b", t, MakeShape(d.in1));
  Value* y = l->graph.AddValue("y", t);
  l->request.node = l->graph.AddNode("FusedMatMul", "einsum_gemm", {x0, x1}, {y}, InnerAttrs(f));
  l->request.inputs = {{t, MakeShape(d.in0), d.in0, nullptr},
                       {t, MakeShape(d.in1), d.in1, nullptr}};
  l->request.outputs = {{t, MakeShape(d.out), d.out, nullptr}};
  l->request.max_tactics = r.max_tactics;
  return l;
}

// The FusedMatMul kernel on views of the einsum's operands with the matrix dims.
class EinsumGemmKernel final : public Kernel {
 public:
  EinsumGemmKernel(GemmForm form, EinsumEquation eq, std::unique_ptr<Kernel> inner)
      : form_(std::move(form)), eq_(std::move(eq)), inner_(std::move(inner)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    Bind(inputs, outputs);
    return inner_->Prepare(in_, out_);
  }
  StatusOr<size_t> QueryWorkspace(std::span<const TensorView> inputs,
                                  std::span<const TensorView> outputs) override {
    Bind(inputs, outputs);
    return inner_->QueryWorkspace(in_, out_);
  }
  Status Run(const KernelRunArgs& args) override {
    const size_t first = form_.y_nm ? 1 : 0;
    in_[0].data = args.inputs[first].data;
    in_[1].data = args.inputs[1 - first].data;
    out_[0].data = args.outputs[0].data;
    KernelRunArgs inner = args;
    inner.inputs = in_;
    inner.outputs = out_;
    return inner_->Run(inner);
  }

 private:
  // The inner operands' views for these shapes (their dims live in dims_).
  void Bind(std::span<const TensorView> inputs, std::span<const TensorView> outputs) {
    dims_ = InnerDimsFor(form_, eq_, inputs[0].dims, inputs[1].dims);
    const size_t first = form_.y_nm ? 1 : 0;
    in_[0] = {inputs[first].dtype, dims_.in0, inputs[first].data};
    in_[1] = {inputs[1 - first].dtype, dims_.in1, inputs[1 - first].data};
    out_[0] = {outputs[0].dtype, dims_.out, outputs[0].data};
  }

  GemmForm form_;
  EinsumEquation eq_;
  std::unique_ptr<Kernel> inner_;
  InnerDims dims_;
  TensorView in_[2], out_[1];
};

class EinsumCublasLtProvider final : public KernelProvider {
 public:
  std::string_view id() const override { return "cuda.einsum.cublaslt"; }
  std::string_view op_type() const override { return "Einsum"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    const KernelProvider* inner = Inner();
    auto eq = Match(r);
    if (!inner || !eq) return {};
    const std::vector<int64_t> a = LargestDims(r.inputs[0]), b = LargestDims(r.inputs[1]);
    if (a.size() != r.inputs[0].shape.size() || b.size() != r.inputs[1].shape.size()) return {};
    auto layer = MakeInner(r, eq->second, eq->first, a, b);
    std::vector<TacticConfig> tactics = inner->Tactics(layer->request);
    for (TacticConfig& t : tactics) {
      // "f16-matmul-cuda-cublaslt-algo..." -> "f16-einsum-cuda-cublaslt-algo...".
      const size_t at = t.name.find("-matmul-");
      if (at != std::string::npos) t.name.replace(at, 8, "-einsum-");
    }
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig& tactic) const override {
    const KernelProvider* inner = Inner();
    if (!inner) {
      return MakeError(ErrorCode::kInvalidArgument, "{}: provider {} is not registered", id(),
                       kInnerProvider);
    }
    auto eq = Match(r);
    if (!eq) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "{}: equation '{}' is not a matrix product of f32/f16/bf16 operands", id(),
                       r.node->attrs().GetString("equation", ""));
    }
    // FusedMatMul's Create reads the node and the operand types only: these dims are placeholders
    // (Prepare binds the real ones).
    std::vector<int64_t> a(r.inputs[0].shape.size(), 1), b(r.inputs[1].shape.size(), 1);
    auto layer = MakeInner(r, eq->second, eq->first, a, b);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel, inner->Create(layer->request, tactic));
    return std::unique_ptr<Kernel>(
        std::make_unique<EinsumGemmKernel>(eq->second, eq->first, std::move(kernel)));
  }

 private:
  static const KernelProvider* Inner() {
    return KernelRegistry::Get().Find(BackendKind::kCuda, kInnerProvider);
  }
  // The equation and its matrix-product form, for two operands of the output's float type.
  static std::optional<std::pair<EinsumEquation, GemmForm>> Match(const KernelRequest& r) {
    const DataType t = OutType(r, 0);
    if (r.inputs.size() != 2 || !IsFloatStorage(t) || InType(r, 0) != t || InType(r, 1) != t) {
      return std::nullopt;
    }
    auto eq = ParseRequest(r);
    if (!eq.ok()) return std::nullopt;
    auto form = MatchGemm(*eq);
    if (!form) return std::nullopt;
    return std::make_pair(std::move(*eq), std::move(*form));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(EinsumCublasLtProvider);

}  // namespace
}  // namespace kiln::cuda
