// Cast on the CPU between every kiln dtype (f64, f32, f16, bf16, the integers, bool). Floats to
// integers truncate toward zero; to bool is `!= 0`; f16/bf16 round to nearest even. BitCast
// (the same bytes) and EyeLike (a typed identity) are here too.
#include <cmath>
#include <cstring>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// Storage <-> compute value: halves are float; the rest are themselves.
template <typename S>
struct Elem {
  using Compute = S;
  static Compute Load(S v) { return v; }
  template <typename C>
  static S Store(C v) {
    if constexpr (std::is_same_v<S, bool>) {
      return v != 0;
    } else if constexpr (std::is_integral_v<S> && std::is_floating_point_v<C>) {
      // Out-of-range and NaN are undefined in ONNX; keep them defined here (no UB).
      if (!std::isfinite(v)) return 0;
      double t = std::trunc(static_cast<double>(v));
      if (t < static_cast<double>(std::numeric_limits<S>::lowest()) ||
          t > static_cast<double>(std::numeric_limits<S>::max())) {
        return 0;
      }
      return static_cast<S>(t);
    } else {
      return static_cast<S>(v);
    }
  }
};

template <typename Src, typename Dst, typename Load, typename Store>
void CastLoop(const KernelRunArgs& a, Load load, Store store) {
  const Src* x = a.inputs[0].as<const Src>();
  Dst* y = a.outputs[0].as<Dst>();
  ParallelRows(a.outputs[0].num_elements(), 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = store(load(x[i]));
  });
}

// Calls f(storage type, load-to-compute, store-from-compute) for dtype t.
template <typename F>
void WithType(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat16:
      f(
          std::type_identity<uint16_t>{}, [](uint16_t v) { return HalfBitsToFloat(v); },
          [](auto c) { return FloatToHalfBits(static_cast<float>(c)); });
      break;
    case DataType::kBFloat16:
      f(
          std::type_identity<uint16_t>{}, [](uint16_t v) { return BFloat16BitsToFloat(v); },
          [](auto c) { return FloatToBFloat16Bits(static_cast<float>(c)); });
      break;
#define KILN_CAST_CASE(kind, T)                                        \
  case DataType::kind:                                                 \
    f(                                                                 \
        std::type_identity<T>{}, [](T v) { return Elem<T>::Load(v); }, \
        [](auto c) { return Elem<T>::Store(c); });                     \
    break;
      KILN_CAST_CASE(kFloat32, float)
      KILN_CAST_CASE(kInt8, int8_t)
      KILN_CAST_CASE(kUInt8, uint8_t)
      KILN_CAST_CASE(kInt32, int32_t)
      KILN_CAST_CASE(kInt64, int64_t)
      KILN_CAST_CASE(kBool, bool)
      KILN_CAST_CASE(kFloat64, double)
      KILN_CAST_CASE(kInt16, int16_t)
      KILN_CAST_CASE(kUInt16, uint16_t)
      KILN_CAST_CASE(kUInt32, uint32_t)
      KILN_CAST_CASE(kUInt64, uint64_t)
#undef KILN_CAST_CASE
    default:
      break;
  }
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Cast",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) != DataType::kUndefined && OutType(r, 0) != DataType::kUndefined;
          },
      .create =
          [](const KernelRequest& r) {
            DataType from = InType(r, 0), to = OutType(r, 0);
            return KernelOr([from, to](const KernelRunArgs& a) {
              if (from == to) {
                if (a.outputs[0].size_bytes() > 0) {
                  std::memcpy(a.outputs[0].data, a.inputs[0].data, a.outputs[0].size_bytes());
                }
                return OkStatus();
              }
              WithType(from, [&](auto src_tag, auto load, auto) {
                using Src = typename decltype(src_tag)::type;
                WithType(to, [&](auto dst_tag, auto, auto store) {
                  using Dst = typename decltype(dst_tag)::type;
                  CastLoop<Src, Dst>(a, load, store);
                });
              });
              return OkStatus();
            });
          },
  });
  // BitCast: the same bytes under another type of the same size (the rule checks the sizes).
  RegisterOpKernel({
      .op_type = "BitCast",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) != DataType::kUndefined &&
                   SizeOf(InType(r, 0)) == SizeOf(OutType(r, 0));
          },
      .create =
          [](const KernelRequest&) {
            return KernelOr([](const KernelRunArgs& a) {
              if (a.outputs[0].size_bytes() > 0) {
                std::memcpy(a.outputs[0].data, a.inputs[0].data, a.outputs[0].size_bytes());
              }
              return OkStatus();
            });
          },
  });
  // EyeLike: ones on diagonal k of a 2-D output, zeros elsewhere, in any type.
  RegisterOpKernel({
      .op_type = "EyeLike",
      .name_operand = -1,
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return OutType(r, 0) != DataType::kUndefined; },
      .create =
          [](const KernelRequest& r) {
            const int64_t k = attrs::EyeLike::k(*r.node);
            return KernelOr([k](const KernelRunArgs& a) {
              const TensorView& y = a.outputs[0];
              const int64_t rows = y.dims[0], cols = y.dims[1];
              if (y.size_bytes() > 0) std::memset(y.data, 0, y.size_bytes());
              for (int64_t i = 0; i < rows; ++i) {
                const int64_t j = i + k;
                if (j >= 0 && j < cols) StoreFromDouble(y, i * cols + j, 1.0);
              }
              return OkStatus();
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
