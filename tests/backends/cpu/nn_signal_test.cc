// Signal ops (DFT, STFT, windows) and the assorted ops of ops/misc.cc on the CPU, against direct
// double-precision references written from the ONNX spec (std::complex sums, cofactor
// determinants, per-element loops), not the kernels' tables.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <limits>
#include <numbers>

#include "nn_test_util.h"

namespace kiln::testing {
namespace {

using cd = std::complex<double>;
constexpr double kPi = std::numbers::pi;

Tensor Ints(std::vector<int64_t> dims, std::vector<int64_t> v) {
  return Tensor::FromVector(DataType::kInt64, std::move(dims), v);
}
Tensor Scalar(int64_t v) { return Ints({}, {v}); }

// ---- DFT ----------------------------------------------------------------------------------------

struct DftCase {
  std::vector<int64_t> x;  // last dim 1 or 2
  int64_t axis = -2;
  int64_t length = 0;  // 0: no dft_length input
  bool inverse = false, onesided = false;
};

void RunDft(const DftCase& k, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "DFT";
  c.attrs.Set("inverse", int64_t{k.inverse});
  c.attrs.Set("onesided", int64_t{k.onesided});
  c.inputs = {RandomTensor(k.x, rng), k.length ? Scalar(k.length) : Tensor(), Scalar(k.axis)};
  c.constant = {false, true, true};
  const int64_t rank = static_cast<int64_t>(k.x.size());
  const int64_t axis = k.axis < 0 ? k.axis + rank : k.axis;
  const int64_t n_in = k.x[axis];
  const int64_t n = k.length ? k.length : (k.inverse && k.onesided ? 2 * (n_in - 1) : n_in);
  auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= k.x[i];
    for (int64_t i = axis + 1; i < rank - 1; ++i) inner *= k.x[i];
    const int64_t c_in = k.x.back(), m = yd[axis], c_out = yd.back();
    std::vector<double> y(static_cast<size_t>(outer * m * inner * c_out));
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        std::vector<cd> v(static_cast<size_t>(n));  // zero-padded or truncated
        for (int64_t t = 0; t < std::min(n, n_in); ++t) {
          const int64_t at = ((o * n_in + t) * inner + i) * c_in;
          v[t] = cd(in[0].GetDouble(at), c_in == 2 ? in[0].GetDouble(at + 1) : 0.0);
        }
        if (k.inverse && k.onesided) {
          // The full Hermitian spectrum from its first n / 2 + 1 values.
          std::vector<cd> full(static_cast<size_t>(n));
          for (int64_t f = 0; f <= n / 2 && f < n_in; ++f) full[f] = v[f];
          full[0] = full[0].real();
          if (n % 2 == 0) full[n / 2] = full[n / 2].real();
          for (int64_t f = n / 2 + 1; f < n; ++f) full[f] = std::conj(full[n - f]);
          v = full;
        }
        for (int64_t f = 0; f < m; ++f) {
          cd acc = 0;
          for (int64_t t = 0; t < n; ++t) {
            acc += v[t] * std::polar(1.0, (k.inverse ? 2 : -2) * kPi * double(f * t) / double(n));
          }
          if (k.inverse) acc /= double(n);
          const int64_t at = ((o * m + f) * inner + i) * c_out;
          y[at] = acc.real();
          if (c_out == 2) y[at + 1] = acc.imag();
        }
      }
    }
    return y;
  };
  CheckAllTactics(c, ref, 1e-4, 1e-4);
}

TEST(CpuDft, ForwardInverseOnesidedLengthsAndAxes) {
  RunDft({{1, 10, 10, 1}, 1}, 1);                // real input, axis 1
  RunDft({{2, 7, 3, 2}, -2}, 2);                 // complex, default axis
  RunDft({{2, 8, 1}, 1, 0, false, true}, 3);     // rfft
  RunDft({{3, 9, 2}, 1, 0, false, true}, 4);     // one-sided of a complex input
  RunDft({{2, 6, 1}, 1, 10}, 5);                 // zero-padded to 10
  RunDft({{2, 12, 2}, 1, 5}, 6);                 // truncated to 5
  RunDft({{2, 5, 4, 2}, 2, 0, true}, 7);         // inverse
  RunDft({{1, 6, 10, 2}, 1, 0, true, true}, 8);  // irfft, length 2 * (6 - 1)
  RunDft({{2, 5, 2}, 1, 9, true, true}, 9);      // irfft of odd length 9
  RunDft({{4, 3, 1}, 0}, 10);                    // axis 0
}

TEST(CpuDft, Dft17AxisAttributeAndBadAxis) {
  OpCase c;
  c.op = "DFT";
  std::mt19937 rng(3);
  c.inputs = {RandomTensor({2, 4, 1}, rng), Tensor(), Scalar(2)};  // the complex axis
  c.constant = {false, true, true};
  auto dims = InferOutputDims(c);
  ASSERT_FALSE(dims.ok());
  EXPECT_EQ(dims.status().code(), ErrorCode::kInvalidAttribute);
}

// ---- STFT ---------------------------------------------------------------------------------------

void RunStft(int64_t batch, int64_t length, int64_t c_in, int64_t step, int64_t frame, bool window,
             bool onesided, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "STFT";
  c.attrs.Set("onesided", int64_t{onesided});
  c.inputs = {RandomTensor({batch, length, c_in}, rng), Scalar(step),
              window ? RandomTensor({frame}, rng, 0.f, 1.f) : Tensor(),
              window ? Tensor() : Scalar(frame)};
  c.constant = {false, true, true, true};
  auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    const int64_t frames = yd[1], bins = yd[2];
    EXPECT_EQ(frames, (length - frame) / step + 1);
    EXPECT_EQ(bins, onesided ? frame / 2 + 1 : frame);
    std::vector<double> y;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t f = 0; f < frames; ++f) {
        for (int64_t k = 0; k < bins; ++k) {
          cd acc = 0;
          for (int64_t t = 0; t < frame; ++t) {
            const int64_t at = (b * length + f * step + t) * c_in;
            const cd v(in[0].GetDouble(at), c_in == 2 ? in[0].GetDouble(at + 1) : 0.0);
            const double w = window ? in[2].GetDouble(t) : 1.0;
            acc += v * w * std::polar(1.0, -2 * kPi * double(k * t) / double(frame));
          }
          y.push_back(acc.real());
          y.push_back(acc.imag());
        }
      }
    }
    return y;
  };
  CheckAllTactics(c, ref, 1e-4, 1e-4);
}

TEST(CpuStft, FramesWindowsAndSides) {
  RunStft(1, 128, 1, 8, 16, false, true, 20);
  RunStft(2, 50, 1, 7, 12, true, true, 21);
  RunStft(2, 33, 2, 5, 9, true, false, 22);  // complex signal, two-sided
  RunStft(1, 20, 1, 3, 20, false, false, 23);
}

// ---- Windows ------------------------------------------------------------------------------------

TEST(CpuWindows, HannHammingBlackmanPeriodicAndSymmetric) {
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) {
    for (int64_t periodic : {0, 1}) {
      for (int64_t size : {1, 2, 10, 17}) {
        for (int64_t out_type : {1, 11}) {  // float, double
          OpCase c;
          c.op = op;
          c.attrs.Set("periodic", periodic);
          c.attrs.Set("output_datatype", out_type);
          c.inputs = {
              Tensor::FromVector(DataType::kInt32, {}, std::vector<int32_t>{int32_t(size)})};
          c.constant = {true};
          auto ref = [&](const std::vector<Tensor>&, const std::vector<int64_t>& yd) {
            EXPECT_EQ(yd, std::vector<int64_t>{size});
            std::vector<double> y;
            const double n = periodic ? double(size) : double(size - 1);
            for (int64_t i = 0; i < size; ++i) {
              if (n == 0) {
                y.push_back(1.0);
                continue;
              }
              const double a = 2 * kPi * double(i) / n;
              if (std::string(op) == "HannWindow") {
                y.push_back(std::pow(std::sin(kPi * double(i) / n), 2));
              } else if (std::string(op) == "HammingWindow") {
                y.push_back(0.54347826086956519 - 0.45652173913043481 * std::cos(a));
              } else {
                y.push_back(0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a));
              }
            }
            return y;
          };
          CheckAllTactics(c, ref, 1e-6, 1e-6);
        }
      }
    }
  }
}

TEST(CpuWindows, SizeMustBeKnown) {
  OpCase c;
  c.op = "HannWindow";
  c.inputs = {Scalar(4)};
  c.constant = {false};  // a graph input with no shape-input value
  auto dims = InferOutputDims(c);
  ASSERT_FALSE(dims.ok());
  EXPECT_EQ(dims.status().code(), ErrorCode::kDataDependentShape);
}

// ---- Det ----------------------------------------------------------------------------------------

double Cofactor(const std::vector<double>& a, int64_t m) {
  if (m == 1) return a[0];
  double det = 0;
  for (int64_t j = 0; j < m; ++j) {
    std::vector<double> minor;
    for (int64_t r = 1; r < m; ++r) {
      for (int64_t c = 0; c < m; ++c) {
        if (c != j) minor.push_back(a[r * m + c]);
      }
    }
    det += (j % 2 ? -1 : 1) * a[j] * Cofactor(minor, m - 1);
  }
  return det;
}

TEST(CpuDet, BatchesSizesSingularAndDouble) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat64}) {
    for (std::vector<int64_t> dims :
         std::vector<std::vector<int64_t>>{{1, 1}, {2, 2}, {3, 3, 3}, {2, 2, 4, 4}, {5, 5}}) {
      std::mt19937 rng(static_cast<uint32_t>(dims.size() * 10 + dims.back()));
      OpCase c;
      c.op = "Det";
      Tensor x = RandomTensor(dims, rng);
      if (dims.back() == 3) {  // a singular matrix: row 1 = 2 * row 0
        for (int64_t j = 0; j < 3; ++j) StoreFromDouble(x.view(), 3 + j, 2 * x.GetDouble(j));
      }
      c.inputs = {t == DataType::kFloat64 ? x.CastTo(DataType::kFloat64) : x};
      auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
        const int64_t m = dims.back();
        std::vector<double> y;
        for (int64_t b = 0; b < in[0].num_elements() / (m * m); ++b) {
          std::vector<double> a;
          for (int64_t i = 0; i < m * m; ++i) a.push_back(in[0].GetDouble(b * m * m + i));
          y.push_back(Cofactor(a, m));
        }
        return y;
      };
      CheckAllTactics(c, ref, 1e-5, 1e-5);
    }
  }
}

// ---- GroupNormalization -------------------------------------------------------------------------

TEST(CpuGroupNormalization, GroupsOfChannels) {
  struct Case {
    std::vector<int64_t> x;
    int64_t groups;
  };
  for (const Case& k :
       std::vector<Case>{{{3, 4, 2, 2}, 2}, {{2, 6, 5}, 3}, {{1, 4, 3}, 4}, {{2, 3, 2, 2, 2}, 1}}) {
    std::mt19937 rng(static_cast<uint32_t>(k.groups * 7));
    OpCase c;
    c.op = "GroupNormalization";
    c.attrs.Set("num_groups", k.groups);
    c.attrs.Set("epsilon", 1e-3f);
    const int64_t ch = k.x[1];
    c.inputs = {RandomTensor(k.x, rng), RandomTensor({ch}, rng), RandomTensor({ch}, rng)};
    c.constant = {false, true, true};
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
      const int64_t n = k.x[0], spatial = in[0].num_elements() / (n * ch), per = ch / k.groups;
      std::vector<double> y(static_cast<size_t>(in[0].num_elements()));
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t g = 0; g < k.groups; ++g) {
          double mean = 0, var = 0;
          const int64_t first = (b * ch + g * per) * spatial, count = per * spatial;
          for (int64_t i = 0; i < count; ++i) mean += in[0].GetDouble(first + i) / count;
          for (int64_t i = 0; i < count; ++i) {
            var += std::pow(in[0].GetDouble(first + i) - mean, 2) / count;
          }
          for (int64_t i = 0; i < count; ++i) {
            const int64_t cc = g * per + i / spatial;
            y[first + i] =
                (in[0].GetDouble(first + i) - mean) / std::sqrt(var + 1e-3) * in[1].GetDouble(cc) +
                in[2].GetDouble(cc);
          }
        }
      }
      return y;
    };
    CheckAllTactics(c, ref, 1e-4, 1e-4);
  }
}

// ---- ReverseSequence ----------------------------------------------------------------------------

TEST(CpuReverseSequence, BatchAndTimeAxes) {
  for (int64_t batch_axis : {0, 1}) {
    std::mt19937 rng(static_cast<uint32_t>(50 + batch_axis));
    const int64_t batch = 3, time = 5, inner = 2;
    std::vector<int64_t> dims = batch_axis == 0 ? std::vector<int64_t>{batch, time, inner}
                                                : std::vector<int64_t>{time, batch, inner};
    std::vector<int64_t> lens = {5, 0, 3};
    OpCase c;
    c.op = "ReverseSequence";
    c.attrs.Set("batch_axis", batch_axis);
    c.attrs.Set("time_axis", 1 - batch_axis);
    c.inputs = {RandomTensor(dims, rng), Ints({batch}, lens)};
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
      std::vector<double> y(static_cast<size_t>(in[0].num_elements()));
      auto at = [&](int64_t b, int64_t t, int64_t i) {
        return (batch_axis == 0 ? b * time + t : t * batch + b) * inner + i;
      };
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t t = 0; t < time; ++t) {
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t from = t < lens[b] ? lens[b] - 1 - t : t;
            y[at(b, t, i)] = in[0].GetDouble(at(b, from, i));
          }
        }
      }
      return y;
    };
    CheckAllTactics(c, ref, 0, 0);
  }
}

// ---- AffineGrid ---------------------------------------------------------------------------------

TEST(CpuAffineGrid, TwoAndThreeDimensionsBothAlignments) {
  for (bool align : {false, true}) {
    for (std::vector<int64_t> size :
         std::vector<std::vector<int64_t>>{{2, 3, 4, 5}, {1, 1, 1, 3}, {2, 1, 3, 4, 2}}) {
      const int64_t r = static_cast<int64_t>(size.size()) - 2;
      std::mt19937 rng(static_cast<uint32_t>(60 + r + align));
      OpCase c;
      c.op = "AffineGrid";
      c.attrs.Set("align_corners", int64_t{align});
      c.inputs = {RandomTensor({size[0], r, r + 1}, rng, -2.f, 2.f), Ints({r + 2}, size)};
      c.constant = {false, true};
      auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
        auto base = [&](int64_t i, int64_t n) {
          if (align) return n == 1 ? -1.0 : -1.0 + 2.0 * double(i) / double(n - 1);
          return (2.0 * double(i) + 1.0) / double(n) - 1.0;
        };
        std::vector<double> y;
        const int64_t depth = r == 3 ? size[2] : 1, height = size[r], width = size[r + 1];
        for (int64_t b = 0; b < size[0]; ++b) {
          for (int64_t d = 0; d < depth; ++d) {
            for (int64_t h = 0; h < height; ++h) {
              for (int64_t w = 0; w < width; ++w) {
                std::vector<double> v = {base(w, width), base(h, height)};
                if (r == 3) v.push_back(base(d, depth));
                v.push_back(1.0);
                for (int64_t i = 0; i < r; ++i) {
                  double acc = 0;
                  for (int64_t j = 0; j <= r; ++j) {
                    acc += in[0].GetDouble((b * r + i) * (r + 1) + j) * v[j];
                  }
                  y.push_back(acc);
                }
              }
            }
          }
        }
        return y;
      };
      CheckAllTactics(c, ref, 1e-5, 1e-5);
    }
  }
}

// ---- TensorScatter ------------------------------------------------------------------------------

TEST(CpuTensorScatter, LinearAndCircularWrites) {
  for (std::string mode : {"linear", "circular"}) {
    for (int64_t axis : {-2, 2}) {
      std::mt19937 rng(70);
      const std::vector<int64_t> past = {2, 3, 6, 4};
      std::vector<int64_t> upd = past;
      upd[2] = 3;
      std::vector<int64_t> idx =
          mode == "linear" ? std::vector<int64_t>{0, 3} : std::vector<int64_t>{5, 2};
      OpCase c;
      c.op = "TensorScatter";
      c.attrs.Set("mode", mode);
      c.attrs.Set("axis", axis);
      c.inputs = {RandomTensor(past, rng), RandomTensor(upd, rng), Ints({2}, idx)};
      auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
        std::vector<double> y;
        for (int64_t e = 0; e < in[0].num_elements(); ++e) y.push_back(in[0].GetDouble(e));
        for (int64_t b = 0; b < 2; ++b) {
          for (int64_t h = 0; h < 3; ++h) {
            for (int64_t s = 0; s < 3; ++s) {
              const int64_t at = (idx[b] + s) % 6;
              for (int64_t i = 0; i < 4; ++i) {
                y[((b * 3 + h) * 6 + at) * 4 + i] = in[1].GetDouble(((b * 3 + h) * 3 + s) * 4 + i);
              }
            }
          }
        }
        return y;
      };
      CheckAllTactics(c, ref, 0, 0);
    }
  }
}

// ---- MaxUnpool ----------------------------------------------------------------------------------

TEST(CpuMaxUnpool, IndicesIntoTheInferredShapeWithinOutputShape) {
  for (bool with_shape : {false, true}) {
    std::mt19937 rng(80);
    OpCase c;
    c.op = "MaxUnpool";
    c.attrs.Set("kernel_shape", std::vector<int64_t>{2, 2});
    c.attrs.Set("strides", std::vector<int64_t>{2, 2});
    // X [1, 2, 2, 2] unpools into [1, 2, 4, 4] (32 elements); one index per window.
    std::vector<int64_t> idx = {0, 3, 9, 15, 16, 22, 25, 31};
    c.inputs = {RandomTensor({1, 2, 2, 2}, rng), Ints({1, 2, 2, 2}, idx),
                with_shape ? Ints({4}, {1, 2, 5, 6}) : Tensor()};
    c.constant = {false, true, true};
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      EXPECT_EQ(
          yd, with_shape ? std::vector<int64_t>({1, 2, 5, 6}) : std::vector<int64_t>({1, 2, 4, 4}));
      std::vector<double> y(static_cast<size_t>(yd[1] * yd[2] * yd[3]), 0.0);
      for (size_t e = 0; e < idx.size(); ++e) {
        const int64_t ch = idx[e] / 16, h = idx[e] / 4 % 4, w = idx[e] % 4;
        y[(ch * yd[2] + h) * yd[3] + w] = in[0].GetDouble(static_cast<int64_t>(e));
      }
      return y;
    };
    CheckAllTactics(c, ref, 0, 0);
  }
}

// ---- MatMulInteger and ConvInteger --------------------------------------------------------------

Tensor Random8(std::vector<int64_t> dims, DataType t, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(t == DataType::kUInt8 ? 0 : -128,
                                          t == DataType::kUInt8 ? 255 : 127);
  Tensor x(t, dims);
  for (int64_t i = 0; i < x.num_elements(); ++i) StoreFromDouble(x.view(), i, dist(rng));
  return x;
}

TEST(CpuMatMulInteger, ZeroPointsTypesAndBatches) {
  for (DataType ta : {DataType::kUInt8, DataType::kInt8}) {
    for (DataType tb : {DataType::kUInt8, DataType::kInt8}) {
      std::mt19937 rng(90);
      OpCase c;
      c.op = "MatMulInteger";
      // A [2, 1, 4, 3] x B [3, 3, 5] -> [2, 3, 4, 5]; per-row a zero points, a scalar b one.
      c.inputs = {Random8({2, 1, 4, 3}, ta, rng), Random8({3, 3, 5}, tb, rng),
                  Random8({4}, ta, rng), Random8({}, tb, rng)};
      auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
        std::vector<double> y;
        for (int64_t b0 = 0; b0 < 2; ++b0) {
          for (int64_t b1 = 0; b1 < 3; ++b1) {
            for (int64_t i = 0; i < 4; ++i) {
              for (int64_t j = 0; j < 5; ++j) {
                double acc = 0;
                for (int64_t p = 0; p < 3; ++p) {
                  acc += (in[0].GetDouble((b0 * 4 + i) * 3 + p) - in[2].GetDouble(i)) *
                         (in[1].GetDouble((b1 * 3 + p) * 5 + j) - in[3].GetDouble(0));
                }
                y.push_back(acc);
              }
            }
          }
        }
        return y;
      };
      CheckAllTactics(c, ref, 0, 0);
    }
  }
}

TEST(CpuConvInteger, PadsStridesDilationsGroups) {
  struct Case {
    std::vector<int64_t> x, w, pads, strides, dilations;
    int64_t group;
  };
  for (const Case& k :
       std::vector<Case>{{{1, 1, 3, 3}, {2, 1, 2, 2}, {1, 1, 1, 1}, {}, {}, 1},
                         {{2, 4, 6, 5}, {6, 2, 3, 2}, {0, 1, 2, 0}, {2, 1}, {1, 2}, 2},
                         {{1, 2, 7}, {3, 2, 3}, {1, 1}, {2}, {}, 1}}) {
    std::mt19937 rng(100);
    OpCase c;
    c.op = "ConvInteger";
    c.attrs.Set("pads", k.pads);
    if (!k.strides.empty()) c.attrs.Set("strides", k.strides);
    if (!k.dilations.empty()) c.attrs.Set("dilations", k.dilations);
    c.attrs.Set("group", k.group);
    c.inputs = {Random8(k.x, DataType::kUInt8, rng), Random8(k.w, DataType::kUInt8, rng),
                Random8({}, DataType::kUInt8, rng), Random8({k.w[0]}, DataType::kUInt8, rng)};
    c.constant = {false, true, true, true};
    const size_t r = k.x.size() - 2;
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      std::vector<double> y;
      const int64_t cg = k.x[1] / k.group, mg = k.w[0] / k.group;
      const int64_t h_in = k.x[2], w_in = r == 2 ? k.x[3] : 1;
      const int64_t kh = k.w[2], kw = r == 2 ? k.w[3] : 1;
      auto st = [&](size_t i) { return k.strides.empty() ? 1 : k.strides[i]; };
      auto dl = [&](size_t i) { return k.dilations.empty() ? 1 : k.dilations[i]; };
      const int64_t h_out = yd[2], w_out = r == 2 ? yd[3] : 1;
      for (int64_t b = 0; b < k.x[0]; ++b) {
        for (int64_t m = 0; m < k.w[0]; ++m) {
          for (int64_t oh = 0; oh < h_out; ++oh) {
            for (int64_t ow = 0; ow < w_out; ++ow) {
              double acc = 0;
              for (int64_t cc = 0; cc < cg; ++cc) {
                for (int64_t i = 0; i < kh; ++i) {
                  for (int64_t j = 0; j < kw; ++j) {
                    const int64_t ih = oh * st(0) - k.pads[0] + i * dl(0);
                    const int64_t iw = r == 2 ? ow * st(1) - k.pads[1] + j * dl(1) : 0;
                    const int64_t ch = m / mg * cg + cc;
                    const double xv =
                        ih < 0 || ih >= h_in || iw < 0 || iw >= w_in
                            ? in[2].GetDouble(0)
                            : in[0].GetDouble(((b * k.x[1] + ch) * h_in + ih) * w_in + iw);
                    acc +=
                        (xv - in[2].GetDouble(0)) *
                        (in[1].GetDouble(((m * cg + cc) * kh + i) * kw + j) - in[3].GetDouble(m));
                  }
                }
              }
              y.push_back(acc);
            }
          }
        }
      }
      return y;
    };
    CheckAllTactics(c, ref, 0, 0);
  }
}

// ---- DeformConv ---------------------------------------------------------------------------------

// Bilinear interpolation at (y, x) with zeros outside, from the four surrounding pixels.
double Bilinear(const Tensor& t, int64_t base, int64_t h, int64_t w, double y, double x) {
  auto px = [&](int64_t i, int64_t j) {
    return i < 0 || i >= h || j < 0 || j >= w ? 0.0 : t.GetDouble(base + i * w + j);
  };
  const int64_t i0 = static_cast<int64_t>(std::floor(y)), j0 = static_cast<int64_t>(std::floor(x));
  const double fy = y - double(i0), fx = x - double(j0);
  return px(i0, j0) * (1 - fy) * (1 - fx) + px(i0, j0 + 1) * (1 - fy) * fx +
         px(i0 + 1, j0) * fy * (1 - fx) + px(i0 + 1, j0 + 1) * fy * fx;
}

TEST(CpuDeformConv, OffsetsMasksBiasGroupsAndOffsetGroups) {
  struct Case {
    std::vector<int64_t> x, w;
    int64_t group, offset_group;
    std::vector<int64_t> pads, strides, dilations;
    bool bias, mask;
  };
  for (const Case& k : std::vector<Case>{
           {{1, 1, 3, 3}, {1, 1, 2, 2}, 1, 1, {0, 0, 0, 0}, {1, 1}, {1, 1}, false, false},
           {{2, 4, 5, 6}, {6, 2, 3, 2}, 2, 2, {1, 0, 1, 1}, {2, 1}, {1, 2}, true, true},
           {{1, 2, 4, 4}, {3, 2, 2, 2}, 1, 2, {1, 1, 1, 1}, {1, 1}, {1, 1}, true, false}}) {
    std::mt19937 rng(120);
    const int64_t kh = k.w[2], kw = k.w[3], taps = kh * kw;
    const int64_t oh =
        (k.x[2] + k.pads[0] + k.pads[2] - k.dilations[0] * (kh - 1) - 1) / k.strides[0] + 1;
    const int64_t ow =
        (k.x[3] + k.pads[1] + k.pads[3] - k.dilations[1] * (kw - 1) - 1) / k.strides[1] + 1;
    OpCase c;
    c.op = "DeformConv";
    c.attrs.Set("group", k.group);
    c.attrs.Set("offset_group", k.offset_group);
    c.attrs.Set("pads", k.pads);
    c.attrs.Set("strides", k.strides);
    c.attrs.Set("dilations", k.dilations);
    c.inputs = {
        RandomTensor(k.x, rng), RandomTensor(k.w, rng),
        RandomTensor({k.x[0], k.offset_group * taps * 2, oh, ow}, rng, -1.5f, 1.5f),
        k.bias ? RandomTensor({k.w[0]}, rng) : Tensor(),
        k.mask ? RandomTensor({k.x[0], k.offset_group * taps, oh, ow}, rng, 0.f, 1.f) : Tensor()};
    c.constant = {false, true, false, true, false};
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      EXPECT_EQ(yd, (std::vector<int64_t>{k.x[0], k.w[0], oh, ow}));
      const int64_t cin = k.x[1], cg = k.w[1], mg = k.w[0] / k.group;
      std::vector<double> y;
      for (int64_t b = 0; b < k.x[0]; ++b) {
        for (int64_t m = 0; m < k.w[0]; ++m) {
          for (int64_t i = 0; i < oh; ++i) {
            for (int64_t j = 0; j < ow; ++j) {
              double acc = k.bias ? in[3].GetDouble(m) : 0.0;
              for (int64_t cc = 0; cc < cg; ++cc) {
                const int64_t ch = m / mg * cg + cc, og = ch / (cin / k.offset_group);
                for (int64_t ki = 0; ki < kh; ++ki) {
                  for (int64_t kj = 0; kj < kw; ++kj) {
                    const int64_t t = ki * kw + kj;
                    auto offset = [&](int64_t comp) {
                      return in[2].GetDouble(
                          ((((b * k.offset_group + og) * taps + t) * 2 + comp) * oh + i) * ow + j);
                    };
                    const double py =
                        double(i * k.strides[0] - k.pads[0] + ki * k.dilations[0]) + offset(0);
                    const double px =
                        double(j * k.strides[1] - k.pads[1] + kj * k.dilations[1]) + offset(1);
                    double v =
                        Bilinear(in[0], (b * cin + ch) * k.x[2] * k.x[3], k.x[2], k.x[3], py, px) *
                        in[1].GetDouble(((m * cg + cc) * kh + ki) * kw + kj);
                    if (k.mask) {
                      v *= in[4].GetDouble((((b * k.offset_group + og) * taps + t) * oh + i) * ow +
                                           j);
                    }
                    acc += v;
                  }
                }
              }
              y.push_back(acc);
            }
          }
        }
      }
      return y;
    };
    CheckAllTactics(c, ref, 1e-4, 1e-4);
  }
}

// ---- RoiAlign -----------------------------------------------------------------------------------

TEST(CpuRoiAlign, AverageAndMaxHalfPixelAndNot) {
  for (std::string mode : {"avg", "max"}) {
    for (std::string ctm : {"half_pixel", "output_half_pixel"}) {
      for (int64_t ratio : {0, 2}) {
        std::mt19937 rng(130);
        const int64_t batch = 2, channels = 3, h = 8, w = 7, oh = 3, ow = 2;
        OpCase c;
        c.op = "RoiAlign";
        c.attrs.Set("mode", mode);
        c.attrs.Set("coordinate_transformation_mode", ctm);
        c.attrs.Set("output_height", oh);
        c.attrs.Set("output_width", ow);
        c.attrs.Set("sampling_ratio", ratio);
        c.attrs.Set("spatial_scale", 0.5f);
        std::vector<float> rois = {0,  0,  12,    14,    2.5f, 1, 9,    6,
                                   10, 12, 13.5f, 15.5f, 1,    3, 1.5f, 3};
        c.inputs = {RandomTensor({batch, channels, h, w}, rng),
                    Tensor::FromVector(DataType::kFloat32, {4, 4}, rois), Ints({4}, {0, 1, 1, 0})};
        auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
          EXPECT_EQ(yd, (std::vector<int64_t>{4, channels, oh, ow}));
          std::vector<double> y;
          const double off = ctm == "half_pixel" ? 0.5 : 0.0;
          const std::vector<int64_t> bidx = {0, 1, 1, 0};
          for (int64_t r = 0; r < 4; ++r) {
            const double x0 = rois[r * 4] * 0.5 - off, y0 = rois[r * 4 + 1] * 0.5 - off;
            double rw = rois[r * 4 + 2] * 0.5 - off - x0, rh = rois[r * 4 + 3] * 0.5 - off - y0;
            if (ctm != "half_pixel") {
              rw = std::max(rw, 1.0);
              rh = std::max(rh, 1.0);
            }
            const double bh = rh / oh, bw = rw / ow;
            const int64_t gh = ratio ? ratio : int64_t(std::ceil(rh / oh));
            const int64_t gw = ratio ? ratio : int64_t(std::ceil(rw / ow));
            for (int64_t ch = 0; ch < channels; ++ch) {
              const int64_t base = (bidx[r] * channels + ch) * h * w;
              for (int64_t i = 0; i < oh; ++i) {
                for (int64_t j = 0; j < ow; ++j) {
                  double sum = 0, best = -1e300;
                  for (int64_t a = 0; a < gh; ++a) {
                    for (int64_t b = 0; b < gw; ++b) {
                      double yy = y0 + i * bh + (a + 0.5) * bh / gh;
                      double xx = x0 + j * bw + (b + 0.5) * bw / gw;
                      double corners[4] = {0, 0, 0, 0};
                      if (yy >= -1 && yy <= h && xx >= -1 && xx <= w) {
                        yy = std::min(std::max(yy, 0.0), double(h - 1));
                        xx = std::min(std::max(xx, 0.0), double(w - 1));
                        const int64_t yl = int64_t(yy), xl = int64_t(xx);
                        const int64_t yh2 = std::min(yl + 1, h - 1), xh2 = std::min(xl + 1, w - 1);
                        const double ly = yy - yl, lx = xx - xl;
                        corners[0] = (1 - ly) * (1 - lx) * in[0].GetDouble(base + yl * w + xl);
                        corners[1] = (1 - ly) * lx * in[0].GetDouble(base + yl * w + xh2);
                        corners[2] = ly * (1 - lx) * in[0].GetDouble(base + yh2 * w + xl);
                        corners[3] = ly * lx * in[0].GetDouble(base + yh2 * w + xh2);
                      }
                      sum += corners[0] + corners[1] + corners[2] + corners[3];
                      best = std::max({best, corners[0], corners[1], corners[2], corners[3]});
                    }
                  }
                  // No samples (an empty roi with sampling_ratio 0): 0 in both modes.
                  if (gh * gw == 0) best = 0;
                  y.push_back(mode == "max" ? best : sum / double(std::max<int64_t>(gh * gw, 1)));
                }
              }
            }
          }
          return y;
        };
        CheckAllTactics(c, ref, 1e-5, 1e-5);
      }
    }
  }
}

TEST(CpuRoiAlign, BadRoisAndBatchIndicesAreErrors) {
  std::mt19937 rng(131);
  OpCase c;
  c.op = "RoiAlign";
  c.attrs.Set("output_height", int64_t{2});
  c.attrs.Set("output_width", int64_t{2});
  const float inf = std::numeric_limits<float>::infinity();
  c.inputs = {RandomTensor({1, 1, 4, 4}, rng),
              Tensor::FromVector(DataType::kFloat32, {1, 4}, std::vector<float>{0, 0, inf, 3}),
              Ints({1}, {0})};
  auto got = RunFirstTactic(c, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kKernelFailed);
  c.inputs[1] = Tensor::FromVector(DataType::kFloat32, {1, 4}, std::vector<float>{0, 0, 2, 3});
  c.inputs[2] = Ints({1}, {1});  // X has one image
  got = RunFirstTactic(c, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("batch_indices"), std::string::npos);
}

// ---- MaxPool of int8/uint8 and with Indices -----------------------------------------------------

TEST(CpuMaxPoolIndexed, Uint8Int8AndIndicesInBothStorageOrders) {
  struct Case {
    std::vector<int64_t> x, kernel, pads, strides;
    DataType t;
    size_t outputs;
    int64_t order;
  };
  for (const Case& k :
       std::vector<Case>{{{1, 1, 5, 5}, {5, 5}, {2, 2, 2, 2}, {1, 1}, DataType::kUInt8, 1, 0},
                         {{2, 3, 6, 7}, {3, 2}, {1, 0, 1, 1}, {2, 2}, DataType::kInt8, 1, 0},
                         {{2, 2, 5, 6}, {2, 3}, {0, 1, 1, 0}, {1, 2}, DataType::kFloat32, 2, 0},
                         {{1, 2, 5, 5}, {2, 2}, {0, 0, 0, 0}, {2, 2}, DataType::kFloat32, 2, 1},
                         {{2, 2, 9}, {3}, {1, 1}, {2}, DataType::kUInt8, 2, 0}}) {
    std::mt19937 rng(140);
    OpCase c;
    c.op = "MaxPool";
    c.attrs.Set("kernel_shape", k.kernel);
    c.attrs.Set("pads", k.pads);
    c.attrs.Set("strides", k.strides);
    c.attrs.Set("storage_order", k.order);
    c.inputs = {k.t == DataType::kFloat32 ? RandomTensor(k.x, rng) : Random8(k.x, k.t, rng)};
    c.num_outputs = k.outputs;
    const size_t r = k.x.size() - 2;
    // The reference: output 0 (values) or, with outputs == 2, checks output 0 and computes the
    // indices below.
    auto pool = [&](const Tensor& x, const std::vector<int64_t>& yd, bool want_index) {
      const int64_t ih = k.x[2], iw = r == 2 ? k.x[3] : 1;
      const int64_t oh = yd[2], ow = r == 2 ? yd[3] : 1;
      const int64_t kh = k.kernel[0], kw = r == 2 ? k.kernel[1] : 1;
      const int64_t sh = k.strides[0], sw = r == 2 ? k.strides[1] : 1;
      const int64_t ph = k.pads[0], pw = r == 2 ? k.pads[1] : 0;
      std::vector<double> y;
      for (int64_t pl = 0; pl < k.x[0] * k.x[1]; ++pl) {
        for (int64_t i = 0; i < oh; ++i) {
          for (int64_t j = 0; j < ow; ++j) {
            double best = -1e300;
            int64_t where = -1;
            for (int64_t a = 0; a < kh; ++a) {
              for (int64_t b = 0; b < kw; ++b) {
                const int64_t yy = i * sh - ph + a, xx = j * sw - pw + b;
                if (yy < 0 || yy >= ih || xx < 0 || xx >= iw) continue;
                const double v = x.GetDouble(pl * ih * iw + yy * iw + xx);
                if (v > best) {
                  best = v;
                  where = pl * ih * iw + (k.order ? xx * ih + yy : yy * iw + xx);
                }
              }
            }
            y.push_back(want_index ? double(where) : best);
          }
        }
      }
      return y;
    };
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      return pool(in[0], yd, false);
    };
    auto results = CheckAllTactics(c, ref, 0, 0, DataType::kFloat32);
    EXPECT_FALSE(results.empty());
    if (k.outputs == 2) {
      // The Indices output, run through the layer directly: the harness checks output 0 only.
      auto dims = InferOutputDims(c);
      ASSERT_TRUE(dims.ok());
      std::vector<double> want = pool(c.inputs[0], *dims, true);
      auto got = RunFirstTactic(c, 1);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(got->num_elements(), static_cast<int64_t>(want.size()));
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got->GetDouble(static_cast<int64_t>(i)), want[i]) << i;
      }
    }
  }
}

// ---- BatchNormalization, training mode ---------------------------------------------------------

TEST(CpuBatchNormTraining, BatchStatisticsAndRunningOutputs) {
  for (std::vector<int64_t> dims :
       std::vector<std::vector<int64_t>>{{2, 3, 4, 5}, {3, 2}, {1, 4, 7}}) {
    std::mt19937 rng(150);
    const int64_t ch = dims[1];
    OpCase c;
    c.op = "BatchNormalization";
    c.attrs.Set("training_mode", int64_t{1});
    c.attrs.Set("epsilon", 1e-2f);
    c.attrs.Set("momentum", 0.8f);
    c.inputs = {RandomTensor(dims, rng), RandomTensor({ch}, rng), RandomTensor({ch}, rng),
                RandomTensor({ch}, rng), RandomTensor({ch}, rng, 0.1f, 1.f)};
    c.num_outputs = 3;
    const int64_t n = dims[0], total = NumElements(dims), spatial = total / (n * ch);
    // [0]: y; [1], [2]: running mean and variance.
    auto stats = [&](const std::vector<Tensor>& in) {
      std::vector<double> mean(ch), var(ch);
      for (int64_t cc = 0; cc < ch; ++cc) {
        for (int64_t b = 0; b < n; ++b) {
          for (int64_t i = 0; i < spatial; ++i) {
            mean[cc] += in[0].GetDouble((b * ch + cc) * spatial + i) / double(n * spatial);
          }
        }
        for (int64_t b = 0; b < n; ++b) {
          for (int64_t i = 0; i < spatial; ++i) {
            var[cc] += std::pow(in[0].GetDouble((b * ch + cc) * spatial + i) - mean[cc], 2) /
                       double(n * spatial);
          }
        }
      }
      return std::make_pair(mean, var);
    };
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
      auto [mean, var] = stats(in);
      std::vector<double> y(static_cast<size_t>(total));
      for (int64_t e = 0; e < total; ++e) {
        const int64_t cc = e / spatial % ch;
        y[e] = (in[0].GetDouble(e) - mean[cc]) / std::sqrt(var[cc] + 1e-2) * in[1].GetDouble(cc) +
               in[2].GetDouble(cc);
      }
      return y;
    };
    CheckAllTactics(c, ref, 1e-4, 1e-4);
    auto [mean, var] = stats(c.inputs);
    for (size_t k : {size_t{1}, size_t{2}}) {
      auto got = RunFirstTactic(c, k);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (int64_t cc = 0; cc < ch; ++cc) {
        const double batch = k == 1 ? mean[cc] : var[cc];
        const double want = c.inputs[k + 2].GetDouble(cc) * 0.8 + batch * 0.2;
        EXPECT_NEAR(got->GetDouble(cc), want, 1e-5) << k << " " << cc;
      }
    }
  }
}

// ---- Einsum in double ---------------------------------------------------------------------------

TEST(CpuEinsum, Float64Operands) {
  std::mt19937 rng(110);
  OpCase c;
  c.op = "Einsum";
  c.attrs.Set("equation", std::string("bij,bjk->bik"));
  c.inputs = {RandomTensor({2, 3, 4}, rng).CastTo(DataType::kFloat64),
              RandomTensor({2, 4, 5}, rng).CastTo(DataType::kFloat64)};
  auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
    std::vector<double> y;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 3; ++i) {
        for (int64_t k = 0; k < 5; ++k) {
          double acc = 0;
          for (int64_t j = 0; j < 4; ++j) {
            acc += in[0].GetDouble((b * 3 + i) * 4 + j) * in[1].GetDouble((b * 4 + j) * 5 + k);
          }
          y.push_back(acc);
        }
      }
    }
    return y;
  };
  CheckAllTactics(c, ref, 1e-12, 1e-12);
}

}  // namespace
}  // namespace kiln::testing
