// Broadcasting elementwise ops on the CPU: every row of ops/binary_ops.inc (arithmetic,
// comparisons, logic, Pow, Mod, PRelu; Max/Min with any number of inputs), Sum/Mean, Where and
// the bitwise ops (BitwiseAnd/Or/Xor, BitShift).
// Floats compute in FP32 (f16/bf16 through the wrapper); integer and bool paths by the row's type
// class.
#include <type_traits>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/binary_ops.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// out[j] = f(a[..], b[..]) over a broadcast plan; contiguous inner loops.
template <typename A, typename B, typename Out, typename F>
void BinaryLoop(const KernelRunArgs& args, F f) {
  const TensorView& out = args.outputs[0];
  BroadcastPlan plan(args.inputs.subspan(0, 2), out.dims);
  const A* a = args.inputs[0].as<const A>();
  const B* b = args.inputs[1].as<const B>();
  Out* y = out.as<Out>();
  int64_t sa = plan.inner_stride[0], sb = plan.inner_stride[1], n = plan.inner;
  ParallelRows(plan.rows, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const A* pa = a + plan.offset(0, r);
      const B* pb = b + plan.offset(1, r);
      Out* py = y + r * n;
      if (sa && sb) {
        for (int64_t j = 0; j < n; ++j) py[j] = f(pa[j], pb[j]);
      } else if (sa) {
        B vb = pb[0];
        for (int64_t j = 0; j < n; ++j) py[j] = f(pa[j], vb);
      } else if (sb) {
        A va = pa[0];
        for (int64_t j = 0; j < n; ++j) py[j] = f(va, pb[j]);
      } else {
        Out v = f(pa[0], pb[0]);
        for (int64_t j = 0; j < n; ++j) py[j] = v;
      }
    }
  });
}

// Every numeric type: f32 (and f16/bf16 through the wrapper), f64 and the integers.
bool ArithType(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || IsInteger(t);
}
bool SameInputs(const KernelRequest& r) {
  for (const auto& d : r.inputs) {
    if (d.dtype != InType(r, 0)) return false;
  }
  return true;
}

// The operand types the CPU serves for each of binary_ops.inc's type classes (f16/bf16 arrive
// as f32 through the float wrapper).
bool Accepts(BinaryTypes types, const KernelRequest& r) {
  const DataType t = InType(r, 0);
  switch (types) {
    case BinaryTypes::kArith:
    case BinaryTypes::kCompare:
      return SameInputs(r) && ArithType(t);
    case BinaryTypes::kArithWide:
      return SameInputs(r) && (t == DataType::kFloat32 || t == DataType::kFloat64 ||
                               t == DataType::kInt64 || t == DataType::kInt32);
    case BinaryTypes::kEquality:
      return SameInputs(r) && (ArithType(t) || t == DataType::kBool);
    case BinaryTypes::kLogic:
      return t == DataType::kBool && InType(r, 1) == DataType::kBool;
    case BinaryTypes::kPow: {
      // The exponent may have any numeric type, whatever the base's (ONNX's T and T1).
      const DataType e = InType(r, 1);
      return (t == DataType::kFloat32 || t == DataType::kFloat64 || IsIndexType(t)) && ArithType(e);
    }
  }
  return false;
}

// Runs a Pow-typed formula `f(a, b)` for base type Base over the exponent type `e`.
template <typename Base, typename F>
Status PowLoop(DataType e, const KernelRunArgs& args, F f) {
  return DispatchNumeric(e, [&](auto tag) -> Status {
    using E = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<E, bool>) {
      BinaryLoop<Base, E, Base>(args, [f](Base x, E y) { return static_cast<Base>(f(x, y)); });
    }
    return OkStatus();
  });
}

// out = formula(a, b) for a two-operand row, by its type class.
template <BinaryTypes kTypes, typename F>
Status RunBinary(DataType a_type, DataType b_type, const KernelRunArgs& args, F f) {
  if constexpr (kTypes == BinaryTypes::kLogic) {
    BinaryLoop<uint8_t, uint8_t, uint8_t>(
        args, [f](uint8_t a, uint8_t b) -> uint8_t { return static_cast<uint8_t>(f(a, b)); });
    return OkStatus();
  } else if constexpr (kTypes == BinaryTypes::kPow) {
    switch (a_type) {
      case DataType::kFloat32:
        return PowLoop<float>(b_type, args, f);
      case DataType::kFloat64:
        return PowLoop<double>(b_type, args, f);
      case DataType::kInt64:
        return PowLoop<int64_t>(b_type, args, f);
      default:
        return PowLoop<int32_t>(b_type, args, f);
    }
  } else {
    return DispatchNumeric(a_type, [&](auto tag) -> Status {
      using T = typename decltype(tag)::type;
      if constexpr (WritesBool(kTypes)) {
        BinaryLoop<T, T, uint8_t>(
            args, [f](T a, T b) -> uint8_t { return static_cast<uint8_t>(f(a, b)); });
      } else if constexpr (!std::is_same_v<T, bool>) {
        BinaryLoop<T, T, T>(args, [f](T a, T b) -> T { return static_cast<T>(f(a, b)); });
      }
      return OkStatus();
    });
  }
}

// Variadic: out = fold(f, inputs...), then finish(out, count) (Mean divides).
template <typename T, typename F>
void Variadic(const KernelRunArgs& args, F f, bool mean) {
  const TensorView& out = args.outputs[0];
  BroadcastPlan plan(args.inputs, out.dims);
  T* y = out.as<T>();
  int64_t n = plan.inner;
  size_t k = args.inputs.size();
  ParallelRows(plan.rows, n * static_cast<int64_t>(k), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* py = y + r * n;
      for (size_t i = 0; i < k; ++i) {
        const T* p = args.inputs[i].as<const T>() + plan.offset(i, r);
        int64_t s = plan.inner_stride[i];
        if (i == 0) {
          for (int64_t j = 0; j < n; ++j) py[j] = p[j * s];
        } else {
          for (int64_t j = 0; j < n; ++j) py[j] = f(py[j], p[j * s]);
        }
      }
      if (mean) {
        for (int64_t j = 0; j < n; ++j) py[j] = static_cast<T>(py[j] / static_cast<T>(k));
      }
    }
  });
}

template <typename T>
void WhereLoop(const KernelRunArgs& args) {
  const TensorView& out = args.outputs[0];
  BroadcastPlan plan(args.inputs, out.dims);
  const uint8_t* c = args.inputs[0].as<const uint8_t>();
  const T* x = args.inputs[1].as<const T>();
  const T* yv = args.inputs[2].as<const T>();
  T* o = out.as<T>();
  int64_t n = plan.inner, sc = plan.inner_stride[0], sx = plan.inner_stride[1],
          sy = plan.inner_stride[2];
  ParallelRows(plan.rows, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* pc = c + plan.offset(0, r);
      const T* px = x + plan.offset(1, r);
      const T* py = yv + plan.offset(2, r);
      T* po = o + r * n;
      for (int64_t j = 0; j < n; ++j) po[j] = pc[j * sc] ? px[j * sx] : py[j * sy];
    }
  });
}

// The node's attributes that the formulas read, with ops.inc's defaults.
BinaryParams ReadParams(const Node& node) {
  BinaryParams p;
  p.fmod = OpTypeOf(node) == OpType::kMod && attrs::Mod::fmod(node) != 0;
  return p;
}

// out = fold of every input with the formula (a KILN_VARIADIC_OP row).
template <BinaryTypes kTypes, typename F>
Status RunVariadic(DataType t, const KernelRunArgs& args, F f) {
  static_assert(!WritesBool(kTypes) && kTypes != BinaryTypes::kPow,
                "a Variadic row folds operands of one type into that type");
  return DispatchNumeric(t, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>) {
      Variadic<T>(
          args, [f](T a, T b) -> T { return static_cast<T>(f(a, b)); }, false);
    }
    return OkStatus();
  });
}

// One provider per row of ops/binary_ops.inc. `formula` is the row's generic lambda; taking its
// type (not a function pointer) lets the element loops inline and vectorise it.
template <BinaryTypes kTypes, bool kVariadic, typename Formula>
void RegisterRow(const char* op, Formula formula) {
  RegisterOpKernel({
      .op_type = op,
      .float_wrap = kTypes != BinaryTypes::kLogic,
      .accepts = [](const KernelRequest& r) { return Accepts(kTypes, r); },
      .create =
          [formula](const KernelRequest& r) {
            const BinaryParams p = ReadParams(*r.node);
            auto f = [formula, p](auto a, auto b) { return formula(a, b, p); };
            return KernelOr([f, a = InType(r, 0), b = InType(r, 1)](const KernelRunArgs& args) {
              if constexpr (kVariadic) {
                return RunVariadic<kTypes>(a, args, f);
              } else {
                return RunBinary<kTypes>(a, b, args, f);
              }
            });
          },
  });
}

// BitwiseAnd/Or/Xor: integer operands of one type, broadcasting (CPU only: ops.inc declares no
// CUDA kernel, so they are not binary_ops.inc rows, which generate one).
template <typename F>
void RegisterBitwise(const char* op, F f) {
  RegisterOpKernel({
      .op_type = op,
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return SameInputs(r) && IsInteger(InType(r, 0)); },
      .create =
          [f](const KernelRequest& r) {
            return KernelOr([f, t = InType(r, 0)](const KernelRunArgs& args) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                  BinaryLoop<T, T, T>(args, [f](T a, T b) { return static_cast<T>(f(a, b)); });
                }
                return OkStatus();
              });
            });
          },
  });
}

// BitShift on unsigned integers; a shift by the type's width or more gives 0 (C++ leaves it
// undefined; ONNX Runtime gives 0 too).
void RegisterBitShift() {
  RegisterOpKernel({
      .op_type = "BitShift",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return SameInputs(r) && IsUnsigned(InType(r, 0)); },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        const Attribute* dir = r.node->attrs().Find("direction");
        const std::string* d = dir ? std::get_if<std::string>(dir) : nullptr;
        if (!d || (*d != "LEFT" && *d != "RIGHT")) {
          return MakeError(ErrorCode::kInvalidAttribute,
                           "BitShift needs direction 'LEFT' or 'RIGHT'");
        }
        const bool left = *d == "LEFT";
        return KernelOr([left, t = InType(r, 0)](const KernelRunArgs& args) {
          return DispatchNumeric(t, [&](auto tag) -> Status {
            using T = typename decltype(tag)::type;
            if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
              constexpr T kBits = static_cast<T>(8 * sizeof(T));
              BinaryLoop<T, T, T>(args, [left](T a, T b) -> T {
                if (b >= kBits) return 0;
                return static_cast<T>(left ? a << b : a >> b);
              });
            }
            return OkStatus();
          });
        });
      },
  });
}

// Sum and Mean, any number of inputs (not binary_ops.inc rows: neither has a two-operand kernel on
// CUDA, so a row would add one).
void RegisterSumOrMean(const char* op, bool mean) {
  RegisterOpKernel({
      .op_type = op,
      .accepts = [](const KernelRequest& r) { return Accepts(BinaryTypes::kArith, r); },
      .create =
          [mean](const KernelRequest& r) {
            return KernelOr([mean, t = InType(r, 0)](const KernelRunArgs& args) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (!std::is_same_v<T, bool>) {
                  Variadic<T>(
                      args, [](T a, T b) -> T { return static_cast<T>(a + b); }, mean);
                }
                return OkStatus();
              });
            });
          },
  });
}

const bool kRegistered = [] {
#define KILN_CPU_REGISTER_ROW(Name, Types, variadic, formula)             \
  RegisterRow<BinaryTypes::k##Types, variadic>(                           \
      #Name, [](auto a, auto b, [[maybe_unused]] const BinaryParams& p) { \
        using A [[maybe_unused]] = decltype(a);                           \
        using B [[maybe_unused]] = decltype(b);                           \
        return formula;                                                   \
      });
#define KILN_BINARY_OP(Name, Types, formula) KILN_CPU_REGISTER_ROW(Name, Types, false, formula)
#define KILN_VARIADIC_OP(Name, Types, formula) KILN_CPU_REGISTER_ROW(Name, Types, true, formula)
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
#undef KILN_CPU_REGISTER_ROW
  RegisterBitwise("BitwiseAnd", [](auto a, auto b) { return a & b; });
  RegisterBitwise("BitwiseOr", [](auto a, auto b) { return a | b; });
  RegisterBitwise("BitwiseXor", [](auto a, auto b) { return a ^ b; });
  RegisterBitShift();
  RegisterSumOrMean("Sum", false);
  RegisterSumOrMean("Mean", true);

  RegisterOpKernel({
      .op_type = "Where",
      .name_operand = 1,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kBool && InType(r, 1) == InType(r, 2) &&
                   (ArithType(InType(r, 1)) || InType(r, 1) == DataType::kBool);
          },
      .create =
          [](const KernelRequest& r) {
            return KernelOr([t = InType(r, 1)](const KernelRunArgs& args) {
              switch (SizeOf(t)) {
                case 1:
                  WhereLoop<uint8_t>(args);
                  break;
                case 2:
                  WhereLoop<uint16_t>(args);
                  break;
                case 4:
                  WhereLoop<uint32_t>(args);
                  break;
                default:
                  WhereLoop<uint64_t>(args);
                  break;
              }
              return OkStatus();
            });
          },
  });

  return true;
}();

}  // namespace
}  // namespace kiln::cpu
