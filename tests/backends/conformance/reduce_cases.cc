// Op conformance cases, reduce family: Reductions (float and integer), ArgMax/ArgMin, CumSum, TopK.
// Each case is a one-node graph that the suite (op_conformance_test.cc) runs on every backend built
// here, every tactic, on fresh random inputs, against the CPU backend (see op_cases.h).
#include "op_cases.h"

namespace kiln::testing {

std::vector<OpCase> ReduceCases() {
  std::vector<OpCase> c;
  // `add`: a case each backend runs where it has a tactic; `must`: every backend must have one.
  [[maybe_unused]] auto add = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), false});
  };
  [[maybe_unused]] auto must = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), true});
  };

  // ---- reductions -----------------------------------------------------------------------------
  struct R {
    const char* op;
    std::vector<int64_t> dims, axes;
    int64_t keepdims;
  };
  for (R r : std::vector<R>{{"ReduceMean", {3, 5, 40}, {-1}, 1},
                            {"ReduceMean", {4, 1000}, {1}, 0},
                            {"ReduceSum", {3, 50, 7}, {1}, 1},
                            {"ReduceMax", {4, 5, 6}, {0, 2}, 1},
                            {"ReduceMin", {4, 5, 6}, {0, 2}, 0},
                            {"ReduceSum", {6, 70}, {}, 0},
                            {"ReduceProd", {5, 6}, {1}, 1},
                            {"ReduceL2", {2, 3, 4}, {1, 2}, 1},
                            {"ReduceSumSquare", {3, 9}, {0}, 1},
                            {"ReduceLogSumExp", {3, 9}, {-1}, 1}}) {
    std::string name = std::string(r.op) + "_" + std::to_string(r.dims.size()) + "d_" +
                       std::to_string(r.axes.size()) + "ax_k" + std::to_string(r.keepdims) + "_" +
                       std::to_string(NumElements(r.dims));
    add(name, [r] {
      OpTester t(r.op, Attrs({{"keepdims", r.keepdims}}));
      double lo = std::string(r.op) == "ReduceProd" ? 0.8 : -2;
      double hi = std::string(r.op) == "ReduceProd" ? 1.2 : 2;
      t.Input(kF32, r.dims, lo, hi);
      if (!r.axes.empty()) t.Constant(I64({static_cast<int64_t>(r.axes.size())}, r.axes));
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
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
        must(sop + "_" + std::string(ToString(t)) + "_" + r.name, [sop, r, t] {
          OpTester u(sop, Attrs({{"keepdims", r.keep}, {"noop_with_empty_axes", r.noop}}));
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
    must(sop + "_bool", [sop] {
      OpTester u(sop, Attrs({{"keepdims", int64_t{0}}}));
      u.Input(kBool, {4, 6}).Constant(I64({1}, {1}));
      return u;
    });
  }

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
          must(name, [sop, a, last, keep] {
            OpTester t(sop, Attrs({{"axis", a.axis},
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
  must("ArgMax_random_f32", [] {
    OpTester t("ArgMax", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {6, 700}).FloatTypes(kAllFloats);
    return t;
  });
  must("ArgMin_i64", [] {
    OpTester t("ArgMin", Attrs({{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}}));
    t.Input(kI64, {3, 300}, -5, 5);
    return t;
  });
  must("ArgMax_i32", [] {
    OpTester t("ArgMax", Attrs({{"axis", int64_t{0}}}));
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
        must(name, [s, exclusive, reverse] {
          OpTester t("CumSum",
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
  must("CumSum_i64", [] {
    OpTester t("CumSum");
    t.Input(kI64, {5, 130}, -1000, 1000).Constant(I64({1}, {1}));
    return t;
  });
  must("CumSum_i32_rev_excl", [] {
    OpTester t("CumSum", Attrs({{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}}));
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
        must(name, [k, largest, sorted] {
          OpTester t("TopK", Attrs({{"axis", k.axis},
                                    {"largest", int64_t{largest}},
                                    {"sorted", int64_t{sorted}}}));
          t.Input(Rounded(k.dims, -20, 20, 5)).Constant(I64({1}, {k.k})).Outputs(2);
          t.FloatTypes(kAllFloats);
          return t;
        });
      }
    }
  }
  must("TopK_random_f32", [] {
    OpTester t("TopK", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {4, 777}).Constant(I64({1}, {10})).Outputs(2).FloatTypes(kAllFloats);
    return t;
  });
  must("TopK_i64", [] {
    OpTester t("TopK", Attrs({{"axis", int64_t{0}}, {"largest", int64_t{0}}}));
    t.Input(kI64, {64, 3}, -9, 9).Constant(I64({1}, {6})).Outputs(2);
    return t;
  });

  return c;
}

}  // namespace kiln::testing
