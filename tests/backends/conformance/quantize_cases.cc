// Op conformance cases, explicit quantization family: QuantizeLinear and DequantizeLinear per
// tensor and per axis (axis 0, 1, negative), int8/uint8 (int32 for DequantizeLinear), float
// storage inputs, output_dtype, exact ties, saturation, NaN and infinities, parameters given at
// run time. Every case has its own reference (the ONNX formulas in FP32, as op_cases.h's suite
// describes), so the CPU backend is checked too; every backend must run them (`must`).
#include <cmath>
#include <limits>

#include "op_cases.h"

namespace kiln::testing {
namespace {

constexpr DataType kI8 = DataType::kInt8;
constexpr DataType kU8 = DataType::kUInt8;

Tensor I8(std::vector<int64_t> dims, std::vector<int8_t> v) {
  return Tensor::FromVector(kI8, std::move(dims), v);
}
Tensor U8(std::vector<int64_t> dims, std::vector<uint8_t> v) {
  return Tensor::FromVector(kU8, std::move(dims), v);
}

// The channel of element i of `dims` for parameters of `channels` elements along `axis`
// (negative from the end); one channel: per tensor.
int64_t ChannelOf(const std::vector<int64_t>& dims, int64_t axis, int64_t channels, int64_t i) {
  if (channels == 1) return 0;
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < 0) axis += rank;
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < rank; ++d) inner *= dims[static_cast<size_t>(d)];
  return (i / inner) % channels;
}

// q = clamp(round_half_even(x / scale) + zero, type range), x / scale in FP32, NaN -> zero.
ReferenceFn QuantizeRef(int64_t axis, DataType q_type) {
  const double lo = q_type == kI8 ? -128 : 0, hi = q_type == kI8 ? 127 : 255;
  return [=](const std::vector<RefTensor>& in) {
    RefTensor y = RefTensor::Zeros(in[0].dims);
    for (int64_t i = 0; i < y.size(); ++i) {
      const int64_t c = ChannelOf(in[0].dims, axis, in[1].size(), i);
      const float ratio = static_cast<float>(in[0][i]) / static_cast<float>(in[1][c]);
      float q = std::nearbyint(ratio);
      if (std::isnan(q)) q = 0;
      const double zero = in.size() > 2 && in[2].size() > 0 ? in[2][c] : 0.0;
      y[i] = std::fmin(std::fmax(static_cast<double>(q) + zero, lo), hi);
    }
    return std::vector<RefTensor>{y};
  };
}

// x = float(q - zero) * scale in FP32.
ReferenceFn DequantizeRef(int64_t axis) {
  return [=](const std::vector<RefTensor>& in) {
    RefTensor y = RefTensor::Zeros(in[0].dims);
    for (int64_t i = 0; i < y.size(); ++i) {
      const int64_t c = ChannelOf(in[0].dims, axis, in[1].size(), i);
      const double zero = in.size() > 2 && in[2].size() > 0 ? in[2][c] : 0.0;
      y[i] = static_cast<float>(in[0][i] - zero) * static_cast<float>(in[1][c]);
    }
    return std::vector<RefTensor>{y};
  };
}

AttributeMap Axis(int64_t axis) { return Attrs({{"axis", axis}}); }

}  // namespace

std::vector<OpCase> QuantizeCases() {
  std::vector<OpCase> c;
  // Every case here is `must`: each backend has to run them.
  auto must = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), true});
  };
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();

  // ---- QuantizeLinear ---------------------------------------------------------------------------
  // Values at exact .5 steps of the scale (half to even: 2.5 -> 2, 3.5 -> 4, -0.5 -> -0), NaN
  // (the zero point) and infinities (saturated); exact in f16 and bf16 too. Odd count: the tail.
  must("QuantizeLinear_ties_nan_inf_u8", [=] {
    OpTester t("QuantizeLinear");
    t.Input(F32({3, 5}, {-1.25f, -0.75f, -0.25f, 0.25f, 0.75f, 1.25f, 1.75f, 2.25f, 0.f, -0.f, kNaN,
                         kInf, -kInf, 63.25f, -64.75f}));
    t.Constant(F32({}, {0.5f})).Constant(U8({}, {128}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kU8));
    return t;
  });
  must("QuantizeLinear_ties_i8_scale_1", [=] {
    OpTester t("QuantizeLinear");
    t.Input(F32({2, 4}, {-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 126.5f, -128.5f}));
    t.Constant(F32({1}, {1.f})).Constant(I8({1}, {-1}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kI8));
    return t;
  });
  // Values past the range on both sides: saturation; 4-aligned sizes take the vector path.
  must("QuantizeLinear_saturate_i8", [] {
    OpTester t("QuantizeLinear");
    t.Input(kF32, {4, 64}, -100.0, 100.0).Constant(F32({}, {0.3f})).Constant(I8({}, {5}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kI8));
    return t;
  });
  must("QuantizeLinear_saturate_u8_no_zero_point", [] {
    OpTester t("QuantizeLinear");
    t.Input(kF32, {3, 7, 5}, -40.0, 40.0).Constant(F32({}, {0.125f}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kU8));
    return t;
  });
  must("QuantizeLinear_output_dtype_i8", [] {
    OpTester t("QuantizeLinear", Attrs({{"output_dtype", int64_t{3}}}));
    t.Input(kF32, {2, 3, 8}, -3.0, 3.0).Constant(F32({}, {0.02f}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kI8));
    return t;
  });
  must("QuantizeLinear_per_axis1_u8", [] {
    OpTester t("QuantizeLinear", Axis(1));
    t.Input(kF32, {2, 4, 3, 5}, -6.0, 6.0);
    t.Constant(F32({4}, {0.05f, 0.02f, 0.1f, 0.03f})).Constant(U8({4}, {128, 0, 10, 255}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kU8));
    return t;
  });
  must("QuantizeLinear_per_axis0_i8", [] {
    OpTester t("QuantizeLinear", Axis(0));
    t.Input(kF32, {3, 16}, -4.0, 4.0);
    t.Constant(F32({3}, {0.01f, 0.04f, 0.5f})).Constant(I8({3}, {0, -20, 7}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(0, kI8));
    return t;
  });
  must("QuantizeLinear_per_axis_negative_i8", [] {
    OpTester t("QuantizeLinear", Axis(-1));
    t.Input(kF32, {5, 2, 6}, -2.0, 2.0);
    t.Constant(F32({6}, {0.01f, 0.02f, 0.03f, 0.015f, 0.025f, 0.5f}));
    t.Constant(I8({6}, {0, 1, -1, 3, -128, 127}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(-1, kI8));
    return t;
  });
  // Scale and zero point as graph inputs (read by the kernel at run time), per axis and per
  // tensor.
  must("QuantizeLinear_runtime_params_per_axis", [] {
    OpTester t("QuantizeLinear", Axis(-2));
    t.Input(kF32, {2, 3, 4}, -3.0, 3.0).Input(F32({3}, {0.02f, 0.05f, 0.1f}));
    t.Input(U8({3}, {100, 128, 3}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(-2, kU8));
    return t;
  });
  must("QuantizeLinear_runtime_params_per_tensor", [] {
    OpTester t("QuantizeLinear");
    t.Input(kF32, {6, 10}, -3.0, 3.0).Input(F32({}, {0.03f})).Input(I8({}, {-7}));
    t.FloatTypes(kAllFloats).Reference(QuantizeRef(1, kI8));
    return t;
  });
  // int32 input: x / 2 has exact ties at every odd x.
  must("QuantizeLinear_i32_input_ties", [] {
    OpTester t("QuantizeLinear");
    t.Input(kI32, {4, 9}, -300.0, 300.0).Constant(F32({}, {2.f})).Constant(U8({}, {100}));
    t.Reference(QuantizeRef(1, kU8));
    return t;
  });

  // ---- DequantizeLinear -------------------------------------------------------------------------
  must("DequantizeLinear_i8_per_tensor", [] {
    OpTester t("DequantizeLinear");
    t.Input(kI8, {3, 33}, -128.0, 127.0).Constant(F32({}, {0.02f})).Constant(I8({}, {-3}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(1));
    return t;
  });
  must("DequantizeLinear_u8_no_zero_point", [] {
    OpTester t("DequantizeLinear");
    t.Input(kU8, {2, 4, 8}, 0.0, 255.0).Constant(F32({1}, {0.125f}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(1));
    return t;
  });
  must("DequantizeLinear_per_axis0_i8", [] {
    OpTester t("DequantizeLinear", Axis(0));
    t.Input(kI8, {4, 3, 3}, -128.0, 127.0);
    t.Constant(F32({4}, {0.01f, 0.2f, 0.03f, 1.5f})).Constant(I8({4}, {0, 5, -5, 127}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(0));
    return t;
  });
  must("DequantizeLinear_per_axis1_u8", [] {
    OpTester t("DequantizeLinear", Axis(1));
    t.Input(kU8, {2, 3, 5, 2}, 0.0, 255.0);
    t.Constant(F32({3}, {0.5f, 0.01f, 0.07f})).Constant(U8({3}, {128, 0, 255}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(1));
    return t;
  });
  must("DequantizeLinear_per_axis_negative_u8", [] {
    OpTester t("DequantizeLinear", Axis(-1));
    t.Input(kU8, {3, 4, 8}, 0.0, 255.0);
    t.Constant(F32({8}, {0.1f, 0.2f, 0.3f, 0.4f, 0.05f, 0.06f, 0.07f, 0.08f}));
    t.Constant(U8({8}, {0, 1, 2, 3, 250, 251, 252, 253}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(-1));
    return t;
  });
  // int32 (a bias quantized with scale x_scale * w_scale), per axis, zero point 0.
  must("DequantizeLinear_i32_per_axis", [] {
    OpTester t("DequantizeLinear", Axis(0));
    t.Input(kI32, {6, 7}, -100000.0, 100000.0);
    t.Constant(F32({6}, {1e-4f, 2e-4f, 3e-5f, 1e-3f, 5e-4f, 7e-5f}));
    t.Constant(I32({6}, {0, 0, 0, 0, 0, 0}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(0));
    return t;
  });
  must("DequantizeLinear_i32_per_tensor", [] {
    OpTester t("DequantizeLinear");
    t.Input(kI32, {5, 5}, -5000.0, 5000.0).Constant(F32({}, {0.001f}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(1));
    return t;
  });
  // f16 result from an f32 scale; bf16 likewise.
  must("DequantizeLinear_output_dtype_f16", [] {
    OpTester t("DequantizeLinear", Attrs({{"output_dtype", int64_t{10}}}));
    t.Input(kI8, {4, 16}, -128.0, 127.0).Constant(F32({}, {0.05f})).Constant(I8({}, {2}));
    t.Reference(DequantizeRef(1));
    return t;
  });
  must("DequantizeLinear_output_dtype_bf16_per_axis", [] {
    OpTester t("DequantizeLinear", Attrs({{"axis", int64_t{1}}, {"output_dtype", int64_t{16}}}));
    t.Input(kU8, {2, 3, 4}, 0.0, 255.0).Constant(F32({3}, {0.02f, 0.5f, 0.001f}));
    t.Constant(U8({3}, {0, 128, 255}));
    t.Reference(DequantizeRef(1));
    return t;
  });
  must("DequantizeLinear_runtime_params_per_axis", [] {
    OpTester t("DequantizeLinear", Axis(1));
    t.Input(kI8, {3, 4, 5}, -128.0, 127.0).Input(F32({4}, {0.5f, 0.25f, 0.125f, 0.0625f}));
    t.Input(I8({4}, {-1, 0, 1, 2}));
    t.FloatTypes(kAllFloats).Reference(DequantizeRef(1));
    return t;
  });
  return c;
}

}  // namespace kiln::testing
