// If, Loop and Scan lowered at import: the lowered graph's values on the CPU against results
// computed by hand (double loops written from the spec) as imported and after the default
// passes; scan axes and directions, Scan-8's batch axis, states threaded, outer-scope names and
// name clashes, body initializers, loop conditions that fold, nested If inside a Loop, a run-time
// If as Where; and the catalog errors for what cannot be lowered.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/passes/pass.h"
#include "tests/onnx/model_builder.h"
#include "tests/passes/pass_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;  // NOLINT
using onnx::TensorProto;

constexpr int32_t kF = TensorProto::FLOAT;
constexpr int32_t kI64 = TensorProto::INT64;
constexpr int32_t kBool = TensorProto::BOOL;

struct Io {
  std::string name;
  int32_t type;
  std::vector<DimSpec> dims;
  bool shaped = true;  // false: no shape declared
};

onnx::GraphProto Graph(const std::string& name, const std::vector<Io>& inputs,
                       const std::vector<Io>& outputs) {
  onnx::GraphProto g;
  g.set_name(name);
  for (const Io& io : inputs) ModelBuilder::FillValueInfo(g.add_input(), io.name, io.type, io.dims);
  for (const Io& io : outputs) {
    auto* vi = g.add_output();
    if (io.shaped) {
      ModelBuilder::FillValueInfo(vi, io.name, io.type, io.dims);
    } else {
      vi->set_name(io.name);
      vi->mutable_type()->mutable_tensor_type()->set_elem_type(io.type);
    }
  }
  return g;
}

TensorProto IntTensor(const std::string& name, std::vector<int64_t> v, std::vector<int64_t> dims,
                      int32_t type = kI64) {
  TensorProto t;
  t.set_name(name);
  t.set_data_type(type);
  for (int64_t d : dims) t.add_dims(d);
  for (int64_t x : v) {
    if (type == kI64) {
      t.add_int64_data(x);
    } else {
      t.add_int32_data(static_cast<int32_t>(x));
    }
  }
  return t;
}
void ConstNode(onnx::GraphProto* g, const std::string& out, TensorProto t) {
  auto* n = Add(g, "Constant", {}, {out});
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  *a->mutable_t() = std::move(t);
}

Tensor Floats(std::vector<int64_t> dims, std::vector<float> v) {
  return Tensor::FromVector<float>(DataType::kFloat32, std::move(dims), std::move(v));
}

void ExpectValues(const std::map<std::string, Tensor>& got,
                  const std::map<std::string, std::vector<double>>& want,
                  const std::map<std::string, std::vector<int64_t>>& want_dims,
                  const std::string& what) {
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no output " << name;
    const Tensor& t = got.at(name);
    if (want_dims.count(name)) {
      EXPECT_EQ(t.dims(), want_dims.at(name)) << what << ": " << name;
    }
    ASSERT_EQ(static_cast<size_t>(t.num_elements()), w.size()) << what << ": " << name;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_NEAR(t.GetDouble(static_cast<int64_t>(i)), w[i], 1e-5 * std::max(1.0, std::abs(w[i])))
          << what << ": " << name << "[" << i << "]";
    }
  }
}

// Imports, evaluates as imported and after the default passes, checks against `want`.
void Check(const ModelBuilder& mb, const std::map<std::string, Tensor>& inputs,
           const std::map<std::string, std::vector<double>>& want,
           const std::map<std::string, std::vector<int64_t>>& want_dims = {},
           const ImportOptions& options = {}) {
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "", options);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto before = cpu::EvaluateGraph(**g, inputs);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ExpectValues(*before, want, want_dims, "as imported");
  auto report = passes::RunDefaultPasses(**g, passes::testing::TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  auto after = cpu::EvaluateGraph(**g, inputs);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ExpectValues(*after, want, want_dims, "after the passes");
}

Status ImportStatus(const ModelBuilder& mb, const ImportOptions& options = {}) {
  return ImportOnnxBytes(AsBytes(mb.Bytes()), "", options).status();
}

// ---- Scan ----

// Scan-9 with one state and two scan inputs: `a` [3, L] scanned along axis 1 forwards, `b`
// [L, 3] scanned along axis 0 in reverse. Body: s' = s + a_t * b_t + w (w an outer-scope
// initializer), y_t = s' * c (c a body initializer); y stacked along `out_axis`, in reverse
// when `out_reverse`. The body defines a value named like a graph value ("s_out" is also the
// Scan's output name; "tmp" also a main-graph value).
void ScanCase(int64_t out_axis, bool out_reverse) {
  const int64_t L = 4;
  ModelBuilder mb(16);
  mb.Input("s0", kF, {3}).Input("a", kF, {3, L}).Input("b", kF, {L, 3});
  mb.Initializer("w", {0.5f, -1.0f, 2.0f}, {3});
  mb.Initializer("tmp_src", {1.0f, 1.0f, 1.0f}, {3});
  onnx::GraphProto body = Graph("body", {{"s", kF, {3}}, {"at", kF, {3}}, {"bt", kF, {3}}},
                                {{"s_out", kF, {3}}, {"y", kF, {3}}});
  *body.add_initializer() = [] {
    TensorProto t;
    t.set_name("c");
    t.set_data_type(kF);
    t.add_dims(1);
    t.add_float_data(3.0f);
    return t;
  }();
  Add(&body, "Mul", {"at", "bt"}, {"tmp"});
  Add(&body, "Add", {"s", "tmp"}, {"tmp2"});
  Add(&body, "Add", {"tmp2", "w"}, {"s_out"});
  Add(&body, "Mul", {"s_out", "c"}, {"y"});
  auto* scan = mb.Node("Scan", {"s0", "a", "b"}, {"s_out", "ys"}, "scan");
  AttrInt(scan, "num_scan_inputs", 2);
  AttrInts(scan, "scan_input_axes", {1, 0});
  AttrInts(scan, "scan_input_directions", {0, 1});
  AttrInts(scan, "scan_output_axes", {out_axis});
  AttrInts(scan, "scan_output_directions", {out_reverse ? 1 : 0});
  GraphAttr(scan, "body", std::move(body));
  mb.Node("Add", {"tmp_src", "s_out"}, {"tmp"}, "outer_tmp");
  mb.Output("s_out").Output("ys").Output("tmp");

  std::vector<float> s0 = {1, 2, 3}, a(3 * L), b(L * 3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.5f - 0.125f * static_cast<float>(i);
  const double w[3] = {0.5, -1.0, 2.0};
  std::vector<double> s(s0.begin(), s0.end());
  std::vector<std::vector<double>> y;  // per step
  for (int64_t t = 0; t < L; ++t) {
    std::vector<double> yt(3);
    for (int64_t i = 0; i < 3; ++i) {
      s[i] += double(a[i * L + t]) * double(b[(L - 1 - t) * 3 + i]) + w[i];
      yt[i] = s[i] * 3.0;
    }
    y.push_back(yt);
  }
  if (out_reverse) std::reverse(y.begin(), y.end());
  std::vector<double> ys;
  std::vector<int64_t> ys_dims;
  if (out_axis == 0) {
    for (auto& yt : y) ys.insert(ys.end(), yt.begin(), yt.end());
    ys_dims = {L, 3};
  } else {  // axis 1 (or -1): [3, L]
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t t = 0; t < L; ++t) ys.push_back(y[t][i]);
    }
    ys_dims = {3, L};
  }
  std::vector<double> tmp = {1 + s[0], 1 + s[1], 1 + s[2]};
  Check(mb, {{"s0", Floats({3}, s0)}, {"a", Floats({3, L}, a)}, {"b", Floats({L, 3}, b)}},
        {{"s_out", s}, {"ys", ys}, {"tmp", tmp}}, {{"ys", ys_dims}, {"s_out", {3}}});
}

TEST(ControlFlow, ScanAxesDirectionsStatesOuterScopeAndNameClashes) {
  ScanCase(0, false);
  ScanCase(1, false);
  ScanCase(1, true);
  ScanCase(-1, true);
}

// Scan-8: axis 0 is a batch axis (2 entries), the scan axis 1; a running sum per batch entry.
TEST(ControlFlow, Scan8BatchAxis) {
  ModelBuilder mb(8);
  mb.Input("init", kF, {2, 2}).Input("x", kF, {2, 3, 2});
  onnx::GraphProto body =
      Graph("body", {{"acc", kF, {2}}, {"xt", kF, {2}}}, {{"acc_out", kF, {2}}, {"y", kF, {2}}});
  Add(&body, "Add", {"acc", "xt"}, {"acc_out"});
  Add(&body, "Identity", {"acc_out"}, {"y"});
  auto* scan = mb.Node("Scan", {"", "init", "x"}, {"final", "ys"}, "scan8");
  AttrInt(scan, "num_scan_inputs", 1);
  AttrInts(scan, "directions", {1});
  GraphAttr(scan, "body", std::move(body));
  mb.Output("final").Output("ys");
  std::vector<float> init = {1, 2, 3, 4}, x(12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<double> fin, ys(12);
  for (int b = 0; b < 2; ++b) {
    double acc[2] = {init[b * 2], init[b * 2 + 1]};
    for (int t = 0; t < 3; ++t) {  // reverse: step t reads x[b, 2 - t]
      for (int i = 0; i < 2; ++i) {
        acc[i] += x[b * 6 + (2 - t) * 2 + i];
        ys[b * 6 + t * 2 + i] = acc[i];
      }
    }
    fin.push_back(acc[0]);
    fin.push_back(acc[1]);
  }
  Check(mb, {{"init", Floats({2, 2}, init)}, {"x", Floats({2, 3, 2}, x)}},
        {{"final", fin}, {"ys", ys}}, {{"ys", {2, 3, 2}}, {"final", {2, 2}}});
}

// A scan longer than Concat's 1024 inputs: the per-step outputs are concatenated in groups.
TEST(ControlFlow, LongScanStacksInGroups) {
  const int64_t L = 2500;
  ModelBuilder mb(16);
  mb.Input("s0", kF, {}).Input("x", kF, {L});
  onnx::GraphProto body =
      Graph("body", {{"s", kF, {}}, {"xt", kF, {}}}, {{"s_out", kF, {}}, {"y", kF, {}}});
  Add(&body, "Add", {"s", "xt"}, {"s_out"});
  Add(&body, "Identity", {"s_out"}, {"y"});
  auto* scan = mb.Node("Scan", {"s0", "x"}, {"s", "ys"}, "scan");
  AttrInt(scan, "num_scan_inputs", 1);
  GraphAttr(scan, "body", std::move(body));
  mb.Output("s").Output("ys");
  std::vector<float> x(L);
  std::vector<double> ys;
  double acc = 1.0;
  for (int64_t i = 0; i < L; ++i) {
    x[i] = static_cast<float>(i % 7) - 3.0f;
    acc += x[i];
    ys.push_back(acc);
  }
  Check(mb, {{"s0", Floats({}, {1.0f})}, {"x", Floats({L}, x)}}, {{"s", {acc}}, {"ys", ys}},
        {{"ys", {L}}});
}

// The scan length of a value computed in the graph (Transpose of a Reshape by a shape made of
// Shape slices), as ONNX's own function bodies write it.
TEST(ControlFlow, ScanLengthFromComputedShapes) {
  ModelBuilder mb(21);
  mb.Input("x", kF, {2, 6});
  auto* s0 = mb.Node("Shape", {"x"}, {"batch"});
  AttrInt(s0, "start", 0);
  AttrInt(s0, "end", 1);
  ConstNode(&mb.graph(), "three", IntTensor("three", {3}, {1}));
  ConstNode(&mb.graph(), "minus1", IntTensor("minus1", {-1}, {1}));
  auto* cat = mb.Node("Concat", {"batch", "three", "minus1"}, {"shape"});
  AttrInt(cat, "axis", 0);
  mb.Node("Reshape", {"x", "shape"}, {"r"});  // [2, 3, 2]
  auto* tr = mb.Node("Transpose", {"r"}, {"seq"});
  AttrInts(tr, "perm", {1, 0, 2});  // [3, 2, 2]
  ConstNode(&mb.graph(), "zero", [] {
    TensorProto t;
    t.set_name("zero");
    t.set_data_type(kF);
    for (int i = 0; i < 2; ++i) t.add_dims(2);
    for (int i = 0; i < 4; ++i) t.add_float_data(0.0f);
    return t;
  }());
  onnx::GraphProto body =
      Graph("body", {{"acc", kF, {}, false}, {"xt", kF, {}, false}}, {{"acc_out", kF, {}, false}});
  body.mutable_input(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  body.mutable_input(1)->mutable_type()->mutable_tensor_type()->clear_shape();
  Add(&body, "Add", {"acc", "xt"}, {"acc_out"});
  auto* scan = mb.Node("Scan", {"zero", "seq"}, {"sum"}, "scan");
  AttrInt(scan, "num_scan_inputs", 1);
  GraphAttr(scan, "body", std::move(body));
  mb.Output("sum");
  std::vector<float> x(12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  // seq[t, b, k] = x[b, 2t + k]; sum over t.
  std::vector<double> sum(4, 0.0);
  for (int b = 0; b < 2; ++b) {
    for (int k = 0; k < 2; ++k) {
      for (int t = 0; t < 3; ++t) sum[b * 2 + k] += x[b * 6 + 2 * t + k];
    }
  }
  Check(mb, {{"x", Floats({2, 6}, x)}}, {{"sum", sum}}, {{"sum", {2, 2}}});
}

// ---- Loop ----

// Loop with trip count 5 (an initializer) whose body's condition is iter < 2 (folds each
// iteration): it runs iterations 0, 1, 2. State y += x[iter] (x an outer-scope value, read by
// Gather on the iteration number); scan output y * iter.
TEST(ControlFlow, LoopConstantTripCountAndFoldingCondition) {
  ModelBuilder mb(16);
  mb.Input("y0", kF, {2}).Input("x", kF, {5, 2});
  *mb.graph().add_initializer() = IntTensor("M", {5}, {});
  *mb.graph().add_initializer() = IntTensor("two", {2}, {});
  onnx::GraphProto body =
      Graph("body", {{"iter", kI64, {}}, {"cond_in", kBool, {}}, {"y", kF, {2}}},
            {{"cond_out", kBool, {}}, {"y_out", kF, {2}}, {"scan", kF, {2}}});
  Add(&body, "Less", {"iter", "two"}, {"cond_out"});
  auto* g = Add(&body, "Gather", {"x", "iter"}, {"xi"});
  AttrInt(g, "axis", 0);
  Add(&body, "Add", {"y", "xi"}, {"y_out"});
  Add(&body, "Cast", {"iter"}, {"iter_f"});
  AttrInt(body.mutable_node(3), "to", kF);
  Add(&body, "Mul", {"y_out", "iter_f"}, {"scan"});
  auto* loop = mb.Node("Loop", {"M", "", "y0"}, {"y_final", "scans"}, "loop");
  GraphAttr(loop, "body", std::move(body));
  mb.Output("y_final").Output("scans");
  std::vector<float> y0 = {1, -1}, x(10);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
  std::vector<double> y(y0.begin(), y0.end()), scans;
  for (int it = 0; it < 3; ++it) {
    for (int i = 0; i < 2; ++i) y[i] += x[it * 2 + i];
    for (int i = 0; i < 2; ++i) scans.push_back(y[i] * it);
  }
  Check(mb, {{"y0", Floats({2}, y0)}, {"x", Floats({5, 2}, x)}}, {{"y_final", y}, {"scans", scans}},
        {{"scans", {3, 2}}});
}

// ONNX's test_loop11 body (opset 11: Unsqueeze with an axes attribute, rewritten inside the
// body) with a constant trip count and condition: y += x[i : i + 1] each iteration.
TEST(ControlFlow, Opset11LoopBodyIsNormalised) {
  ModelBuilder mb(11);
  mb.Input("y", kF, {1});
  *mb.graph().add_initializer() = IntTensor("trip_count", {5}, {});
  *mb.graph().add_initializer() = IntTensor("cond", {1}, {}, kBool);
  onnx::GraphProto body =
      Graph("body", {{"iter_count", kI64, {}}, {"cond_in", kBool, {}}, {"y_in", kF, {1}}},
            {{"cond_out", kBool, {}}, {"y_out", kF, {1}}, {"scan_out", kF, {1}}});
  Add(&body, "Identity", {"cond_in"}, {"cond_out"});
  ConstNode(&body, "x", [] {
    TensorProto t;
    t.set_name("x");
    t.set_data_type(kF);
    t.add_dims(5);
    for (int i = 1; i <= 5; ++i) t.add_float_data(static_cast<float>(i));
    return t;
  }());
  ConstNode(&body, "one", IntTensor("one", {1}, {}));
  Add(&body, "Add", {"iter_count", "one"}, {"end"});
  AttrInts(Add(&body, "Unsqueeze", {"iter_count"}, {"slice_start"}), "axes", {0});
  AttrInts(Add(&body, "Unsqueeze", {"end"}, {"slice_end"}), "axes", {0});
  Add(&body, "Slice", {"x", "slice_start", "slice_end"}, {"slice_out"});
  Add(&body, "Add", {"y_in", "slice_out"}, {"y_out"});
  Add(&body, "Identity", {"y_out"}, {"scan_out"});
  GraphAttr(mb.Node("Loop", {"trip_count", "cond", "y"}, {"res_y", "res_scan"}, "loop"), "body",
            std::move(body));
  mb.Output("res_y").Output("res_scan");
  Check(mb, {{"y", Floats({1}, {-2.0f})}}, {{"res_y", {13}}, {"res_scan", {-1, 1, 4, 8, 13}}},
        {{"res_scan", {5, 1}}});
}

// A Loop of 4 iterations (trip count from a Constant node, condition a constant true) whose
// body holds an If on iter == 0 (folds per iteration): the first iteration doubles, the others
// add 1. Also a body value named like the Loop's own input.
TEST(ControlFlow, LoopWithNestedIfOnTheIterationNumber) {
  ModelBuilder mb(13);
  mb.Input("v", kF, {3});
  ConstNode(&mb.graph(), "M", IntTensor("M", {4}, {1}));
  ConstNode(&mb.graph(), "cond", IntTensor("cond", {1}, {}, kBool));
  mb.Initializer("one", {1.0f}, {1});
  onnx::GraphProto then_g = Graph("then", {}, {{"t", kF, {3}}});
  Add(&then_g, "Add", {"v", "v"}, {"t"});  // "v" here is the body's own value
  onnx::GraphProto else_g = Graph("else", {}, {{"e", kF, {3}}});
  Add(&else_g, "Add", {"v", "one"}, {"e"});
  onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"v", kF, {3}}},
                                {{"c_out", kBool, {}}, {"v_out", kF, {3}}});
  ConstNode(&body, "zero", IntTensor("zero", {0}, {}));
  Add(&body, "Equal", {"i", "zero"}, {"first"});
  auto* iff = Add(&body, "If", {"first"}, {"v_out"}, "pick");
  GraphAttr(iff, "then_branch", std::move(then_g));
  GraphAttr(iff, "else_branch", std::move(else_g));
  Add(&body, "Identity", {"c"}, {"c_out"});
  auto* loop = mb.Node("Loop", {"M", "cond", "v"}, {"v_final"}, "loop");
  GraphAttr(loop, "body", std::move(body));
  mb.Output("v_final");
  std::vector<float> v = {1, 2, -3};
  std::vector<double> want;
  for (float x : v) want.push_back(x * 2.0 + 3.0);
  Check(mb, {{"v", Floats({3}, v)}}, {{"v_final", want}});
}

// A Loop with a constant trip count (6) whose condition is computed at run time: the initial
// condition is a graph input and the body's is y[0] < limit. Unrolled with each state kept once
// the condition turned false; a second state counts the iterations that ran.
TEST(ControlFlow, LoopWithARunTimeConditionKeepsStatesOnceItIsFalse) {
  ModelBuilder mb(16);
  mb.Input("y0", kF, {2}).Input("go", kBool, {}).Input("limit", kF, {});
  *mb.graph().add_initializer() = IntTensor("M", {6}, {});
  mb.Initializer("step", {1.5f, -0.5f}, {2});
  mb.Initializer("one", {1.0f}, {1});
  mb.Initializer("n0", {0.0f}, {1});
  onnx::GraphProto body =
      Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {2}}, {"n", kF, {1}}},
            {{"c_out", kBool, {}}, {"y_out", kF, {2}}, {"n_out", kF, {1}}});
  Add(&body, "Add", {"y", "step"}, {"y_out"});
  Add(&body, "Add", {"n", "one"}, {"n_out"});
  ConstNode(&body, "zero", IntTensor("zero", {0}, {}));
  AttrInt(Add(&body, "Gather", {"y_out", "zero"}, {"y_first"}), "axis", 0);
  Add(&body, "Less", {"y_first", "limit"}, {"c_out"});
  GraphAttr(mb.Node("Loop", {"M", "go", "y0", "n0"}, {"y", "n"}, "loop"), "body", std::move(body));
  mb.Output("y").Output("n");
  for (bool go : {true, false}) {
    for (float limit : {3.0f, 100.0f, -10.0f}) {
      std::vector<double> y = {0.25, 2.0};
      double n = 0;
      bool c = go;
      for (int it = 0; it < 6 && c; ++it) {
        y[0] += 1.5;
        y[1] -= 0.5;
        n += 1;
        c = y[0] < limit;
      }
      Check(mb,
            {{"y0", Floats({2}, {0.25f, 2.0f})},
             {"go", Tensor::FromVector<uint8_t>(DataType::kBool, {}, {uint8_t(go)})},
             {"limit", Floats({}, {limit})}},
            {{"y", y}, {"n", {n}}});
    }
  }
}

// Loop(M, "", y0) with a run-time trip count M: y_t = y_{t-1} + t (the iteration number as a
// float), scan output ys stacking each y_t. Unrolled to the bound (4 here); M above it fails
// at run time (KILN-E5016), never a truncated result.
ModelBuilder RunTimeTripCountLoop() {
  ModelBuilder mb(16);
  mb.Input("M", kI64, {}).Input("y0", kF, {2});
  onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {2}}},
                                {{"c_out", kBool, {}}, {"y_out", kF, {2}}, {"scan", kF, {2}}});
  Add(&body, "Identity", {"c"}, {"c_out"});
  AttrInt(Add(&body, "Cast", {"i"}, {"fi"}), "to", kF);
  Add(&body, "Add", {"y", "fi"}, {"y_out"});
  Add(&body, "Identity", {"y_out"}, {"scan"});
  GraphAttr(mb.Node("Loop", {"M", "", "y0"}, {"y", "ys"}, "loop"), "body", std::move(body));
  mb.Output("y").Output("ys");
  return mb;
}

TEST(ControlFlow, LoopWithARunTimeTripCountIsUnrolledToTheBound) {
  ModelBuilder mb = RunTimeTripCountLoop();
  ImportOptions options;
  options.max_loop_trips = 4;
  for (int64_t m : {0, 1, 3, 4}) {
    SCOPED_TRACE(m);
    std::vector<double> y = {0.5, -1.0}, ys;
    for (int64_t t = 0; t < m; ++t) {
      for (double& v : y) v += static_cast<double>(t);
      ys.insert(ys.end(), y.begin(), y.end());
    }
    Check(mb,
          {{"M", Tensor::FromVector<int64_t>(DataType::kInt64, {}, {m})},
           {"y0", Floats({2}, {0.5f, -1.0f})}},
          {{"y", y}, {"ys", ys}}, {{"ys", {m, 2}}}, options);
  }
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "", options);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto past =
      cpu::EvaluateGraph(**g, {{"M", Tensor::FromVector<int64_t>(DataType::kInt64, {}, {5})},
                               {"y0", Floats({2}, {0.5f, -1.0f})}});
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), ErrorCode::kLoopTripLimit) << past.status().ToString();
  EXPECT_NE(past.status().message().find("Loop 'loop'"), std::string::npos)
      << past.status().ToString();
}

// A body that slices a constant [4] at the iteration number (as ONNX's test_loop11 does): its
// shapes need the number as a constant, so the iterations are unrolled with constants until the
// slice would leave the tensor (4 iterations, under the default bound of 16); M = 5 wants a
// fifth and fails with KILN-E5016.
TEST(ControlFlow, LoopSlicingAtTheIterationNumberStopsWhereTheShapesWouldChange) {
  ModelBuilder mb(16);
  mb.Input("M", kI64, {}).Input("y0", kF, {1});
  mb.Initializer("x", {1.0f, 2.0f, 4.0f, 8.0f}, {4});
  onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                {{"c_out", kBool, {}}, {"y_out", kF, {1}}, {"scan", kF, {1}}});
  Add(&body, "Identity", {"c"}, {"c_out"});
  ConstNode(&body, "one", IntTensor("one", {1}, {}));
  ConstNode(&body, "axes", IntTensor("axes", {0}, {1}));
  Add(&body, "Add", {"i", "one"}, {"end"});
  Add(&body, "Unsqueeze", {"i", "axes"}, {"start1"});
  Add(&body, "Unsqueeze", {"end", "axes"}, {"end1"});
  Add(&body, "Slice", {"x", "start1", "end1"}, {"xi"});
  Add(&body, "Add", {"y", "xi"}, {"y_out"});
  Add(&body, "Identity", {"y_out"}, {"scan"});
  GraphAttr(mb.Node("Loop", {"M", "", "y0"}, {"y", "ys"}, "loop"), "body", std::move(body));
  mb.Output("y").Output("ys");
  const std::vector<double> x = {1, 2, 4, 8};
  for (int64_t m : {0, 2, 4}) {
    SCOPED_TRACE(m);
    double y = 0.5;
    std::vector<double> ys;
    for (int64_t t = 0; t < m; ++t) ys.push_back(y += x[static_cast<size_t>(t)]);
    Check(mb,
          {{"M", Tensor::FromVector<int64_t>(DataType::kInt64, {}, {m})},
           {"y0", Floats({1}, {0.5f})}},
          {{"y", {y}}, {"ys", ys}}, {{"ys", {m, 1}}});
  }
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto past = cpu::EvaluateGraph(
      **g,
      {{"M", Tensor::FromVector<int64_t>(DataType::kInt64, {}, {5})}, {"y0", Floats({1}, {0.5f})}});
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), ErrorCode::kLoopTripLimit) << past.status().ToString();
  EXPECT_NE(past.status().message().find("4 iteration(s)"), std::string::npos)
      << past.status().ToString();
}

// A run-time condition with scan outputs (their length then depends on the data) and a run-time
// condition without a trip count: both unrolled to the bound.
TEST(ControlFlow, LoopWithARunTimeConditionAndScanOutputsCutsThemToTheIterationsRun) {
  ModelBuilder mb(16);
  mb.Input("y0", kF, {1}).Input("lim", kF, {1});
  onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                {{"c_out", kBool, {1}}, {"y_out", kF, {1}}, {"scan", kF, {1}}});
  Add(&body, "Add", {"y", "y"}, {"y_out"});
  Add(&body, "Less", {"y_out", "lim"}, {"c_out"});
  Add(&body, "Identity", {"y_out"}, {"scan"});
  GraphAttr(mb.Node("Loop", {"", "", "y0"}, {"y", "ys"}, "loop"), "body", std::move(body));
  mb.Output("y").Output("ys");
  for (float lim : {0.5f, 3.0f, 100.0f}) {
    SCOPED_TRACE(lim);
    double y = 1.0;
    std::vector<double> ys;
    bool c = true;
    while (c) {
      y += y;
      ys.push_back(y);
      c = y < lim;
    }
    Check(mb, {{"y0", Floats({1}, {1.0f})}, {"lim", Floats({1}, {lim})}}, {{"y", {y}}, {"ys", ys}},
          {{"ys", {static_cast<int64_t>(ys.size()), 1}}});
  }
  // 2^17 > 1e5: the loop wants 17 iterations, one past the default bound of 16.
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto past = cpu::EvaluateGraph(**g, {{"y0", Floats({1}, {1.0f})}, {"lim", Floats({1}, {1e5f})}});
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), ErrorCode::kLoopTripLimit) << past.status().ToString();
}

// ---- If ----

onnx::GraphProto Branch(const std::string& name, const std::string& op, const std::string& out,
                        bool shaped = true, int64_t dim = 3) {
  onnx::GraphProto g = Graph(name, {}, {{out, kF, {dim}, shaped}});
  Add(&g, op, {"x", "k"}, {out});
  return g;
}

TEST(ControlFlow, IfOnAConstantConditionInlinesOneBranch) {
  for (bool c : {true, false}) {
    ModelBuilder mb(16);
    mb.Input("x", kF, {3});
    mb.Initializer("k", {2.0f}, {1});
    *mb.graph().add_initializer() = IntTensor("c", {c ? 1 : 0}, {1}, kBool);
    auto* n = mb.Node("If", {"c"}, {"y"}, "if");
    GraphAttr(n, "then_branch", Branch("then", "Mul", "o"));
    GraphAttr(n, "else_branch", Branch("else", "Sub", "o"));  // same name in both branches
    mb.Output("y");
    auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(passes::testing::CountOps(**g, "Where"), 0);
    std::vector<float> x = {1, -2, 5};
    std::vector<double> want;
    for (float v : x) want.push_back(c ? v * 2.0 : v - 2.0);
    Check(mb, {{"x", Floats({3}, x)}}, {{"y", want}});
  }
}

TEST(ControlFlow, IfOnARunTimeConditionIsBothBranchesAndWhere) {
  ModelBuilder mb(16);
  mb.Input("x", kF, {3}).Input("c", kBool, {1});
  mb.Initializer("k", {2.0f}, {1});
  auto* n = mb.Node("If", {"c"}, {"y"}, "if");
  GraphAttr(n, "then_branch", Branch("then", "Mul", "o"));
  GraphAttr(n, "else_branch", Branch("else", "Sub", "o", /*shaped=*/false));  // shape from facts
  mb.Output("y");
  std::vector<float> x = {1, -2, 5};
  for (bool c : {true, false}) {
    std::vector<double> want;
    for (float v : x) want.push_back(c ? v * 2.0 : v - 2.0);
    Tensor cond = Tensor::FromVector<uint8_t>(DataType::kBool, {1}, {uint8_t(c)});
    Check(mb, {{"x", Floats({3}, x)}, {"c", cond}}, {{"y", want}}, {{"y", {3}}});
  }
}

// 1-D branch outputs of different lengths (an empty constant against a data-dependent count, as
// in detection post-processing): Compress over both under the taken branch's mask.
TEST(ControlFlow, IfOnARunTimeConditionWithOneDimensionalBranchesOfDifferentLengthsIsCompress) {
  ModelBuilder mb(16);
  mb.Input("x", kF, {3}).Input("c", kBool, {});
  mb.Initializer("k", {2.0f}, {1});
  auto* n = mb.Node("If", {"c"}, {"y"}, "if");
  GraphAttr(n, "then_branch", Branch("then", "Mul", "o", true, 3));  // [3]
  onnx::GraphProto else_g = Graph("else", {}, {{"o", kF, {1}}});
  Add(&else_g, "Add", {"k", "k"}, {"o"});  // [1]
  GraphAttr(n, "else_branch", std::move(else_g));
  mb.Output("y");
  std::vector<float> x = {1, -2, 5};
  for (bool c : {true, false}) {
    std::vector<double> want = c ? std::vector<double>{2, -4, 10} : std::vector<double>{4};
    Tensor cond = Tensor::FromVector<uint8_t>(DataType::kBool, {}, {uint8_t(c)});
    Check(mb, {{"x", Floats({3}, x)}, {"c", cond}}, {{"y", want}},
          {{"y", {static_cast<int64_t>(want.size())}}});
  }
}

// A condition computed from a dim that is static behind a data-dependent one (Shape of a
// Gather by NonZero's indices, then Gather of the static dim) folds: the branch taken is
// inlined, even though the branches differ in rank.
TEST(ControlFlow, IfOnAStaticDimBehindADataDependentOneFolds) {
  ModelBuilder mb(16);
  mb.Input("x", kF, {4, 2}).Input("m", kBool, {4});
  *mb.graph().add_initializer() = IntTensor("one", {1}, {1});
  *mb.graph().add_initializer() = IntTensor("zero", {0}, {1});
  mb.Node("NonZero", {"m"}, {"nz"});            // [1, ?]
  mb.Node("Transpose", {"nz"}, {"nzt"});        // [?, 1]
  mb.Node("Squeeze", {"nzt", "one"}, {"idx"});  // [?]
  mb.Node("Gather", {"x", "idx"}, {"rows"});    // [?, 2]
  mb.Node("Gather", {"rows", "zero"}, {"col"})->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("axis");
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(1);
    return a;
  }());  // [?, 1]
  mb.Node("Shape", {"col"}, {"shape"});
  mb.Node("Gather", {"shape", "one"}, {"d1"});  // [1]: static
  mb.Node("Equal", {"d1", "one"}, {"c"});
  auto* n = mb.Node("If", {"c"}, {"y"}, "if");
  onnx::GraphProto then_g = Graph("then", {}, {{"o", kF, {-1}, false}});
  Add(&then_g, "Squeeze", {"col", "one"}, {"o"});
  onnx::GraphProto else_g = Graph("else", {}, {{"o", kF, {-1, 1}, false}});
  Add(&else_g, "Identity", {"col"}, {"o"});
  GraphAttr(n, "then_branch", std::move(then_g));
  GraphAttr(n, "else_branch", std::move(else_g));
  mb.Output("y");
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  Tensor m = Tensor::FromVector<uint8_t>(DataType::kBool, {4}, {1, 0, 1, 1});
  Check(mb, {{"x", Floats({4, 2}, x)}, {"m", m}}, {{"y", {1, 5, 7}}}, {{"y", {3}}});
}

// The same condition behind values whose dims import does not know: a Reshape to a shape of
// a symbolic dim and a Slice to a bound computed from it keep their ranks, so the Gather of
// column 0 is [?, 1] and the condition still folds.
TEST(ControlFlow, IfOnAStaticDimBehindSymbolicReshapeAndSliceFolds) {
  ModelBuilder mb(16);
  mb.Input("x", kF, {"N", 2}).Input("m", kBool, {4});
  *mb.graph().add_initializer() = IntTensor("one", {1}, {1});
  *mb.graph().add_initializer() = IntTensor("zero", {0}, {1});
  mb.Node("Shape", {"x"}, {"s"});                // [N, 2]: not all known
  mb.Node("Reshape", {"x", "s"}, {"r"});         // [?, ?]
  mb.Node("Gather", {"s", "zero"}, {"e"});       // [N]
  mb.Node("Slice", {"r", "zero", "e"}, {"rs"});  // [?, ?]
  mb.Node("NonZero", {"m"}, {"nz"});
  mb.Node("Transpose", {"nz"}, {"nzt"});
  mb.Node("Squeeze", {"nzt", "one"}, {"idx"});
  mb.Node("Gather", {"rs", "idx"}, {"rows"});                // [?, ?]
  auto* col = mb.Node("Gather", {"rows", "zero"}, {"col"});  // [?, 1]
  auto* axis = col->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  mb.Node("Shape", {"col"}, {"shape"});
  mb.Node("Gather", {"shape", "one"}, {"d1"});
  mb.Node("Equal", {"d1", "one"}, {"c"});
  auto* n = mb.Node("If", {"c"}, {"y"}, "if");
  onnx::GraphProto then_g = Graph("then", {}, {{"o", kF, {-1}, false}});
  Add(&then_g, "Squeeze", {"col", "one"}, {"o"});
  onnx::GraphProto else_g = Graph("else", {}, {{"o", kF, {-1, 1}, false}});
  Add(&else_g, "Identity", {"col"}, {"o"});
  GraphAttr(n, "then_branch", std::move(then_g));
  GraphAttr(n, "else_branch", std::move(else_g));
  mb.Output("y");
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  Tensor m = Tensor::FromVector<uint8_t>(DataType::kBool, {4}, {1, 0, 1, 1});
  // x as [4, 2], rows 0..3: rows 0, 2, 3 by m, column 0.
  Check(mb, {{"x", Floats({4, 2}, x)}, {"m", m}}, {{"y", {1, 5, 7}}}, {{"y", {3}}});
}

// ---- what cannot be lowered ----

TEST(ControlFlow, UnlowerableControlFlowIsOneCatalogErrorSayingWhy) {
  ImportOptions no_bound;
  no_bound.max_loop_trips = 0;
  {  // Loop with a run-time trip count, imported without a bound
    ModelBuilder mb(16);
    mb.Input("M", kI64, {}).Input("y0", kF, {1});
    onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                  {{"c_out", kBool, {}}, {"y_out", kF, {1}}});
    Add(&body, "Identity", {"c"}, {"c_out"});
    Add(&body, "Identity", {"y"}, {"y_out"});
    GraphAttr(mb.Node("Loop", {"M", "", "y0"}, {"y"}, "loop"), "body", std::move(body));
    mb.Output("y");
    Status st = ImportStatus(mb, no_bound);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("trip count 'M' is computed at run time"), std::string::npos)
        << st.ToString();
    EXPECT_NE(st.message().find("--max-loop-trips"), std::string::npos) << st.ToString();
    EXPECT_TRUE(ImportStatus(mb).ok());  // the default bound lowers it
  }
  {  // Loop whose condition is data-dependent, with a scan output (of data-dependent length)
    ModelBuilder mb(16);
    mb.Input("y0", kF, {1});
    *mb.graph().add_initializer() = IntTensor("M", {10}, {});
    mb.Initializer("lim", {5.0f}, {1});
    onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                  {{"c_out", kBool, {1}}, {"y_out", kF, {1}}, {"scan", kF, {1}}});
    Add(&body, "Add", {"y", "y"}, {"y_out"});
    Add(&body, "Less", {"y_out", "lim"}, {"c_out"});
    Add(&body, "Identity", {"y_out"}, {"scan"});
    GraphAttr(mb.Node("Loop", {"M", "", "y0"}, {"y", "ys"}, "loop"), "body", std::move(body));
    mb.Output("y").Output("ys");
    Status st = ImportStatus(mb, no_bound);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("does not fold to a constant"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("a bound given at build time"), std::string::npos) << st.ToString();
  }
  {  // run-time trip count, and a body that grows its state
    ModelBuilder mb(16);
    mb.Input("M", kI64, {}).Input("y0", kF, {1});
    onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                  {{"c_out", kBool, {}}, {"y_out", kF, {2}}});
    Add(&body, "Identity", {"c"}, {"c_out"});
    AttrInt(Add(&body, "Concat", {"y", "y"}, {"y_out"}), "axis", 0);
    GraphAttr(mb.Node("Loop", {"M", "", "y0"}, {"y"}, "loop"), "body", std::move(body));
    mb.Output("y");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("keeps the shape of loop state 'y'"), std::string::npos)
        << st.ToString();
  }
  {  // run-time condition and no trip count
    ModelBuilder mb(16);
    mb.Input("y0", kF, {1}).Input("c0", kBool, {});
    onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                  {{"c_out", kBool, {}}, {"y_out", kF, {1}}});
    Add(&body, "Identity", {"c"}, {"c_out"});
    Add(&body, "Neg", {"y"}, {"y_out"});
    GraphAttr(mb.Node("Loop", {"", "c0", "y0"}, {"y"}, "loop"), "body", std::move(body));
    mb.Output("y");
    Status st = ImportStatus(mb, no_bound);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("a bound given at build time"), std::string::npos) << st.ToString();
  }
  {  // Scan over a symbolic length
    ModelBuilder mb(16);
    mb.Input("s0", kF, {2}).Input("x", kF, {"T", 2});
    onnx::GraphProto body = Graph("body", {{"s", kF, {2}}, {"xt", kF, {2}}}, {{"s_out", kF, {2}}});
    Add(&body, "Add", {"s", "xt"}, {"s_out"});
    auto* scan = mb.Node("Scan", {"s0", "x"}, {"s"}, "scan");
    AttrInt(scan, "num_scan_inputs", 1);
    GraphAttr(scan, "body", std::move(body));
    mb.Output("s");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("is not static"), std::string::npos) << st.ToString();
  }
  {  // run-time If whose branches differ in shape
    ModelBuilder mb(16);
    mb.Input("x", kF, {3}).Input("c", kBool, {});
    mb.Initializer("k", {2.0f}, {1});
    auto* n = mb.Node("If", {"c"}, {"y"}, "if");
    GraphAttr(n, "then_branch", Branch("then", "Mul", "o", true, 3));
    mb.Initializer("k2", {2.0f}, {1, 1});
    onnx::GraphProto else_g = Graph("else", {}, {{"o", kF, {1, 1}}});
    Add(&else_g, "Add", {"k", "k2"}, {"o"});  // [1, 1]: another rank
    GraphAttr(n, "else_branch", std::move(else_g));
    mb.Output("y");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("of one shape"), std::string::npos) << st.ToString();
  }
  {  // a Loop past the unrolling budget
    ModelBuilder mb(16);
    mb.Input("y0", kF, {1});
    *mb.graph().add_initializer() = IntTensor("M", {1000000}, {});
    onnx::GraphProto body = Graph("body", {{"i", kI64, {}}, {"c", kBool, {}}, {"y", kF, {1}}},
                                  {{"c_out", kBool, {}}, {"y_out", kF, {1}}});
    Add(&body, "Identity", {"c"}, {"c_out"});
    Add(&body, "Neg", {"y"}, {"y_out"});
    GraphAttr(mb.Node("Loop", {"M", "", "y0"}, {"y"}, "loop"), "body", std::move(body));
    mb.Output("y");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("more than 200000 nodes"), std::string::npos) << st.ToString();
  }
  {  // a malformed Scan: the body's inputs do not match the node's
    ModelBuilder mb(16);
    mb.Input("s0", kF, {2}).Input("x", kF, {3, 2});
    onnx::GraphProto body = Graph("body", {{"s", kF, {2}}}, {{"s_out", kF, {2}}});
    Add(&body, "Identity", {"s"}, {"s_out"});
    auto* scan = mb.Node("Scan", {"s0", "x"}, {"s"}, "scan");
    AttrInt(scan, "num_scan_inputs", 1);
    GraphAttr(scan, "body", std::move(body));
    mb.Output("s");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidModel) << st.ToString();
  }
}

}  // namespace
}  // namespace kiln
