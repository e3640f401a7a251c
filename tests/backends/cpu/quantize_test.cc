// QuantizeLinear and DequantizeLinear on the CPU (QDQ models) against references written from the
// ONNX spec: per tensor and per axis, int8 and uint8 (int32 for dequantize), zero points or none,
// f32 and f16 inputs, saturation at both ends and round-half-to-even ties; and the shape rule's
// refusals (blockwise scales, zero or NaN constant scales, a zero point of another type).
#include <cmath>

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
  AttributeMap block;
  block.Set("block_size", int64_t{2});
  Status s = InferQdq("DequantizeLinear", kInt8, one, MakeTensor(kInt8, {}, {0}), block);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blockwise"), std::string::npos) << s.ToString();
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
