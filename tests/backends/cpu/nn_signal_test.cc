// Signal ops (DFT, STFT, windows) and the assorted ops of ops/misc.cc on the CPU, against direct
// double-precision references written from the ONNX spec (std::complex sums, cofactor
// determinants, per-element loops), not the kernels' tables.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
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
