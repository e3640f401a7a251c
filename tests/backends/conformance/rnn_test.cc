// Conformance of RNN, GRU and LSTM against a double-precision reference written from the ONNX
// equations (default activations): directions, sequence_lens, initial states, biases, LSTM
// peepholes, GRU linear_before_reset, clip and layout 1. The kernels are CPU-only (ops.inc).
#include <cmath>

#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;

double Sig(double x) { return 1 / (1 + std::exp(-x)); }

struct Spec {
  std::string op;
  int64_t seq = 4, batch = 3, input = 2, hidden = 3;
  std::string direction = "forward";
  int64_t layout = 0;
  bool linear_before_reset = false;
  double clip = 0;  // 0: none
};

int64_t GatesOf(const std::string& op) { return op == "RNN" ? 1 : (op == "GRU" ? 3 : 4); }

// Inputs: X, W, R, B, sequence_lens, initial_h, [initial_c, P]; outputs Y, Y_h[, Y_c].
std::vector<RefTensor> Reference(const Spec& s, const std::vector<RefTensor>& in) {
  const int64_t g = GatesOf(s.op), h = s.hidden, dirs = s.direction == "bidirectional" ? 2 : 1;
  const bool lstm = s.op == "LSTM";
  auto x = [&](int64_t t, int64_t b, int64_t i) {
    return in[0][(s.layout == 0 ? t * s.batch + b : b * s.seq + t) * s.input + i];
  };
  auto state_at = [&](int64_t d, int64_t b, int64_t k) {
    return s.layout == 0 ? (d * s.batch + b) * h + k : (b * dirs + d) * h + k;
  };
  RefTensor y = RefTensor::Zeros(s.layout == 0 ? std::vector<int64_t>{s.seq, dirs, s.batch, h}
                                               : std::vector<int64_t>{s.batch, s.seq, dirs, h});
  std::vector<int64_t> sd = s.layout == 0 ? std::vector<int64_t>{dirs, s.batch, h}
                                          : std::vector<int64_t>{s.batch, dirs, h};
  RefTensor yh = RefTensor::Zeros(sd), yc = RefTensor::Zeros(sd);
  auto clip = [&](double v) { return s.clip > 0 ? std::clamp(v, -s.clip, s.clip) : v; };
  for (int64_t d = 0; d < dirs; ++d) {
    const bool back = s.direction == "reverse" || d == 1;
    // gate pre-activation of row `row`: x W^T + hp R^T + Wb + Rb (the recurrent part apart).
    auto xw = [&](int64_t row, int64_t t, int64_t b) {
      double a = in[3][d * 2 * g * h + row];
      for (int64_t i = 0; i < s.input; ++i)
        a += x(t, b, i) * in[1][(d * g * h + row) * s.input + i];
      return a;
    };
    auto hr = [&](int64_t row, const std::vector<double>& hp) {
      double a = 0;
      for (int64_t i = 0; i < h; ++i) a += hp[i] * in[2][(d * g * h + row) * h + i];
      return a;
    };
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t len = static_cast<int64_t>(in[4][b]);
      std::vector<double> hp(h), cp(h);
      for (int64_t k = 0; k < h; ++k) {
        hp[k] = in[5][state_at(d, b, k)];
        if (lstm) cp[k] = in[6][state_at(d, b, k)];
      }
      for (int64_t st = 0; st < len; ++st) {
        const int64_t t = back ? len - 1 - st : st;
        std::vector<double> hn(h), cn(h);
        for (int64_t k = 0; k < h; ++k) {
          auto rbias = [&](int64_t row) { return in[3][d * 2 * g * h + g * h + row]; };
          if (s.op == "RNN") {
            hn[k] = std::tanh(clip(xw(k, t, b) + hr(k, hp) + rbias(k)));
          } else if (s.op == "GRU") {
            const double z = Sig(clip(xw(k, t, b) + hr(k, hp) + rbias(k)));
            std::vector<double> rv(h);
            for (int64_t j = 0; j < h; ++j)
              rv[j] = Sig(clip(xw(h + j, t, b) + hr(h + j, hp) + rbias(h + j)));
            double rec;
            if (s.linear_before_reset) {
              rec = rv[k] * (hr(2 * h + k, hp) + rbias(2 * h + k));
            } else {
              std::vector<double> reset(h);
              for (int64_t j = 0; j < h; ++j) reset[j] = rv[j] * hp[j];
              rec = hr(2 * h + k, reset) + rbias(2 * h + k);
            }
            const double ht = std::tanh(clip(xw(2 * h + k, t, b) + rec));
            hn[k] = (1 - z) * ht + z * hp[k];
          } else {
            auto pre = [&](int64_t blk) {
              return xw(blk * h + k, t, b) + hr(blk * h + k, hp) + rbias(blk * h + k);
            };
            auto peep = [&](int64_t which) { return in[7][(d * 3 + which) * h + k]; };
            const double i = Sig(clip(pre(0) + peep(0) * cp[k]));
            const double f = Sig(clip(pre(2) + peep(2) * cp[k]));
            const double c = std::tanh(clip(pre(3)));
            cn[k] = f * cp[k] + i * c;
            const double o = Sig(clip(pre(1) + peep(1) * cn[k]));
            hn[k] = o * std::tanh(cn[k]);
          }
        }
        hp = hn;
        if (lstm) cp = cn;
        for (int64_t k = 0; k < h; ++k) {
          y[s.layout == 0 ? ((t * dirs + d) * s.batch + b) * h + k
                          : ((b * s.seq + t) * dirs + d) * h + k] = hp[k];
        }
      }
      for (int64_t k = 0; k < h; ++k) {
        yh[state_at(d, b, k)] = hp[k];
        yc[state_at(d, b, k)] = cp[k];
      }
    }
  }
  if (lstm) return {y, yh, yc};
  return {y, yh};
}

void RunSpec(const Spec& s, BackendKind backend) {
  const int64_t g = GatesOf(s.op), dirs = s.direction == "bidirectional" ? 2 : 1;
  const bool lstm = s.op == "LSTM";
  AttributeMap attrs;
  attrs.Set("hidden_size", s.hidden);
  attrs.Set("direction", s.direction);
  attrs.Set("layout", s.layout);
  if (s.op == "GRU") attrs.Set("linear_before_reset", int64_t{s.linear_before_reset});
  if (s.clip > 0) attrs.Set("clip", static_cast<float>(s.clip));
  std::vector<int64_t> xd = s.layout == 0 ? std::vector<int64_t>{s.seq, s.batch, s.input}
                                          : std::vector<int64_t>{s.batch, s.seq, s.input};
  std::vector<int64_t> sd = s.layout == 0 ? std::vector<int64_t>{dirs, s.batch, s.hidden}
                                          : std::vector<int64_t>{s.batch, dirs, s.hidden};
  std::vector<double> lens;
  for (int64_t b = 0; b < s.batch; ++b) lens.push_back(static_cast<double>(s.seq - b % s.seq));
  OpTester t(s.op, attrs);
  t.Input(kFloat32, xd, -1, 1)
      .Input(kFloat32, {dirs, g * s.hidden, s.input}, -0.8, 0.8)
      .Input(kFloat32, {dirs, g * s.hidden, s.hidden}, -0.8, 0.8)
      .Input(kFloat32, {dirs, 2 * g * s.hidden}, -0.5, 0.5)
      .Input(MakeTensor(kInt32, {s.batch}, lens))
      .Input(kFloat32, sd, -0.5, 0.5);
  if (lstm) t.Input(kFloat32, sd, -0.5, 0.5).Input(kFloat32, {dirs, 3 * s.hidden}, -0.5, 0.5);
  t.Outputs(lstm ? 3 : 2)
      .Tolerance(1e-5, 1e-4)
      .Reference([s](const std::vector<RefTensor>& in) { return Reference(s, in); })
      .Run(backend);
}

class RecurrentOps : public BackendTest {};

TEST_P(RecurrentOps, EveryCellDirectionAndLayout) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "RNN/GRU/LSTM: CPU only (ops.inc)";
  for (std::string op : {"RNN", "GRU", "LSTM"}) {
    for (std::string dir : {"forward", "reverse", "bidirectional"}) {
      for (int64_t layout : {0, 1}) {
        SCOPED_TRACE(fmt::format("{} {} layout {}", op, dir, layout));
        Spec s;
        s.op = op;
        s.direction = dir;
        s.layout = layout;
        RunSpec(s, GetParam());
      }
    }
  }
  Spec gru;
  gru.op = "GRU";
  gru.linear_before_reset = true;
  gru.clip = 0.7;
  RunSpec(gru, GetParam());
  Spec lstm;
  lstm.op = "LSTM";
  lstm.clip = 0.5;
  lstm.direction = "bidirectional";
  RunSpec(lstm, GetParam());
}

KILN_INSTANTIATE_BACKENDS(RecurrentOps);

}  // namespace
}  // namespace kiln::testing
