// QuantizeLinear and DequantizeLinear on the CPU (explicit quantization: QDQ models), per tensor,
// per axis or blockwise, the arithmetic of the ONNX spec and of ONNX Runtime:
//   quantize    q = clamp(round_half_even(x / scale) + zero_point, qmin, qmax)   (x / scale in
//               float; NaN becomes the zero point); (u)int4 and (u)int2 the same with their
//               ranges; float8: q = float8(x / scale) with `saturate` (no zero point); float4:
//               q = float4(x / scale + zero_point)
//   dequantize  x = float(q - zero_point) * scale; float8 and float4: float(q) * scale
// Constant DequantizeLinear of a weight is folded at build time through these same kernels.
// Also DynamicQuantizeLinear and QLinearMatMul (reference loops: int32 accumulation).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/core/minifloat.h"
#include "kiln/ops/matmul_geometry.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// Scales and zero points as floats/ints, one per channel of the axis (or one), or one per block.
struct QuantParams {
  std::vector<float> scale;
  std::vector<int32_t> zero;
  std::vector<float> zero_value;    // the zero point's value (float4's is not an integer)
  int64_t channels = 1, inner = 1;  // element i uses channel (i / inner) % channels
  int64_t block = 0, axis_dim = 1, scale_axis_dim = 1;  // blockwise (block > 0)

  // Sizes the vectors for the bound shapes (Prepare: nothing is allocated while executing).
  void Size(std::span<const TensorView> in, int64_t axis_attr, int64_t block_size) {
    const int64_t n = in[1].num_elements();
    scale.resize(static_cast<size_t>(n));
    zero.resize(static_cast<size_t>(n));
    zero_value.resize(static_cast<size_t>(n));
    channels = n;
    inner = 1;
    block = 0;
    if (n > 1 || block_size > 0) {
      const auto& dims = in[0].dims;
      const int64_t rank = static_cast<int64_t>(dims.size());
      const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
      for (int64_t d = axis + 1; d < rank; ++d) inner *= dims[d];
      if (block_size > 0 && rank > 0) {
        block = block_size;
        axis_dim = dims[axis];
        scale_axis_dim = in[1].dims[axis];
      }
    }
  }
  // Reads the scale and zero point of this run (they may be run-time inputs).
  void Load(const KernelRunArgs& a) {
    const int64_t n = channels;
    for (int64_t i = 0; i < n; ++i) scale[i] = static_cast<float>(LoadAsDouble(a.inputs[1], i));
    const bool has_zero = a.inputs.size() > 2 && a.inputs[2].data;
    for (int64_t i = 0; i < n; ++i) {
      const double z = has_zero ? LoadAsDouble(a.inputs[2], i) : 0;
      zero[i] = static_cast<int32_t>(z);
      zero_value[i] = static_cast<float>(z);
    }
  }
  int64_t Channel(int64_t i) const {
    if (block > 0) {  // the scale's index: x's coordinates with the axis one divided by block
      const int64_t outer = i / (axis_dim * inner);
      const int64_t a = (i / inner) % axis_dim;
      return (outer * scale_axis_dim + a / block) * inner + i % inner;
    }
    return channels == 1 ? 0 : (i / inner) % channels;
  }
};

// y[i] = store(x[i] / scale, channel) for every element.
template <typename Q, typename Store>
void QuantizeEach(const TensorView& x, const QuantParams& p, Q* y, Store store) {
  const float* xf = x.dtype == DataType::kFloat32 ? x.as<const float>() : nullptr;
  ParallelRows(x.num_elements(), 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t c = p.Channel(i);
      const float v = xf ? xf[i] : static_cast<float>(LoadAsDouble(x, i));
      y[i] = store(v / p.scale[c], c);
    }
  });
}

// Integer quantization into [qmin, qmax] (a sub-byte type's range in its byte).
template <typename Q>
void QuantizeLoop(const TensorView& x, const QuantParams& p, Q* y,
                  float qmin = static_cast<float>(std::numeric_limits<Q>::min()),
                  float qmax = static_cast<float>(std::numeric_limits<Q>::max())) {
  QuantizeEach(x, p, y, [&](float v, int64_t c) {
    float q = std::nearbyint(v);
    q = std::isnan(q) ? 0.f : q;
    q = std::fmin(std::fmax(q + static_cast<float>(p.zero[c]), qmin), qmax);
    return static_cast<Q>(q);
  });
}

// Quantization to one of the storage-only types of QuantizeLinear.
void QuantizeStorageOnly(DataType out, bool saturate, const TensorView& x, const QuantParams& p,
                         const TensorView& y) {
  switch (out) {
    case DataType::kInt4:
      return QuantizeLoop(x, p, y.as<int8_t>(), -8.f, 7.f);
    case DataType::kUInt4:
      return QuantizeLoop(x, p, y.as<uint8_t>(), 0.f, 15.f);
    case DataType::kInt2:
      return QuantizeLoop(x, p, y.as<int8_t>(), -2.f, 1.f);
    case DataType::kUInt2:
      return QuantizeLoop(x, p, y.as<uint8_t>(), 0.f, 3.f);
    case DataType::kFloat4E2M1:
      return QuantizeEach(x, p, y.as<uint8_t>(), [&](float v, int64_t c) {
        return FloatToFloat4E2M1Bits(v + p.zero_value[c]);
      });
    default: {  // float8 (the rule admits no other type)
      const Float8Format format = ToFloat8Format(out);
      return QuantizeEach(x, p, y.as<uint8_t>(),
                          [&](float v, int64_t) { return FloatToFloat8Bits(v, format, saturate); });
    }
  }
}

template <typename Q>
void DequantizeLoop(const TensorView& x, const QuantParams& p, const TensorView& y) {
  const Q* q = x.as<const Q>();
  float* yf = y.dtype == DataType::kFloat32 ? y.as<float>() : nullptr;
  ParallelRows(x.num_elements(), 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t c = p.Channel(i);
      const float v = static_cast<float>(static_cast<int64_t>(q[i]) - p.zero[c]) * p.scale[c];
      if (yf) {
        yf[i] = v;
      } else {
        StoreFromDouble(y, i, v);
      }
    }
  });
}

// Float8 and float4 dequantization: the value times the scale (no zero point).
void DequantizeFloatLoop(const TensorView& x, const QuantParams& p, const TensorView& y) {
  const uint8_t* q = x.as<const uint8_t>();
  const DataType t = x.dtype;
  const Float8Format format = ToFloat8Format(t);
  ParallelRows(x.num_elements(), 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = t == DataType::kFloat4E2M1 ? Float4E2M1BitsToFloat(q[i])
                                                 : Float8BitsToFloat(q[i], format);
      StoreFromDouble(y, i, v * p.scale[p.Channel(i)]);
    }
  });
}

// A Q/DQ kernel: parameters sized in Prepare, read at each run, then `body(args, params)`.
template <typename Body>
StatusOr<std::unique_ptr<Kernel>> QdqKernel(int64_t axis, int64_t block, Body body) {
  auto p = std::make_shared<QuantParams>();
  return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(
      [p, body](const KernelRunArgs& a) {
        p->Load(a);
        body(a, *p);
        return OkStatus();
      },
      [p, axis, block](std::span<const TensorView> in,
                       std::span<const TensorView>) -> StatusOr<size_t> {
        p->Size(in, axis, block);
        return size_t{0};
      }));
}

// DynamicQuantizeLinear: uint8 with the scale and zero point that cover [min(x, 0), max(x, 0)]
// (ONNX's formula, FP32, ties to even).
Status DynamicQuantize(const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const float* xf = x.as<const float>();
  const int64_t n = x.num_elements();
  float mx = 0.f, mn = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    mx = std::max(mx, xf[i]);
    mn = std::min(mn, xf[i]);
  }
  const float scale = (mx == mn ? 1.f : mx - mn) / 255.f;
  const float zp = std::nearbyint(std::clamp(0.f - mn / scale, 0.f, 255.f));
  uint8_t* y = a.outputs[0].as<uint8_t>();
  ParallelRows(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      y[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(xf[i] / scale) + zp, 0.f, 255.f));
    }
  });
  *a.outputs[1].as<float>() = scale;
  *a.outputs[2].as<uint8_t>() = static_cast<uint8_t>(zp);
  return OkStatus();
}

// A value of a scale or zero point that is a scalar, or a vector along the matrices' columns
// (b's N: per-column scale/zero point) or rows.
double ParamAt(const TensorView& p, int64_t index) {
  return LoadAsDouble(p, p.num_elements() == 1 ? 0 : index);
}

// The float product scale of one FP16 operation: numpy rounds every f16 result to f16.
double RoundLike(DataType t, double v) {
  if (t == DataType::kFloat16) return HalfBitsToFloat(FloatToHalfBits(static_cast<float>(v)));
  if (t == DataType::kBFloat16) {
    return BFloat16BitsToFloat(FloatToBFloat16Bits(static_cast<float>(v)));
  }
  return static_cast<float>(v);
}

// QLinearMatMul as ONNX defines it: int32 (a - a_zp) x (b - b_zp), times
// a_scale * b_scale / y_scale (in the scales' type), rounded half to even, plus y_zp, saturated.
Status QLinearMatMul(const KernelRunArgs& a) {
  const TensorView &av = a.inputs[0], &bv = a.inputs[3], &yv = a.outputs[0];
  KILN_ASSIGN_OR_RETURN(MatMulGeometry g,
                        ResolveMatMulGeometry(false, false, av.dims, bv.dims, /*offsets=*/true));
  const bool u8 = yv.dtype == DataType::kUInt8;
  const double qmin = u8 ? 0 : -128, qmax = u8 ? 255 : 127;
  const DataType st = a.inputs[1].dtype;
  // A folded batch (B without batch dims) is one [batch * m, k] matrix.
  const bool folded = g.fold || g.a_offsets.empty();
  const int64_t batches = folded ? 1 : static_cast<int64_t>(g.a_offsets.size());
  const int64_t rows = folded ? g.batch * g.m : g.m;
  for (int64_t bi = 0; bi < batches; ++bi) {
    const int64_t ao = folded ? 0 : g.a_offsets[bi];
    const int64_t bo = folded ? 0 : g.b_offsets[bi];
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        int64_t acc = 0;
        const double azp = ParamAt(a.inputs[2], i % g.m), bzp = ParamAt(a.inputs[5], j);
        for (int64_t k = 0; k < g.k; ++k) {
          const int64_t x = static_cast<int64_t>(LoadAsDouble(av, ao + i * g.k + k) - azp);
          const int64_t w = static_cast<int64_t>(LoadAsDouble(bv, bo + k * g.n + j) - bzp);
          acc += x * w;
        }
        const double m =
            RoundLike(st, RoundLike(st, ParamAt(a.inputs[1], i % g.m) * ParamAt(a.inputs[4], j)) /
                              ParamAt(a.inputs[6], j));
        const double q = std::nearbyint(static_cast<double>(acc) * m) + ParamAt(a.inputs[7], j);
        StoreFromDouble(yv, (bi * rows + i) * g.n + j, std::clamp(q, qmin, qmax));
      }
    }
  }
  return OkStatus();
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "QuantizeLinear",
      .name_operand = 0,
      .float_wrap = false,
      .storage_types = true,
      .accepts =
          [](const KernelRequest& r) {
            const DataType out = OutType(r, 0);
            return (IsFloat(InType(r, 0)) || InType(r, 0) == DataType::kInt32) &&
                   IsFloat(InType(r, 1)) &&
                   (out == DataType::kInt8 || out == DataType::kUInt8 || out == DataType::kInt16 ||
                    out == DataType::kUInt16 ||
                    (IsStorageOnly(out) && out != DataType::kFloat8E8M0));
          },
      .create =
          [](const KernelRequest& r) {
            const DataType out = OutType(r, 0);
            const bool saturate = attrs::QuantizeLinear::saturate(*r.node) != 0;
            return QdqKernel(attrs::QuantizeLinear::axis(*r.node),
                             attrs::QuantizeLinear::block_size(*r.node),
                             [out, saturate](const KernelRunArgs& a, const QuantParams& p) {
                               if (IsStorageOnly(out)) {
                                 QuantizeStorageOnly(out, saturate, a.inputs[0], p, a.outputs[0]);
                               } else if (out == DataType::kInt8) {
                                 QuantizeLoop(a.inputs[0], p, a.outputs[0].as<int8_t>());
                               } else if (out == DataType::kInt16) {
                                 QuantizeLoop(a.inputs[0], p, a.outputs[0].as<int16_t>());
                               } else if (out == DataType::kUInt16) {
                                 QuantizeLoop(a.inputs[0], p, a.outputs[0].as<uint16_t>());
                               } else {
                                 QuantizeLoop(a.inputs[0], p, a.outputs[0].as<uint8_t>());
                               }
                             });
          },
  });
  RegisterOpKernel({
      .op_type = "DequantizeLinear",
      .name_operand = 0,
      .float_wrap = false,
      .storage_types = true,
      .accepts =
          [](const KernelRequest& r) {
            const DataType in = InType(r, 0);
            return (in == DataType::kInt8 || in == DataType::kUInt8 || in == DataType::kInt16 ||
                    in == DataType::kUInt16 || in == DataType::kInt32 ||
                    (IsStorageOnly(in) && in != DataType::kFloat8E8M0)) &&
                   IsFloat(InType(r, 1)) && IsFloat(OutType(r, 0));
          },
      .create =
          [](const KernelRequest& r) {
            const DataType in = InType(r, 0);
            return QdqKernel(attrs::DequantizeLinear::axis(*r.node),
                             attrs::DequantizeLinear::block_size(*r.node),
                             [in](const KernelRunArgs& a, const QuantParams& p) {
                               // Sub-byte integers are sign-extended bytes: the 8-bit loops.
                               if (IsFloat8(in) || in == DataType::kFloat4E2M1) {
                                 DequantizeFloatLoop(a.inputs[0], p, a.outputs[0]);
                               } else if (in == DataType::kInt8 || in == DataType::kInt4 ||
                                          in == DataType::kInt2) {
                                 DequantizeLoop<int8_t>(a.inputs[0], p, a.outputs[0]);
                               } else if (in == DataType::kUInt8 || in == DataType::kUInt4 ||
                                          in == DataType::kUInt2) {
                                 DequantizeLoop<uint8_t>(a.inputs[0], p, a.outputs[0]);
                               } else if (in == DataType::kInt16) {
                                 DequantizeLoop<int16_t>(a.inputs[0], p, a.outputs[0]);
                               } else if (in == DataType::kUInt16) {
                                 DequantizeLoop<uint16_t>(a.inputs[0], p, a.outputs[0]);
                               } else {
                                 DequantizeLoop<int32_t>(a.inputs[0], p, a.outputs[0]);
                               }
                             });
          },
  });
  RegisterOpKernel({
      .op_type = "DynamicQuantizeLinear",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return InType(r, 0) == DataType::kFloat32; },
      .create = [](const KernelRequest&) { return KernelOr(DynamicQuantize); },
  });
  RegisterOpKernel({
      .op_type = "QLinearMatMul",
      .name_operand = 0,
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            for (size_t i : {0, 2, 3, 5, 7}) {
              if (InType(r, i) != DataType::kInt8 && InType(r, i) != DataType::kUInt8) return false;
            }
            return IsFloat(InType(r, 1)) && IsFloat(InType(r, 4)) && IsFloat(InType(r, 6));
          },
      .create = [](const KernelRequest&) { return KernelOr(QLinearMatMul); },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
