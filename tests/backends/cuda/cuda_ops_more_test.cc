// Conformance of the CUDA kernels for the ops that first ran only on the CPU (variadic
// Sum/Mean/Max/Min, integer Neg/Abs/Sign and Reduce*, IsNaN/IsInf, ArgMax/ArgMin, CumSum, TopK,
// Pad, Tile, DepthToSpace, SpaceToDepth, GatherElements, ScatterND, OneHot, cubic Resize) and of
// the run-time index check of Gather, GatherElements and ScatterND. Every case runs each CUDA
// tactic and the CPU backend on the same fresh random inputs (f32, f16 and bf16 where the op takes
// floats) and must find at least one CUDA tactic. GPU cases skip without a GPU; the host-side cases
// (coverage, tactics, constant-index checks) run everywhere. KILN_CUDA_KERNELS_ON=cpu runs the
// conformance cases on the CPU providers instead: a check of the cases themselves on a machine
// without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_cases.h"
#include "kiln/backends/backend.h"
#include "kiln/backends/kernel.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "op_tester.h"

namespace kiln {
namespace {

using testing::OpTester;

using namespace testing;  // cuda_cases.h: Attrs, F32, I64, kAllFloats, TargetBackend...
// f32 with small integer values: many exact ties in every float type (ArgMax, TopK).
Tensor Rounded(std::vector<int64_t> dims, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(NumElements(dims)));
  for (float& x : v) x = static_cast<float>(dist(rng));
  return F32(std::move(dims), v);
}
// A permutation of 0..n-1 (distinct indices for ScatterND without reduction), as int64.
std::vector<int64_t> Shuffled(int64_t n, uint32_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

// One operand of a hand-built request: a tensor, passed as a constant or as a run-time input (a
// default Tensor: an omitted optional input).
struct Operand {
  Tensor value;
  bool constant = false;
};

// A one-node graph and its request with the given operands (output dims given, not inferred, so
// run-time shape inputs work).
struct Layer {
  Graph graph;
  KernelRequest request;
};
std::unique_ptr<Layer> MakeLayer(const std::string& op, AttributeMap attrs,
                                 const std::vector<Operand>& ins, const std::vector<Tensor>& outs) {
  auto l = std::make_unique<Layer>();
  std::vector<Value*> in_values, out_values;
  for (size_t i = 0; i < ins.size(); ++i) {
    const Tensor& t = ins[i].value;
    if (t.dtype() == DataType::kUndefined) {  // an omitted optional input
      in_values.push_back(nullptr);
      l->request.inputs.emplace_back();
      continue;
    }
    in_values.push_back(
        ins[i].constant ? l->graph.AddConstant(fmt::format("c{}", i), t)
                        : l->graph.AddInput(fmt::format("x{}", i), t.dtype(), MakeShape(t.dims())));
    l->request.inputs.push_back({t.dtype(), MakeShape(t.dims()), t.dims(),
                                 ins[i].constant ? in_values.back()->constant() : nullptr});
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    out_values.push_back(l->graph.AddValue(fmt::format("y{}", i), outs[i].dtype()));
    l->request.outputs.push_back(
        {outs[i].dtype(), MakeShape(outs[i].dims()), outs[i].dims(), nullptr});
  }
  l->request.node = l->graph.AddNode(op, "node", in_values, out_values, std::move(attrs));
  return l;
}

// The cases as data: what OpTester needs, kept so that a host-side test can also build each
// case's kernel request and ask the CUDA providers for a tactic without a device.
class Spec {
 public:
  explicit Spec(std::string op, AttributeMap attrs = {})
      : op_(std::move(op)), attrs_(std::move(attrs)) {}
  Spec& Input(DataType dtype, std::vector<int64_t> dims, double lo = -2.0, double hi = 2.0) {
    ins_.push_back({Kind::kRandom, dtype, std::move(dims), lo, hi, {}});
    return *this;
  }
  Spec& Input(Tensor value) {
    ins_.push_back({Kind::kGiven, value.dtype(), value.dims(), 0, 0, std::move(value)});
    return *this;
  }
  Spec& Constant(Tensor value) {
    ins_.push_back({Kind::kConstant, value.dtype(), value.dims(), 0, 0, std::move(value)});
    return *this;
  }
  Spec& Omitted() {
    ins_.push_back({Kind::kOmitted, DataType::kUndefined, {}, 0, 0, {}});
    return *this;
  }
  Spec& Outputs(int n) {
    outputs_ = n;
    return *this;
  }
  Spec& FloatTypes(std::vector<DataType> types) {
    float_types_ = std::move(types);
    return *this;
  }
  Spec& Tolerance(double abs, double rel) {
    tolerance_ = {abs, rel};
    return *this;
  }

  const std::string& op() const { return op_; }
  const std::vector<DataType>& float_types() const { return float_types_; }

  OpTester Tester() const {
    OpTester t(op_, attrs_);
    for (const In& in : ins_) {
      switch (in.kind) {
        case Kind::kRandom:
          t.Input(in.dtype, in.dims, in.lo, in.hi);
          break;
        case Kind::kGiven:
          t.Input(in.value);
          break;
        case Kind::kConstant:
          t.Constant(in.value);
          break;
        case Kind::kOmitted:
          t.Omitted();
          break;
      }
    }
    t.Outputs(outputs_).FloatTypes(float_types_);
    if (tolerance_) t.Tolerance(tolerance_->first, tolerance_->second);
    return t;
  }

  // The request OpTester builds for float storage `float_type` (float operands in that type).
  StatusOr<std::unique_ptr<Layer>> Request(DataType float_type) const {
    auto l = std::make_unique<Layer>();
    std::vector<Value*> in_values, out_values;
    for (size_t i = 0; i < ins_.size(); ++i) {
      const In& in = ins_[i];
      if (in.kind == Kind::kOmitted) {
        in_values.push_back(nullptr);
        l->request.inputs.emplace_back();
        continue;
      }
      DataType t = IsFloat(in.dtype) ? float_type : in.dtype;
      const Tensor* constant = nullptr;
      if (in.kind == Kind::kConstant) {
        Tensor c = IsFloat(in.dtype) ? in.value.CastTo(t) : in.value;
        in_values.push_back(l->graph.AddConstant(fmt::format("c{}", i), c));
        constant = in_values.back()->constant();
      } else {
        in_values.push_back(l->graph.AddInput(fmt::format("x{}", i), t, MakeShape(in.dims)));
      }
      l->request.inputs.push_back({t, MakeShape(in.dims), in.dims, constant});
    }
    for (int i = 0; i < outputs_; ++i) {
      out_values.push_back(l->graph.AddValue(fmt::format("y{}", i)));
    }
    l->request.node = l->graph.AddNode(op_, "node", in_values, out_values, attrs_);
    for (Value* v : out_values) l->graph.MarkOutput(v);
    KILN_RETURN_IF_ERROR(InferShapes(l->graph).status());
    for (Value* v : out_values) {
      auto dims = StaticDims(v->shape());
      if (!dims) return MakeError(ErrorCode::kShapeMismatch, "output shape is not static");
      l->request.outputs.push_back({v->dtype(), v->shape(), *dims, nullptr});
    }
    return l;
  }

 private:
  enum class Kind { kRandom, kGiven, kConstant, kOmitted };
  struct In {
    Kind kind;
    DataType dtype;
    std::vector<int64_t> dims;
    double lo, hi;
    Tensor value;
  };
  std::string op_;
  AttributeMap attrs_;
  std::vector<In> ins_;
  int outputs_ = 1;
  std::vector<DataType> float_types_ = {kF32};
  std::optional<std::pair<double, double>> tolerance_;
};

struct Case {
  std::string name;
  std::function<Spec()> make;
};

std::vector<Case> Cases() {
  std::vector<Case> c;
  auto add = [&c](std::string name, std::function<Spec()> make) {
    c.push_back({std::move(name), std::move(make)});
  };

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
      add(sop + "_" + v.name, [sop, v] {
        Spec t(sop);
        for (const auto& s : v.shapes) t.Input(kF32, s);
        // Long sums in f16/bf16 round once at the end (FP32 accumulation on both sides).
        t.FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
    std::string sop = op;
    if (sop == "Mean") continue;  // ONNX's Mean takes floats only
    add(sop + "_i64_bcast", [sop] {
      Spec t(sop);
      t.Input(kI64, {4, 3}, -50, 50).Input(kI64, {3}, -50, 50).Input(kI64, {4, 1}, -50, 50);
      return t;
    });
    add(sop + "_u8", [sop] {
      // Sums wrap in the 8-bit types, as on the CPU.
      Spec t(sop);
      t.Input(DataType::kUInt8, {6, 5}, 0, 255).Input(DataType::kUInt8, {5}, 0, 255);
      t.Input(DataType::kUInt8, {6, 1}, 0, 255);
      return t;
    });
    add(sop + "_i8", [sop] {
      Spec t(sop);
      for (int i = 0; i < 3; ++i) t.Input(DataType::kInt8, {4, 9}, -128, 127);
      return t;
    });
    add(sop + "_i32_four", [sop] {
      Spec t(sop);
      for (int i = 0; i < 4; ++i) t.Input(kI32, {5, 6}, -99, 99);
      return t;
    });
  }

  // ---- Neg / Abs / Sign on signed integers ----------------------------------------------------
  for (const char* op : {"Neg", "Abs", "Sign"}) {
    for (DataType t : {kI64, kI32, DataType::kInt8}) {
      std::string sop = op;
      add(sop + "_" + std::string(ToString(t)), [sop, t] {
        Spec u(sop);
        u.Input(t, {5, 7}, -100, 100);
        return u;
      });
    }
  }

  // ---- Reduce* on integers (double accumulation, truncated, as the CPU) -----------------------
  struct IR {
    std::string name;
    std::vector<int64_t> axes;  // empty: no axes input
    int64_t keep, noop;
  };
  for (const char* op :
       {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare"}) {
    for (const IR& r : std::vector<IR>{{"ax1", {1}, 1, 0},
                                       {"ax02_nokeep", {0, 2}, 0, 0},
                                       {"ax_neg", {-1}, 1, 0},
                                       {"all", {}, 1, 0},
                                       {"noop", {}, 1, 1}}) {
      std::string sop = op;
      // Products of all 60 elements would overflow: the product takes one axis only.
      if (sop == "ReduceProd" && (r.name == "all" || r.name == "ax02_nokeep")) continue;
      for (DataType t : {kI64, kI32}) {
        add(sop + "_" + std::string(ToString(t)) + "_" + r.name, [sop, r, t] {
          Spec u(sop, Attrs({{"keepdims", r.keep}, {"noop_with_empty_axes", r.noop}}));
          u.Input(t, {3, 4, 5}, -3, 3);
          if (!r.axes.empty()) {
            u.Constant(I64({static_cast<int64_t>(r.axes.size())}, r.axes));
          }
          return u;
        });
      }
    }
  }
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    std::string sop = op;
    add(sop + "_bool", [sop] {
      Spec u(sop, Attrs({{"keepdims", int64_t{0}}}));
      u.Input(kBool, {4, 6}).Constant(I64({1}, {1}));
      return u;
    });
  }

  // ---- IsNaN / IsInf ---------------------------------------------------------------------------
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = F32({2, 5}, {inf, -inf, nan, 1.5f, -2.f, 0.f, -nan, 65504.f, -1e-3f, inf});
  add("IsNaN", [special] {
    Spec t("IsNaN");
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });
  add("IsNaN_random", [] {
    Spec t("IsNaN");
    t.Input(kF32, {1030}).FloatTypes(kAllFloats);
    return t;
  });
  add("IsInf", [special] {
    Spec t("IsInf");
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });
  add("IsInf_positive_only", [special] {
    Spec t("IsInf", Attrs({{"detect_negative", int64_t{0}}}));
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });
  add("IsInf_negative_only", [special] {
    Spec t("IsInf", Attrs({{"detect_positive", int64_t{0}}}));
    t.Input(special).FloatTypes(kAllFloats);
    return t;
  });

  // ---- ArgMax / ArgMin: the line kernel (n < 64 or inner > 1) and the warp kernel ------------
  struct A {
    std::vector<int64_t> dims;
    int64_t axis;
  };
  for (const A& a : std::vector<A>{{{4, 37}, 1},
                                   {{3, 1000}, -1},
                                   {{5, 6, 7}, 1},
                                   {{9, 4}, 0},
                                   {{2, 129, 1}, 1},
                                   {{7}, 0}}) {
    for (const char* op : {"ArgMax", "ArgMin"}) {
      for (int last : {0, 1}) {
        for (int keep : {1, 0}) {
          std::string name = std::string(op) + "_" + std::to_string(NumElements(a.dims)) + "_ax" +
                             std::to_string(a.axis) + (last ? "_last" : "") +
                             (keep ? "" : "_nokeep");
          std::string sop = op;
          add(name, [sop, a, last, keep] {
            Spec t(sop, Attrs({{"axis", a.axis},
                               {"select_last_index", int64_t{last}},
                               {"keepdims", int64_t{keep}}}));
            // Small integers: ties everywhere, so the tie rule is what is checked.
            t.Input(Rounded(a.dims, -3, 3, 11)).FloatTypes(kAllFloats);
            return t;
          });
        }
      }
    }
  }
  add("ArgMax_random_f32", [] {
    Spec t("ArgMax", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {6, 700}).FloatTypes(kAllFloats);
    return t;
  });
  add("ArgMin_i64", [] {
    Spec t("ArgMin", Attrs({{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}}));
    t.Input(kI64, {3, 300}, -5, 5);
    return t;
  });
  add("ArgMax_i32", [] {
    Spec t("ArgMax", Attrs({{"axis", int64_t{0}}}));
    t.Input(kI32, {40, 3}, -5, 5);
    return t;
  });

  // ---- CumSum: warp scan (contiguous, n >= 64) and line walk ---------------------------------
  struct S {
    std::vector<int64_t> dims;
    int64_t axis;
  };
  for (const S& s : std::vector<S>{
           {{3, 100}, 1}, {{3, 40}, -1}, {{4, 5, 6}, 1}, {{70, 3}, 0}, {{2, 1000}, 1}, {{1}, 0}}) {
    for (int exclusive : {0, 1}) {
      for (int reverse : {0, 1}) {
        std::string name = "CumSum_" + std::to_string(NumElements(s.dims)) + "_ax" +
                           std::to_string(s.axis) + (exclusive ? "_excl" : "") +
                           (reverse ? "_rev" : "");
        add(name, [s, exclusive, reverse] {
          Spec t("CumSum",
                 Attrs({{"exclusive", int64_t{exclusive}}, {"reverse", int64_t{reverse}}}));
          // The warp scan adds in another order than the CPU's loop: FP32 rounding differs, by
          // up to about sqrt(n) half-ulps of the running sum (|sum| < 100 here).
          t.Input(kF32, s.dims).Constant(I64({}, {s.axis})).FloatTypes(kAllFloats);
          t.Tolerance(5e-4, 1e-5);
          return t;
        });
      }
    }
  }
  add("CumSum_i64", [] {
    Spec t("CumSum");
    t.Input(kI64, {5, 130}, -1000, 1000).Constant(I64({1}, {1}));
    return t;
  });
  add("CumSum_i32_rev_excl", [] {
    Spec t("CumSum", Attrs({{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}}));
    t.Input(kI32, {4, 3, 9}, -1000, 1000).Constant(I32({}, {1}));
    return t;
  });

  // ---- TopK ------------------------------------------------------------------------------------
  struct K {
    std::vector<int64_t> dims;
    int64_t axis, k;
  };
  for (const K& k : std::vector<K>{{{3, 50}, -1, 5},
                                   {{40, 3, 2}, 0, 7},
                                   {{2, 300}, 1, 300},
                                   {{5, 17}, 1, 1},
                                   {{1, 2000}, 1, 33}}) {
    for (int largest : {1, 0}) {
      for (int sorted : {1, 0}) {
        std::string name = "TopK_" + std::to_string(NumElements(k.dims)) + "_k" +
                           std::to_string(k.k) + (largest ? "" : "_smallest") +
                           (sorted ? "" : "_unsorted");
        add(name, [k, largest, sorted] {
          Spec t("TopK", Attrs({{"axis", k.axis},
                                {"largest", int64_t{largest}},
                                {"sorted", int64_t{sorted}}}));
          t.Input(Rounded(k.dims, -20, 20, 5)).Constant(I64({1}, {k.k})).Outputs(2);
          t.FloatTypes(kAllFloats);
          return t;
        });
      }
    }
  }
  add("TopK_random_f32", [] {
    Spec t("TopK", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {4, 777}).Constant(I64({1}, {10})).Outputs(2).FloatTypes(kAllFloats);
    return t;
  });
  add("TopK_i64", [] {
    Spec t("TopK", Attrs({{"axis", int64_t{0}}, {"largest", int64_t{0}}}));
    t.Input(kI64, {64, 3}, -9, 9).Constant(I64({1}, {6})).Outputs(2);
    return t;
  });

  // ---- Pad -------------------------------------------------------------------------------------
  struct P {
    std::string mode;
    std::vector<int64_t> dims, pads;
  };
  for (const P& p : std::vector<P>{{"constant", {2, 3, 4}, {0, 1, 2, 1, 0, 3}},
                                   {"edge", {2, 3, 4}, {1, 2, 0, 0, 3, 2}},
                                   {"reflect", {3, 5}, {2, 3, 2, 4}},
                                   {"wrap", {3, 5}, {2, 6, 1, 7}},
                                   {"constant", {4, 6}, {-1, 2, 1, -2}},
                                   {"reflect", {1, 1, 6, 7}, {0, 0, 2, 3, 0, 0, 3, 2}}}) {
    std::string name = "Pad_" + p.mode + "_" + std::to_string(NumElements(p.dims)) + "_" +
                       std::to_string(p.pads[0]) + std::to_string(p.pads.back());
    add(name, [p] {
      Spec t("Pad", Attrs({{"mode", p.mode}}));
      t.Input(kF32, p.dims).Constant(I64({static_cast<int64_t>(p.pads.size())}, p.pads));
      t.FloatTypes(kAllFloats);
      return t;
    });
  }
  add("Pad_constant_value", [] {
    Spec t("Pad");
    t.Input(kF32, {3, 4}).Constant(I64({4}, {1, 2, 2, 1})).Constant(F32({}, {-7.5f}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  add("Pad_constant_value_runtime", [] {
    Spec t("Pad");
    t.Input(kF32, {3, 4}).Constant(I64({4}, {0, 1, 3, 0})).Input(F32({}, {2.25f}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  add("Pad_axes", [] {
    Spec t("Pad", Attrs({{"mode", std::string("edge")}}));
    t.Input(kF32, {2, 3, 4})
        .Constant(I64({2}, {1, 2}))
        .Omitted()
        .Constant(I64({1}, {-1}))
        .FloatTypes(kAllFloats);
    return t;
  });
  add("Pad_i64", [] {
    Spec t("Pad", Attrs({{"mode", std::string("reflect")}}));
    t.Input(kI64, {4, 5}, -100, 100).Constant(I64({4}, {3, 1, 0, 4}));
    return t;
  });
  add("Pad_bool", [] {
    Spec t("Pad");
    t.Input(kBool, {3, 3}).Constant(I64({4}, {1, 1, 1, 1}));
    return t;
  });

  // ---- Tile ------------------------------------------------------------------------------------
  add("Tile_3d", [] {
    Spec t("Tile");
    t.Input(kF32, {2, 3, 4}).Constant(I64({3}, {2, 1, 3})).FloatTypes(kAllFloats);
    return t;
  });
  add("Tile_1d", [] {
    Spec t("Tile");
    t.Input(kF32, {7}).Constant(I64({1}, {5})).FloatTypes(kAllFloats);
    return t;
  });
  add("Tile_i64", [] {
    Spec t("Tile");
    t.Input(kI64, {3, 1, 2}, -9, 9).Constant(I64({3}, {1, 4, 2}));
    return t;
  });
  add("Tile_bool", [] {
    Spec t("Tile");
    t.Input(kBool, {2, 3}).Constant(I64({2}, {3, 2}));
    return t;
  });

  // ---- DepthToSpace / SpaceToDepth -------------------------------------------------------------
  for (const char* mode : {"DCR", "CRD"}) {
    std::string m = mode;
    add("DepthToSpace_" + m, [m] {
      Spec t("DepthToSpace", Attrs({{"blocksize", int64_t{2}}, {"mode", m}}));
      t.Input(kF32, {2, 8, 3, 5}).FloatTypes(kAllFloats);
      return t;
    });
    add("DepthToSpace_" + m + "_b3", [m] {
      Spec t("DepthToSpace", Attrs({{"blocksize", int64_t{3}}, {"mode", m}}));
      t.Input(kF32, {1, 18, 4, 4}).FloatTypes(kAllFloats);
      return t;
    });
  }
  add("SpaceToDepth", [] {
    Spec t("SpaceToDepth", Attrs({{"blocksize", int64_t{2}}}));
    t.Input(kF32, {2, 3, 4, 6}).FloatTypes(kAllFloats);
    return t;
  });
  add("SpaceToDepth_i64_b3", [] {
    Spec t("SpaceToDepth", Attrs({{"blocksize", int64_t{3}}}));
    t.Input(kI64, {1, 2, 6, 9}, -99, 99);
    return t;
  });

  // ---- GatherElements --------------------------------------------------------------------------
  add("GatherElements_axis1", [] {
    Spec t("GatherElements", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {4, 5}).Input(kI64, {4, 3}, -5, 4).FloatTypes(kAllFloats);
    return t;
  });
  add("GatherElements_axis0_3d", [] {
    Spec t("GatherElements", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {3, 4, 5}).Input(kI64, {6, 4, 2}, -3, 2).FloatTypes(kAllFloats);
    return t;
  });
  add("GatherElements_neg_axis_i32", [] {
    Spec t("GatherElements", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kI64, {2, 3, 7}, -50, 50).Input(kI32, {2, 3, 9}, -7, 6);
    return t;
  });
  add("GatherElements_constant_indices", [] {
    Spec t("GatherElements", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3}).Constant(I64({2, 2}, {0, 2, -1, 1})).FloatTypes(kAllFloats);
    return t;
  });

  // ---- ScatterND -------------------------------------------------------------------------------
  add("ScatterND_rows", [] {
    Spec t("ScatterND");
    std::vector<int64_t> rows = Shuffled(6, 3);
    t.Input(kF32, {6, 5, 4})
        .Input(I64({3, 1}, {rows[0], rows[1] - 6, rows[2]}))  // one negative index
        .Input(kF32, {3, 5, 4})
        .FloatTypes(kAllFloats);
    return t;
  });
  add("ScatterND_elements", [] {
    Spec t("ScatterND");
    // Distinct (row, col) pairs of a 7x8 matrix.
    std::vector<int64_t> cells = Shuffled(56, 9), idx;
    for (int i = 0; i < 10; ++i) {
      idx.push_back(cells[i] / 8);
      idx.push_back(cells[i] % 8);
    }
    t.Input(kF32, {7, 8}).Input(I64({10, 2}, idx)).Input(kF32, {10}).FloatTypes(kAllFloats);
    return t;
  });
  add("ScatterND_i32_indices_bool", [] {
    Spec t("ScatterND");
    t.Input(kBool, {4, 3}).Input(I32({2, 1}, {3, 0})).Input(kBool, {2, 3});
    return t;
  });
  for (const char* red : {"add", "mul", "max", "min"}) {
    std::string r = red;
    // Duplicate indices on purpose: the reductions combine them.
    add("ScatterND_" + r + "_i64", [r] {
      Spec t("ScatterND", Attrs({{"reduction", r}}));
      t.Input(kI64, {5, 4}, -9, 9)
          .Input(I64({6, 1}, {1, 3, 1, 0, 3, 1}))
          .Input(kI64, {6, 4}, -9, 9);
      return t;
    });
    add("ScatterND_" + r + "_f32", [r] {
      Spec t("ScatterND", Attrs({{"reduction", r}}));
      t.Input(kF32, {5, 4}).Input(I64({6, 1}, {1, 3, 1, 0, 3, 1})).Input(kF32, {6, 4});
      t.Tolerance(1e-5, 1e-5);  // atomics add in any order
      return t;
    });
  }

  // ---- OneHot (out-of-range indices give a row of off values) ----------------------------------
  for (int64_t axis : {-1, 0, 1}) {
    add("OneHot_axis" + std::to_string(axis), [axis] {
      Spec t("OneHot", Attrs({{"axis", axis}}));
      t.Input(kI64, {3, 4}, -7, 6).Constant(I64({}, {5})).Input(F32({2}, {0.25f, 3.f}));
      t.FloatTypes(kAllFloats);
      return t;
    });
  }
  add("OneHot_i32_indices_i64_values", [] {
    Spec t("OneHot");
    t.Input(kI32, {10}, -3, 9).Constant(I64({1}, {8})).Input(I64({2}, {-1, 42}));
    return t;
  });
  add("OneHot_float_indices", [] {
    Spec t("OneHot", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {2, 5}, -4.5, 4.5).Constant(I64({}, {4})).Input(F32({2}, {0.f, 1.f}));
    return t;
  });

  // ---- cubic Resize ----------------------------------------------------------------------------
  struct R {
    const char* coord;
    float a;
    int exclude;
    std::vector<int64_t> x, sizes;
  };
  for (const R& z : std::vector<R>{{"half_pixel", -0.75f, 0, {1, 2, 7, 9}, {1, 2, 14, 20}},
                                   {"half_pixel", -0.5f, 1, {2, 3, 8, 6}, {2, 3, 5, 4}},
                                   {"align_corners", -0.75f, 0, {1, 1, 5, 5}, {1, 1, 9, 11}},
                                   {"asymmetric", -0.75f, 1, {1, 3, 6, 7}, {1, 3, 12, 7}},
                                   {"pytorch_half_pixel", -0.75f, 0, {1, 2, 4, 9}, {1, 2, 1, 13}},
                                   {"half_pixel", -0.75f, 0, {3, 16}, {3, 37}}}) {
    std::string name = std::string("Resize_cubic_") + z.coord + "_" +
                       std::to_string(z.sizes[z.sizes.size() - 2]) + "x" +
                       std::to_string(z.sizes.back()) + (z.exclude ? "_excl" : "");
    add(name, [z] {
      Spec t("Resize", Attrs({{"mode", std::string("cubic")},
                              {"coordinate_transformation_mode", std::string(z.coord)},
                              {"cubic_coeff_a", z.a},
                              {"exclude_outside", int64_t{z.exclude}}}));
      t.Input(kF32, z.x).Omitted().Omitted().Constant(
          I64({static_cast<int64_t>(z.sizes.size())}, z.sizes));
      // One 4^k-tap blend on CUDA, separable passes on the CPU: FP32 rounding differs.
      t.FloatTypes(kAllFloats).Tolerance(2e-5, 1e-4);
      return t;
    });
  }
  add("Resize_cubic_scales", [] {
    Spec t("Resize", Attrs({{"mode", std::string("cubic")}}));
    t.Input(kF32, {1, 2, 5, 6}).Omitted().Constant(F32({4}, {1.f, 1.f, 1.6f, 0.7f}));
    t.FloatTypes(kAllFloats).Tolerance(2e-5, 1e-4);
    return t;
  });

  // ---- Gather (already on CUDA; its index check is new): in-range negative indices -------------
  add("Gather_runtime_indices", [] {
    Spec t("Gather", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {3, 6, 2}).Input(kI64, {4}, -6, 5).FloatTypes(kAllFloats);
    return t;
  });
  return c;
}

class CudaOpsMore : public ::testing::TestWithParam<Case> {};

TEST_P(CudaOpsMore, MatchesCpu) {
  OpTester t = GetParam().make().Tester();
  int runs = t.Run(TargetBackend());
  if (::testing::Test::IsSkipped()) return;
  // These ops must now have a tactic on the target (the harness only notes a missing one).
  EXPECT_GT(runs, 0) << GetParam().name << ": no tactic ran";
}

// Without a device: every case's request gets a tactic from some CUDA provider, in every float
// type it runs in (what the GPU run above relies on, checked where CI runs).
TEST_P(CudaOpsMore, OffersACudaTacticWithoutADevice) {
  Spec spec = GetParam().make();
  for (DataType ft : spec.float_types()) {
    SCOPED_TRACE(std::string(ToString(ft)));
    auto layer = spec.Request(ft);
    ASSERT_TRUE(layer.ok()) << layer.status().ToString();
    bool offered = false;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, spec.op())) {
      offered = offered || !p->Tactics((*layer)->request).empty();
    }
    EXPECT_TRUE(offered) << GetParam().name << ": no CUDA tactic";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOpsMore, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return CaseTestName(info.param.name);
                         });

// ---- direct provider runs (index checks, run-time pads) ----------------------------------------

// The single CUDA provider of `op` that offers a tactic for `r`.
const KernelProvider* CudaProviderFor(const std::string& op, const KernelRequest& r) {
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, op)) {
    if (!p->Tactics(r).empty()) return p;
  }
  return nullptr;
}

// Runs `kernel` on `kind` with host tensors in and out (device copies made and freed here).
Status RunKernel(BackendKind kind, Kernel& kernel, const std::vector<Tensor>& ins,
                 std::vector<Tensor>& outs) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(kind));
  std::vector<DeviceBuffer> bufs;
  std::vector<TensorView> in_views, out_views;
  for (const Tensor& t : ins) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend->Allocate(t.size_bytes()));
    if (t.size_bytes() > 0) {
      KILN_RETURN_IF_ERROR(backend->CopyToDevice(b.data(), t.raw(), t.size_bytes(), nullptr));
    }
    TensorView v = t.view();
    v.data = b.data();
    in_views.push_back(v);
    bufs.push_back(std::move(b));
  }
  for (Tensor& t : outs) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend->Allocate(t.size_bytes()));
    TensorView v = t.view();
    v.data = b.data();
    out_views.push_back(v);
    bufs.push_back(std::move(b));
  }
  KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel.Prepare(in_views, out_views));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer ws, backend->Allocate(ws_bytes));
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = ws.data();
  args.workspace_bytes = ws_bytes;
  Status run = kernel.Run(args);
  KILN_RETURN_IF_ERROR(backend->Synchronize(nullptr));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].size_bytes() == 0) continue;
    KILN_RETURN_IF_ERROR(backend->CopyToHost(outs[i].mutable_raw(), out_views[i].data,
                                             outs[i].size_bytes(), nullptr));
  }
  return run;
}

bool HaveCuda() { return GetBackend(BackendKind::kCuda).ok(); }

// Gather with run-time indices: an out-of-range index is KILN-E6001 naming it, like the CPU; the
// next in-range run of the same kernel succeeds (the record is cleared) and matches.
TEST(CudaIndexCheck, GatherRuntimeIndexOutOfRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor bad = I64({3}, {1, 4, -1});
  Tensor out(kF32, {3, 3});
  auto l = MakeLayer("Gather", Attrs({{"axis", int64_t{0}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("Gather", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad}, outs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index 4 is out of range for an axis of size 4"), std::string::npos)
      << s.ToString();
  // The CPU says the same kind of thing.
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, "Gather");
  ASSERT_FALSE(cpu.empty());
  auto cpu_kernel = cpu[0]->Create(l->request, cpu[0]->Tactics(l->request)[0]);
  ASSERT_TRUE(cpu_kernel.ok());
  std::vector<Tensor> cpu_outs = {out};
  EXPECT_EQ(RunKernel(BackendKind::kCpu, **cpu_kernel, {data, bad}, cpu_outs).code(),
            ErrorCode::kKernelFailed);
  // In range again: no stale record; rows 1, 3 and 0.
  Tensor good = I64({3}, {1, -1, 0});
  s = RunKernel(BackendKind::kCuda, **kernel, {data, good}, outs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<float> want = {3, 4, 5, 9, 10, 11, 0, 1, 2};
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(outs[0].GetDouble(i), want[i]) << i;
}

TEST(CudaIndexCheck, GatherInt32IndexBelowRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor bad = I32({2}, {0, -6});
  Tensor out(kF32, {2, 2});
  auto l = MakeLayer("Gather", Attrs({{"axis", int64_t{1}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("Gather", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad}, outs);
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index -6"), std::string::npos) << s.ToString();
}

TEST(CudaIndexCheck, GatherElementsRuntimeIndexOutOfRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor bad = I64({2, 2}, {0, 2, 3, 1});
  Tensor out(kF32, {2, 2});
  auto l = MakeLayer("GatherElements", Attrs({{"axis", int64_t{1}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("GatherElements", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad}, outs);
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index 3 is out of range for an axis of size 3"), std::string::npos)
      << s.ToString();
  // The valid elements were still gathered: [0][0] = 0, [0][1] = 2, [1][1] = 4.
  EXPECT_EQ(outs[0].GetDouble(0), 0);
  EXPECT_EQ(outs[0].GetDouble(1), 2);
  EXPECT_EQ(outs[0].GetDouble(3), 4);
}

TEST(CudaIndexCheck, ScatterNDRuntimeIndexOutOfRange) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Tensor data = F32({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor bad = I64({2, 1}, {-4, 1});
  Tensor upd = F32({2, 2}, {7, 7, 9, 9});
  Tensor out(kF32, {3, 2});
  auto l = MakeLayer("ScatterND", {}, {{data}, {bad}, {upd}}, {out});
  const KernelProvider* p = CudaProviderFor("ScatterND", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  std::vector<Tensor> outs = {out};
  Status s = RunKernel(BackendKind::kCuda, **kernel, {data, bad, upd}, outs);
  EXPECT_EQ(s.code(), ErrorCode::kKernelFailed) << s.ToString();
  EXPECT_NE(s.ToString().find("index -4"), std::string::npos) << s.ToString();
  // Row 1 was still written, rows 0 and 2 kept.
  std::vector<float> want = {0, 1, 9, 9, 4, 5};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(outs[0].GetDouble(i), want[i]) << i;
}

// Inside a CUDA graph capture nothing can be waited for: the launch records nothing, Run
// succeeds, and the replay writes zeros for the bad index (index_fault.h documents the gap).
TEST(CudaIndexCheck, CapturedGatherIsNotCheckedAndWritesZeros) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  Backend* backend = *GetBackend(BackendKind::kCuda);
  Tensor data = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor bad = I64({2}, {2, 7});
  Tensor out(kF32, {2, 2});
  auto l = MakeLayer("Gather", Attrs({{"axis", int64_t{0}}}), {{data}, {bad}}, {out});
  const KernelProvider* p = CudaProviderFor("Gather", l->request);
  ASSERT_NE(p, nullptr);
  auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
  ASSERT_TRUE(kernel.ok());
  auto db = backend->Allocate(data.size_bytes());
  auto ib = backend->Allocate(bad.size_bytes());
  auto ob = backend->Allocate(out.size_bytes());
  ASSERT_TRUE(db.ok() && ib.ok() && ob.ok());
  ASSERT_TRUE(backend->CopyToDevice(db->data(), data.raw(), data.size_bytes(), nullptr).ok());
  ASSERT_TRUE(backend->CopyToDevice(ib->data(), bad.raw(), bad.size_bytes(), nullptr).ok());
  std::vector<TensorView> ins = {data.view(), bad.view()}, outs = {out.view()};
  ins[0].data = db->data();
  ins[1].data = ib->data();
  outs[0].data = ob->data();
  ASSERT_TRUE((*kernel)->Prepare(ins, outs).ok());
  auto stream = backend->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  KernelRunArgs args;
  args.inputs = ins;
  args.outputs = outs;
  args.stream = stream->get();
  ASSERT_TRUE(backend->BeginCapture(args.stream).ok());
  Status run = (*kernel)->Run(args);
  auto graph = backend->EndCapture(args.stream);
  ASSERT_TRUE(run.ok()) << run.ToString();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  ASSERT_TRUE(backend->LaunchGraph(graph->get(), args.stream).ok());
  ASSERT_TRUE(backend->Synchronize(args.stream).ok());
  Tensor got(kF32, {2, 2});
  ASSERT_TRUE(backend->CopyToHost(got.mutable_raw(), ob->data(), got.size_bytes(), nullptr).ok());
  std::vector<float> want = {5, 6, 0, 0};
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(got.GetDouble(i), want[i]) << i;
}

// Pad whose pads and axes are run-time tensors (the one-node harness needs them constant for
// shape inference): the kernel reads them on the device; compared with the CPU.
TEST(CudaPad, RuntimePadsMatchCpu) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> dist(-2, 2);
    std::vector<float> xv(4 * 5 * 3);
    for (float& v : xv) v = dist(rng);
    Tensor x = F32({4, 5, 3}, xv);
    Tensor pads = I64({4}, {2, -1, 1, 3});  // axes 2 and 0: begin 2, -1; end 1, 3
    Tensor axes = I64({2}, {-1, 0});
    Tensor fill = F32({}, {0.5f});
    Tensor out(kF32, {4 - 1 + 3, 5, 3 + 2 + 1});
    auto l = MakeLayer("Pad", Attrs({{"mode", std::string(mode)}}), {{x}, {pads}, {fill}, {axes}},
                       {out});
    const KernelProvider* p = CudaProviderFor("Pad", l->request);
    ASSERT_NE(p, nullptr);
    auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
    ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
    std::vector<Tensor> got = {out};
    Status s = RunKernel(BackendKind::kCuda, **kernel, {x, pads, fill, axes}, got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, "Pad");
    ASSERT_FALSE(cpu.empty());
    auto cpu_kernel = cpu[0]->Create(l->request, cpu[0]->Tactics(l->request)[0]);
    ASSERT_TRUE(cpu_kernel.ok());
    std::vector<Tensor> want = {out};
    s = RunKernel(BackendKind::kCpu, **cpu_kernel, {x, pads, fill, axes}, want);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int64_t i = 0; i < out.num_elements(); ++i) {
      ASSERT_EQ(got[0].GetDouble(i), want[0].GetDouble(i)) << "element " << i;
    }
  }
}

// ---- host-side checks: run without a GPU -------------------------------------------------------

// Every op kiln declares has at least one CUDA provider, or a reason it has none in the op table
// (KILN_OP_NO_KERNEL: QuantizeLinear/DequantizeLinear so far).
TEST(CudaOpsCoverage, EveryDeclaredOpHasACudaProvider) {
  std::vector<std::string> missing;
  for (const OpSchema& s : AllOpSchemas()) {
    if (auto op = LookupOpType(s.name); op && !NoKernelReason(*op, "cuda").empty()) continue;
    if (KernelRegistry::Get().Providers(BackendKind::kCuda, s.name).empty()) {
      missing.emplace_back(s.name);
    }
  }
  EXPECT_TRUE(missing.empty()) << "no CUDA provider for: " << ::testing::PrintToString(missing);
}

// The builder asks for tactics on machines that only build: offered without a device, named
// by the storage type.
TEST(CudaOpsCoverage, TacticsWithoutADevice) {
  struct T {
    std::string op;
    AttributeMap attrs;
    std::vector<Operand> ins;
    std::vector<Tensor> outs;
    std::string tactic;
  };
  Tensor x16(DataType::kFloat16, {2, 8});
  std::vector<T> cases;
  cases.push_back({"Sum", {}, {{x16}, {x16}, {x16}}, {x16}, "f16-sum-cuda-variadic"});
  cases.push_back({"Max", {}, {{x16}, {x16}, {x16}}, {x16}, "f16-max-cuda-variadic"});
  cases.push_back({"CumSum", {}, {{x16}, {I64({}, {1}), true}}, {x16}, "f16-cum-sum-cuda"});
  cases.push_back({"ArgMax", {}, {{x16}}, {Tensor(kI64, {1, 8})}, "f16-arg-max-cuda"});
  cases.push_back({"Tile",
                   {},
                   {{x16}, {I64({2}, {1, 2}), true}},
                   {Tensor(DataType::kFloat16, {2, 16})},
                   "f16-tile-cuda"});
  cases.push_back({"Pad",
                   {},
                   {{x16}, {I64({4}, {0, 1, 0, 1}), true}},
                   {Tensor(DataType::kFloat16, {2, 10})},
                   "f16-pad-cuda"});
  cases.push_back({"Resize",
                   Attrs({{"mode", std::string("cubic")}}),
                   {{x16}, {Tensor()}, {Tensor()}, {I64({2}, {4, 16}), true}},
                   {Tensor(DataType::kFloat16, {4, 16})},
                   "f16-resize-cuda-direct"});
  for (T& c : cases) {
    SCOPED_TRACE(c.op);
    std::vector<Operand> ins;
    for (const Operand& o : c.ins) ins.push_back(o);
    auto l = MakeLayer(c.op, c.attrs, ins, c.outs);
    const KernelProvider* p = CudaProviderFor(c.op, l->request);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->Tactics(l->request)[0].name, c.tactic);
  }
}

// Antialiased Resize stays on the CPU.
TEST(CudaOpsCoverage, ResizeCasesLeftToTheCpu) {
  Tensor x(kF32, {4, 4});
  auto l = MakeLayer("Resize", Attrs({{"mode", std::string("cubic")}, {"antialias", int64_t{1}}}),
                     {{x}}, {Tensor(kF32, {8, 8})});
  EXPECT_EQ(CudaProviderFor("Resize", l->request), nullptr);
}

// Constant out-of-range indices are found in Prepare (no device needed), with the CPU's code.
TEST(CudaIndexCheck, ConstantIndicesCheckedInPrepare) {
  struct C {
    std::string op;
    AttributeMap attrs;
    std::vector<Operand> ins;
    Tensor out;
    std::string says;
  };
  Tensor data(kF32, {4, 3});
  std::vector<C> cases;
  cases.push_back({"Gather",
                   Attrs({{"axis", int64_t{1}}}),
                   {{data}, {I64({2}, {0, 3}), true}},
                   Tensor(kF32, {4, 2}),
                   "constant index 3"});
  cases.push_back({"Gather",
                   Attrs({{"axis", int64_t{0}}}),
                   {{data}, {I32({1}, {-5}), true}},
                   Tensor(kF32, {1, 3}),
                   "constant index -5"});
  cases.push_back({"GatherElements",
                   Attrs({{"axis", int64_t{0}}}),
                   {{data}, {I64({1, 3}, {0, 4, 1}), true}},
                   Tensor(kF32, {1, 3}),
                   "constant index 4"});
  cases.push_back({"ScatterND",
                   {},
                   {{data}, {I64({1, 1}, {9}), true}, {Tensor(kF32, {1, 3})}},
                   Tensor(kF32, {4, 3}),
                   "constant index 9"});
  for (C& c : cases) {
    SCOPED_TRACE(c.op);
    auto l = MakeLayer(c.op, c.attrs, c.ins, {c.out});
    const KernelProvider* p = CudaProviderFor(c.op, l->request);
    ASSERT_NE(p, nullptr);
    auto kernel = p->Create(l->request, p->Tactics(l->request)[0]);
    ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
    // Shapes only: Prepare reads dims, never data (as the builder's PreparedWorkspace calls it).
    std::vector<TensorView> ins, outs = {c.out.view()};
    for (const Operand& o : c.ins) ins.push_back(o.value.view());
    auto prepared = (*kernel)->Prepare(ins, outs);
    ASSERT_FALSE(prepared.ok());
    EXPECT_EQ(prepared.status().code(), ErrorCode::kKernelFailed);
    EXPECT_NE(prepared.status().ToString().find(c.says), std::string::npos)
        << prepared.status().ToString();
  }
}

}  // namespace
}  // namespace kiln
