// Conformance of reductions, ArgMax/ArgMin, CumSum, TopK, Softmax/LogSoftmax and
// LayerNormalization against double-precision references, for every backend.
#include <cmath>
#include <optional>

#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

AttributeMap Attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  AttributeMap m;
  for (auto& [k, v] : kv) m.Set(k, v);
  return m;
}

// Reference reduction: groups input elements by their kept coordinates.
ReferenceFn ReduceRef(std::vector<int64_t> axes, bool keepdims,
                      std::function<double(const std::vector<double>&)> f) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    size_t rank = x.dims.size();
    std::vector<bool> red(rank, axes.empty());
    for (int64_t a : axes) red[a < 0 ? a + rank : a] = true;
    std::vector<int64_t> kdims, odims;
    for (size_t a = 0; a < rank; ++a) {
      kdims.push_back(red[a] ? 1 : x.dims[a]);
      if (!red[a]) odims.push_back(x.dims[a]);
    }
    RefTensor out = RefTensor::Zeros(keepdims ? kdims : odims);
    std::vector<std::vector<double>> groups(static_cast<size_t>(out.size()));
    std::vector<int64_t> c(rank, 0);
    for (int64_t i = 0; i < x.size(); ++i) {
      int64_t k = 0;
      for (size_t a = 0; a < rank; ++a) k = k * kdims[a] + (red[a] ? 0 : c[a]);
      groups[k].push_back(x[i]);
      for (size_t a = rank; a-- > 0;) {
        if (++c[a] < x.dims[a]) break;
        c[a] = 0;
      }
    }
    for (int64_t k = 0; k < out.size(); ++k) out[k] = f(groups[k]);
    return std::vector<RefTensor>{out};
  };
}

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

class ReduceOps : public BackendTest {};

TEST_P(ReduceOps, AllReductionsOverSeveralAxisSets) {
  std::vector<std::pair<const char*, std::function<double(const std::vector<double>&)>>> ops = {
      {"ReduceSum", Sum},
      {"ReduceMean", [](const auto& v) { return Sum(v) / v.size(); }},
      {"ReduceMax", [](const auto& v) { return *std::max_element(v.begin(), v.end()); }},
      {"ReduceMin", [](const auto& v) { return *std::min_element(v.begin(), v.end()); }},
      {"ReduceProd",
       [](const auto& v) {
         double p = 1;
         for (double x : v) p *= x;
         return p;
       }},
      {"ReduceSumSquare",
       [](const auto& v) {
         double s = 0;
         for (double x : v) s += x * x;
         return s;
       }},
      {"ReduceL2",
       [](const auto& v) {
         double s = 0;
         for (double x : v) s += x * x;
         return std::sqrt(s);
       }},
      {"ReduceLogSumExp",
       [](const auto& v) {
         double s = 0;
         for (double x : v) s += std::exp(x);
         return std::log(s);
       }},
  };
  std::vector<std::vector<int64_t>> axis_sets = {{-1}, {1}, {0, 2}, {1, 2}, {}};
  for (auto& [op, f] : ops) {
    for (const auto& axes : axis_sets) {
      for (int64_t keep : {0, 1}) {
        SCOPED_TRACE(fmt::format("{} axes [{}] keepdims {}", op, fmt::join(axes, ","), keep));
        OpTester t(op, Attrs({{"keepdims", keep}}));
        t.Input(kFloat32, {3, 4, 5}, 0.5, 1.5);
        if (!axes.empty()) t.Constant(Int64s({static_cast<int64_t>(axes.size())}, axes));
        t.FloatTypes(kAllFloats)
            .Tolerance(1e-5, 1e-5)
            .Reference(ReduceRef(axes, keep, f))
            .Run(GetParam());
      }
    }
  }
  OpTester("ReduceSum", Attrs({{"keepdims", int64_t{0}}}))
      .Input(kInt64, {4, 6}, -9, 9)
      .Constant(Int64s({1}, {0}))
      .Reference(ReduceRef({0}, false, Sum))
      .Run(GetParam());
  // noop_with_empty_axes: the input passes through.
  OpTester("ReduceMean", Attrs({{"noop_with_empty_axes", int64_t{1}}}))
      .Input(kFloat32, {2, 3})
      .Reference([](const std::vector<RefTensor>& in) { return std::vector<RefTensor>{in[0]}; })
      .Run(GetParam());
}

TEST_P(ReduceOps, ArgMaxArgMinWithTies) {
  Tensor x = MakeTensor(kFloat32, {2, 4}, {1, 3, 3, 0, -1, -1, 2, -1});
  auto ref = [](bool is_max, bool last) {
    return [=](const std::vector<RefTensor>& in) {
      RefTensor out = RefTensor::Zeros({2, 1});
      for (int64_t r = 0; r < 2; ++r) {
        int64_t best = 0;
        for (int64_t j = 1; j < 4; ++j) {
          double c = in[0][r * 4 + j], b = in[0][r * 4 + best];
          if (is_max ? (c > b || (last && c == b)) : (c < b || (last && c == b))) best = j;
        }
        out[r] = best;
      }
      return std::vector<RefTensor>{out};
    };
  };
  for (bool is_max : {true, false}) {
    for (int64_t last : {0, 1}) {
      OpTester(is_max ? "ArgMax" : "ArgMin",
               Attrs({{"axis", int64_t{1}}, {"select_last_index", last}}))
          .Input(x)
          .FloatTypes(kAllFloats)
          .Reference(ref(is_max, last))
          .Run(GetParam());
    }
  }
}

TEST_P(ReduceOps, CumSumAndTopK) {
  for (int64_t exclusive : {0, 1}) {
    for (int64_t reverse : {0, 1}) {
      OpTester("CumSum", Attrs({{"exclusive", exclusive}, {"reverse", reverse}}))
          .Input(kFloat32, {3, 5})
          .Constant(Int64s({}, {1}))
          .Reference([=](const std::vector<RefTensor>& in) {
            RefTensor out = in[0];
            for (int64_t r = 0; r < 3; ++r) {
              for (int64_t j = 0; j < 5; ++j) {
                double s = 0;
                for (int64_t k = 0; k < 5; ++k) {
                  bool take = reverse ? (exclusive ? k > j : k >= j) : (exclusive ? k < j : k <= j);
                  if (take) s += in[0][r * 5 + k];
                }
                out[r * 5 + j] = s;
              }
            }
            return std::vector<RefTensor>{out};
          })
          .Run(GetParam());
    }
  }
  for (int64_t largest : {0, 1}) {
    OpTester("TopK", Attrs({{"axis", int64_t{0}}, {"largest", largest}}))
        .Input(MakeTensor(kFloat32, {5, 2}, {3, 1, 1, 4, 3, 1, 0, 5, 2, 9}))
        .Constant(Int64s({1}, {3}))
        .Outputs(2)
        .Reference([=](const std::vector<RefTensor>& in) {
          RefTensor vals = RefTensor::Zeros({3, 2}), idx = RefTensor::Zeros({3, 2});
          for (int64_t c = 0; c < 2; ++c) {
            std::vector<int64_t> order = {0, 1, 2, 3, 4};
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
              double va = in[0][a * 2 + c], vb = in[0][b * 2 + c];
              return largest ? va > vb : va < vb;
            });
            for (int64_t k = 0; k < 3; ++k) {
              vals[k * 2 + c] = in[0][order[k] * 2 + c];
              idx[k * 2 + c] = order[k];
            }
          }
          return std::vector<RefTensor>{vals, idx};
        })
        .Run(GetParam());
  }
}

ReferenceFn SoftmaxRef(int64_t axis, bool log) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t a = axis < 0 ? axis + rank : axis;
    int64_t outer = 1, n = x.dims[a], inner = 1;
    for (int64_t i = 0; i < a; ++i) outer *= x.dims[i];
    for (int64_t i = a + 1; i < rank; ++i) inner *= x.dims[i];
    RefTensor out = x;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[(o * n + j) * inner + i]);
        for (int64_t j = 0; j < n; ++j) s += std::exp(x[(o * n + j) * inner + i] - mx);
        for (int64_t j = 0; j < n; ++j) {
          double v = x[(o * n + j) * inner + i] - mx;
          out[(o * n + j) * inner + i] = log ? v - std::log(s) : std::exp(v) / s;
        }
      }
    }
    return std::vector<RefTensor>{out};
  };
}

TEST_P(ReduceOps, SoftmaxAndLogSoftmaxOnAnyAxis) {
  for (bool log : {false, true}) {
    for (int64_t axis : {-1, 1, 0}) {
      SCOPED_TRACE(fmt::format("log {} axis {}", log, axis));
      OpTester(log ? "LogSoftmax" : "Softmax", Attrs({{"axis", axis}}))
          .Input(kFloat32, {3, 7, 33}, -5, 5)
          .FloatTypes(kAllFloats)
          .Tolerance(1e-5, 1e-4)
          .Reference(SoftmaxRef(axis, log))
          .Run(GetParam());
    }
  }
}

TEST_P(ReduceOps, LayerNormalizationWithStatistics) {
  auto ref = [](int64_t axis, float eps, bool has_bias) {
    return [=](const std::vector<RefTensor>& in) {
      const RefTensor& x = in[0];
      int64_t n = 1;
      for (size_t i = axis; i < x.dims.size(); ++i) n *= x.dims[i];
      int64_t rows = x.size() / n;
      RefTensor y = x;
      std::vector<int64_t> sdims = x.dims;
      for (size_t i = axis; i < sdims.size(); ++i) sdims[i] = 1;
      RefTensor mean = RefTensor::Zeros(sdims), inv = RefTensor::Zeros(sdims);
      for (int64_t r = 0; r < rows; ++r) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < n; ++j) m += x[r * n + j];
        m /= n;
        for (int64_t j = 0; j < n; ++j) v += (x[r * n + j] - m) * (x[r * n + j] - m);
        double is = 1 / std::sqrt(v / n + eps);
        for (int64_t j = 0; j < n; ++j) {
          y[r * n + j] = (x[r * n + j] - m) * is * in[1][j] + (has_bias ? in[2][j] : 0.0);
        }
        mean[r] = m;
        inv[r] = is;
      }
      return std::vector<RefTensor>{y, mean, inv};
    };
  };
  OpTester("LayerNormalization", Attrs({{"epsilon", 1e-3f}}))
      .Input(kFloat32, {2, 5, 64}, -3, 3)
      .Input(kFloat32, {64}, 0.5, 1.5)
      .Input(kFloat32, {64})
      .Outputs(3)
      .FloatTypes(kAllFloats)
      .Tolerance(1e-5, 1e-4)
      .Reference(ref(2, 1e-3f, true))
      .Run(GetParam());
  OpTester("LayerNormalization", Attrs({{"axis", int64_t{1}}}))
      .Input(kFloat32, {3, 4, 6}, -3, 3)
      .Input(kFloat32, {4, 6}, 0.5, 1.5)
      .Outputs(3)
      .Tolerance(1e-5, 1e-4)
      .Reference(ref(1, 1e-5f, false))
      .Run(GetParam());
}

// f64 and the integer types beyond the index types (CPU kernels only); an `axes` input that is
// a graph input of length 0 (not a constant) reduces every axis, as ONNX's default.
TEST_P(ReduceOps, F64AndWideIntegerTypes) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "f64 and 16/32/64-bit types: CPU only";
  auto max = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  for (DataType type : {kFloat64, kInt16, kUInt16, kUInt32, kUInt64, kInt8, kUInt8}) {
    SCOPED_TRACE(ToString(type));
    OpTester("ReduceSum", Attrs({{"keepdims", int64_t{0}}}))
        .Input(type, {4, 6}, 0, 9)
        .Constant(Int64s({1}, {1}))
        .Tolerance(1e-12, 1e-12)
        .Reference(ReduceRef({1}, false, Sum))
        .Run(GetParam());
    OpTester("ReduceMax")
        .Input(type, {3, 4, 5}, 0, 50)
        .Constant(Int64s({2}, {0, 2}))
        .Reference(ReduceRef({0, 2}, true, max))
        .Run(GetParam());
    OpTester("ReduceMin")
        .Input(type, {3, 4}, 0, 50)
        .Input(Int64s({0}, {}))
        .Reference(ReduceRef(
            {}, true,
            [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }))
        .Run(GetParam());
  }
  OpTester("ReduceLogSumExp")
      .Input(kFloat64, {3, 4}, -2, 2)
      .Constant(Int64s({1}, {-1}))
      .Tolerance(1e-12, 1e-12)
      .Reference(ReduceRef({-1}, true,
                           [](const std::vector<double>& v) {
                             double s = 0;
                             for (double x : v) s += std::exp(x);
                             return std::log(s);
                           }))
      .Run(GetParam());
}

TEST_P(ReduceOps, ReduceL1AndLogSumHardmaxLpNormalization) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "these ops: CPU only (ops.inc)";
  OpTester("ReduceL1", Attrs({{"keepdims", int64_t{0}}}))
      .Input(kFloat32, {3, 4, 5}, -2, 2)
      .Constant(Int64s({2}, {0, 2}))
      .FloatTypes(kAllFloats)
      .Reference(ReduceRef({0, 2}, false,
                           [](const std::vector<double>& v) {
                             double s = 0;
                             for (double x : v) s += std::fabs(x);
                             return s;
                           }))
      .Run(GetParam());
  OpTester("ReduceLogSum")
      .Input(kFloat32, {3, 4, 5}, 0.1, 2)
      .Constant(Int64s({1}, {1}))
      .Reference(
          ReduceRef({1}, true, [](const std::vector<double>& v) { return std::log(Sum(v)); }))
      .Run(GetParam());
  // Hardmax: one-hot of the first maximum along the axis (ties among integral values).
  for (int64_t axis : {0, 1, -1}) {
    SCOPED_TRACE(axis);
    OpTester("Hardmax", Attrs({{"axis", axis}}))
        .Input(MakeTensor(kFloat32, {2, 3, 2}, {1, 3, 3, 0, 2, 3, 5, 5, 0, 1, 5, 2}))
        .Reference([axis](const std::vector<RefTensor>& in) {
          const RefTensor& x = in[0];
          int64_t ax = axis < 0 ? axis + 3 : axis;
          std::vector<int64_t> st = x.Strides();
          RefTensor out = RefTensor::Zeros(x.dims);
          for (int64_t i = 0; i < x.size(); ++i) {
            int64_t c = (i / st[ax]) % x.dims[ax], base = i - c * st[ax];
            int64_t best = 0;
            for (int64_t j = 1; j < x.dims[ax]; ++j) {
              if (x[base + j * st[ax]] > x[base + best * st[ax]]) best = j;
            }
            out[i] = c == best ? 1 : 0;
          }
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
  for (int64_t p : {1, 2}) {
    SCOPED_TRACE(p);
    OpTester("LpNormalization", Attrs({{"axis", int64_t{1}}, {"p", p}}))
        .Input(MakeTensor(kFloat64, {2, 3, 4},
                          {1, 2, 0, -1, 3, 4, 0, 2, 0, 5, 0, 1,  // a zero column per batch
                           6, 8, 0, 0,  0, 1, 0, 3, 2, 2, 0, 4}))
        .Tolerance(1e-12, 1e-12)
        .Reference([p](const std::vector<RefTensor>& in) {
          RefTensor out = in[0];
          for (int64_t a = 0; a < 2; ++a) {
            for (int64_t c = 0; c < 4; ++c) {
              double n = 0;
              for (int64_t j = 0; j < 3; ++j) {
                double x = in[0][(a * 3 + j) * 4 + c];
                n += p == 1 ? std::fabs(x) : x * x;
              }
              if (p == 2) n = std::sqrt(n);
              for (int64_t j = 0; j < 3; ++j) out[(a * 3 + j) * 4 + c] *= n == 0 ? 0 : 1 / n;
            }
          }
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
}

TEST_P(ReduceOps, CumProdBothDirections) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "CumProd: CPU only (ops.inc)";
  for (int64_t exclusive : {0, 1}) {
    for (int64_t reverse : {0, 1}) {
      SCOPED_TRACE(fmt::format("exclusive {} reverse {}", exclusive, reverse));
      OpTester("CumProd", Attrs({{"exclusive", exclusive}, {"reverse", reverse}}))
          .Input(kFloat64, {3, 4}, 0.5, 2)
          .Constant(Int64s({}, {1}))
          .Tolerance(1e-12, 1e-12)
          .Reference([=](const std::vector<RefTensor>& in) {
            RefTensor out = in[0];
            for (int64_t r = 0; r < 3; ++r) {
              double acc = 1;
              for (int64_t s = 0; s < 4; ++s) {
                const int64_t j = reverse ? 3 - s : s;
                if (exclusive) out[r * 4 + j] = acc;
                acc *= in[0][r * 4 + j];
                if (!exclusive) out[r * 4 + j] = acc;
              }
            }
            return std::vector<RefTensor>{out};
          })
          .Run(GetParam());
    }
  }
}

TEST_P(ReduceOps, InstanceNormLrnAndMeanVarianceNormalization) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "these ops: CPU only (ops.inc)";
  // Statistics per (n, c) over H x W.
  auto normalize = [](const RefTensor& x, int64_t groups, auto group_of, double eps, bool mvn) {
    std::vector<double> sum(groups), sq(groups), cnt(groups);
    for (int64_t i = 0; i < x.size(); ++i) {
      sum[group_of(i)] += x[i];
      sq[group_of(i)] += x[i] * x[i];
      cnt[group_of(i)] += 1;
    }
    RefTensor out = x;
    for (int64_t i = 0; i < x.size(); ++i) {
      const int64_t g = group_of(i);
      const double mean = sum[g] / cnt[g], var = sq[g] / cnt[g] - mean * mean;
      out[i] = mvn ? (x[i] - mean) / (std::sqrt(var) + 1e-9) : (x[i] - mean) / std::sqrt(var + eps);
    }
    return out;
  };
  OpTester("InstanceNormalization", Attrs({{"epsilon", 1e-3f}}))
      .Input(kFloat32, {2, 3, 4, 5}, -2, 2)
      .Input(kFloat32, {3}, 0.5, 2)
      .Input(kFloat32, {3}, -1, 1)
      .FloatTypes({kFloat32, kFloat16})
      .Tolerance(1e-5, 1e-4)
      .Reference([&](const std::vector<RefTensor>& in) {
        RefTensor y = normalize(
            in[0], 6, [](int64_t i) { return i / 20; }, 1e-3, false);
        for (int64_t i = 0; i < y.size(); ++i)
          y[i] = y[i] * in[1][(i / 20) % 3] + in[2][(i / 20) % 3];
        return std::vector<RefTensor>{y};
      })
      .Run(GetParam());
  // MVN over the default axes [0, 2, 3]: one group per channel.
  OpTester("MeanVarianceNormalization")
      .Input(kFloat64, {2, 3, 2, 2}, -2, 2)
      .Tolerance(1e-9, 1e-9)
      .Reference([&](const std::vector<RefTensor>& in) {
        return std::vector<RefTensor>{normalize(
            in[0], 3, [](int64_t i) { return (i / 4) % 3; }, 0, true)};
      })
      .Run(GetParam());
  // LRN over a window of 3 channels (1 before, 1 after).
  OpTester("LRN", Attrs({{"size", int64_t{3}}, {"alpha", 0.5f}, {"beta", 0.75f}, {"bias", 2.0f}}))
      .Input(kFloat32, {2, 5, 3}, -2, 2)
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = in[0];
        for (int64_t i = 0; i < out.size(); ++i) {
          const int64_t n = i / 15, c = (i / 3) % 5, w = i % 3;
          double sq = 0;
          for (int64_t k = std::max<int64_t>(0, c - 1); k <= std::min<int64_t>(4, c + 1); ++k) {
            sq += in[0][(n * 5 + k) * 3 + w] * in[0][(n * 5 + k) * 3 + w];
          }
          out[i] = in[0][i] / std::pow(2.0 + 0.5 / 3 * sq, 0.75);
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
}

// NLL over log-probabilities x [N, C, D...] with targets [N, D...]; weights and ignore_index as
// the ONNX spec (mean divides by the weights of the counted targets).
RefTensor RefNll(const RefTensor& x, const RefTensor& target, const RefTensor* weight,
                 const std::string& reduction, std::optional<int64_t> ignore) {
  const int64_t n = x.dims[0], c = x.dims[1], d = x.size() / (n * c);
  RefTensor loss = RefTensor::Zeros(target.dims);
  double sum = 0, wsum = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t t = static_cast<int64_t>(target[i * d + j]);
      if (ignore && t == *ignore) continue;
      const double w = weight ? (*weight)[t] : 1.0;
      loss[i * d + j] = -x[(i * c + t) * d + j] * w;
      sum += loss[i * d + j];
      wsum += w;
    }
  }
  if (reduction == "none") return loss;
  return RefTensor{{}, {reduction == "sum" ? sum : sum / wsum}};
}

RefTensor RefLogSoftmaxOverC(const RefTensor& x) {
  const int64_t n = x.dims[0], c = x.dims[1], d = x.size() / (n * c);
  RefTensor out = x;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      double s = 0;
      for (int64_t k = 0; k < c; ++k) s += std::exp(x[(i * c + k) * d + j]);
      for (int64_t k = 0; k < c; ++k)
        out[(i * c + k) * d + j] = x[(i * c + k) * d + j] - std::log(s);
    }
  }
  return out;
}

TEST_P(ReduceOps, NegativeLogLikelihoodAndSoftmaxCrossEntropyLoss) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "loss ops: CPU only (ops.inc)";
  // Targets of [2, 3, 2] over 4 classes; class 1 is the ignored one where asked.
  const Tensor target = Int64s({2, 3, 2}, {0, 1, 3, 2, 1, 1, 2, 0, 3, 3, 1, 0});
  for (const char* reduction : {"none", "sum", "mean"}) {
    for (bool weighted : {false, true}) {
      for (bool ignore : {false, true}) {
        SCOPED_TRACE(fmt::format("{} weighted {} ignore {}", reduction, weighted, ignore));
        AttributeMap attrs;
        attrs.Set("reduction", std::string(reduction));
        if (ignore) attrs.Set("ignore_index", int64_t{1});
        std::optional<int64_t> ii;
        if (ignore) ii = 1;
        std::string red = reduction;
        auto nll = [red, ii, weighted](const std::vector<RefTensor>& in) {
          return std::vector<RefTensor>{RefNll(in[0], in[1], weighted ? &in[2] : nullptr, red, ii)};
        };
        OpTester t("NegativeLogLikelihoodLoss", attrs);
        t.Input(kFloat32, {2, 4, 3, 2}, -3, 0).Input(target);
        if (weighted) t.Input(kFloat32, {4}, 0.5, 2);
        t.FloatTypes({kFloat32, kFloat16}).Tolerance(1e-5, 1e-5).Reference(nll).Run(GetParam());

        auto sce = [red, ii, weighted](const std::vector<RefTensor>& in) {
          RefTensor logp = RefLogSoftmaxOverC(in[0]);
          return std::vector<RefTensor>{RefNll(logp, in[1], weighted ? &in[2] : nullptr, red, ii),
                                        logp};
        };
        OpTester u("SoftmaxCrossEntropyLoss", attrs);
        u.Input(kFloat64, {2, 4, 3, 2}, -3, 3).Input(target);
        if (weighted) u.Input(kFloat64, {4}, 0.5, 2);
        u.Outputs(2).Tolerance(1e-12, 1e-12).Reference(sce).Run(GetParam());
      }
    }
  }
}

KILN_INSTANTIATE_BACKENDS(ReduceOps);

}  // namespace
}  // namespace kiln::testing
