// QuantizeLinear and DequantizeLinear on the CPU (QDQ models) against references written from the
// ONNX spec: per tensor and per axis, int8 and uint8 (int32 for dequantize), zero points or none,
// f32 and f16 inputs, saturation at both ends and round-half-to-even ties; and the shape rule's
// refusals (badly shaped blockwise scales, zero or NaN constant scales, a zero point of another
// type, a nonzero float8 zero point). The storage-only types: (u)int4/(u)int2 with their ranges,
// float8 with and without saturation, float4 E2M1; blockwise scales.
#include <cmath>

#include "kiln/core/minifloat.h"

#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"
#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;

AttributeMap Axis(int64_t axis) {
  AttributeMap m;
  m.Set("axis", axis);
  return m;
}

// Channel of element i for a per-axis parameter of `n` elements along `axis` of `dims`.
int64_t ChannelOf(int64_t i, const std::vector<int64_t>& dims, int64_t axis, int64_t n) {
  if (n == 1) return 0;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < dims.size(); ++d) inner *= dims[d];
  return (i / inner) % n;
}

ReferenceFn QuantizeRef(int64_t axis, double qmin, double qmax) {
  return [=](const std::vector<RefTensor>& in) {
    RefTensor y = RefTensor::Zeros(in[0].dims);
    const int64_t n = in[1].size();
    for (int64_t i = 0; i < y.size(); ++i) {
      const int64_t c = ChannelOf(i, in[0].dims, axis, n);
      const float q = std::nearbyint(static_cast<float>(in[0][i]) / static_cast<float>(in[1][c]));
      const double zp = in.size() > 2 && in[2].size() ? in[2][c] : 0.0;
      y[i] = std::fmin(std::fmax(q + zp, qmin), qmax);
    }
    return std::vector<RefTensor>{y};
  };
}

ReferenceFn DequantizeRef(int64_t axis) {
  return [=](const std::vector<RefTensor>& in) {
    RefTensor y = RefTensor::Zeros(in[0].dims);
    const int64_t n = in[1].size();
    for (int64_t i = 0; i < y.size(); ++i) {
      const int64_t c = ChannelOf(i, in[0].dims, axis, n);
      const double zp = in.size() > 2 && in[2].size() ? in[2][c] : 0.0;
      y[i] = static_cast<float>(in[0][i] - zp) * static_cast<float>(in[1][c]);
    }
    return std::vector<RefTensor>{y};
  };
}

TEST(CpuQuantize, PerTensorAndPerAxisInt8AndUint8) {
  // Per tensor, int8 with a zero point; inputs reach past both ends of the range.
  EXPECT_GT(OpTester("QuantizeLinear")
                .Input(kFloat32, {3, 5, 4}, -40.0, 40.0)
                .Constant(MakeTensor(kFloat32, {}, {0.125}))
                .Constant(MakeTensor(kInt8, {}, {-3}))
                .Reference(QuantizeRef(1, -128, 127))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  // Per axis 1, uint8; without a zero point the result is uint8 with zero point 0.
  EXPECT_GT(OpTester("QuantizeLinear", Axis(1))
                .Input(kFloat32, {2, 4, 3, 3}, -2.0, 60.0)
                .Constant(MakeTensor(kFloat32, {4}, {0.1, 0.25, 0.5, 0.03}))
                .Constant(MakeTensor(kUInt8, {4}, {0, 10, 128, 255}))
                .Reference(QuantizeRef(1, 0, 255))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("QuantizeLinear")
                .Input(kFloat32, {7}, -3.0, 300.0)
                .Constant(MakeTensor(kFloat32, {1}, {1.0}))
                .Reference(QuantizeRef(1, 0, 255))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  // Negative axis, per channel of the last axis, f16 input.
  EXPECT_GT(OpTester("QuantizeLinear", Axis(-1))
                .Input(kFloat32, {5, 3}, -4.0, 4.0)
                .Constant(MakeTensor(kFloat32, {3}, {0.02, 0.05, 0.5}))
                .Constant(MakeTensor(kInt8, {3}, {1, 0, -1}))
                .FloatTypes({kFloat32, kFloat16})
                .Reference(QuantizeRef(1, -128, 127))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuQuantize, TiesRoundToEven) {
  // x / scale = -2.5 -1.5 -0.5 0.5 1.5 2.5 -> -2 -2 -0 0 2 2.
  EXPECT_GT(OpTester("QuantizeLinear")
                .Input(MakeTensor(kFloat32, {6}, {-1.25, -0.75, -0.25, 0.25, 0.75, 1.25}))
                .Constant(MakeTensor(kFloat32, {}, {0.5}))
                .Constant(MakeTensor(kInt8, {}, {0}))
                .Reference([](const std::vector<RefTensor>&) {
                  return std::vector<RefTensor>{{{6}, {-2, -2, 0, 0, 2, 2}}};
                })
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuQuantize, DequantizeInt8Uint8Int32PerTensorAndPerAxis) {
  EXPECT_GT(OpTester("DequantizeLinear")
                .Input(kInt8, {4, 6}, -128, 127)
                .Constant(MakeTensor(kFloat32, {}, {0.05}))
                .Constant(MakeTensor(kInt8, {}, {-7}))
                .Reference(DequantizeRef(1))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("DequantizeLinear", Axis(0))
                .Input(kUInt8, {3, 2, 5}, 0, 255)
                .Constant(MakeTensor(kFloat32, {3}, {0.1, 0.02, 1.5}))
                .Constant(MakeTensor(kUInt8, {3}, {128, 0, 255}))
                .Reference(DequantizeRef(0))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  // An int32 bias dequantized with the product of input and weight scales, no zero point.
  EXPECT_GT(OpTester("DequantizeLinear")
                .Input(kInt32, {9}, -100000, 100000)
                .Constant(MakeTensor(kFloat32, {1}, {0.0003}))
                .Reference(DequantizeRef(1))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuQuantize, Int16AndUint16BothWays) {
  // Saturation at both ends of the 16-bit ranges, per tensor and per axis.
  EXPECT_GT(OpTester("QuantizeLinear")
                .Input(kFloat32, {4, 6}, -40000.0, 40000.0)
                .Constant(MakeTensor(kFloat32, {}, {0.5}))
                .Constant(MakeTensor(kInt16, {}, {-300}))
                .Reference(QuantizeRef(1, -32768, 32767))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("QuantizeLinear", Axis(0))
                .Input(kFloat32, {3, 5}, -100.0, 70000.0)
                .Constant(MakeTensor(kFloat32, {3}, {1.0, 0.5, 2.0}))
                .Constant(MakeTensor(kUInt16, {3}, {0, 1000, 65535}))
                .Reference(QuantizeRef(0, 0, 65535))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("DequantizeLinear")
                .Input(kInt16, {4, 6}, -32768, 32767)
                .Constant(MakeTensor(kFloat32, {}, {0.001}))
                .Constant(MakeTensor(kInt16, {}, {-12}))
                .Reference(DequantizeRef(1))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("DequantizeLinear")
                .Input(kUInt16, {9}, 0, 65535)
                .Constant(MakeTensor(kFloat32, {}, {0.25}))
                .Constant(MakeTensor(kUInt16, {}, {30000}))
                .Reference(DequantizeRef(1))
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuQuantize, DynamicQuantizeLinearCoversTheRangeWithZero) {
  // min 0 (zero is always covered), max 2.55: scale 0.01, zero point 0.
  EXPECT_GT(OpTester("DynamicQuantizeLinear")
                .Input(MakeTensor(kFloat32, {4}, {0.0, 1.0, 2.55, 0.126}))
                .Outputs(3)
                .Reference([](const std::vector<RefTensor>&) {
                  return std::vector<RefTensor>{{{4}, {0, 100, 255, 13}}, {{}, {0.01f}}, {{}, {0}}};
                })
                .Run(BackendKind::kCpu),
            0);
  // Negative values move the zero point: [-1, 1.55] -> scale 0.01, zero point 100.
  EXPECT_GT(OpTester("DynamicQuantizeLinear")
                .Input(MakeTensor(kFloat32, {3}, {-1.0, 1.55, 0.5}))
                .Outputs(3)
                .Reference([](const std::vector<RefTensor>&) {
                  return std::vector<RefTensor>{{{3}, {0, 255, 150}}, {{}, {0.01f}}, {{}, {100}}};
                })
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuQuantize, QLinearMatMulPerTensorAndBatched) {
  // y = round((a - azp) x (b - bzp) * as * bs / ys) + yzp, saturated, in uint8.
  for (bool batched : {false, true}) {
    SCOPED_TRACE(batched);
    std::vector<int64_t> ad = batched ? std::vector<int64_t>{2, 2, 3} : std::vector<int64_t>{2, 3};
    std::vector<int64_t> bd = batched ? std::vector<int64_t>{2, 3, 2} : std::vector<int64_t>{3, 2};
    EXPECT_GT(
        OpTester("QLinearMatMul")
            .Input(kUInt8, ad, 0, 255)
            .Constant(MakeTensor(kFloat32, {}, {0.02}))
            .Constant(MakeTensor(kUInt8, {}, {100}))
            .Input(kUInt8, bd, 0, 255)
            .Constant(MakeTensor(kFloat32, {}, {0.01}))
            .Constant(MakeTensor(kUInt8, {}, {120}))
            .Constant(MakeTensor(kFloat32, {}, {0.05}))
            .Constant(MakeTensor(kUInt8, {}, {128}))
            .Reference([batched](const std::vector<RefTensor>& in) {
              const int64_t batches = batched ? 2 : 1;
              RefTensor y = RefTensor::Zeros(batched ? std::vector<int64_t>{2, 2, 2}
                                                     : std::vector<int64_t>{2, 2});
              const double m = static_cast<float>(static_cast<float>(0.02f * 0.01f) / 0.05f);
              for (int64_t bi = 0; bi < batches; ++bi) {
                for (int64_t i = 0; i < 2; ++i) {
                  for (int64_t j = 0; j < 2; ++j) {
                    double acc = 0;
                    for (int64_t k = 0; k < 3; ++k) {
                      acc += (in[0][bi * 6 + i * 3 + k] - 100) * (in[3][bi * 6 + k * 2 + j] - 120);
                    }
                    y[bi * 4 + i * 2 + j] = std::clamp(std::nearbyint(acc * m) + 128, 0.0, 255.0);
                  }
                }
              }
              return std::vector<RefTensor>{y};
            })
            .Run(BackendKind::kCpu),
        0);
  }
}

TEST(CpuQuantize, SubByteIntegersSaturateToTheirRanges) {
  // int4 [-8, 7], uint4 [0, 15], int2 [-2, 1], uint2 [0, 3]; odd element counts, zero points.
  struct Case {
    DataType t;
    double qmin, qmax, zero;
  };
  for (const Case& c : {Case{kInt4, -8, 7, -1}, Case{kUInt4, 0, 15, 3}, Case{kInt2, -2, 1, 0},
                        Case{kUInt2, 0, 3, 1}}) {
    EXPECT_GT(OpTester("QuantizeLinear")
                  .Input(kFloat32, {3, 5}, -6.0, 6.0)
                  .Constant(MakeTensor(kFloat32, {}, {0.5}))
                  .Constant(MakeTensor(c.t, {}, {c.zero}))
                  .Reference(QuantizeRef(1, c.qmin, c.qmax))
                  .Tolerance(0, 0)
                  .Run(BackendKind::kCpu),
              0)
        << ToString(c.t);
    // Dequantize per axis: every value of the type, zero points per channel.
    std::vector<double> all;
    for (double v = c.qmin; v <= c.qmax; ++v) all.push_back(v);
    const int64_t n = static_cast<int64_t>(all.size());
    EXPECT_GT(OpTester("DequantizeLinear", Axis(0))
                  .Input(MakeTensor(c.t, {2, n},
                                    [&] {
                                      std::vector<double> v = all;
                                      v.insert(v.end(), all.rbegin(), all.rend());
                                      return v;
                                    }()))
                  .Constant(MakeTensor(kFloat32, {2}, {0.25, 3.0}))
                  .Constant(MakeTensor(c.t, {2}, {c.qmin, c.qmax}))
                  .Reference(DequantizeRef(0))
                  .Tolerance(0, 0)
                  .Run(BackendKind::kCpu),
              0)
        << ToString(c.t);
  }
}

AttributeMap Saturate(int64_t saturate) {
  AttributeMap m;
  m.Set("saturate", saturate);
  return m;
}

TEST(CpuQuantize, Float8SaturatesOrOverflowsAndFloat4Rounds) {
  // x / scale reaches past every format's largest value; saturate=1 clamps to it.
  const Tensor x = MakeTensor(kFloat32, {2, 4},
                              {0.3, -1.7, 1000.0, -1e6, 240.5, 0.0013, 61440.0 * 0.5, -3.14159});
  for (DataType t : {kFloat8E4M3FN, kFloat8E4M3FNUZ, kFloat8E5M2, kFloat8E5M2FNUZ}) {
    const Float8Format f = ToFloat8Format(t);
    for (int64_t saturate : {1, 0}) {
      EXPECT_GT(OpTester("QuantizeLinear", Saturate(saturate))
                    .Input(x)
                    .Constant(MakeTensor(kFloat32, {}, {0.5}))
                    .Constant(MakeTensor(t, {}, {0}))
                    .Reference([&](const std::vector<RefTensor>& in) {
                      RefTensor y = RefTensor::Zeros(in[0].dims);
                      for (int64_t i = 0; i < y.size(); ++i) {
                        const float v = static_cast<float>(in[0][i]) / 0.5f;
                        y[i] = Float8BitsToFloat(FloatToFloat8Bits(v, f, saturate != 0), f);
                      }
                      return std::vector<RefTensor>{y};
                    })
                    .Tolerance(0, 0)
                    .Run(BackendKind::kCpu),
                0)
          << ToString(t) << " saturate " << saturate;
    }
    // Dequantize: the value times the scale.
    EXPECT_GT(OpTester("DequantizeLinear")
                  .Input(MakeTensor(t, {5}, {-2.5, 0.0, 1.0, 224.0, 0.015625}))
                  .Constant(MakeTensor(kFloat32, {}, {2.0}))
                  .Reference([](const std::vector<RefTensor>& in) {
                    return std::vector<RefTensor>{{{5}, {-5.0, 0.0, 2.0, 448.0, 0.03125}}};
                  })
                  .Tolerance(0, 0)
                  .Run(BackendKind::kCpu),
              0)
        << ToString(t);
  }
  // The saturated values themselves: 1000 / 0.5 is 448 in E4M3FN, 240 in E4M3FNUZ.
  EXPECT_EQ(FloatToFloat8Bits(2000.f, Float8Format::kE4M3FN, true), 0x7e);
  // float4: x / scale + zero point, ties to even, saturating at 6.
  EXPECT_GT(OpTester("QuantizeLinear")
                .Input(MakeTensor(kFloat32, {7}, {0.5, 1.5, 2.5, 5.0, -7.0, 100.0, 0.2}))
                .Constant(MakeTensor(kFloat32, {}, {0.5}))
                .Constant(MakeTensor(kFloat4E2M1, {}, {0}))
                .Reference([](const std::vector<RefTensor>&) {
                  return std::vector<RefTensor>{{{7}, {1.0, 3.0, 4.0, 6.0, -6.0, 6.0, 0.5}}};
                })
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuQuantize, BlockwiseScalesAndZeroPoints) {
  // x 2x5, axis 1 in blocks of 2: blocks {0,1}, {2,3}, {4} per row; scale and zero point 2x3.
  AttributeMap attrs = Axis(1);
  attrs.Set("block_size", int64_t{2});
  const std::vector<double> scale = {0.5, 1.0, 2.0, 0.25, 4.0, 0.125};
  const std::vector<double> zero = {1, -2, 0, 3, 0, -4};
  auto block_of = [](int64_t i) { return (i / 5) * 3 + (i % 5) / 2; };
  EXPECT_GT(OpTester("QuantizeLinear", attrs)
                .Input(kFloat32, {2, 5}, -20.0, 20.0)
                .Constant(MakeTensor(kFloat32, {2, 3}, scale))
                .Constant(MakeTensor(kInt8, {2, 3}, zero))
                .Reference([&](const std::vector<RefTensor>& in) {
                  RefTensor y = RefTensor::Zeros(in[0].dims);
                  for (int64_t i = 0; i < y.size(); ++i) {
                    const int64_t b = block_of(i);
                    const float q =
                        std::nearbyint(static_cast<float>(in[0][i]) / static_cast<float>(scale[b]));
                    y[i] = std::fmin(std::fmax(q + zero[b], -128.0), 127.0);
                  }
                  return std::vector<RefTensor>{y};
                })
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("DequantizeLinear", attrs)
                .Input(MakeTensor(kInt4, {2, 5}, {-8, -1, 0, 7, 3, 1, 2, -3, -4, 5}))
                .Constant(MakeTensor(kFloat32, {2, 3}, scale))
                .Constant(MakeTensor(kInt4, {2, 3}, zero))
                .Reference([&](const std::vector<RefTensor>& in) {
                  RefTensor y = RefTensor::Zeros(in[0].dims);
                  for (int64_t i = 0; i < y.size(); ++i) {
                    y[i] = (in[0][i] - zero[block_of(i)]) * scale[block_of(i)];
                  }
                  return std::vector<RefTensor>{y};
                })
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

// The shape rule's verdict on a one-node graph.
Status InferQdq(const std::string& op, DataType x, const Tensor& scale,
                const std::optional<Tensor>& zero, AttributeMap attrs = {}) {
  Graph g;
  Value* in = g.AddInput("x", x, {Dim(2), Dim(3)});
  std::vector<Value*> ins = {in, g.AddConstant("scale", scale)};
  if (zero) ins.push_back(g.AddConstant("zero", *zero));
  Value* out = g.AddValue("y", DataType::kUndefined);
  g.AddNode(op, "q", ins, {out}, std::move(attrs));
  g.MarkOutput(out);
  return InferShapes(g).status();
}

TEST(CpuQuantize, ShapeRuleRefusesWhatItCannotRunFaithfully) {
  const Tensor one = MakeTensor(kFloat32, {}, {0.5});
  EXPECT_TRUE(InferQdq("QuantizeLinear", kFloat32, one, MakeTensor(kInt8, {}, {0})).ok());
  for (double bad : {0.0, -0.5, std::nan(""), double{INFINITY}}) {
    Status s = InferQdq("QuantizeLinear", kFloat32, MakeTensor(kFloat32, {}, {bad}), std::nullopt);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("finite and positive"), std::string::npos) << s.ToString();
  }
  // Blockwise (x is 2x3): axis 1 in blocks of 2 needs a 2x2 scale; a scalar one is refused.
  AttributeMap block;
  block.Set("block_size", int64_t{2});
  Status s = InferQdq("DequantizeLinear", kInt8, one, MakeTensor(kInt8, {}, {0}), block);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blockwise"), std::string::npos) << s.ToString();
  EXPECT_TRUE(InferQdq("DequantizeLinear", kInt8, MakeTensor(kFloat32, {2, 2}, {1, 2, 3, 4}),
                       MakeTensor(kInt8, {2, 2}, {0, 0, 0, 0}), block)
                  .ok());
  // Float8 has no zero point: a nonzero one is refused, zero is accepted.
  EXPECT_TRUE(InferQdq("QuantizeLinear", kFloat32, one, MakeTensor(kFloat8E4M3FN, {}, {0})).ok());
  s = InferQdq("QuantizeLinear", kFloat32, one, MakeTensor(kFloat8E4M3FN, {}, {1}));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no zero point"), std::string::npos) << s.ToString();
  // E8M0 is a scale type, not a quantized one.
  s = InferQdq("QuantizeLinear", kFloat32, one, MakeTensor(kFloat8E8M0, {}, {1}));
  EXPECT_FALSE(s.ok());
  s = InferQdq("DequantizeLinear", kInt8, one, MakeTensor(kUInt8, {}, {0}));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("zero point has type"), std::string::npos) << s.ToString();
  // Per-axis scale whose length is not the axis's.
  s = InferQdq("QuantizeLinear", kFloat32, MakeTensor(kFloat32, {2}, {0.5, 0.5}), std::nullopt);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("per-axis scale has 2 elements"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace kiln::testing
