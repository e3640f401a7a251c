// QuantizeLinear and DequantizeLinear on the CPU (explicit quantization: QDQ models), per tensor
// or per axis, the arithmetic of the ONNX spec and of ONNX Runtime:
//   quantize    q = clamp(round_half_even(x / scale) + zero_point, qmin, qmax)   (x / scale in
//               float; NaN becomes the zero point)
//   dequantize  x = float(q - zero_point) * scale
// Constant DequantizeLinear of a weight is folded at build time through these same kernels.
#include <cmath>
#include <memory>
#include <vector>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// Scales and zero points as floats/ints, one per channel of the axis (or one).
struct QuantParams {
  std::vector<float> scale;
  std::vector<int32_t> zero;
  int64_t channels = 1, inner = 1;  // element i uses channel (i / inner) % channels

  // Sizes the vectors for the bound shapes (Prepare: nothing is allocated while executing).
  void Size(std::span<const TensorView> in, int64_t axis_attr) {
    const int64_t n = in[1].num_elements();
    scale.resize(static_cast<size_t>(n));
    zero.resize(static_cast<size_t>(n));
    channels = n;
    inner = 1;
    if (n > 1) {
      const auto& dims = in[0].dims;
      const int64_t rank = static_cast<int64_t>(dims.size());
      const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
      for (int64_t d = axis + 1; d < rank; ++d) inner *= dims[d];
    }
  }
  // Reads the scale and zero point of this run (they may be run-time inputs).
  void Load(const KernelRunArgs& a) {
    const int64_t n = channels;
    for (int64_t i = 0; i < n; ++i) scale[i] = static_cast<float>(LoadAsDouble(a.inputs[1], i));
    const bool has_zero = a.inputs.size() > 2 && a.inputs[2].data;
    for (int64_t i = 0; i < n; ++i) {
      zero[i] = has_zero ? static_cast<int32_t>(LoadAsDouble(a.inputs[2], i)) : 0;
    }
  }
  int64_t Channel(int64_t i) const { return channels == 1 ? 0 : (i / inner) % channels; }
};

template <typename Q>
void QuantizeLoop(const TensorView& x, const QuantParams& p, Q* y) {
  constexpr float kMin = static_cast<float>(std::numeric_limits<Q>::min());
  constexpr float kMax = static_cast<float>(std::numeric_limits<Q>::max());
  const float* xf = x.dtype == DataType::kFloat32 ? x.as<const float>() : nullptr;
  ParallelRows(x.num_elements(), 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t c = p.Channel(i);
      const float v = xf ? xf[i] : static_cast<float>(LoadAsDouble(x, i));
      float q = std::nearbyint(v / p.scale[c]);
      q = std::isnan(q) ? 0.f : q;
      q = std::fmin(std::fmax(q + static_cast<float>(p.zero[c]), kMin), kMax);
      y[i] = static_cast<Q>(q);
    }
  });
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

// A Q/DQ kernel: parameters sized in Prepare, read at each run, then `body(args, params)`.
template <typename Body>
StatusOr<std::unique_ptr<Kernel>> QdqKernel(int64_t axis, Body body) {
  auto p = std::make_shared<QuantParams>();
  return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(
      [p, body](const KernelRunArgs& a) {
        p->Load(a);
        body(a, *p);
        return OkStatus();
      },
      [p, axis](std::span<const TensorView> in, std::span<const TensorView>) -> StatusOr<size_t> {
        p->Size(in, axis);
        return size_t{0};
      }));
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "QuantizeLinear",
      .name_operand = 0,
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            const DataType out = OutType(r, 0);
            return (IsFloat(InType(r, 0)) || InType(r, 0) == DataType::kInt32) &&
                   IsFloat(InType(r, 1)) &&
                   (out == DataType::kInt8 || out == DataType::kUInt8 || out == DataType::kInt16 ||
                    out == DataType::kUInt16);
          },
      .create =
          [](const KernelRequest& r) {
            const DataType out = OutType(r, 0);
            return QdqKernel(attrs::QuantizeLinear::axis(*r.node),
                             [out](const KernelRunArgs& a, const QuantParams& p) {
                               if (out == DataType::kInt8) {
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
      .accepts =
          [](const KernelRequest& r) {
            const DataType in = InType(r, 0);
            return (in == DataType::kInt8 || in == DataType::kUInt8 || in == DataType::kInt16 ||
                    in == DataType::kUInt16 || in == DataType::kInt32) &&
                   IsFloat(InType(r, 1)) && IsFloat(OutType(r, 0));
          },
      .create =
          [](const KernelRequest& r) {
            const DataType in = InType(r, 0);
            return QdqKernel(attrs::DequantizeLinear::axis(*r.node),
                             [in](const KernelRunArgs& a, const QuantParams& p) {
                               if (in == DataType::kInt8) {
                                 DequantizeLoop<int8_t>(a.inputs[0], p, a.outputs[0]);
                               } else if (in == DataType::kUInt8) {
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
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
