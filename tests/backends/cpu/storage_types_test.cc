// The storage-only element types (float8, float4, int4/uint4, int2/uint2) on the CPU: Cast to and
// from f32/f16 with `saturate` and `round_mode`, data movement on their one-byte-per-value
// storage, and kernels that cannot take them offering no tactic (the layer fails at build).
#include <cmath>

#include "kiln/backends/kernel.h"
#include "kiln/core/minifloat.h"
#include "kiln/ops/onnx_dtype.h"
#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;

AttributeMap CastTo(DataType t, int64_t saturate = 1, const char* round_mode = nullptr) {
  AttributeMap m;
  m.Set("to", OnnxDataTypeCode(t));
  m.Set("saturate", saturate);
  if (round_mode) m.Set("round_mode", std::string(round_mode));
  return m;
}

const std::vector<double> kFloatEdges = {0.47892547, -1000000.0, 1e-7,   -0.0,  300.0,
                                         -250.0,     61440.0,    0.0625, 464.0, -0.013671875};

TEST(CpuStorageTypes, CastFloatToFloat8AndBack) {
  for (DataType t : {kFloat8E4M3FN, kFloat8E4M3FNUZ, kFloat8E5M2, kFloat8E5M2FNUZ}) {
    const Float8Format f = ToFloat8Format(t);
    for (int64_t saturate : {1, 0}) {
      for (DataType from : {kFloat32, kFloat16}) {
        const Tensor x = MakeTensor(from, {2, 5}, kFloatEdges);
        EXPECT_GT(OpTester("Cast", CastTo(t, saturate))
                      .Input(x)
                      .Reference([&](const std::vector<RefTensor>& in) {
                        RefTensor y = RefTensor::Zeros(in[0].dims);
                        for (int64_t i = 0; i < y.size(); ++i) {
                          y[i] = Float8BitsToFloat(
                              FloatToFloat8Bits(static_cast<float>(in[0][i]), f, saturate != 0), f);
                        }
                        return std::vector<RefTensor>{y};
                      })
                      .Tolerance(0, 0)
                      .Run(BackendKind::kCpu),
                  0)
            << ToString(from) << " -> " << ToString(t) << " saturate " << saturate;
      }
    }
    // Back to f32 and f16: exact (every float8 value is a half value).
    const Tensor q = MakeTensor(t, {5}, {-2.5, 0.0, 1.0, 224.0, 0.015625});
    for (DataType to : {kFloat32, kFloat16}) {
      EXPECT_GT(OpTester("Cast", CastTo(to))
                    .Input(q)
                    .Reference([](const std::vector<RefTensor>& in) {
                      return std::vector<RefTensor>{in[0]};
                    })
                    .Tolerance(0, 0)
                    .Run(BackendKind::kCpu),
                0)
          << ToString(t) << " -> " << ToString(to);
    }
  }
}

TEST(CpuStorageTypes, CastToSubByteIntegersWrapsLikeTheReference) {
  // Truncation toward zero, then the higher bits dropped: -9 -> 7 in int4, 20 -> 4 in uint4.
  std::vector<double> x;
  for (double v = -9; v <= 15; ++v) x.push_back(v + (v < 0 ? -0.5 : 0.5));
  struct Case {
    DataType t;
    int bits;
    bool is_signed;
  };
  for (const Case& c : {Case{kInt4, 4, true}, Case{kUInt4, 4, false}, Case{kInt2, 2, true},
                        Case{kUInt2, 2, false}}) {
    EXPECT_GT(OpTester("Cast", CastTo(c.t))
                  .Input(MakeTensor(kFloat32, {5, 5}, x))
                  .Reference([&](const std::vector<RefTensor>& in) {
                    RefTensor y = RefTensor::Zeros(in[0].dims);
                    for (int64_t i = 0; i < y.size(); ++i) {
                      y[i] = static_cast<double>(WrapToBits(
                          static_cast<int64_t>(std::trunc(in[0][i])), c.bits, c.is_signed));
                    }
                    return std::vector<RefTensor>{y};
                  })
                  .Tolerance(0, 0)
                  .Run(BackendKind::kCpu),
              0)
        << ToString(c.t);
  }
  // And back: int4 -> int8 sign-extends, uint4 -> f16 is the value.
  const Tensor i4 = MakeTensor(kInt4, {5}, {-8, -1, 0, 3, 7});
  EXPECT_GT(
      OpTester("Cast", CastTo(kInt8))
          .Input(i4)
          .Reference([](const std::vector<RefTensor>& in) { return std::vector<RefTensor>{in[0]}; })
          .Tolerance(0, 0)
          .Run(BackendKind::kCpu),
      0);
  EXPECT_GT(
      OpTester("Cast", CastTo(kFloat16))
          .Input(MakeTensor(kUInt4, {3}, {0, 9, 15}))
          .Reference([](const std::vector<RefTensor>& in) { return std::vector<RefTensor>{in[0]}; })
          .Tolerance(0, 0)
          .Run(BackendKind::kCpu),
      0);
}

TEST(CpuStorageTypes, CastToE8M0HonoursRoundMode) {
  const Tensor x = MakeTensor(kFloat32, {5}, {1.0, 1.25, 1.5, 3.0, 0.75});
  struct Case {
    const char* mode;
    std::vector<double> want;
  };
  for (const Case& c : {Case{"up", {1, 2, 2, 4, 1}}, Case{"down", {1, 1, 1, 2, 0.5}},
                        Case{"nearest", {1, 1, 2, 4, 1}}}) {
    EXPECT_GT(OpTester("Cast", CastTo(kFloat8E8M0, 1, c.mode))
                  .Input(x)
                  .Reference([&](const std::vector<RefTensor>& in) {
                    return std::vector<RefTensor>{{in[0].dims, c.want}};
                  })
                  .Tolerance(0, 0)
                  .Run(BackendKind::kCpu),
              0)
        << c.mode;
  }
}

TEST(CpuStorageTypes, DataMovementKeepsTheBytes) {
  // Transpose of an int4 tensor (sign-extended bytes): values move unchanged.
  AttributeMap perm;
  perm.Set("perm", std::vector<int64_t>{1, 0});
  const std::vector<double> v = {-8, -1, 0, 1, 2, 7};
  EXPECT_GT(OpTester("Transpose", perm)
                .Input(MakeTensor(kInt4, {2, 3}, v))
                .Reference([&](const std::vector<RefTensor>&) {
                  return std::vector<RefTensor>{{{3, 2}, {-8, 1, -1, 2, 0, 7}}};
                })
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
  EXPECT_GT(OpTester("Reshape")
                .Input(MakeTensor(kFloat8E5M2, {2, 3}, {0.5, -3, 57344, 0, 1, 2}))
                .Constant(Int64s({1}, {6}))
                .Reference([](const std::vector<RefTensor>& in) {
                  return std::vector<RefTensor>{{{6}, in[0].data}};
                })
                .Tolerance(0, 0)
                .Run(BackendKind::kCpu),
            0);
}

TEST(CpuStorageTypes, ArithmeticKernelsOfferNoTactic) {
  // Relu/Add/MatMul on float8 or int4 would compute on the wrong bytes: no CPU provider serves
  // them, so the build fails with "no cpu implementation" instead.
  for (DataType t : {kFloat8E4M3FN, kInt4, kFloat4E2M1}) {
    for (const char* op : {"Relu", "Add", "MatMul"}) {
      OpTester tester(op);
      tester.Input(t, {2, 2}, 0, 1);
      if (std::string(op) != "Relu") tester.Input(t, {2, 2}, 0, 1);
      auto layer = tester.Request(kFloat32);
      if (!layer.ok()) continue;  // the shape rule refused the type already
      for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, op)) {
        EXPECT_TRUE(p->Tactics((*layer)->request).empty()) << p->id() << " " << ToString(t);
      }
    }
  }
}

}  // namespace
}  // namespace kiln::testing
