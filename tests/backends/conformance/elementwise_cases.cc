// Op conformance cases, elementwise family: Unary activations, broadcasting binary ops (both from
// the op lists, ops/unary_ops.inc and binary_ops.inc), Cast,
// variadic Sum/Mean/Max/Min, integer Neg/Abs/Sign, IsNaN/IsInf. Each case is a one-node graph that
// the suite (op_conformance_test.cc) runs on every backend built here, every tactic, on fresh
// random inputs, against the CPU backend (see op_cases.h).
#include "op_cases.h"

#include <map>
#include <utility>

#include "kiln/ops/binary_ops.h"

namespace kiln::testing {

std::vector<OpCase> ElementwiseCases() {
  std::vector<OpCase> c;
  // `add`: a case each backend runs where it has a tactic; `must`: every backend must have one.
  [[maybe_unused]] auto add = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), false});
  };
  [[maybe_unused]] auto must = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), true});
  };

  // ---- unary ops: every row of ops/unary_ops.inc (a new row is a case here with no edit), plus
  // attribute variants; odd, vector-tail, large and single-element shapes ----------------------
  struct U {
    std::string op;
    double lo, hi;
    AttributeMap attrs;
  };
  // Input ranges where [-2, 2] leaves the op's domain or misses its shape.
  const std::map<std::string, std::pair<double, double>> ranges = {
      {"Sigmoid", {-6, 6}},        {"Tanh", {-3, 3}},         {"Log", {0.1, 4}},
      {"Sqrt", {0.01, 4}},         {"Reciprocal", {0.25, 4}}, {"Softplus", {-3, 3}},
      {"HardSigmoid", {-4, 4}},    {"HardSwish", {-5, 5}},    {"Gelu", {-3, 3}},
      {"Mish", {-3, 3}},           {"Sin", {-4, 4}},          {"Cos", {-4, 4}},
      {"ThresholdedRelu", {-3, 3}}};
  std::vector<U> unary;
  auto unary_op = [&](const char* op) {
    auto r = ranges.find(op);
    unary.push_back({op,
                     r == ranges.end() ? -2.0 : r->second.first,
                     r == ranges.end() ? 2.0 : r->second.second,
                     {}});
  };
#define KILN_UNARY_OP(Name, formula) unary_op(#Name);
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  unary.push_back({"LeakyRelu", -2, 2, Attrs({{"alpha", 0.1f}})});
  unary.push_back({"HardSigmoid", -4, 4, Attrs({{"alpha", 0.25f}, {"beta", 0.4f}})});
  unary.push_back({"Gelu", -3, 3, Attrs({{"approximate", std::string("tanh")}})});
  unary.push_back({"Elu", -2, 2, Attrs({{"alpha", 0.5f}})});
  unary.push_back({"Celu", -2, 2, Attrs({{"alpha", 0.7f}})});
  unary.push_back({"Selu", -2, 2, Attrs({{"alpha", 1.5f}, {"gamma", 1.1f}})});
  unary.push_back({"ThresholdedRelu", -3, 3, Attrs({{"alpha", 0.5f}})});
  for (const U& u : unary) {
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{2, 3, 17}, std::vector<int64_t>{4099}, std::vector<int64_t>{1}}) {
      std::string name =
          u.op + (u.attrs.size() ? "_attr" : "") + "_" + std::to_string(NumElements(dims));
      must(name, [u, dims] {
        OpTester t(u.op, u.attrs);
        t.Input(kF32, dims, u.lo, u.hi).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
  }
  add("Clip_min_max", [] {
    OpTester t("Clip");
    t.Input(kF32, {3, 33}).Input(F32({}, {-0.5f})).Input(F32({}, {0.75f})).FloatTypes(kAllFloats);
    return t;
  });
  add("Clip_min_only", [] {
    OpTester t("Clip");
    t.Input(kF32, {130}).Input(F32({}, {0.1f})).FloatTypes(kAllFloats);
    return t;
  });
  add("Not", [] {
    OpTester t("Not");
    t.Input(kBool, {5, 7});
    return t;
  });

  // ---- binary ops: every row of ops/binary_ops.inc (a new row is a case here with no edit), by
  // its type class, plus attribute and mixed-type variants --------------------------------------
  struct B {
    std::vector<int64_t> a, b;
  };
  // 6-10: one operand broadcast over the middle dims (CUDA's row-broadcast path): a
  // squeeze-excite scale in NHWC either way round, a bias over rows either way round, and a row of
  // 12 (a whole vector in f32, not in f16/bf16: there the strided path runs).
  std::vector<B> shapes = {{{3, 5, 7}, {3, 5, 7}},
                           {{3, 1, 7}, {5, 1}},
                           {{}, {2, 3}},
                           {{256, 1031}, {256, 1031}},
                           {{2, 3, 4, 5}, {3, 1, 1}},
                           {{1001}, {1}},
                           {{2, 6, 5, 16}, {2, 1, 1, 16}},
                           {{2, 1, 1, 16}, {2, 6, 5, 16}},
                           {{7, 24}, {24}},
                           {{24}, {7, 24}},
                           {{3, 10, 12}, {3, 1, 12}}};
  // Operand ranges where [-2, 2] leaves the op's domain: divisors away from 0, positive bases.
  struct Range {
    double a_lo, a_hi, b_lo, b_hi;
  };
  const std::map<std::string, Range> float_ranges = {
      {"Div", {-2, 2, 0.5, 2}}, {"Mod", {-4, 4, 0.5, 2}}, {"Pow", {0.5, 2, -2, 3}}};
  const std::map<std::string, Range> int_ranges = {{"Div", {-9, 9, 1, 5}}, {"Mod", {-9, 9, 1, 5}}};
  // Attributes the float cases need: ONNX's Mod takes floats only with fmod = 1.
  const std::map<std::string, AttributeMap> float_attrs = {{"Mod", Attrs({{"fmod", int64_t{1}}})}};
  auto range = [](const std::map<std::string, Range>& m, const std::string& op, Range dflt) {
    auto r = m.find(op);
    return r == m.end() ? dflt : r->second;
  };
  // Whether b broadcasts to a's shape (ONNX's unidirectional broadcast).
  auto unidirectional = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    if (b.size() > a.size()) return false;
    for (size_t i = 0; i < b.size(); ++i) {
      const int64_t d = b[b.size() - 1 - i];
      if (d != 1 && d != a[a.size() - 1 - i]) return false;
    }
    return true;
  };
  auto binary_op = [&](const std::string& op, BinaryTypes types) {
    const Range fr = range(float_ranges, op, {-2, 2, -2, 2});
    const Range ir = range(int_ranges, op, {-9, 9, -5, 5});
    auto fa = float_attrs.find(op);
    const AttributeMap fattrs = fa == float_attrs.end() ? AttributeMap{} : fa->second;
    switch (types) {
      case BinaryTypes::kArith:
      case BinaryTypes::kArithWide:
        for (size_t i = 0; i < shapes.size(); ++i) {
          B s = shapes[i];
          // PRelu's slope broadcasts to X (ONNX's unidirectional broadcast).
          if (types == BinaryTypes::kArithWide && !unidirectional(s.a, s.b)) continue;
          must(op + "_" + std::to_string(i), [op, s, fr, fattrs] {
            OpTester t(op, fattrs);
            t.Input(kF32, s.a, fr.a_lo, fr.a_hi).Input(kF32, s.b, fr.b_lo, fr.b_hi);
            t.FloatTypes(kAllFloats);
            return t;
          });
        }
        for (DataType it : {kI64, kI32}) {
          must(op + "_" + std::string(ToString(it)), [op, it, ir] {
            OpTester t(op);
            t.Input(it, {4, 3}, ir.a_lo, ir.a_hi).Input(it, {3}, ir.b_lo, ir.b_hi);
            return t;
          });
        }
        break;
      case BinaryTypes::kCompare:
      case BinaryTypes::kEquality:
        must(op + "_f32", [op] {
          OpTester t(op);
          // Small integers in f32, so that ties occur.
          t.Input(Rounded({6, 11}, -2, 2, 7)).Input(Rounded({11}, -2, 2, 8));
          return t;
        });
        must(op + "_f32_random", [op] {
          OpTester t(op);
          t.Input(kF32, {6, 11}, -2, 2).Input(kF32, {11}, -2, 2);
          return t;
        });
        must(op + "_i64", [op] {
          OpTester t(op);
          t.Input(kI64, {5, 4}, -2, 2).Input(kI64, {5, 1}, -2, 2);
          return t;
        });
        if (types == BinaryTypes::kEquality) {
          must(op + "_bool", [op] {
            OpTester t(op);
            t.Input(kBool, {3, 8}).Input(kBool, {8});
            return t;
          });
        }
        break;
      case BinaryTypes::kLogic:
        must(op, [op] {
          OpTester t(op);
          t.Input(kBool, {4, 1, 6}).Input(kBool, {5, 6});
          return t;
        });
        break;
      case BinaryTypes::kPow:
        must(op + "_f32", [op, fr, fattrs] {
          OpTester t(op, fattrs);
          t.Input(kF32, {4, 9}, fr.a_lo, fr.a_hi).Input(kF32, {9}, fr.b_lo, fr.b_hi);
          t.FloatTypes(kAllFloats);
          return t;
        });
        must(op + "_i64_i64", [op] {
          OpTester t(op);
          t.Input(kI64, {3, 5}, -4, 4).Input(kI64, {5}, 0, 5);
          return t;
        });
        must(op + "_i64_exp", [op] {
          OpTester t(op);
          t.Input(kF32, {3, 4}, -2, 2).Input(I64({}, {3}));
          return t;
        });
        break;
    }
  };
#define KILN_BINARY_OP(Name, Types, formula) binary_op(#Name, BinaryTypes::k##Types);
#define KILN_VARIADIC_OP(Name, Types, formula) binary_op(#Name, BinaryTypes::k##Types);
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
  add("Pow_square", [] {
    OpTester t("Pow");
    t.Input(kF32, {37}, -2, 2).Input(F32({}, {2.f})).FloatTypes(kAllFloats);
    return t;
  });
  add("Pow_i32_f32_exp", [] {
    OpTester t("Pow");
    t.Input(kI32, {2, 6}, -5, 5).Input(F32({}, {2.f}));
    return t;
  });
  must("Mod_fmod_negative_divisors", [] {
    OpTester t("Mod", Attrs({{"fmod", int64_t{1}}}));
    t.Input(kF32, {5, 8}, -4, 4).Input(F32({8}, {3.f, -3.f, 0.7f, -0.7f, 1.5f, 2.f, -1.f, 0.5f}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  must("Mod_fmod_i32", [] {
    OpTester t("Mod", Attrs({{"fmod", int64_t{1}}}));
    t.Input(kI32, {5, 6}, -20, 20).Input(I32({6}, {3, -3, 7, -7, 5, -2}));
    return t;
  });
  must("Mod_negative_divisors", [] {
    OpTester t("Mod");
    t.Input(kI64, {5, 6}, -20, 20).Input(I64({6}, {3, -3, 7, -7, 5, -2}));
    return t;
  });
  add("Where_broadcast", [] {
    OpTester t("Where");
    t.Input(kBool, {2, 1, 5}).Input(kF32, {2, 3, 5}).Input(kF32, {5}).FloatTypes(kAllFloats);
    return t;
  });
  add("Where_i64", [] {
    OpTester t("Where");
    t.Input(kBool, {7}).Input(kI64, {7}, -9, 9).Input(kI64, {}, -9, 9);
    return t;
  });

  // ---- Cast -------------------------------------------------------------------------------------
  struct C {
    DataType from;
    int64_t to;  // ONNX type number
    double lo, hi;
  };
  for (C cc : std::vector<C>{{kF32, 7, -50, 50},
                             {kF32, 10, -4, 4},
                             {kF32, 16, -4, 4},
                             {kF32, 9, -1, 1},
                             {kI64, 1, -1000, 1000},
                             {kI32, 7, -1000, 1000},
                             {kBool, 1, 0, 1},
                             {DataType::kFloat16, 1, -4, 4},
                             {DataType::kBFloat16, 6, -100, 100}}) {
    add("Cast_" + std::string(ToString(cc.from)) + "_to_" + std::to_string(cc.to), [cc] {
      OpTester t("Cast", Attrs({{"to", cc.to}}));
      DataType stored = IsFloat(cc.from) ? kF32 : cc.from;
      t.Input(stored, {3, 67}, cc.lo, cc.hi);
      if (IsFloat(cc.from)) t.FloatTypes({cc.from});
      return t;
    });
  }

  // ---- variadic Sum / Mean / Max / Min --------------------------------------------------------
  struct V {
    std::string name;
    std::vector<std::vector<int64_t>> shapes;
  };
  std::vector<V> vshapes = {
      {"same3", {{2, 3, 17}, {2, 3, 17}, {2, 3, 17}}},
      {"bcast3", {{3, 1, 5}, {1, 4, 5}, {5}}},
      {"one", {{4, 33}}},
      {"five", {{6, 7}, {7}, {6, 1}, {}, {6, 7}}},
      {"sixteen", std::vector<std::vector<int64_t>>(16, std::vector<int64_t>{3, 5})},
  };
  for (const char* op : {"Sum", "Mean", "Max", "Min"}) {
    for (const V& v : vshapes) {
      std::string sop = op;
      must(sop + "_" + v.name, [sop, v] {
        OpTester t(sop);
        for (const auto& s : v.shapes) t.Input(kF32, s);
        // Long sums in f16/bf16 round once at the end (FP32 accumulation on both sides).
        t.FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
    std::string sop = op;
    if (sop == "Mean") continue;  // ONNX's Mean takes floats only
    must(sop + "_i64_bcast", [sop] {
      OpTester t(sop);
      t.Input(kI64, {4, 3}, -50, 50).Input(kI64, {3}, -50, 50).Input(kI64, {4, 1}, -50, 50);
      return t;
    });
    must(sop + "_u8", [sop] {
      // Sums wrap in the 8-bit types, as on the CPU.
      OpTester t(sop);
      t.Input(DataType::kUInt8, {6, 5}, 0, 255).Input(DataType::kUInt8, {5}, 0, 255);
      t.Input(DataType::kUInt8, {6, 1}, 0, 255);
      return t;
    });
    must(sop + "_i8", [sop] {
      OpTester t(sop);
      for (int i = 0; i < 3; ++i) t.Input(DataType::kInt8, {4, 9}, -128, 127);
      return t;
    });
    must(sop + "_i32_four", [sop] {
      OpTester t(sop);
      for (int i = 0; i < 4; ++i) t.Input(kI32, {5, 6}, -99, 99);
      return t;
    });
  }

  // ---- Neg / Abs / Sign on signed integers ----------------------------------------------------
  for (const char* op : {"Neg", "Abs", "Sign"}) {
    for (DataType t : {kI64, kI32, DataType::kInt8}) {
      std::string sop = op;
      must(sop + "_" + std::string(ToString(t)), [sop, t] {
        OpTester u(sop);
        u.Input(t, {5, 7}, -100, 100);
        return u;
      });
    }
  }

  // ---- IsNaN / IsInf ---------------------------------------------------------------------------
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = F32({2, 5}, {inf, -inf, nan, 1.5f, -2.f, 0.f, -nan, 65504.f, -1e-3f, inf});
  must("IsNaN", [special] {
    OpTester t("IsNaN");
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });
  must("IsNaN_random", [] {
    OpTester t("IsNaN");
    t.Input(kF32, {1030}).FloatTypes(kAllFloats);
    return t;
  });
  must("IsInf", [special] {
    OpTester t("IsInf");
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });
  must("IsInf_positive_only", [special] {
    OpTester t("IsInf", Attrs({{"detect_negative", int64_t{0}}}));
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });
  must("IsInf_negative_only", [special] {
    OpTester t("IsInf", Attrs({{"detect_positive", int64_t{0}}}));
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });

  return c;
}

}  // namespace kiln::testing
