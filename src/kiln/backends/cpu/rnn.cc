// RNN, GRU and LSTM on the CPU (f32 and f64; f16/bf16 through the wrapper): ONNX's equations
// with its default activations (Tanh; Sigmoid/Tanh for GRU; Sigmoid/Tanh/Tanh for LSTM), both
// layouts, forward/reverse/bidirectional, bias, sequence_lens, initial states, LSTM peepholes,
// GRU linear_before_reset and clip. Reference loops in double, one batch row at a time; the
// states live in the workspace.
#include <algorithm>
#include <cmath>
#include <optional>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

enum class Cell { kRnn, kGru, kLstm };

int64_t Gates(Cell c) { return c == Cell::kRnn ? 1 : (c == Cell::kGru ? 3 : 4); }

struct RnnAttrs {
  Cell cell = Cell::kRnn;
  int64_t hidden = 0, dirs = 1, layout = 0;
  bool reverse_only = false, linear_before_reset = false;
  std::optional<double> clip;
};

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The shapes of one call: sequence, batch, input sizes.
struct RnnDims {
  int64_t seq = 0, batch = 0, input = 0;
};

template <typename T>
class RnnRun {
 public:
  RnnRun(const RnnAttrs& a, const KernelRunArgs& args)
      : a_(a), args_(args), h_(a.hidden), g_(Gates(a.cell)) {
    const auto& xd = args.inputs[0].dims;
    d_.seq = a.layout == 0 ? xd[0] : xd[1];
    d_.batch = a.layout == 0 ? xd[1] : xd[0];
    d_.input = xd[2];
  }

  Status Run() {
    const TensorView* lens = Opt(4);
    if (lens && lens->dtype != DataType::kInt32) {
      return MakeError(ErrorCode::kKernelFailed, "sequence_lens must be int32");
    }
    for (int64_t i = 0; i < Outputs(); ++i) {
      if (Out(i)) std::fill_n(Out(i)->template as<T>(), Out(i)->num_elements(), T(0));
    }
    double* ws = static_cast<double*>(args_.workspace);
    double* hs = ws;                // [hidden]
    double* cs = hs + h_;           // [hidden]
    double* gate = cs + h_;         // [gates * hidden]
    double* prev = gate + g_ * h_;  // [hidden]
    for (int64_t dir = 0; dir < a_.dirs; ++dir) {
      const bool backward = a_.reverse_only || dir == 1;
      for (int64_t b = 0; b < d_.batch; ++b) {
        int64_t len = d_.seq;
        if (lens) len = lens->as<const int32_t>()[b];
        if (len < 0 || len > d_.seq) {
          return MakeError(ErrorCode::kKernelFailed, "sequence_lens[{}] is {}, outside [0, {}]", b,
                           len, d_.seq);
        }
        for (int64_t k = 0; k < h_; ++k) {
          hs[k] = Opt(5)
                      ? static_cast<double>(Opt(5)->template as<const T>()[StateIndex(dir, b, k)])
                      : 0;
          cs[k] = Opt(6) && a_.cell == Cell::kLstm
                      ? static_cast<double>(Opt(6)->template as<const T>()[StateIndex(dir, b, k)])
                      : 0;
        }
        for (int64_t s = 0; s < len; ++s) {
          const int64_t t = backward ? len - 1 - s : s;
          std::copy_n(hs, h_, prev);
          Step(dir, b, t, prev, hs, cs, gate);
          if (Out(0)) {
            T* y = Out(0)->template as<T>();
            for (int64_t k = 0; k < h_; ++k) y[YIndex(t, dir, b, k)] = static_cast<T>(hs[k]);
          }
        }
        for (int64_t k = 0; k < h_; ++k) {
          if (Out(1)) Out(1)->template as<T>()[StateIndex(dir, b, k)] = static_cast<T>(hs[k]);
          if (Out(2)) Out(2)->template as<T>()[StateIndex(dir, b, k)] = static_cast<T>(cs[k]);
        }
      }
    }
    return OkStatus();
  }

 private:
  const TensorView* Opt(size_t i) const {
    return args_.inputs.size() > i && args_.inputs[i].data ? &args_.inputs[i] : nullptr;
  }
  int64_t Outputs() const { return static_cast<int64_t>(args_.outputs.size()); }
  const TensorView* Out(int64_t i) const {
    return i < Outputs() && args_.outputs[i].data && args_.outputs[i].dtype != DataType::kUndefined
               ? &args_.outputs[i]
               : nullptr;
  }
  int64_t XIndex(int64_t t, int64_t b, int64_t i) const {
    return (a_.layout == 0 ? t * d_.batch + b : b * d_.seq + t) * d_.input + i;
  }
  int64_t YIndex(int64_t t, int64_t dir, int64_t b, int64_t k) const {
    return a_.layout == 0 ? ((t * a_.dirs + dir) * d_.batch + b) * h_ + k
                          : ((b * d_.seq + t) * a_.dirs + dir) * h_ + k;
  }
  int64_t StateIndex(int64_t dir, int64_t b, int64_t k) const {
    return a_.layout == 0 ? (dir * d_.batch + b) * h_ + k : (b * a_.dirs + dir) * h_ + k;
  }
  double Clip(double v) const { return a_.clip ? std::clamp(v, -*a_.clip, *a_.clip) : v; }
  // W row r of gate block `gate` times x_t, or R's times the previous state; the biases.
  double XW(int64_t dir, int64_t row, int64_t b, int64_t t) const {
    const T* w = args_.inputs[1].template as<const T>() + (dir * g_ * h_ + row) * d_.input;
    const T* x = args_.inputs[0].template as<const T>();
    double acc = 0;
    for (int64_t i = 0; i < d_.input; ++i) {
      acc += static_cast<double>(x[XIndex(t, b, i)]) * static_cast<double>(w[i]);
    }
    return acc;
  }
  double HR(int64_t dir, int64_t row, const double* h) const {
    const T* r = args_.inputs[2].template as<const T>() + (dir * g_ * h_ + row) * h_;
    double acc = 0;
    for (int64_t i = 0; i < h_; ++i) acc += h[i] * static_cast<double>(r[i]);
    return acc;
  }
  double Wb(int64_t dir, int64_t row) const {
    return Opt(3) ? static_cast<double>(Opt(3)->template as<const T>()[dir * 2 * g_ * h_ + row])
                  : 0;
  }
  double Rb(int64_t dir, int64_t row) const {
    return Opt(3) ? static_cast<double>(
                        Opt(3)->template as<const T>()[dir * 2 * g_ * h_ + g_ * h_ + row])
                  : 0;
  }
  double Peephole(int64_t dir, int64_t which, int64_t k) const {  // which: 0 i, 1 o, 2 f
    return Opt(7) ? static_cast<double>(Opt(7)->template as<const T>()[(dir * 3 + which) * h_ + k])
                  : 0;
  }

  void Step(int64_t dir, int64_t b, int64_t t, const double* prev, double* hs, double* cs,
            double* gate) const {
    switch (a_.cell) {
      case Cell::kRnn:
        for (int64_t k = 0; k < h_; ++k) {
          hs[k] = std::tanh(Clip(XW(dir, k, b, t) + HR(dir, k, prev) + Wb(dir, k) + Rb(dir, k)));
        }
        break;
      case Cell::kGru: {
        // Gate blocks z, r, h.
        double* z = gate;
        double* r = gate + h_;
        for (int64_t k = 0; k < h_; ++k) {
          z[k] = Sigmoid(Clip(XW(dir, k, b, t) + HR(dir, k, prev) + Wb(dir, k) + Rb(dir, k)));
          const int64_t rr = h_ + k;
          r[k] = Sigmoid(Clip(XW(dir, rr, b, t) + HR(dir, rr, prev) + Wb(dir, rr) + Rb(dir, rr)));
        }
        double* reset = gate + 2 * h_;  // r (.) H_{t-1}
        for (int64_t k = 0; k < h_; ++k) reset[k] = r[k] * prev[k];
        for (int64_t k = 0; k < h_; ++k) {
          const int64_t hr = 2 * h_ + k;
          const double rec = a_.linear_before_reset ? r[k] * (HR(dir, hr, prev) + Rb(dir, hr))
                                                    : HR(dir, hr, reset) + Rb(dir, hr);
          const double ht = std::tanh(Clip(XW(dir, hr, b, t) + rec + Wb(dir, hr)));
          hs[k] = (1 - z[k]) * ht + z[k] * prev[k];
        }
        break;
      }
      case Cell::kLstm:
        // Gate blocks i, o, f, c.
        for (int64_t k = 0; k < h_; ++k) {
          auto pre = [&](int64_t block) {
            const int64_t row = block * h_ + k;
            return XW(dir, row, b, t) + HR(dir, row, prev) + Wb(dir, row) + Rb(dir, row);
          };
          const double i = Sigmoid(Clip(pre(0) + Peephole(dir, 0, k) * cs[k]));
          const double f = Sigmoid(Clip(pre(2) + Peephole(dir, 2, k) * cs[k]));
          const double c = std::tanh(Clip(pre(3)));
          gate[k] = f * cs[k] + i * c;                                           // C_t
          gate[h_ + k] = Sigmoid(Clip(pre(1) + Peephole(dir, 1, k) * gate[k]));  // o_t
        }
        for (int64_t k = 0; k < h_; ++k) {
          cs[k] = gate[k];
          hs[k] = gate[h_ + k] * std::tanh(cs[k]);
        }
        break;
    }
  }

  const RnnAttrs& a_;
  const KernelRunArgs& args_;
  const int64_t h_, g_;
  RnnDims d_;
};

StatusOr<RnnAttrs> ReadRnnAttrs(const Node& node, Cell cell) {
  RnnAttrs a;
  a.cell = cell;
  a.hidden = node.attrs().GetInt("hidden_size", 0);
  const std::string direction = node.attrs().GetString("direction", "forward");
  a.dirs = direction == "bidirectional" ? 2 : 1;
  a.reverse_only = direction == "reverse";
  a.layout = node.attrs().GetInt("layout", 0);
  a.linear_before_reset = cell == Cell::kGru && attrs::GRU::linear_before_reset(node) != 0;
  if (node.attrs().Has("clip")) a.clip = node.attrs().GetFloat("clip", 0.f);
  if (a.hidden < 1) {
    return MakeError(ErrorCode::kInvalidAttribute, "node '{}': hidden_size must be >= 1",
                     node.name());
  }
  return a;
}

void RegisterRecurrent(const char* op, Cell cell) {
  RegisterOpKernel({
      .op_type = op,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 || InType(r, 0) == DataType::kFloat64;
          },
      .create = [cell](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(RnnAttrs attrs, ReadRnnAttrs(*r.node, cell));
        const DataType t = InType(r, 0);
        auto run = [attrs, t](const KernelRunArgs& a) -> Status {
          if (t == DataType::kFloat64) return RnnRun<double>(attrs, a).Run();
          return RnnRun<float>(attrs, a).Run();
        };
        auto prepare = [attrs](std::span<const TensorView>,
                               std::span<const TensorView>) -> StatusOr<size_t> {
          return static_cast<size_t>((3 + Gates(attrs.cell)) * attrs.hidden) * sizeof(double);
        };
        return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(run, prepare));
      },
  });
}

const bool kRegistered = [] {
  RegisterRecurrent("RNN", Cell::kRnn);
  RegisterRecurrent("GRU", Cell::kGru);
  RegisterRecurrent("LSTM", Cell::kLstm);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
