// Sequences and optionals lowered at import: models written here, run on the CPU as imported and
// after the default passes, against values computed by hand from the spec (slices, stacks and
// sums written as loops); sequence and optional graph inputs and outputs specialised into
// tensors (names, bindings, per-element symbols); backend-test values read by declared kind;
// and the catalog errors for what cannot be resolved at import.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

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

void IntConst(ModelBuilder& mb, const std::string& name, std::vector<int64_t> v,
              std::vector<int64_t> dims) {
  auto* t = mb.graph().add_initializer();
  t->set_name(name);
  t->set_data_type(kI64);
  for (int64_t d : dims) t->add_dims(d);
  for (int64_t x : v) t->add_int64_data(x);
}

// A value_info of sequence (or optional sequence / optional tensor) type around a tensor type.
onnx::TypeProto TensorType(int32_t elem, const std::vector<DimSpec>& dims, bool shaped = true) {
  onnx::ValueInfoProto vi;
  ModelBuilder::FillValueInfo(&vi, "t", elem, dims);
  if (!shaped) vi.mutable_type()->mutable_tensor_type()->clear_shape();
  return vi.type();
}
void SeqValue(onnx::ValueInfoProto* vi, const std::string& name, onnx::TypeProto elem,
              bool optional = false) {
  vi->set_name(name);
  onnx::TypeProto seq;
  *seq.mutable_sequence_type()->mutable_elem_type() = std::move(elem);
  if (optional) {
    *vi->mutable_type()->mutable_optional_type()->mutable_elem_type() = std::move(seq);
  } else {
    *vi->mutable_type() = std::move(seq);
  }
}
void OptTensorValue(onnx::ValueInfoProto* vi, const std::string& name, onnx::TypeProto elem) {
  vi->set_name(name);
  *vi->mutable_type()->mutable_optional_type()->mutable_elem_type() = std::move(elem);
}

Tensor Floats(std::vector<int64_t> dims, std::vector<float> v) {
  return Tensor::FromVector<float>(DataType::kFloat32, std::move(dims), std::move(v));
}

struct Want {
  std::vector<int64_t> dims;
  std::vector<double> values;
};

void ExpectValues(const std::map<std::string, Tensor>& got, const std::map<std::string, Want>& want,
                  const std::string& what) {
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no output " << name;
    const Tensor& t = got.at(name);
    EXPECT_EQ(t.dims(), w.dims) << what << ": " << name;
    ASSERT_EQ(static_cast<size_t>(t.num_elements()), w.values.size()) << what << ": " << name;
    for (size_t i = 0; i < w.values.size(); ++i) {
      EXPECT_NEAR(t.GetDouble(static_cast<int64_t>(i)), w.values[i], 1e-6)
          << what << ": " << name << "[" << i << "]";
    }
  }
}

// Imports with `options`, evaluates as imported and after the default passes.
void Check(const ModelBuilder& mb, const ImportOptions& options,
           const std::map<std::string, Tensor>& inputs, const std::map<std::string, Want>& want,
           OnnxModelMeta* meta = nullptr) {
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "", options, meta);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto before = cpu::EvaluateGraph(**g, inputs);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ExpectValues(*before, want, "as imported");
  auto report = passes::RunDefaultPasses(**g, passes::testing::TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  auto after = cpu::EvaluateGraph(**g, inputs);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ExpectValues(*after, want, "after the passes");
}

// x[r][c] of a row-major [rows, cols] vector, columns [c0, c1).
std::vector<double> Cols(const std::vector<float>& x, int64_t cols, int64_t c0, int64_t c1) {
  std::vector<double> out;
  for (size_t r = 0; r < x.size() / static_cast<size_t>(cols); ++r) {
    for (int64_t c = c0; c < c1; ++c) out.push_back(x[r * static_cast<size_t>(cols) + c]);
  }
  return out;
}

// SplitToSequence (constant sizes, a constant chunk size, pieces of one squeezed), SequenceAt
// (negative position), SequenceInsert/Erase, SequenceLength, ConcatFromSequence with and without
// a new axis: the torch `torch.split` / `torch.stack` / list-manipulation exports.
TEST(Sequences, SplitInsertEraseAtLengthConcat) {
  ModelBuilder mb(17);
  mb.Input("x", kF, {2, 6});
  IntConst(mb, "sizes", {1, 2, 3}, {3});
  IntConst(mb, "chunk", {4}, {});
  IntConst(mb, "minus1", {-1}, {});
  IntConst(mb, "zero", {0}, {});
  IntConst(mb, "one", {1}, {});
  AttrInt(mb.Node("SplitToSequence", {"x", "sizes"}, {"seq"}), "axis", 1);  // [2,1] [2,2] [2,3]
  mb.Node("SequenceLength", {"seq"}, {"n"});
  mb.Node("SequenceAt", {"seq", "minus1"}, {"last"});                          // [2, 3]
  mb.Node("SequenceInsert", {"seq", "last", "zero"}, {"seq2"});                // last, p0, p1, p2
  mb.Node("SequenceErase", {"seq2", "one"}, {"seq3"});                         // last, p1, p2
  AttrInt(mb.Node("ConcatFromSequence", {"seq3"}, {"cat"}), "axis", 1);        // [2, 8]
  AttrInt(mb.Node("SplitToSequence", {"x", "chunk"}, {"chunks"}), "axis", 1);  // [2,4] [2,2]
  mb.Node("SequenceAt", {"chunks", "one"}, {"tail"});
  auto* rows = mb.Node("SplitToSequence", {"x"}, {"rows"});  // two [6] rows
  AttrInt(rows, "axis", 0);
  AttrInt(rows, "keepdims", 0);
  auto* stack = mb.Node("ConcatFromSequence", {"rows"}, {"stacked"});  // [6, 2]
  AttrInt(stack, "axis", -1);
  AttrInt(stack, "new_axis", 1);
  mb.Output("n", kI64).Output("cat").Output("tail").Output("stacked");
  std::vector<float> x;
  for (int i = 0; i < 12; ++i) x.push_back(static_cast<float>(i * i) - 7.5f);
  std::vector<double> cat;
  for (int r = 0; r < 2; ++r) {
    for (int c : {3, 4, 5, 1, 2, 3, 4, 5}) cat.push_back(x[static_cast<size_t>(r * 6 + c)]);
  }
  std::vector<double> stacked;
  for (int c = 0; c < 6; ++c) {
    for (int r = 0; r < 2; ++r) stacked.push_back(x[static_cast<size_t>(r * 6 + c)]);
  }
  Check(mb, {}, {{"x", Floats({2, 6}, x)}},
        {{"n", {{}, {3}}},
         {"cat", {{2, 8}, cat}},
         {"tail", {{2, 2}, Cols(x, 6, 4, 6)}},
         {"stacked", {{6, 2}, stacked}}});
}

// A sequence graph input specialised to a length: inputs s.0 ... s.2, each with symbols of its
// own (elements of one declared type differ in shape); SequenceMap with a tensor passed to every
// copy of the body; a sequence output becomes y.0 ... y.2; the bindings say so.
TEST(Sequences, SequenceInputMapAndSequenceOutput) {
  ModelBuilder mb(17);
  SeqValue(mb.graph().add_input(), "s", TensorType(kF, {"N"}));
  mb.Input("t", kF, {1});
  onnx::GraphProto body;
  body.set_name("body");
  ModelBuilder::FillValueInfo(body.add_input(), "e", kF, {"N"});
  ModelBuilder::FillValueInfo(body.add_input(), "k", kF, {1});
  Add(&body, "Add", {"e", "k"}, {"sum"});
  Add(&body, "Shape", {"e"}, {"shape"});
  ModelBuilder::FillValueInfo(body.add_output(), "sum", kF, {"N"});
  ModelBuilder::FillValueInfo(body.add_output(), "shape", kI64, {1});
  GraphAttr(mb.Node("SequenceMap", {"s", "t"}, {"y", "shapes"}), "body", std::move(body));
  SeqValue(mb.graph().add_output(), "y", TensorType(kF, {"N"}));
  SeqValue(mb.graph().add_output(), "shapes", TensorType(kI64, {1}));
  ImportOptions options;
  options.sequence_inputs["s"] = {3, -1};
  OnnxModelMeta meta;
  std::vector<std::vector<float>> elems = {{1, 2, 3}, {-4}, {5, 6}};
  std::map<std::string, Tensor> inputs = {{"t", Floats({1}, {0.5f})}};
  std::map<std::string, Want> want;
  for (size_t k = 0; k < elems.size(); ++k) {
    const auto len = static_cast<int64_t>(elems[k].size());
    inputs["s." + std::to_string(k)] = Floats({len}, elems[k]);
    std::vector<double> sum;
    for (float v : elems[k]) sum.push_back(v + 0.5);
    want["y." + std::to_string(k)] = {{len}, sum};
    want["shapes." + std::to_string(k)] = {{1}, {static_cast<double>(len)}};
  }
  Check(mb, options, inputs, want, &meta);
  ASSERT_EQ(meta.inputs.size(), 2u);
  EXPECT_EQ(meta.inputs[0].kind, OnnxValueKind::kSequence);
  EXPECT_EQ(meta.inputs[0].tensors, (std::vector<std::string>{"s.0", "s.1", "s.2"}));
  EXPECT_EQ(meta.inputs[1].tensors, (std::vector<std::string>{"t"}));
  ASSERT_EQ(meta.outputs.size(), 2u);
  EXPECT_EQ(meta.outputs[0].kind, OnnxValueKind::kSequence);
  EXPECT_EQ(meta.outputs[0].tensors, (std::vector<std::string>{"y.0", "y.1", "y.2"}));
  // Each element has symbols of its own.
  auto g = ImportOnnxBytes(AsBytes(mb.Bytes()), "", options);
  ASSERT_TRUE(g.ok());
  std::set<std::string> symbols;
  for (const Value* v : (*g)->inputs()) {
    for (const Dim& d : v->shape()) {
      if (!d.is_static()) symbols.insert(d.ToString());
    }
  }
  EXPECT_EQ(symbols.size(), 3u);
}

// A Loop of a constant trip count that grows a sequence state (SequenceEmpty, SequenceInsert of
// x * i per iteration), then ConcatFromSequence; an If on a run-time condition that gives
// sequences of one length from each branch picks element by element.
TEST(Sequences, LoopGrowsASequenceAndRunTimeIfPicksSequences) {
  ModelBuilder mb(17);
  mb.Input("x", kF, {2}).Input("c", kBool, {});
  IntConst(mb, "M", {3}, {});
  mb.Node("SequenceEmpty", {}, {"empty"});
  onnx::GraphProto body;
  body.set_name("body");
  ModelBuilder::FillValueInfo(body.add_input(), "i", kI64, {});
  ModelBuilder::FillValueInfo(body.add_input(), "cond", kBool, {});
  SeqValue(body.add_input(), "acc", TensorType(kF, {2}));
  Add(&body, "Identity", {"cond"}, {"cond_out"});
  auto* cast = Add(&body, "Cast", {"i"}, {"fi"});
  AttrInt(cast, "to", kF);
  Add(&body, "Mul", {"x", "fi"}, {"xi"});
  Add(&body, "SequenceInsert", {"acc", "xi"}, {"acc_out"});
  ModelBuilder::FillValueInfo(body.add_output(), "cond_out", kBool, {});
  SeqValue(body.add_output(), "acc_out", TensorType(kF, {2}));
  GraphAttr(mb.Node("Loop", {"M", "", "empty"}, {"grown"}), "body", std::move(body));
  AttrInt(mb.Node("ConcatFromSequence", {"grown"}, {"cat"}), "axis", 0);  // [6]
  auto branch = [&](const std::string& name, const std::string& op) {
    onnx::GraphProto g;
    g.set_name(name);
    Add(&g, op, {"x"}, {name + "_e"});
    Add(&g, "SequenceConstruct", {name + "_e", "x"}, {name + "_seq"});
    SeqValue(g.add_output(), name + "_seq", TensorType(kF, {2}));
    return g;
  };
  auto* n = mb.Node("If", {"c"}, {"picked"});
  GraphAttr(n, "then_branch", branch("then", "Neg"));
  GraphAttr(n, "else_branch", branch("else", "Abs"));
  SeqValue(mb.graph().add_output(), "picked", TensorType(kF, {2}));
  mb.Output("cat");
  std::vector<float> x = {1.5f, -2.0f};
  for (bool c : {true, false}) {
    std::map<std::string, Want> want;
    want["cat"] = {{6}, {0, 0, 1.5, -2.0, 3.0, -4.0}};
    want["picked.0"] = {{2}, c ? std::vector<double>{-1.5, 2.0} : std::vector<double>{1.5, 2.0}};
    want["picked.1"] = {{2}, {1.5, -2.0}};
    Tensor cond = Tensor::FromVector<uint8_t>(DataType::kBool, {}, {uint8_t(c)});
    Check(mb, {}, {{"x", Floats({2}, x)}, {"c", cond}}, want);
  }
}

// Optionals: Optional(x) and Optional() with a type, OptionalHasElement (of an optional, of no
// input, of a tensor), OptionalGetElement; an optional input present (its tensor under its own
// name) or specialised absent (no engine input); optional outputs present or absent.
TEST(Optionals, ConstructHasGetAndInputsOutputs) {
  auto model = [] {
    ModelBuilder mb(18);
    mb.Input("x", kF, {3});
    OptTensorValue(mb.graph().add_input(), "o", TensorType(kF, {3}));
    mb.Node("Optional", {"x"}, {"ox"});
    auto* none = mb.Node("Optional", {}, {"none"});
    auto* a = none->add_attribute();
    a->set_name("type");
    a->set_type(onnx::AttributeProto::TYPE_PROTO);
    *a->mutable_tp() = TensorType(kF, {3});
    mb.Node("OptionalHasElement", {"ox"}, {"has_x"});
    mb.Node("OptionalHasElement", {"none"}, {"has_none"});
    mb.Node("OptionalHasElement", {}, {"has_nothing"});
    mb.Node("OptionalHasElement", {"x"}, {"has_tensor"});
    mb.Node("OptionalHasElement", {"o"}, {"has_o"});
    mb.Node("OptionalGetElement", {"ox"}, {"got"});
    mb.Node("Identity", {"o"}, {"o_copy"});
    mb.Output("has_x", kBool).Output("has_none", kBool).Output("has_nothing", kBool);
    mb.Output("has_tensor", kBool).Output("has_o", kBool).Output("got");
    OptTensorValue(mb.graph().add_output(), "o_copy", TensorType(kF, {3}));
    OptTensorValue(mb.graph().add_output(), "none", TensorType(kF, {3}));
    return mb;
  };
  std::vector<float> x = {1, 2, 3}, o = {-1, 0, 4};
  for (bool present : {true, false}) {
    ImportOptions options;
    std::map<std::string, Tensor> inputs = {{"x", Floats({3}, x)}};
    std::map<std::string, Want> want = {{"has_x", {{}, {1}}},
                                        {"has_none", {{}, {0}}},
                                        {"has_nothing", {{}, {0}}},
                                        {"has_tensor", {{}, {1}}},
                                        {"has_o", {{}, {present ? 1.0 : 0.0}}},
                                        {"got", {{3}, {1, 2, 3}}}};
    if (present) {
      inputs["o"] = Floats({3}, o);
      want["o_copy"] = {{3}, {-1, 0, 4}};
    } else {
      options.absent_inputs.insert("o");
    }
    OnnxModelMeta meta;
    Check(model(), options, inputs, want, &meta);
    ASSERT_EQ(meta.inputs.size(), 2u);
    EXPECT_EQ(meta.inputs[1].kind, OnnxValueKind::kOptionalTensor);
    EXPECT_EQ(meta.inputs[1].present, present);
    ASSERT_EQ(meta.outputs.size(), 8u);
    EXPECT_EQ(meta.outputs[6].present, present);  // o_copy
    EXPECT_EQ(meta.outputs[6].tensors.size(), present ? 1u : 0u);
    EXPECT_FALSE(meta.outputs[7].present);  // none
    auto g = ImportOnnxBytes(AsBytes(model().Bytes()), "", options);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->inputs().size(), present ? 2u : 1u);
  }
}

// An optional holding a sequence, given as a graph input of a known length: OptionalGetElement
// gives the sequence, SequenceLength folds.
TEST(Optionals, OptionalSequenceInput) {
  ModelBuilder mb(18);
  SeqValue(mb.graph().add_input(), "os", TensorType(kI64, {2}), /*optional=*/true);
  mb.Node("OptionalGetElement", {"os"}, {"seq"});
  mb.Node("SequenceLength", {"seq"}, {"n"});
  AttrInt(mb.Node("ConcatFromSequence", {"seq"}, {"cat"}), "axis", 0);
  mb.Output("n", kI64).Output("cat", kI64);
  ImportOptions options;
  options.sequence_inputs["os"] = {2, -1};
  auto i64 = [](std::vector<int64_t> v) {
    return Tensor::FromVector<int64_t>(DataType::kInt64, {2}, std::move(v));
  };
  Check(mb, options, {{"os.0", i64({7, -8})}, {"os.1", i64({9, 10})}},
        {{"n", {{}, {2}}}, {"cat", {{4}, {7, -8, 9, 10}}}});
}

Status ImportStatus(const ModelBuilder& mb, const ImportOptions& options = {}) {
  return ImportOnnxBytes(AsBytes(mb.Bytes()), "", options).status();
}

TEST(Sequences, WhatCannotBeResolvedAtImportIsACatalogErrorSayingWhy) {
  {  // a sequence input without a length
    ModelBuilder mb(17);
    SeqValue(mb.graph().add_input(), "s", TensorType(kF, {3}));
    AttrInt(mb.Node("ConcatFromSequence", {"s"}, {"y"}), "axis", 0);
    mb.Output("y");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kSequenceInputUnspecialized) << st.ToString();
    EXPECT_NE(st.message().find("'s'"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("--sequence-input"), std::string::npos) << st.ToString();
  }
  {  // a position computed at run time
    ModelBuilder mb(17);
    mb.Input("x", kF, {3}).Input("p", kI64, {});
    mb.Node("SequenceConstruct", {"x", "x"}, {"s"});
    mb.Node("SequenceAt", {"s", "p"}, {"y"});
    mb.Output("y");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("position 'p' is computed at run time"), std::string::npos)
        << st.ToString();
  }
  {  // SplitToSequence along a symbolic axis, and what reads its sequence
    ModelBuilder mb(17);
    mb.Input("x", kF, {"T", 2});
    mb.Node("SplitToSequence", {"x"}, {"s"});
    AttrInt(mb.Node("ConcatFromSequence", {"s"}, {"y"}), "axis", 0);
    mb.Output("y");
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("is not static"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("which kiln could not lower"), std::string::npos) << st.ToString();
  }
  {  // a run-time If whose branches give sequences of different lengths
    ModelBuilder mb(17);
    mb.Input("x", kF, {2}).Input("c", kBool, {});
    auto branch = [](const std::string& name, int copies) {
      onnx::GraphProto g;
      g.set_name(name);
      std::vector<std::string> in(static_cast<size_t>(copies), "x");
      Add(&g, "SequenceConstruct", in, {name + "_seq"});
      SeqValue(g.add_output(), name + "_seq", TensorType(kF, {2}));
      return g;
    };
    auto* n = mb.Node("If", {"c"}, {"s"});
    GraphAttr(n, "then_branch", branch("then", 1));
    GraphAttr(n, "else_branch", branch("else", 2));
    SeqValue(mb.graph().add_output(), "s", TensorType(kF, {2}));
    Status st = ImportStatus(mb);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupportedOps) << st.ToString();
    EXPECT_NE(st.message().find("lengths 1 and 2"), std::string::npos) << st.ToString();
  }
  {  // an engine input name that the model already uses
    ModelBuilder mb(17);
    SeqValue(mb.graph().add_input(), "s", TensorType(kF, {3}));
    mb.Input("s.0", kF, {3});
    mb.Node("SequenceLength", {"s"}, {"n"});
    mb.Output("n", kI64);
    ImportOptions options;
    options.sequence_inputs["s"] = {1, -1};
    Status st = ImportStatus(mb, options);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidModel) << st.ToString();
  }
}

// Backend-test values are read as the model declares them: a SequenceProto and OptionalProto
// (present and empty) come back as their tensors; reading a file as the wrong message fails.
TEST(OnnxValues, LoadSequenceAndOptionalProtos) {
  auto dir =
      std::filesystem::temp_directory_path() / ("kiln_seq_values_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto tensor = [](std::vector<float> v) {
    TensorProto t;
    t.set_data_type(kF);
    t.add_dims(static_cast<int64_t>(v.size()));
    for (float x : v) t.add_float_data(x);
    return t;
  };
  auto write = [&](const std::string& name, const google::protobuf::Message& m) {
    std::ofstream f(dir / name, std::ios::binary);
    f << m.SerializeAsString();
    return (dir / name).string();
  };
  onnx::SequenceProto seq;
  seq.set_elem_type(onnx::SequenceProto::TENSOR);
  *seq.add_tensor_values() = tensor({1, 2});
  *seq.add_tensor_values() = tensor({3});
  auto v = LoadOnnxValue(write("seq.pb", seq), OnnxValueKind::kSequence);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->elements.size(), 2u);
  EXPECT_EQ(v->elements[0].dims(), (std::vector<int64_t>{2}));
  EXPECT_EQ(v->elements[1].GetDouble(0), 3.0);

  onnx::OptionalProto opt;
  opt.set_elem_type(onnx::OptionalProto::TENSOR);
  *opt.mutable_tensor_value() = tensor({4, 5, 6});
  v = LoadOnnxValue(write("opt.pb", opt), OnnxValueKind::kOptionalTensor);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->present);
  EXPECT_EQ(v->tensor.num_elements(), 3);

  onnx::OptionalProto empty;
  empty.set_elem_type(onnx::OptionalProto::SEQUENCE);
  v = LoadOnnxValue(write("empty.pb", empty), OnnxValueKind::kOptionalSequence);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_FALSE(v->present);

  auto sig_bad = LoadOnnxValue((dir / "nothing.pb").string(), OnnxValueKind::kSequence);
  EXPECT_FALSE(sig_bad.ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
