// Broadcasting elementwise ops on the CPU: arithmetic, comparisons and logic (binary), Sum/Mean/
// Max/Min (variadic), Where (ternary) and PRelu. One table line per op: name and scalar lambda.
// Floats compute in FP32 (f16/bf16 through the wrapper); integer and bool paths where ONNX
// defines them (integer Div truncates, as ONNX says).
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
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

template <typename T>
T IntPow(T base, T exp) {
  if (exp < 0) return base == 1 ? 1 : (base == -1 ? (exp % 2 ? -1 : 1) : 0);
  T r = 1;
  for (; exp > 0; exp >>= 1, base *= base) {
    if (exp & 1) r *= base;
  }
  return r;
}

// Arithmetic: name, expression over a, b of type T (a C++ arithmetic type).
#define KILN_CPU_ARITH_OPS(X) \
  X(Add, a + b)               \
  X(Sub, a - b)               \
  X(Mul, a* b)                \
  X(Div, std::is_integral_v<T> ? (b == 0 ? T(0) : static_cast<T>(a / b)) : static_cast<T>(a / b))

#define KILN_CPU_COMPARE_OPS(X) \
  X(Equal, a == b)              \
  X(Less, a < b)                \
  X(LessOrEqual, a <= b)        \
  X(Greater, a > b)             \
  X(GreaterOrEqual, a >= b)

#define KILN_CPU_LOGIC_OPS(X) \
  X(And, a&& b)               \
  X(Or, a || b)               \
  X(Xor, (a != 0) != (b != 0))

bool ArithType(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kInt64 || t == DataType::kInt32 ||
         t == DataType::kInt8 || t == DataType::kUInt8;
}
bool SameInputs(const KernelRequest& r) {
  for (const auto& d : r.inputs) {
    if (d.dtype != InType(r, 0)) return false;
  }
  return true;
}

template <typename Op>
void RegisterTyped(const char* name, bool allow_bool, bool float_ok, Op op) {
  RegisterOpKernel({
      .op_type = name,
      .accepts =
          [allow_bool, float_ok](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return SameInputs(r) &&
                   (t == DataType::kBool ? allow_bool
                                         : (t == DataType::kFloat32 ? float_ok : ArithType(t)));
          },
      .create =
          [op](const KernelRequest& r) {
            return KernelOr([op, t = InType(r, 0)](const KernelRunArgs& a) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                op(tag, a);
                return OkStatus();
              });
            });
          },
  });
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

template <typename T>
T ModOf(T a, T b, bool fmod) {
  if constexpr (std::is_floating_point_v<T>) {
    if (fmod) return std::fmod(a, b);
    T m = std::fmod(a, b);
    return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
  } else {
    if (b == 0) return 0;
    T m = static_cast<T>(a % b);
    if (!fmod && m != 0 && ((m < 0) != (b < 0))) m = static_cast<T>(m + b);
    return m;
  }
}

const bool kRegistered = [] {
#define KILN_REGISTER_ARITH(Name, expr)                                              \
  RegisterTyped(#Name, false, true, [](auto tag, const KernelRunArgs& args) {        \
    using T = typename decltype(tag)::type;                                          \
    if constexpr (!std::is_same_v<T, bool>) {                                        \
      BinaryLoop<T, T, T>(args, [](T a, T b) -> T { return static_cast<T>(expr); }); \
    }                                                                                \
  });
  KILN_CPU_ARITH_OPS(KILN_REGISTER_ARITH)
#undef KILN_REGISTER_ARITH

#define KILN_REGISTER_COMPARE(Name, expr)                                                    \
  RegisterTyped(#Name, std::string_view(#Name) == "Equal", true,                             \
                [](auto tag, const KernelRunArgs& args) {                                    \
                  using T = typename decltype(tag)::type;                                    \
                  BinaryLoop<T, T, uint8_t>(args, [](T a, T b) -> uint8_t { return expr; }); \
                });
  KILN_CPU_COMPARE_OPS(KILN_REGISTER_COMPARE)
#undef KILN_REGISTER_COMPARE

#define KILN_REGISTER_LOGIC(Name, expr)                                                      \
  RegisterOpKernel({.op_type = #Name,                                                        \
                    .float_wrap = false,                                                     \
                    .accepts =                                                               \
                        [](const KernelRequest& r) {                                         \
                          return InType(r, 0) == DataType::kBool &&                          \
                                 InType(r, 1) == DataType::kBool;                            \
                        },                                                                   \
                    .create =                                                                \
                        [](const KernelRequest&) {                                           \
                          return KernelOr([](const KernelRunArgs& args) {                    \
                            BinaryLoop<uint8_t, uint8_t, uint8_t>(                           \
                                args, [](uint8_t a, uint8_t b) -> uint8_t { return expr; }); \
                            return OkStatus();                                               \
                          });                                                                \
                        }});
  KILN_CPU_LOGIC_OPS(KILN_REGISTER_LOGIC)
#undef KILN_REGISTER_LOGIC

  // Variadic ops.
#define KILN_REGISTER_VARIADIC(Name, expr, mean)                              \
  RegisterTyped(#Name, false, true, [](auto tag, const KernelRunArgs& args) { \
    using T = typename decltype(tag)::type;                                   \
    if constexpr (!std::is_same_v<T, bool>) {                                 \
      Variadic<T>(                                                            \
          args, [](T a, T b) -> T { return expr; }, mean);                    \
    }                                                                         \
  });
  KILN_REGISTER_VARIADIC(Sum, static_cast<T>(a + b), false)
  KILN_REGISTER_VARIADIC(Mean, static_cast<T>(a + b), true)
  // NaN propagates through Max/Min, as in ONNX Runtime.
  KILN_REGISTER_VARIADIC(Max, (a > b || a != a) ? a : b, false)
  KILN_REGISTER_VARIADIC(Min, (a < b || a != a) ? a : b, false)
#undef KILN_REGISTER_VARIADIC

  RegisterOpKernel({
      .op_type = "Mod",
      .accepts = [](const KernelRequest& r) { return SameInputs(r) && ArithType(InType(r, 0)); },
      .create =
          [](const KernelRequest& r) {
            bool fmod = attrs::Mod::fmod(*r.node) != 0;
            return KernelOr([fmod, t = InType(r, 0)](const KernelRunArgs& args) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (!std::is_same_v<T, bool>) {
                  BinaryLoop<T, T, T>(args, [fmod](T a, T b) { return ModOf(a, b, fmod); });
                }
                return OkStatus();
              });
            });
          },
  });

  // Pow: the exponent may have another type than the base.
  RegisterOpKernel({
      .op_type = "Pow",
      .accepts =
          [](const KernelRequest& r) {
            DataType b = InType(r, 0), e = InType(r, 1);
            if (b == DataType::kFloat32) return e == DataType::kFloat32 || IsIndexType(e);
            return IsIndexType(b) && (IsIndexType(e) || e == DataType::kFloat32);
          },
      .create =
          [](const KernelRequest& r) {
            return KernelOr([b = InType(r, 0), e = InType(r, 1)](const KernelRunArgs& args) {
              auto fpow = [](double x, double y) { return std::pow(x, y); };
              if (b == DataType::kFloat32) {
                if (e == DataType::kFloat32) {
                  BinaryLoop<float, float, float>(args, [](float x, float y) {
                    return y == 2.f ? x * x : (y == 0.5f ? std::sqrt(x) : std::pow(x, y));
                  });
                } else if (e == DataType::kInt64) {
                  BinaryLoop<float, int64_t, float>(
                      args, [&](float x, int64_t y) { return static_cast<float>(fpow(x, y)); });
                } else {
                  BinaryLoop<float, int32_t, float>(
                      args, [&](float x, int32_t y) { return static_cast<float>(fpow(x, y)); });
                }
                return OkStatus();
              }
              return DispatchNumeric(b, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, int32_t>) {
                  if (e == DataType::kFloat32) {
                    BinaryLoop<T, float, T>(
                        args, [&](T x, float y) { return static_cast<T>(fpow(x, y)); });
                  } else if (e == DataType::kInt64) {
                    BinaryLoop<T, int64_t, T>(
                        args, [](T x, int64_t y) { return IntPow<T>(x, static_cast<T>(y)); });
                  } else {
                    BinaryLoop<T, int32_t, T>(
                        args, [](T x, int32_t y) { return IntPow<T>(x, static_cast<T>(y)); });
                  }
                }
                return OkStatus();
              });
            });
          },
  });

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

  RegisterOpKernel({
      .op_type = "PRelu",
      .accepts =
          [](const KernelRequest& r) {
            return SameInputs(r) &&
                   (InType(r, 0) == DataType::kFloat32 || InType(r, 0) == DataType::kInt64 ||
                    InType(r, 0) == DataType::kInt32);
          },
      .create =
          [](const KernelRequest& r) {
            return KernelOr([t = InType(r, 0)](const KernelRunArgs& args) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (!std::is_same_v<T, bool>) {
                  BinaryLoop<T, T, T>(args, [](T x, T s) -> T { return x < 0 ? x * s : x; });
                }
                return OkStatus();
              });
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
