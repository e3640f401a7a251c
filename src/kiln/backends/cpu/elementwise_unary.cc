// Elementwise unary ops and activations on the CPU, from the table both backends share
// (ops/unary_ops.inc: each op a name and a scalar formula, unary_formula.h; attribute defaults
// from ops.inc). FP32 compute (f16/bf16 through the wrapper), FP64 for f64; the ops that ONNX
// defines on integers or bools get those paths too. Clip reads min/max inputs; BitwiseNot is
// integers only; Shrink (attributes lambd and bias) runs f32 and f64.
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/backends/cpu/unary_formula.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

template <typename In, typename Out, typename F>
Status MapUnary(const KernelRunArgs& a, F f) {
  const In* x = a.inputs[0].as<const In>();
  Out* y = a.outputs[0].as<Out>();
  ParallelRows(a.outputs[0].num_elements(), 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
  return OkStatus();
}

// The op's parameters with their defaults from ops.inc (0 for an op that declares none).
UnaryParams ReadParams(const Node& node) {
  const OpType op = OpTypeOf(node);
  UnaryParams p;
  p.alpha = DeclaredFloat(op, node.attrs(), "alpha");
  p.beta = DeclaredFloat(op, node.attrs(), "beta");
  p.gamma = DeclaredFloat(op, node.attrs(), "gamma");
  p.tanh_gelu = op == OpType::kGelu && attrs::Gelu::approximate(node) == "tanh";
  return p;
}

bool SignedInt(DataType t) {
  return t == DataType::kInt64 || t == DataType::kInt32 || t == DataType::kInt16 ||
         t == DataType::kInt8;
}

template <typename T>
Status RunIntUnary(std::string_view op, const KernelRunArgs& a) {
#define KILN_UNARY_OP(Name, formula)
#define KILN_INT_UNARY_OP(Name, formula) \
  if (op == #Name) return MapUnary<T, T>(a, [](T x) -> T { return static_cast<T>(formula); });
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  return MakeError(ErrorCode::kKernelFailed, "no integer path for {}", op);
}

bool HasIntPath(std::string_view op) {
#define KILN_UNARY_OP(Name, formula)
#define KILN_INT_UNARY_OP(Name, formula) \
  if (op == #Name) return true;
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  return false;
}

// `fn` is the table's lambda; taking its type (not a function pointer) lets the element loop
// inline and vectorise it.
template <typename Fn>
void RegisterFloatUnary(const char* op, Fn fn) {
  std::string name = op;
  RegisterOpKernel({
      .op_type = name,
      .accepts =
          [name](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return t == DataType::kFloat32 || t == DataType::kFloat64 ||
                   (HasIntPath(name) && SignedInt(t));
          },
      .create =
          [name, fn](const KernelRequest& r) {
            UnaryParams p = ReadParams(*r.node);
            DataType t = InType(r, 0);
            return KernelOr([name, p, fn, t](const KernelRunArgs& a) -> Status {
              switch (t) {
                case DataType::kInt64:
                  return RunIntUnary<int64_t>(name, a);
                case DataType::kInt32:
                  return RunIntUnary<int32_t>(name, a);
                case DataType::kInt16:
                  return RunIntUnary<int16_t>(name, a);
                case DataType::kInt8:
                  return RunIntUnary<int8_t>(name, a);
                case DataType::kFloat64:
                  return MapUnary<double, double>(a, [&](double x) { return fn(x, p); });
                default:
                  return MapUnary<float, float>(a, [&](float x) { return fn(x, p); });
              }
            });
          },
  });
}

template <typename T>
Status RunClip(const KernelRunArgs& a) {
  T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  if (a.inputs.size() > 1 && a.inputs[1].data) lo = a.inputs[1].as<const T>()[0];
  if (a.inputs.size() > 2 && a.inputs[2].data) hi = a.inputs[2].as<const T>()[0];
  // ONNX: with min > max every element becomes max.
  return MapUnary<T, T>(a, [lo, hi](T x) { return std::min(std::max(x, lo), hi); });
}

const bool kRegistered = [] {
#define KILN_UNARY_OP(Name, formula) \
  RegisterFloatUnary(#Name,          \
                     [](auto x, const UnaryParams& p) { return Unary<OpType::k##Name>(x, p); });
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  RegisterOpKernel({
      .op_type = "Clip",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return t == DataType::kFloat32 || SignedInt(t) || t == DataType::kUInt8;
          },
      .create =
          [](const KernelRequest& r) {
            return KernelOr([t = InType(r, 0)](const KernelRunArgs& a) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (std::is_same_v<T, bool>) {
                  return MakeError(ErrorCode::kKernelFailed, "Clip has no bool path");
                } else {
                  return RunClip<T>(a);
                }
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "Not",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return InType(r, 0) == DataType::kBool; },
      .create =
          [](const KernelRequest&) {
            return KernelOr([](const KernelRunArgs& a) {
              return MapUnary<uint8_t, uint8_t>(a, [](uint8_t x) -> uint8_t { return x ? 0 : 1; });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "Shrink",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 || InType(r, 0) == DataType::kFloat64;
          },
      .create =
          [](const KernelRequest& r) {
            const double lambd = attrs::Shrink::lambd(*r.node), bias = attrs::Shrink::bias(*r.node);
            return KernelOr([t = InType(r, 0), lambd, bias](const KernelRunArgs& a) -> Status {
              auto shrink = [&](auto x) -> decltype(x) {
                using T = decltype(x);
                return x < -lambd ? static_cast<T>(x + bias)
                                  : (x > lambd ? static_cast<T>(x - bias) : T(0));
              };
              if (t == DataType::kFloat64) return MapUnary<double, double>(a, shrink);
              return MapUnary<float, float>(a, shrink);
            });
          },
  });
  RegisterOpKernel({
      .op_type = "BitwiseNot",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return IsInteger(InType(r, 0)); },
      .create =
          [](const KernelRequest& r) {
            return KernelOr([t = InType(r, 0)](const KernelRunArgs& a) {
              return DispatchNumeric(t, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                  return MapUnary<T, T>(a, [](T x) { return static_cast<T>(~x); });
                } else {
                  return MakeError(ErrorCode::kKernelFailed, "BitwiseNot has no {} path",
                                   ToString(t));
                }
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "IsNaN",
      .accepts = [](const KernelRequest& r) { return InType(r, 0) == DataType::kFloat32; },
      .create =
          [](const KernelRequest&) {
            return KernelOr([](const KernelRunArgs& a) {
              return MapUnary<float, uint8_t>(a, [](float x) -> uint8_t { return std::isnan(x); });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "IsInf",
      .accepts = [](const KernelRequest& r) { return InType(r, 0) == DataType::kFloat32; },
      .create =
          [](const KernelRequest& r) {
            bool neg = attrs::IsInf::detect_negative(*r.node) != 0;
            bool pos = attrs::IsInf::detect_positive(*r.node) != 0;
            return KernelOr([neg, pos](const KernelRunArgs& a) {
              return MapUnary<float, uint8_t>(a, [&](float x) -> uint8_t {
                return std::isinf(x) && ((x > 0 && pos) || (x < 0 && neg));
              });
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
