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

KILN_INSTANTIATE_BACKENDS(BinaryOps);

}  // namespace
}  // namespace kiln::testing
