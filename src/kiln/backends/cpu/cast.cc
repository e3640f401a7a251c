// Cast on the CPU between every kiln dtype (f64, f32, f16, bf16, the integers, bool and the
// storage-only float8/float4/int4/int2 types). Floats to integers truncate toward zero; to bool is
// `!= 0`; f16/bf16/float8/float4 round to nearest even (float8 with the `saturate` rules,
// float8e8m0 with `round_mode`, minifloat.h). To int4/uint4/int2/uint2 the higher bits are
// dropped, as ONNX's reference does (numpy wraps). f64 goes to the 8- and 4-bit floats through
// f32. BitCast (the same bytes) and EyeLike (a typed identity) are here too.
#include <cmath>
#include <cstring>

#include "kiln/core/minifloat.h"

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

// The attributes that shape a conversion to float8 (Cast-19+, Cast-24+).
struct CastOptions {
  bool saturate = true;
  E8M0Rounding rounding = E8M0Rounding::kUp;
};

// A float or integer compute value to a sub-byte integer: truncated toward zero (NaN, Inf and
// values past int64 are 0), then wrapped to `bits` bits.
template <typename C>
uint8_t ToSubByteInt(C v, int bits, bool is_signed) {
  int64_t i = 0;
  if constexpr (std::is_floating_point_v<C>) {
    const double t = std::trunc(static_cast<double>(v));
    i = std::isfinite(t) && std::fabs(t) < 9.2e18 ? static_cast<int64_t>(t) : 0;
  } else {
    i = static_cast<int64_t>(v);
  }
  return static_cast<uint8_t>(WrapToBits(i, bits, is_signed));
}

// Calls f(storage type, load-to-compute, store-from-compute) for dtype t.
template <typename F>
void WithType(DataType t, const CastOptions& o, F&& f) {
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
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ: {
      const Float8Format format = ToFloat8Format(t);
      const bool saturate = o.saturate;
      f(
          std::type_identity<uint8_t>{},
          [format](uint8_t v) { return Float8BitsToFloat(v, format); },
          [format, saturate](auto c) {
            return FloatToFloat8Bits(static_cast<float>(c), format, saturate);
          });
      break;
    }
    case DataType::kFloat8E8M0: {
      const bool saturate = o.saturate;
      const E8M0Rounding rounding = o.rounding;
      f(
          std::type_identity<uint8_t>{}, [](uint8_t v) { return E8M0BitsToFloat(v); },
          [saturate, rounding](auto c) {
            return FloatToE8M0Bits(static_cast<float>(c), saturate, rounding);
          });
      break;
    }
    case DataType::kFloat4E2M1:
      f(
          std::type_identity<uint8_t>{}, [](uint8_t v) { return Float4E2M1BitsToFloat(v); },
          [](auto c) { return FloatToFloat4E2M1Bits(static_cast<float>(c)); });
      break;
#define KILN_CAST_SUBBYTE_CASE(kind, T, bits, is_signed)                          \
  case DataType::kind:                                                            \
    f(                                                                            \
        std::type_identity<T>{}, [](T v) { return static_cast<int32_t>(v); },     \
        [](auto c) { return static_cast<T>(ToSubByteInt(c, bits, is_signed)); }); \
    break;
      KILN_CAST_SUBBYTE_CASE(kInt4, int8_t, 4, true)
      KILN_CAST_SUBBYTE_CASE(kUInt4, uint8_t, 4, false)
      KILN_CAST_SUBBYTE_CASE(kInt2, int8_t, 2, true)
      KILN_CAST_SUBBYTE_CASE(kUInt2, uint8_t, 2, false)
#undef KILN_CAST_SUBBYTE_CASE
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
    case DataType::kUndefined:
      break;
  }
}

// The node's saturate and round_mode attributes (the rule checked round_mode's value).
CastOptions CastOptionsOf(const Node& node) {
  CastOptions o;
  o.saturate = attrs::Cast::saturate(node) != 0;
  const std::string mode = attrs::Cast::round_mode(node);
  o.rounding = mode == "down"      ? E8M0Rounding::kDown
               : mode == "nearest" ? E8M0Rounding::kNearest
                                   : E8M0Rounding::kUp;
  return o;
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Cast",
      .float_wrap = false,
      .storage_types = true,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) != DataType::kUndefined && OutType(r, 0) != DataType::kUndefined;
          },
      .create =
          [](const KernelRequest& r) {
            DataType from = InType(r, 0), to = OutType(r, 0);
            const CastOptions options = CastOptionsOf(*r.node);
            return KernelOr([from, to, options](const KernelRunArgs& a) {
              if (from == to) {
                if (a.outputs[0].size_bytes() > 0) {
                  std::memcpy(a.outputs[0].data, a.inputs[0].data, a.outputs[0].size_bytes());
                }
                return OkStatus();
              }
              WithType(from, options, [&](auto src_tag, auto load, auto) {
                using Src = typename decltype(src_tag)::type;
                WithType(to, options, [&](auto dst_tag, auto, auto store) {
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
