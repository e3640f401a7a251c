// The importer on small models written by the tests: graph structure, dtypes, dims, attributes,
// constants, external data and protobuf limits.
#include <google/protobuf/io/coded_stream.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include <cstring>

#include "kiln/core/float16.h"
#include "tests/onnx/model_builder.h"

namespace kiln {
namespace {

using namespace kiln::testing;  // NOLINT
namespace fs = std::filesystem;

StatusOr<std::unique_ptr<Graph>> Import(const ModelBuilder& b, ImportOptions opts = {},
                                        OnnxModelMeta* meta = nullptr) {
  std::string bytes = b.Bytes();
  return ImportOnnxBytes(AsBytes(bytes), "", opts, meta);
}

ModelBuilder AddReluModel() {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {std::string("batch"), int64_t{3}});
  b.Initializer("bias", {1.0f, 2.0f, 3.0f});
  b.Node("Add", {"x", "bias"}, {"sum"}, "add");
  b.Node("Relu", {"sum"}, {"y"}, "relu");
  b.Output("y");
  return b;
}

TEST(OnnxImport, BuildsInputsConstantsNodesOutputs) {
  OnnxModelMeta meta;
  auto g = Import(AddReluModel(), {}, &meta);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Graph& graph = **g;
  EXPECT_EQ(graph.opset(), 17);
  EXPECT_EQ(graph.name(), "test_graph");
  EXPECT_EQ(meta.opset, 17);
  EXPECT_EQ(meta.ir_version, 8);
  EXPECT_EQ(meta.producer_name, "kiln-test");
  ASSERT_EQ(graph.inputs().size(), 1u);
  Value* x = graph.inputs()[0];
  EXPECT_EQ(x->name(), "x");
  EXPECT_EQ(x->dtype(), DataType::kFloat32);
  EXPECT_EQ(ToString(x->shape()), "[batch,3]");
  Value* bias = graph.FindValue("bias");
  ASSERT_NE(bias, nullptr);
  ASSERT_TRUE(bias->is_constant());
  EXPECT_EQ(bias->constant()->ToFloatVector(), (std::vector<float>{1, 2, 3}));
  EXPECT_FALSE(bias->is_graph_input());
  ASSERT_EQ(graph.num_nodes(), 2u);
  Node* add = graph.FindNode("add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->input(0), x);
  EXPECT_EQ(add->input(1), bias);
  ASSERT_EQ(graph.outputs().size(), 1u);
  EXPECT_EQ(graph.outputs()[0]->name(), "y");
  EXPECT_EQ(graph.outputs()[0]->producer(), graph.FindNode("relu"));
}

TEST(OnnxImport, InitializerListedAsInputStaysConstant) {
  ModelBuilder b = AddReluModel();
  b.Input("bias", onnx::TensorProto::FLOAT, {int64_t{3}});  // IR < 4 style
  auto g = Import(b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ((*g)->inputs().size(), 1u);
  EXPECT_EQ((*g)->inputs()[0]->name(), "x");
  EXPECT_TRUE((*g)->FindValue("bias")->is_constant());
}

TEST(OnnxImport, UnknownDimsBecomeNamedSymbols) {
  ModelBuilder b(17);
  b.Input("tokens", onnx::TensorProto::INT64, {std::string(""), std::string("seq"), int64_t{4}});
  b.Node("Identity", {"tokens"}, {"y"}, "id");
  b.Output("y", onnx::TensorProto::INT64);
  auto g = Import(b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Shape& s = (*g)->inputs()[0]->shape();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].ToString(), "tokens_dim0");
  EXPECT_EQ(s[1].ToString(), "seq");
  EXPECT_EQ(s[2], Dim(4));
  EXPECT_EQ((*g)->inputs()[0]->dtype(), DataType::kInt64);
}

TEST(OnnxImport, EveryKilnDtypeFromTypedFieldsAndRawData) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{1}});
  auto add_typed = [&](const std::string& name, int32_t type, std::vector<int32_t> ints) {
    auto* t = b.graph().add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    t->add_dims(static_cast<int64_t>(ints.size()));
    for (int32_t v : ints) t->add_int32_data(v);
  };
  add_typed("i8", onnx::TensorProto::INT8, {-3, 7});
  add_typed("u8", onnx::TensorProto::UINT8, {200, 1});
  add_typed("i32", onnx::TensorProto::INT32, {-100000, 5});
  add_typed("b", onnx::TensorProto::BOOL, {1, 0});
  add_typed("h", onnx::TensorProto::FLOAT16, {FloatToHalfBits(1.5f), FloatToHalfBits(-2.0f)});
  add_typed("bf", onnx::TensorProto::BFLOAT16,
            {FloatToBFloat16Bits(0.5f), FloatToBFloat16Bits(4.0f)});
  auto* i64 = b.graph().add_initializer();
  i64->set_name("i64");
  i64->set_data_type(onnx::TensorProto::INT64);
  i64->add_dims(2);
  i64->add_int64_data(int64_t{1} << 40);
  i64->add_int64_data(-1);
  add_typed("i16", onnx::TensorProto::INT16, {-300, 7});
  add_typed("u16", onnx::TensorProto::UINT16, {65000, 2});
  auto* f64 = b.graph().add_initializer();
  f64->set_name("f64");
  f64->set_data_type(onnx::TensorProto::DOUBLE);
  f64->add_dims(2);
  f64->add_double_data(0.1);
  f64->add_double_data(-1e300);
  for (auto [name, type] :
       {std::pair{"u32", onnx::TensorProto::UINT32}, std::pair{"u64", onnx::TensorProto::UINT64}}) {
    auto* u = b.graph().add_initializer();
    u->set_name(name);
    u->set_data_type(type);
    u->add_dims(2);
    u->add_uint64_data(4000000000u);
    u->add_uint64_data(3);
  }
  auto* raw = b.graph().add_initializer();
  raw->set_name("raw");
  raw->set_data_type(onnx::TensorProto::FLOAT);
  raw->add_dims(2);
  raw->add_dims(1);
  float rv[2] = {0.25f, 8.0f};
  raw->set_raw_data(std::string(reinterpret_cast<const char*>(rv), sizeof(rv)));
  b.Node("Identity", {"x"}, {"y"});
  b.Output("y");
  auto g = Import(b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto vals = [&](const std::string& name) {
    const Tensor* t = (*g)->FindValue(name)->constant();
    std::vector<double> out;
    for (int64_t i = 0; i < t->num_elements(); ++i) out.push_back(t->GetDouble(i));
    return out;
  };
  EXPECT_EQ((*g)->FindValue("i8")->dtype(), DataType::kInt8);
  EXPECT_EQ(vals("i8"), (std::vector<double>{-3, 7}));
  EXPECT_EQ(vals("u8"), (std::vector<double>{200, 1}));
  EXPECT_EQ(vals("i32"), (std::vector<double>{-100000, 5}));
  EXPECT_EQ((*g)->FindValue("b")->dtype(), DataType::kBool);
  EXPECT_EQ(vals("b"), (std::vector<double>{1, 0}));
  EXPECT_EQ((*g)->FindValue("h")->dtype(), DataType::kFloat16);
  EXPECT_EQ(vals("h"), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ((*g)->FindValue("bf")->dtype(), DataType::kBFloat16);
  EXPECT_EQ(vals("bf"), (std::vector<double>{0.5, 4.0}));
  EXPECT_EQ((*g)->FindValue("i64")->constant()->ToInt64Vector(),
            (std::vector<int64_t>{int64_t{1} << 40, -1}));
  EXPECT_EQ((*g)->FindValue("i16")->dtype(), DataType::kInt16);
  EXPECT_EQ(vals("i16"), (std::vector<double>{-300, 7}));
  EXPECT_EQ((*g)->FindValue("u16")->dtype(), DataType::kUInt16);
  EXPECT_EQ(vals("u16"), (std::vector<double>{65000, 2}));
  EXPECT_EQ((*g)->FindValue("f64")->dtype(), DataType::kFloat64);
  EXPECT_EQ(vals("f64"), (std::vector<double>{0.1, -1e300}));
  EXPECT_EQ((*g)->FindValue("u32")->dtype(), DataType::kUInt32);
  EXPECT_EQ(vals("u32"), (std::vector<double>{4000000000.0, 3}));
  EXPECT_EQ((*g)->FindValue("u64")->dtype(), DataType::kUInt64);
  EXPECT_EQ(vals("u64"), (std::vector<double>{4000000000.0, 3}));
  EXPECT_EQ((*g)->FindValue("raw")->constant()->dims(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(vals("raw"), (std::vector<double>{0.25, 8.0}));
}

TEST(OnnxImport, UnsupportedDtypesAreListedTogether) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::COMPLEX64, {int64_t{1}});
  auto* d = b.graph().add_initializer();
  d->set_name("weights8");
  d->set_data_type(onnx::TensorProto::COMPLEX128);
  d->add_dims(1);
  d->set_raw_data(std::string(16, '\0'));
  b.Node("Identity", {"x"}, {"y"});
  b.Output("y");
  auto g = Import(b);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kUnsupportedDataType);
  EXPECT_NE(g.status().message().find("initializer 'weights8' (complex128)"), std::string::npos)
      << g.status().message();
  EXPECT_NE(g.status().message().find("input 'x' (complex64)"), std::string::npos);
  EXPECT_NE(g.status().message().find("2 tensor(s)"), std::string::npos);
}

// ONNX packs 4-bit values two to a byte and 2-bit values four to a byte, first element in the
// low bits, in raw_data or one byte per int32_data entry; kiln unpacks them to one value per byte
// (signed ones sign-extended). Float8 comes as bits, like float16.
TEST(OnnxImport, PackedSubByteAndFloat8Tensors) {
  auto make = [](int type, std::vector<int64_t> dims) {
    onnx::TensorProto p;
    p.set_name("t");
    p.set_data_type(type);
    for (int64_t d : dims) p.add_dims(d);
    return p;
  };
  auto values = [](const onnx::TensorProto& p, DataType want) {
    auto t = onnx_internal::TensorFromProto(p, nullptr);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    std::vector<double> out;
    if (!t.ok()) return out;
    EXPECT_EQ(t->dtype(), want);
    EXPECT_EQ(t->size_bytes(), static_cast<size_t>(t->num_elements()));  // one byte per value
    for (int64_t i = 0; i < t->num_elements(); ++i) out.push_back(t->GetDouble(i));
    return out;
  };
  onnx::TensorProto i4 = make(22, {5});  // INT4, odd count: the last byte's high nibble is padding
  i4.set_raw_data(std::string("\x78\x0f\x03", 3));
  EXPECT_EQ(values(i4, DataType::kInt4), (std::vector<double>{-8, 7, -1, 0, 3}));
  onnx::TensorProto u4 = make(21, {3});  // UINT4 in int32_data
  u4.add_int32_data(0xf1);
  u4.add_int32_data(0x09);
  EXPECT_EQ(values(u4, DataType::kUInt4), (std::vector<double>{1, 15, 9}));
  onnx::TensorProto i2 = make(26, {5});  // INT2: -2 -1 0 1 | -2
  i2.set_raw_data(std::string("\x4e\x02", 2));
  EXPECT_EQ(values(i2, DataType::kInt2), (std::vector<double>{-2, -1, 0, 1, -2}));
  onnx::TensorProto u2 = make(25, {3});  // UINT2 in int32_data
  u2.add_int32_data(0x23);
  EXPECT_EQ(values(u2, DataType::kUInt2), (std::vector<double>{3, 0, 2}));
  onnx::TensorProto f4 = make(23, {3});  // FLOAT4E2M1: -6, 0.5 | 1.5
  f4.set_raw_data(std::string("\x1f\x03", 2));
  EXPECT_EQ(values(f4, DataType::kFloat4E2M1), (std::vector<double>{-6, 0.5, 1.5}));
  onnx::TensorProto f8 = make(19, {2});  // FLOAT8E5M2 in int32_data: 1, -Inf
  f8.add_int32_data(0x3c);
  f8.add_int32_data(0xfc);
  EXPECT_EQ(values(f8, DataType::kFloat8E5M2), (std::vector<double>{1, -INFINITY}));
  onnx::TensorProto e4 = make(17, {2});  // FLOAT8E4M3FN raw: 448, -2^-9
  e4.set_raw_data(std::string("\x7e\x81", 2));
  EXPECT_EQ(values(e4, DataType::kFloat8E4M3FN), (std::vector<double>{448, -1.0 / 512}));
  // The packed byte count is checked: 5 int4 values need 3 bytes.
  onnx::TensorProto short_i4 = make(22, {5});
  short_i4.set_raw_data(std::string(2, '\0'));
  auto bad = onnx_internal::TensorFromProto(short_i4, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidModel);
  EXPECT_NE(bad.status().message().find("needs 3 bytes"), std::string::npos)
      << bad.status().message();
}

TEST(OnnxImport, TensorDataCountMismatchIsInvalidModel) {
  ModelBuilder b = AddReluModel();
  b.graph().mutable_initializer(0)->add_dims(1000000000);  // [3, 1e9] but 3 values
  auto g = Import(b);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidModel);
  EXPECT_NE(g.status().message().find("'bias'"), std::string::npos);
}

TEST(OnnxImport, AttributesOfEveryKind) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  auto* n = b.Node("Identity", {"x"}, {"y"}, "id");
  AttrInt(n, "i", -7);
  AttrFloat(n, "f", 0.5f);
  AttrString(n, "s", "hello");
  AttrInts(n, "is", {1, 2, 3});
  AttrFloats(n, "fs", {1.5f});
  auto* ss = n->add_attribute();
  ss->set_name("ss");
  ss->set_type(onnx::AttributeProto::STRINGS);
  ss->add_strings("a");
  ss->add_strings("b");
  auto* t = n->add_attribute();
  t->set_name("t");
  t->set_type(onnx::AttributeProto::TENSOR);
  t->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  t->mutable_t()->add_dims(1);
  t->mutable_t()->add_int64_data(42);
  b.Output("y");
  auto g = Import(b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const AttributeMap& a = (*g)->FindNode("id")->attrs();
  EXPECT_EQ(a.GetInt("i", 0), -7);
  EXPECT_EQ(a.GetFloat("f", 0), 0.5f);
  EXPECT_EQ(a.GetString("s", ""), "hello");
  EXPECT_EQ(a.GetInts("is"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(a.GetFloats("fs"), (std::vector<float>{1.5f}));
  EXPECT_EQ(std::get<std::vector<std::string>>(*a.Find("ss")),
            (std::vector<std::string>{"a", "b"}));
  ASSERT_NE(a.GetTensor("t"), nullptr);
  EXPECT_EQ(a.GetTensor("t")->ToInt64Vector(), (std::vector<int64_t>{42}));
}

TEST(OnnxImport, GraphAttributeOnSupportedOpIsRejected) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  auto* n = b.Node("Identity", {"x"}, {"y"}, "id");
  auto* a = n->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name("sub");
  b.Output("y");
  auto g = Import(b);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidAttribute);
  EXPECT_NE(g.status().message().find("subgraph"), std::string::npos);
}

TEST(OnnxImport, EmptyAndDuplicateNodeNamesBecomeUnique) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  b.Node("Relu", {"x"}, {"a"});
  b.Node("Relu", {"a"}, {"b"}, "Relu");
  b.Node("Relu", {"b"}, {"c"});
  b.Node("Relu", {"c"}, {"d"}, "Relu");
  b.Output("d");
  auto g = Import(b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::set<std::string> names;
  for (Node* n : (*g)->nodes()) {
    EXPECT_FALSE(n->name().empty());
    names.insert(n->name());
  }
  EXPECT_EQ(names.size(), 4u);
  EXPECT_TRUE(names.count("Relu"));
}

TEST(OnnxImport, ConstantNodesBecomeConstants) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  auto* c1 = b.Node("Constant", {}, {"cf"});
  AttrFloat(c1, "value_float", 2.5f);
  auto* c2 = b.Node("Constant", {}, {"cis"});
  AttrInts(c2, "value_ints", {4, 5});
  auto* c3 = b.Node("Constant", {}, {"ci"});
  AttrInt(c3, "value_int", 9);
  auto* c4 = b.Node("Constant", {}, {"cfs"});
  AttrFloats(c4, "value_floats", {1, 2});
  auto* c5 = b.Node("Constant", {}, {"ct"});
  auto* a = c5->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_dims(2);
  a->mutable_t()->add_float_data(3);
  a->mutable_t()->add_float_data(4);
  b.Node("Add", {"x", "ct"}, {"y"});
  b.Output("y");
  auto g = Import(b);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->num_nodes(), 1u);
  EXPECT_EQ((*g)->FindValue("cf")->constant()->ToFloatVector(), (std::vector<float>{2.5f}));
  EXPECT_TRUE((*g)->FindValue("cf")->constant()->dims().empty());
  EXPECT_EQ((*g)->FindValue("cis")->constant()->ToInt64Vector(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ((*g)->FindValue("ci")->constant()->ToInt64Vector(), (std::vector<int64_t>{9}));
  EXPECT_EQ((*g)->FindValue("cfs")->constant()->ToFloatVector(), (std::vector<float>{1, 2}));
  EXPECT_EQ((*g)->FindValue("ct")->constant()->ToFloatVector(), (std::vector<float>{3, 4}));
  EXPECT_EQ((*g)->nodes()[0]->input(1), (*g)->FindValue("ct"));
}

// ---- external data ----

// A model whose two weights live in `weights.bin`: one at a 64-byte-aligned offset (mapped),
// one right after it, unaligned (copied).
struct ExternalModel {
  fs::path dir;
  fs::path model;
};

void SetExternal(onnx::TensorProto* t, const std::string& location, int64_t offset,
                 int64_t length) {
  t->clear_float_data();
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* k, const std::string& v) {
    auto* kv = t->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
}

ExternalModel WriteExternalModel(const std::string& location = "weights.bin",
                                 size_t file_bytes = 0) {
  ExternalModel m;
  m.dir = TestDir();
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{4}});
  SetExternal(b.Initializer("w1", {0, 0, 0, 0}), location, 128, 16);
  SetExternal(b.Initializer("w2", {0, 0, 0, 0}), location, 144 + 3, -1);
  b.Node("Add", {"x", "w1"}, {"s"}, "add1");
  b.Node("Add", {"s", "w2"}, {"y"}, "add2");
  b.Output("y");
  std::string data(file_bytes ? file_bytes : 200, '\0');
  float w1[4] = {1, 2, 3, 4};
  float w2[4] = {-1, -2, -3, -4};
  std::memcpy(data.data() + 128, w1, sizeof(w1));
  if (data.size() >= 147 + sizeof(w2)) std::memcpy(data.data() + 147, w2, sizeof(w2));
  WriteFile(m.dir / "weights.bin", data);
  m.model = m.dir / "model.onnx";
  WriteFile(m.model, b.Bytes());
  return m;
}

TEST(OnnxExternalData, MapsAlignedAndCopiesUnalignedWeights) {
  ExternalModel m = WriteExternalModel();
  auto g = ImportOnnxFile(m.model.string());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* w1 = (*g)->FindValue("w1")->constant();
  const Tensor* w2 = (*g)->FindValue("w2")->constant();
  EXPECT_EQ(w1->ToFloatVector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(w2->ToFloatVector(), (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w1->raw()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w2->raw()) % 64, 0u);  // the copy is aligned
  // The graph outlives the importer's mapping table: the constants keep the mapping alive.
  fs::remove_all(m.dir);
  EXPECT_EQ((*g)->FindValue("w1")->constant()->ToFloatVector(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(OnnxExternalData, MissingFileNamesTensorAndFile) {
  ExternalModel m = WriteExternalModel();
  fs::remove(m.dir / "weights.bin");
  auto g = ImportOnnxFile(m.model.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kExternalDataMissing);
  EXPECT_NE(g.status().message().find("'w1'"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("weights.bin"), std::string::npos);
}

TEST(OnnxExternalData, ShortFileNamesTensorAndRange) {
  ExternalModel m = WriteExternalModel("weights.bin", 150);  // w1 fits, w2 does not
  auto g = ImportOnnxFile(m.model.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kExternalDataMissing);
  EXPECT_NE(g.status().message().find("'w2' needs bytes [147, 163)"), std::string::npos)
      << g.status().message();
  EXPECT_NE(g.status().message().find("only 150 bytes"), std::string::npos);
}

TEST(OnnxExternalData, PathsEscapingTheModelDirectoryAreRejected) {
  for (const std::string& location :
       {std::string("../weights.bin"), std::string("sub/../../weights.bin"),
        std::string("/etc/passwd")}) {
    ExternalModel m = WriteExternalModel(location);
    auto g = ImportOnnxFile(m.model.string());
    ASSERT_FALSE(g.ok()) << location;
    EXPECT_EQ(g.status().code(), ErrorCode::kExternalDataPathInvalid) << location;
    EXPECT_NE(g.status().message().find(location), std::string::npos) << g.status().message();
  }
}

TEST(OnnxExternalData, SymlinkOutOfTheDirectoryIsRejected) {
  ExternalModel m = WriteExternalModel("link.bin");
  fs::path outside = m.dir.parent_path() / (m.dir.filename().string() + "_outside.bin");
  fs::copy_file(m.dir / "weights.bin", outside, fs::copy_options::overwrite_existing);
  fs::create_symlink(outside, m.dir / "link.bin");
  auto g = ImportOnnxFile(m.model.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kExternalDataPathInvalid);
  EXPECT_NE(g.status().message().find("symlink"), std::string::npos);
  fs::remove(outside);
}

TEST(OnnxExternalData, FifoIsRefusedWithoutBlocking) {
  ExternalModel m = WriteExternalModel();
  fs::remove(m.dir / "weights.bin");
  ASSERT_EQ(::mkfifo((m.dir / "weights.bin").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto g = ImportOnnxFile(m.model.string());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kNotRegularFile);
  EXPECT_NE(g.status().message().find("weights.bin"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().ToString().find("'w1'"), std::string::npos) << g.status().ToString();
}

TEST(OnnxImportFile, FifoModelIsRefusedWithoutBlocking) {
  fs::path dir = TestDir();
  ASSERT_EQ(::mkfifo((dir / "model.onnx").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto g = ImportOnnxFile((dir / "model.onnx").string());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kNotRegularFile);
  EXPECT_NE(g.status().message().find("FIFO"), std::string::npos) << g.status().message();
}

TEST(OnnxExternalData, BytesWithoutDirectoryCannotUseExternalData) {
  ExternalModel m = WriteExternalModel();
  std::string bytes = ReadFile(m.model);
  auto g = ImportOnnxBytes(AsBytes(bytes), "");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kExternalDataMissing);
  auto ok = ImportOnnxBytes(AsBytes(bytes), m.dir.string());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->FindValue("w2")->constant()->ToFloatVector(),
            (std::vector<float>{-1, -2, -3, -4}));
}

// ---- protobuf limits ----

TEST(OnnxProtobufLimits, CodedStreamAcceptsTheFullTwoGigabytes) {
  // protobuf reports "no limit below INT_MAX" as -1.
  uint8_t byte = 0;
  google::protobuf::io::CodedInputStream stream(&byte, 1);
  stream.SetTotalBytesLimit(64 << 20);  // protobuf's historical default
  onnx_internal::ConfigureCodedStream(stream);
  EXPECT_EQ(stream.BytesUntilTotalBytesLimit(), -1);
  EXPECT_EQ(onnx_internal::kProtobufTotalBytesLimit, INT_MAX);

  // The setting is what decides: a message above a lower limit fails, and parses once
  // ConfigureCodedStream has raised it.
  ModelBuilder big(17);
  big.Initializer("w", std::vector<float>(1000, 1.0f));
  std::string bytes = big.Bytes();
  auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  onnx::ModelProto m;
  google::protobuf::io::CodedInputStream limited(data, static_cast<int>(bytes.size()));
  limited.SetTotalBytesLimit(1000);
  EXPECT_FALSE(m.ParseFromCodedStream(&limited));
  google::protobuf::io::CodedInputStream raised(data, static_cast<int>(bytes.size()));
  raised.SetTotalBytesLimit(1000);
  onnx_internal::ConfigureCodedStream(raised);
  EXPECT_TRUE(m.ParseFromCodedStream(&raised));
  EXPECT_EQ(m.graph().initializer(0).float_data_size(), 1000);
}

TEST(OnnxProtobufLimits, ModelAboveOldSixtyFourMegabyteLimitStreamsFromFile) {
  // 72 MiB of weights inside the file: above protobuf's historical 64 MiB default.
  fs::path dir = TestDir();
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{1}});
  auto* w = b.graph().add_initializer();
  w->set_name("big");
  w->set_data_type(onnx::TensorProto::FLOAT);
  const int64_t n = 18 * 1024 * 1024;
  w->add_dims(n);
  std::string raw(static_cast<size_t>(n) * 4, '\0');
  float last = 7.0f;
  std::memcpy(raw.data() + raw.size() - 4, &last, 4);
  w->set_raw_data(std::move(raw));
  b.Node("Add", {"x", "big"}, {"y"});
  b.Output("y");
  WriteFile(dir / "big.onnx", b.Bytes());
  auto g = ImportOnnxFile((dir / "big.onnx").string());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* t = (*g)->FindValue("big")->constant();
  EXPECT_EQ(t->num_elements(), n);
  EXPECT_EQ(t->GetDouble(n - 1), 7.0);
  fs::remove_all(dir);
}

TEST(OnnxImport, FileHashIsTheHashOfEveryByteOfTheFile) {
  // The importer hashes the file in the read that parses it (protobuf backs up over buffered
  // bytes and reads them again; each must be hashed once). 3 MB of weights span many reads.
  fs::path dir = TestDir();
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{1}});
  for (int i = 0; i < 3; ++i) {
    auto* w = b.graph().add_initializer();
    w->set_name("w" + std::to_string(i));
    w->set_data_type(onnx::TensorProto::FLOAT);
    const int64_t n = 250 * 1000 + i;
    w->add_dims(n);
    std::string raw(static_cast<size_t>(n) * 4, '\0');
    for (size_t k = 0; k < raw.size(); ++k) raw[k] = static_cast<char>((k * 31 + i) & 0xff);
    w->set_raw_data(std::move(raw));
    b.Node("Add", {"x", "w" + std::to_string(i)}, {"y" + std::to_string(i)});
    b.Output("y" + std::to_string(i));
  }
  const std::string bytes = b.Bytes();
  WriteFile(dir / "m.onnx", bytes);
  ImportOptions opts;
  opts.hash_file = true;
  OnnxModelMeta meta;
  auto g = ImportOnnxFile((dir / "m.onnx").string(), opts, &meta);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(meta.file_bytes, bytes.size());
  EXPECT_EQ(meta.file_hash, HashBytes(AsBytes(bytes)));
  EXPECT_NE(meta.file_hash, Hash128{});
  // Without the option nothing is hashed.
  OnnxModelMeta plain;
  ASSERT_TRUE(ImportOnnxFile((dir / "m.onnx").string(), {}, &plain).ok());
  EXPECT_EQ(plain.file_hash, Hash128{});
  fs::remove_all(dir);
}

// A std::string of `bytes` bytes whose buffer is (or is not) 64-byte aligned: heap blocks land
// on 16-byte steps, so one of the first few tries has the wanted alignment.
std::unique_ptr<std::string> StringAligned(size_t bytes, bool aligned) {
  std::vector<std::unique_ptr<std::string>> tries;
  for (int i = 0; i < 256; ++i) {
    auto s = std::make_unique<std::string>(bytes + static_cast<size_t>(i % 4), '\0');
    s->resize(bytes);
    if ((reinterpret_cast<uintptr_t>(s->data()) % 64 == 0) == aligned) return s;
    tries.push_back(std::move(s));  // kept, so the next try gets another block
  }
  return nullptr;
}

TEST(OnnxImport, AlignedRawDataBecomesTheTensorAndUnalignedIsCopied) {
  for (bool aligned : {true, false}) {
    std::unique_ptr<std::string> raw = StringAligned(4096, aligned);
    ASSERT_NE(raw, nullptr) << "no " << (aligned ? "aligned" : "unaligned") << " block found";
    for (size_t i = 0; i < 1024; ++i) {
      const float v = static_cast<float>(i) * 0.5f;
      std::memcpy(raw->data() + 4 * i, &v, 4);
    }
    const char* bytes = raw->data();
    onnx::TensorProto p;
    p.set_name("w");
    p.set_data_type(onnx::TensorProto::FLOAT);
    p.add_dims(32);
    p.add_dims(32);
    p.set_allocated_raw_data(raw.release());  // the proto owns this very buffer
    ASSERT_EQ(p.raw_data().data(), bytes);
    onnx_internal::ExternalDataResolver resolver("");
    auto t = onnx_internal::TakeTensorFromProto(&p, &resolver);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->raw() == bytes, aligned) << "aligned bytes are taken, unaligned ones copied";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % 64, 0u);
    EXPECT_FALSE(p.has_raw_data());
    EXPECT_EQ(t->dims(), (std::vector<int64_t>{32, 32}));
    EXPECT_EQ(t->GetDouble(1023), 511.5);
    EXPECT_EQ(t->GetDouble(7), 3.5);
  }
  // A wrong byte count is still an error, and the proto keeps its bytes.
  onnx::TensorProto p;
  p.set_name("short");
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(4);
  p.set_raw_data(std::string(12, '\0'));
  onnx_internal::ExternalDataResolver resolver("");
  EXPECT_EQ(onnx_internal::TakeTensorFromProto(&p, &resolver).status().code(),
            ErrorCode::kInvalidModel);
  EXPECT_EQ(p.raw_data().size(), 12u);
}

TEST(OnnxProtobufLimits, FileAboveTwoGigabytesAsksForExternalData) {
  // A sparse file: 2 GiB + 1 byte of address space, no disk blocks.
  fs::path dir = TestDir();
  fs::path path = dir / "huge.onnx";
  WriteFile(path, "x");
  ASSERT_EQ(::truncate(path.c_str(), (int64_t{1} << 31) + 1), 0);
  auto g = ImportOnnxFile(path.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidModel);
  EXPECT_NE(g.status().message().find("external data"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
