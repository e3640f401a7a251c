// Conformance of the elementwise ops (unary, binary, variadic, Where, Clip, PRelu, Cast) against
// double-precision references, for every backend (device backends skip when absent).
#include <cmath>

#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

struct UnaryCase {
  const char* op;
  double lo, hi;
  std::function<double(double)> ref;
  AttributeMap attrs = {};
};

AttributeMap Attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  AttributeMap m;
  for (auto& [k, v] : kv) m.Set(k, v);
  return m;
}

std::vector<UnaryCase> UnaryCases() {
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  auto softplus = [](double x) { return std::log1p(std::exp(x)); };
  return {
      {"Identity", -3, 3, [](double x) { return x; }},
      {"Relu", -3, 3, [](double x) { return x > 0 ? x : 0; }},
      {"LeakyRelu", -3, 3, [](double x) { return x >= 0 ? x : 0.1 * x; }, Attrs({{"alpha", 0.1f}})},
      {"Sigmoid", -6, 6, sig},
      {"Tanh", -3, 3, [](double x) { return std::tanh(x); }},
      {"Erf", -3, 3, [](double x) { return std::erf(x); }},
      {"Exp", -3, 3, [](double x) { return std::exp(x); }},
      {"Log", 0.1, 5, [](double x) { return std::log(x); }},
      {"Sqrt", 0.1, 5, [](double x) { return std::sqrt(x); }},
      {"Reciprocal", 0.5, 4, [](double x) { return 1 / x; }},
      {"Neg", -3, 3, [](double x) { return -x; }},
      {"Abs", -3, 3, [](double x) { return std::fabs(x); }},
      {"Floor", -3, 3, [](double x) { return std::floor(x); }},
      {"Ceil", -3, 3, [](double x) { return std::ceil(x); }},
      {"Round", -3, 3, [](double x) { return std::nearbyint(x); }},
      {"Sign", -3, 3, [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }},
      {"Sin", -3, 3, [](double x) { return std::sin(x); }},
      {"Cos", -3, 3, [](double x) { return std::cos(x); }},
      {"Tan", -1.2, 1.2, [](double x) { return std::tan(x); }},
      {"Asin", -0.95, 0.95, [](double x) { return std::asin(x); }},
      {"Acos", -0.95, 0.95, [](double x) { return std::acos(x); }},
      {"Atan", -3, 3, [](double x) { return std::atan(x); }},
      {"Sinh", -3, 3, [](double x) { return std::sinh(x); }},
      {"Cosh", -3, 3, [](double x) { return std::cosh(x); }},
      {"Asinh", -3, 3, [](double x) { return std::asinh(x); }},
      {"Acosh", 1.05, 4, [](double x) { return std::acosh(x); }},
      {"Atanh", -0.9, 0.9, [](double x) { return std::atanh(x); }},
      {"Softplus", -3, 3, softplus},
      {"Softsign", -3, 3, [](double x) { return x / (1 + std::fabs(x)); }},
      {"Elu", -3, 3, [](double x) { return x >= 0 ? x : 0.5 * (std::exp(x) - 1); },
       Attrs({{"alpha", 0.5f}})},
      {"Selu", -3, 3,
       [](double x) {
         return x > 0 ? 1.0507009873554805 * x
                      : 1.0507009873554805 * 1.6732632423543772 * std::expm1(x);
       }},
      {"Celu", -3, 3,
       [](double x) { return std::max(0.0, x) + std::min(0.0, 2.0 * std::expm1(x / 2.0)); },
       Attrs({{"alpha", 2.0f}})},
      {"HardSigmoid", -4, 4, [](double x) { return std::clamp(0.2 * x + 0.5, 0.0, 1.0); }},
      {"HardSwish", -4, 4, [](double x) { return x * std::clamp(x / 6 + 0.5, 0.0, 1.0); }},
      {"Mish", -3, 3, [=](double x) { return x * std::tanh(softplus(x)); }},
      {"ThresholdedRelu", -3, 3, [](double x) { return x > 1.0 ? x : 0; }},
      {"Gelu", -3, 3, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"Gelu", -3, 3,
       [](double x) {
         return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
       },
       Attrs({{"approximate", std::string("tanh")}})},
  };
}

class UnaryOps : public BackendTest {};

TEST_P(UnaryOps, MatchReferenceInEveryFloatType) {
  for (const UnaryCase& c : UnaryCases()) {
    SCOPED_TRACE(c.op);
    auto ref = c.ref;
    OpTester(c.op, c.attrs)
        .Input(kFloat32, {2, 3, 17}, c.lo, c.hi)
        .FloatTypes(kAllFloats)
        .Tolerance(1e-5, 1e-5)
        .Reference([ref](const std::vector<RefTensor>& in) {
          RefTensor out = in[0];
          for (double& x : out.data) x = ref(x);
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
}

TEST_P(UnaryOps, IntegerNegAbsSign) {
  for (DataType t : {kInt64, kInt32}) {
    for (const char* op : {"Neg", "Abs", "Sign"}) {
      SCOPED_TRACE(op);
      std::string name = op;
      OpTester(op)
          .Input(t, {5, 7}, -9, 9)
          .Reference([name](const std::vector<RefTensor>& in) {
            RefTensor out = in[0];
            for (double& x : out.data) {
              x = name == "Neg" ? -x : name == "Abs" ? std::fabs(x) : (x > 0) - (x < 0);
            }
            return std::vector<RefTensor>{out};
          })
          .Run(GetParam());
    }
  }
}

TEST_P(UnaryOps, NotIsNaNIsInf) {
  OpTester("Not")
      .Input(kBool, {4, 9})
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = in[0];
        for (double& x : out.data) x = x == 0;
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
  Tensor x = MakeTensor(kFloat32, {6}, {1.0, NAN, INFINITY, -INFINITY, -2.0, 0.0});
  OpTester("IsNaN")
      .Input(x)
      .FloatTypes(kAllFloats)
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{6}, {0, 1, 0, 0, 0, 0}}};
      })
      .Run(GetParam());
  OpTester("IsInf", Attrs({{"detect_negative", int64_t{0}}}))
      .Input(x)
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{6}, {0, 0, 1, 0, 0, 0}}};
      })
      .Run(GetParam());
}

TEST_P(UnaryOps, ClipWithOptionalBounds) {
  auto clip = [](double lo, double hi) {
    return [=](const std::vector<RefTensor>& in) {
      RefTensor out = in[0];
      for (double& x : out.data) x = std::min(std::max(x, lo), hi);
      return std::vector<RefTensor>{out};
    };
  };
  OpTester("Clip")
      .Input(kFloat32, {3, 11}, -3, 3)
      .Constant(MakeTensor(kFloat32, {}, {-1.0}))
      .Constant(MakeTensor(kFloat32, {}, {1.5}))
      .FloatTypes(kAllFloats)
      .Reference(clip(-1.0, 1.5))
      .Run(GetParam());
  OpTester("Clip")
      .Input(kFloat32, {3, 11}, -3, 3)
      .Omitted()
      .Constant(MakeTensor(kFloat32, {}, {0.5}))
      .Reference(clip(-INFINITY, 0.5))
      .Run(GetParam());
  OpTester("Clip")
      .Input(kInt64, {20}, -9, 9)
      .Constant(Int64s({}, {-2}))
      .Reference(clip(-2, INFINITY))
      .Run(GetParam());
}

TEST_P(UnaryOps, EveryFloatUnaryInF64) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "f64 unary kernels: CPU only";
  for (const UnaryCase& c : UnaryCases()) {
    if (std::string(c.op) == "Identity") continue;  // a view, no kernel
    SCOPED_TRACE(c.op);
    auto ref = c.ref;
    // FP64 compute; the attributes (alpha, gamma) are FP32 values, hence not 1e-12.
    OpTester(c.op, c.attrs)
        .Input(kFloat64, {2, 3, 17}, c.lo, c.hi)
        .Tolerance(1e-6, 1e-6)
        .Reference([ref](const std::vector<RefTensor>& in) {
          RefTensor out = in[0];
          for (double& v : out.data) v = ref(v);
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
}

TEST_P(UnaryOps, ShrinkWithLambdAndBias) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "Shrink: CPU only (ops.inc)";
  AttributeMap attrs;
  attrs.Set("lambd", 1.5f);
  attrs.Set("bias", 0.5f);
  for (DataType t : {kFloat32, kFloat64}) {
    OpTester("Shrink", attrs)
        .Input(t, {4, 9}, -3, 3)
        .Reference([](const std::vector<RefTensor>& in) {
          RefTensor out = in[0];
          for (double& x : out.data) x = x < -1.5 ? x + 0.5 : (x > 1.5 ? x - 0.5 : 0);
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
}

KILN_INSTANTIATE_BACKENDS(UnaryOps);

// ---- binary, variadic, ternary

using BinFn = std::function<double(double, double)>;

std::vector<RefTensor> RefBinary(const std::vector<RefTensor>& in, const BinFn& f) {
  RefTensor out = RefTensor::Zeros(BroadcastDims(in[0].dims, in[1].dims));
  for (int64_t i = 0; i < out.size(); ++i) {
    out[i] = f(in[0][BroadcastIndex(in[0].dims, out.dims, i)],
               in[1][BroadcastIndex(in[1].dims, out.dims, i)]);
  }
  return {out};
}

// Shape pairs covering identity, row broadcast, column broadcast, scalar and both-sides broadcast.
const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> kShapes = {
    {{2, 3, 8}, {2, 3, 8}}, {{2, 3, 8}, {8}},       {{4, 1}, {4, 5}},
    {{2, 3, 8}, {}},        {{3, 1, 5}, {1, 4, 1}}, {{2, 4, 3, 3}, {1, 4, 1, 1}}};

class BinaryOps : public BackendTest {};

TEST_P(BinaryOps, FloatArithmeticAndComparisons) {
  std::vector<std::pair<const char*, BinFn>> ops = {
      {"Add", [](double a, double b) { return a + b; }},
      {"Sub", [](double a, double b) { return a - b; }},
      {"Mul", [](double a, double b) { return a * b; }},
      {"Div", [](double a, double b) { return a / b; }},
      {"Pow", [](double a, double b) { return std::pow(a, b); }},
      {"Max", [](double a, double b) { return std::max(a, b); }},
      {"Min", [](double a, double b) { return std::min(a, b); }},
      {"Sum", [](double a, double b) { return a + b; }},
      {"Mean", [](double a, double b) { return (a + b) / 2; }},
      {"Equal", [](double a, double b) { return double(a == b); }},
      {"Less", [](double a, double b) { return double(a < b); }},
      {"LessOrEqual", [](double a, double b) { return double(a <= b); }},
      {"Greater", [](double a, double b) { return double(a > b); }},
      {"GreaterOrEqual", [](double a, double b) { return double(a >= b); }},
      {"PRelu", [](double a, double b) { return a < 0 ? a * b : a; }},
  };
  for (auto& [op, f] : ops) {
    for (auto& [sa, sb] : kShapes) {
      std::string name = op;
      if (name == "PRelu" && BroadcastDims(sa, sb) != sa) continue;
      SCOPED_TRACE(fmt::format("{} {} {}", op, fmt::join(sa, "x"), fmt::join(sb, "x")));
      // Positive, well-away-from-zero operands keep Div and Pow well conditioned; comparisons
      // use small integers so that equal values occur.
      bool cmp = name.find("Equal") != std::string::npos || name.find("Less") == 0 ||
                 name.find("Greater") == 0;
      double lo = name == "Pow" || name == "Div" ? 0.5 : -3, hi = cmp ? 2 : 3;
      OpTester t(op);
      if (cmp) {
        // Integral float values so ties happen.
        std::vector<double> va(NumElements(sa)), vb(NumElements(sb));
        for (size_t i = 0; i < va.size(); ++i) va[i] = static_cast<double>(i % 3);
        for (size_t i = 0; i < vb.size(); ++i) vb[i] = static_cast<double>((i * 7 + 1) % 3);
        t.Input(MakeTensor(kFloat32, sa, va)).Input(MakeTensor(kFloat32, sb, vb));
      } else {
        t.Input(kFloat32, sa, lo, hi).Input(kFloat32, sb, lo, hi);
      }
      BinFn fn = f;
      t.FloatTypes(kAllFloats)
          .Tolerance(1e-5, 1e-5)
          .Reference([fn](const std::vector<RefTensor>& in) { return RefBinary(in, fn); })
          .Run(GetParam());
    }
  }
}

TEST_P(BinaryOps, IntegerArithmeticTruncatesAndComparisons) {
  std::vector<std::pair<const char*, BinFn>> ops = {
      {"Add", [](double a, double b) { return a + b; }},
      {"Sub", [](double a, double b) { return a - b; }},
      {"Mul", [](double a, double b) { return a * b; }},
      {"Div", [](double a, double b) { return b == 0 ? 0 : std::trunc(a / b); }},
      {"Max", [](double a, double b) { return std::max(a, b); }},
      {"Min", [](double a, double b) { return std::min(a, b); }},
      {"Equal", [](double a, double b) { return double(a == b); }},
      {"Greater", [](double a, double b) { return double(a > b); }},
  };
  for (DataType type : {kInt64, kInt32}) {
    for (auto& [op, f] : ops) {
      SCOPED_TRACE(fmt::format("{} {}", op, ToString(type)));
      BinFn fn = f;
      OpTester(op)
          .Input(type, {3, 1, 5}, -9, 9)
          .Input(type, {4, 1}, -4, 4)
          .Reference([fn](const std::vector<RefTensor>& in) { return RefBinary(in, fn); })
          .Run(GetParam());
    }
  }
}

TEST_P(BinaryOps, ModBothConventions) {
  auto py_mod = [](double a, double b) {
    double m = std::fmod(a, b);
    return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
  };
  OpTester("Mod")
      .Input(kInt64, {4, 6}, -20, 20)
      .Input(MakeTensor(kInt64, {6}, {3, -3, 7, -7, 5, 2}))
      .Reference([&](const std::vector<RefTensor>& in) { return RefBinary(in, py_mod); })
      .Run(GetParam());
  AttributeMap fmod;
  fmod.Set("fmod", int64_t{1});
  OpTester("Mod", fmod)
      .Input(kFloat32, {4, 6}, -20, 20)
      .Input(MakeTensor(kFloat32, {6}, {3, -3, 7.5, -7, 5, 2}))
      .Reference([](const std::vector<RefTensor>& in) {
        return RefBinary(in, [](double a, double b) { return std::fmod(a, b); });
      })
      .Run(GetParam());
}

TEST_P(BinaryOps, PowWithIntegerExponent) {
  OpTester("Pow")
      .Input(kFloat32, {3, 4}, -2, 2)
      .Input(MakeTensor(kInt64, {4}, {0, 1, 2, 3}))
      .Reference([](const std::vector<RefTensor>& in) {
        return RefBinary(in, [](double a, double b) { return std::pow(a, b); });
      })
      .Run(GetParam());
}

TEST_P(BinaryOps, LogicOnBools) {
  std::vector<std::pair<const char*, BinFn>> ops = {
      {"And", [](double a, double b) { return double(a && b); }},
      {"Or", [](double a, double b) { return double(a || b); }},
      {"Xor", [](double a, double b) { return double((a != 0) != (b != 0)); }},
  };
  for (auto& [op, f] : ops) {
    BinFn fn = f;
    OpTester(op)
        .Input(kBool, {3, 8})
        .Input(kBool, {8})
        .Reference([fn](const std::vector<RefTensor>& in) { return RefBinary(in, fn); })
        .Run(GetParam());
  }
}

TEST_P(BinaryOps, VariadicWithThreeInputs) {
  OpTester("Sum")
      .Input(kFloat32, {2, 3, 4})
      .Input(kFloat32, {3, 1})
      .Input(kFloat32, {4})
      .FloatTypes(kAllFloats)
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = RefTensor::Zeros({2, 3, 4});
        for (int64_t i = 0; i < out.size(); ++i) {
          for (const RefTensor& t : in) out[i] += t[BroadcastIndex(t.dims, out.dims, i)];
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
  OpTester("Max")
      .Input(kFloat32, {5})
      .Reference([](const std::vector<RefTensor>& in) { return std::vector<RefTensor>{in[0]}; })
      .Run(GetParam());
}

TEST_P(BinaryOps, WhereBroadcastsAllThree) {
  auto ref = [](const std::vector<RefTensor>& in) {
    std::vector<int64_t> dims = BroadcastDims(BroadcastDims(in[0].dims, in[1].dims), in[2].dims);
    RefTensor out = RefTensor::Zeros(dims);
    for (int64_t i = 0; i < out.size(); ++i) {
      out[i] = in[0][BroadcastIndex(in[0].dims, dims, i)] != 0
                   ? in[1][BroadcastIndex(in[1].dims, dims, i)]
                   : in[2][BroadcastIndex(in[2].dims, dims, i)];
    }
    return std::vector<RefTensor>{out};
  };
  OpTester("Where")
      .Input(kBool, {1, 1, 4, 4})
      .Input(kFloat32, {2, 3, 4, 4})
      .Constant(MakeTensor(kFloat32, {}, {-3.4e38}))
      .FloatTypes({kFloat32})
      .Reference(ref)
      .Run(GetParam());
  OpTester("Where")
      .Input(kBool, {4})
      .Input(kFloat32, {3, 4})
      .Input(kFloat32, {3, 1})
      .FloatTypes(kAllFloats)
      .Reference(ref)
      .Run(GetParam());
  OpTester("Where")
      .Input(kBool, {3})
      .Input(kInt64, {3}, -5, 5)
      .Input(kInt64, {3}, 10, 20)
      .Reference(ref)
      .Run(GetParam());
}

TEST_P(BinaryOps, CastBetweenAllTypes) {
  std::vector<DataType> types = {kFloat32, kFloat16, kBFloat16, kInt8,
                                 kUInt8,   kInt32,   kInt64,    kBool};
  const std::map<DataType, int64_t> onnx = {{kFloat32, 1}, {kFloat16, 10}, {kBFloat16, 16},
                                            {kInt8, 3},    {kUInt8, 2},    {kInt32, 6},
                                            {kInt64, 7},   {kBool, 9}};
  for (DataType from : types) {
    for (DataType to : types) {
      SCOPED_TRACE(fmt::format("{} -> {}", ToString(from), ToString(to)));
      AttributeMap attrs;
      attrs.Set("to", onnx.at(to));
      // Values that every type holds exactly (after rounding to the source type).
      double lo = from == kUInt8 || to == kUInt8 ? 0 : -100, hi = 100;
      OpTester("Cast", attrs)
          .Input(from, {4, 9}, lo, hi)
          .FloatTypes({from})
          .Reference([to](const std::vector<RefTensor>& in) {
            RefTensor out = in[0];
            for (double& x : out.data) {
              if (to == kBool)
                x = x != 0;
              else if (IsInteger(to))
                x = std::trunc(x);
              else if (to == kFloat16)
                x = HalfBitsToFloat(FloatToHalfBits(static_cast<float>(x)));
              else if (to == kBFloat16)
                x = BFloat16BitsToFloat(FloatToBFloat16Bits(static_cast<float>(x)));
            }
            return std::vector<RefTensor>{out};
          })
          .Run(GetParam());
    }
  }
}

// f64 and the 16/32/64-bit integer types beyond the index types: CPU kernels only (the CUDA
// backend's elementwise kernels serve f32/f16/bf16 and the index types).
constexpr DataType kWideTypes[] = {kFloat64, kInt16, kUInt16, kUInt32, kUInt64, kInt8, kUInt8};

TEST_P(BinaryOps, ArithmeticInF64AndEveryIntegerType) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "f64 and 16/32/64-bit types: CPU only";
  std::vector<std::pair<const char*, BinFn>> ops = {
      {"Add", [](double a, double b) { return a + b; }},
      {"Mul", [](double a, double b) { return a * b; }},
      {"Max", [](double a, double b) { return std::max(a, b); }},
      {"Min", [](double a, double b) { return std::min(a, b); }},
      {"Equal", [](double a, double b) { return double(a == b); }},
      {"Less", [](double a, double b) { return double(a < b); }},
      {"GreaterOrEqual", [](double a, double b) { return double(a >= b); }},
  };
  for (DataType type : kWideTypes) {
    const bool is_float = type == kFloat64;
    for (auto& [op, f] : ops) {
      SCOPED_TRACE(fmt::format("{} {}", op, ToString(type)));
      BinFn fn = f;
      // Unsigned operands stay non-negative; f64 ones are fractional.
      OpTester(op)
          .Input(type, {3, 1, 5}, 0, 9.5)
          .Input(type, {4, 1}, 0, 4.5)
          .Tolerance(is_float ? 1e-12 : 0, is_float ? 1e-12 : 0)
          .Reference([fn](const std::vector<RefTensor>& in) { return RefBinary(in, fn); })
          .Run(GetParam());
    }
    // Sub and Div with the larger operand first (no unsigned wrap); Div truncates integers.
    SCOPED_TRACE(ToString(type));
    OpTester("Sub")
        .Input(MakeTensor(type, {4}, {9, 7, 120, 100}))
        .Input(MakeTensor(type, {4}, {2, 7, 13, 99}))
        .Reference([](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{4}, {7, 0, 107, 1}}};
        })
        .Run(GetParam());
    OpTester("Div")
        .Input(MakeTensor(type, {4}, {9, 7, 100, 3}))
        .Input(MakeTensor(type, {4}, {2, 7, 8, 4}))
        .Reference([is_float](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{4},
                                         is_float ? std::vector<double>{4.5, 1, 12.5, 0.75}
                                                  : std::vector<double>{4, 1, 12, 0}}};
        })
        .Run(GetParam());
  }
}

TEST_P(BinaryOps, ModAndPowInF64AndUnsignedTypes) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "f64 and 16/32/64-bit types: CPU only";
  AttributeMap fmod;
  fmod.Set("fmod", int64_t{1});
  OpTester("Mod", fmod)
      .Input(MakeTensor(kFloat64, {4}, {-4.3, 7.2, 5.0, -4.3}))
      .Input(MakeTensor(kFloat64, {4}, {2.1, -3.4, 2.5, -2.1}))
      .Reference([](const std::vector<RefTensor>& in) {
        return RefBinary(in, [](double a, double b) { return std::fmod(a, b); });
      })
      .Tolerance(1e-12, 1e-12)
      .Run(GetParam());
  for (DataType type : {kUInt16, kUInt32, kUInt64}) {
    SCOPED_TRACE(ToString(type));
    OpTester("Mod")
        .Input(MakeTensor(type, {4}, {4, 7, 9, 3}))
        .Input(MakeTensor(type, {4}, {2, 4, 5, 0}))
        .Reference([](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{4}, {0, 3, 4, 0}}};
        })
        .Run(GetParam());
    // f32 base, unsigned exponent (ONNX's T1).
    OpTester("Pow")
        .Input(MakeTensor(kFloat32, {3}, {1.5, 2, -3}))
        .Input(MakeTensor(type, {3}, {2, 3, 3}))
        .Reference([](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{3}, {2.25, 8, -27}}};
        })
        .Run(GetParam());
  }
}

TEST_P(BinaryOps, BitwiseOpsOnIntegers) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "bitwise ops: CPU only (ops.inc)";
  for (DataType type : {kInt8, kUInt8, kInt16, kUInt16, kInt32, kUInt32, kInt64, kUInt64}) {
    SCOPED_TRACE(ToString(type));
    // Column broadcast against a row; values in [0, 100] so every type holds them.
    const std::vector<double> a = {12, 5, 100, 0, 7, 64};
    const std::vector<double> b = {10, 3};
    auto run = [&](const char* op, auto f) {
      OpTester(op)
          .Input(MakeTensor(type, {3, 2}, a))
          .Input(MakeTensor(type, {2}, b))
          .Reference([f](const std::vector<RefTensor>& in) {
            return RefBinary(in, [f](double x, double y) {
              return static_cast<double>(f(static_cast<int64_t>(x), static_cast<int64_t>(y)));
            });
          })
          .Run(GetParam());
    };
    run("BitwiseAnd", [](int64_t x, int64_t y) { return x & y; });
    run("BitwiseOr", [](int64_t x, int64_t y) { return x | y; });
    run("BitwiseXor", [](int64_t x, int64_t y) { return x ^ y; });
  }
  // Not: ~x in the type's width.
  OpTester("BitwiseNot")
      .Input(MakeTensor(kUInt8, {3}, {0, 1, 200}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{3}, {255, 254, 55}}};
      })
      .Run(GetParam());
  OpTester("BitwiseNot")
      .Input(MakeTensor(kInt16, {3}, {0, 5, -7}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{3}, {-1, -6, 6}}};
      })
      .Run(GetParam());
}

TEST_P(BinaryOps, BitShiftBothDirections) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "BitShift: CPU only (ops.inc)";
  for (DataType type : {kUInt8, kUInt16, kUInt32, kUInt64}) {
    SCOPED_TRACE(ToString(type));
    const double width = 8.0 * static_cast<double>(SizeOf(type));
    AttributeMap left, right;
    left.Set("direction", std::string("LEFT"));
    right.Set("direction", std::string("RIGHT"));
    OpTester("BitShift", left)
        .Input(MakeTensor(type, {4}, {16, 4, 1, 3}))
        .Input(MakeTensor(type, {4}, {1, 2, 3, width}))
        .Reference([](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{4}, {32, 16, 8, 0}}};
        })
        .Run(GetParam());
    OpTester("BitShift", right)
        .Input(MakeTensor(type, {4}, {16, 4, 1, 3}))
        .Input(MakeTensor(type, {4}, {1, 2, 3, width}))
        .Reference([](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{4}, {8, 1, 0, 0}}};
        })
        .Run(GetParam());
  }
}

TEST_P(BinaryOps, CastWithF64AndWideIntegers) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "f64 and 16/32/64-bit types: CPU only";
  const std::map<DataType, int64_t> onnx = {{kFloat32, 1}, {kFloat16, 10}, {kFloat64, 11},
                                            {kInt16, 5},   {kUInt16, 4},   {kUInt32, 12},
                                            {kUInt64, 13}, {kInt64, 7},    {kBool, 9}};
  for (const auto& [from, from_code] : onnx) {
    for (const auto& [to, to_code] : onnx) {
      SCOPED_TRACE(fmt::format("{} -> {}", ToString(from), ToString(to)));
      AttributeMap attrs;
      attrs.Set("to", to_code);
      // Non-negative values every type holds (after rounding to the source type).
      OpTester("Cast", attrs)
          .Input(from, {3, 5}, 0, 100)
          .FloatTypes({IsFloat(from) ? from : kFloat32})
          .Reference([to](const std::vector<RefTensor>& in) {
            RefTensor out = in[0];
            for (double& x : out.data) {
              if (to == kBool)
                x = x != 0;
              else if (IsInteger(to))
                x = std::trunc(x);
              else if (to == kFloat16)
                x = HalfBitsToFloat(FloatToHalfBits(static_cast<float>(x)));
              else if (to == kFloat32)
                x = static_cast<float>(x);
            }
            return std::vector<RefTensor>{out};
          })
          .Run(GetParam());
    }
  }
}

TEST_P(BinaryOps, BitCastKeepsBytesAndEyeLikeIsTyped) {
  if (GetParam() != BackendKind::kCpu) GTEST_SKIP() << "BitCast, EyeLike: CPU only (ops.inc)";
  AttributeMap to_i32;
  to_i32.Set("to", int64_t{6});
  OpTester("BitCast", to_i32)
      .Input(MakeTensor(kFloat32, {3}, {1.0, -2.0, 0.0}))
      .Reference([](const std::vector<RefTensor>&) {
        // IEEE-754 bits of 1.0f, -2.0f, 0.0f as int32.
        return std::vector<RefTensor>{{{3}, {1065353216.0, -1073741824.0, 0.0}}};
      })
      .Run(GetParam());
  AttributeMap to_i16;
  to_i16.Set("to", int64_t{5});
  OpTester("BitCast", to_i16)
      .Input(MakeTensor(kUInt16, {3}, {1, 65535, 32768}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{3}, {1, -1, -32768}}};
      })
      .Run(GetParam());
  for (int64_t k : {0, 1, -2}) {
    SCOPED_TRACE(k);
    AttributeMap attrs;
    attrs.Set("k", k);
    attrs.Set("dtype", int64_t{11});  // double
    OpTester("EyeLike", attrs)
        .Input(kInt32, {3, 4}, 0, 9)
        .Reference([k](const std::vector<RefTensor>&) {
          RefTensor out = RefTensor::Zeros({3, 4});
          for (int64_t i = 0; i < 3; ++i) {
            if (i + k >= 0 && i + k < 4) out[i * 4 + i + k] = 1;
          }
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
}

KILN_INSTANTIATE_BACKENDS(BinaryOps);

}  // namespace
}  // namespace kiln::testing
