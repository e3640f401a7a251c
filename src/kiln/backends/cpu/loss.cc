// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss on the CPU (f32 and f64; f16/bf16 through
// the wrapper). Scores are viewed as [N, C, D] (D = d1 * .. * dk) and targets as [N, D].
// SoftmaxCrossEntropyLoss is LogSoftmax over C (into its second output, or the workspace) then
// the same NLL; accumulation is in double.
#include <cmath>
#include <optional>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

enum class Reduction { kNone, kSum, kMean };

struct LossParams {
  Reduction reduction = Reduction::kMean;
  std::optional<int64_t> ignore_index;
};

LossParams ReadLossParams(const Node& node, const std::string& reduction) {
  LossParams p;
  p.reduction = reduction == "none"  ? Reduction::kNone
                : reduction == "sum" ? Reduction::kSum
                                     : Reduction::kMean;
  if (node.attrs().Has("ignore_index")) p.ignore_index = node.attrs().GetInt("ignore_index", 0);
  return p;
}

// [N, C, D] of the scores.
struct LossDims {
  int64_t n = 1, c = 1, d = 1;
  explicit LossDims(std::span<const int64_t> dims) {
    n = dims[0];
    c = dims[1];
    for (size_t i = 2; i < dims.size(); ++i) d *= dims[i];
  }
};

// log_softmax over C of x [N, C, D] into y.
template <typename T>
void LogSoftmaxOverC(const T* x, T* y, const LossDims& s) {
  ParallelRows(s.n * s.d, s.c * 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t off = (t / s.d) * s.c * s.d + t % s.d;
      double mx = -INFINITY;
      for (int64_t j = 0; j < s.c; ++j) mx = std::max(mx, static_cast<double>(x[off + j * s.d]));
      double sum = 0;
      for (int64_t j = 0; j < s.c; ++j) sum += std::exp(static_cast<double>(x[off + j * s.d]) - mx);
      const double lse = mx + std::log(sum);
      for (int64_t j = 0; j < s.c; ++j) {
        y[off + j * s.d] = static_cast<T>(static_cast<double>(x[off + j * s.d]) - lse);
      }
    }
  });
}

// loss[n, d] = -logp[n, target, d] * weight[target] (0 where the target is ignored), reduced.
template <typename T>
Status Nll(const T* logp, const TensorView& target, const TensorView* weight, const LossDims& s,
           const LossParams& p, const TensorView& out) {
  const T* w = weight ? weight->as<const T>() : nullptr;
  T* y = out.as<T>();
  double sum = 0, weight_sum = 0;
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t d = 0; d < s.d; ++d) {
      const int64_t i = n * s.d + d;
      const int64_t t = ReadInt(target, i);
      double loss = 0, wt = 0;
      if (!p.ignore_index || t != *p.ignore_index) {
        if (t < 0 || t >= s.c) {
          return MakeError(ErrorCode::kKernelFailed,
                           "target {} at element {} is outside the {} classes", t, i, s.c);
        }
        wt = w ? static_cast<double>(w[t]) : 1.0;
        loss = -static_cast<double>(logp[(n * s.c + t) * s.d + d]) * wt;
      }
      if (p.reduction == Reduction::kNone) y[i] = static_cast<T>(loss);
      sum += loss;
      weight_sum += wt;
    }
  }
  // Mean divides by the weights of the targets counted (their number without weights).
  if (p.reduction == Reduction::kSum) y[0] = static_cast<T>(sum);
  if (p.reduction == Reduction::kMean) y[0] = static_cast<T>(sum / weight_sum);
  return OkStatus();
}

bool AcceptsLoss(const KernelRequest& r) {
  const DataType t = InType(r, 0);
  if (t != DataType::kFloat32 && t != DataType::kFloat64) return false;
  if (!IsIndexType(InType(r, 1))) return false;
  return r.inputs.size() < 3 || InType(r, 2) == DataType::kUndefined || InType(r, 2) == t;
}

template <typename F>
Status ForLossType(DataType t, F&& f) {
  if (t == DataType::kFloat64) return f(std::type_identity<double>{});
  return f(std::type_identity<float>{});
}

const TensorView* OptionalInput(const KernelRunArgs& a, size_t i) {
  return a.inputs.size() > i && a.inputs[i].data ? &a.inputs[i] : nullptr;
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "NegativeLogLikelihoodLoss",
      .accepts = AcceptsLoss,
      .create =
          [](const KernelRequest& r) {
            LossParams p =
                ReadLossParams(*r.node, attrs::NegativeLogLikelihoodLoss::reduction(*r.node));
            return KernelOr([p, t = InType(r, 0)](const KernelRunArgs& a) {
              return ForLossType(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                LossDims s(a.inputs[0].dims);
                return Nll<T>(a.inputs[0].as<const T>(), a.inputs[1], OptionalInput(a, 2), s, p,
                              a.outputs[0]);
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "SoftmaxCrossEntropyLoss",
      .accepts = AcceptsLoss,
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        LossParams p = ReadLossParams(*r.node, attrs::SoftmaxCrossEntropyLoss::reduction(*r.node));
        const DataType t = InType(r, 0);
        // The log-probabilities go to the second output when the node has it, else to the
        // workspace (asked for either way: whether an output is bound yet is not known here).
        auto prepare = [](std::span<const TensorView> in,
                          std::span<const TensorView>) -> StatusOr<size_t> {
          return in[0].size_bytes();
        };
        auto run = [p, t](const KernelRunArgs& a) {
          return ForLossType(t, [&](auto tag) -> Status {
            using T = typename decltype(tag)::type;
            LossDims s(a.inputs[0].dims);
            const bool has_log_prob = a.outputs.size() > 1 &&
                                      a.outputs[1].dtype != DataType::kUndefined &&
                                      a.outputs[1].data;
            T* logp = has_log_prob ? a.outputs[1].as<T>() : static_cast<T*>(a.workspace);
            LogSoftmaxOverC<T>(a.inputs[0].as<const T>(), logp, s);
            return Nll<T>(logp, a.inputs[1], OptionalInput(a, 2), s, p, a.outputs[0]);
          });
        };
        return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(run, prepare));
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
