// Bad model files: each gives its catalog code with cause and remedy, never a crash. The bad
// files are made here from zoo models and tiny models written by the test.
#include <gtest/gtest.h>

#include <random>

#include "tests/onnx/model_builder.h"

namespace kiln {
namespace {

using namespace kiln::testing;  // NOLINT
namespace fs = std::filesystem;

fs::path ZooModel(const std::string& name) { return SourceDir() / "zoo" / name / "model.onnx"; }

Status ImportFileStatus(const fs::path& p) { return ImportOnnxFile(p.string()).status(); }

TEST(OnnxBadInput, NotProtobufIsE2000) {
  fs::path dir = TestDir();
  WriteFile(dir / "text.onnx", "this is a text file, not a model\n");
  Status s = ImportFileStatus(dir / "text.onnx");
  EXPECT_EQ(s.code(), ErrorCode::kModelNotProtobuf) << s.ToString();
  EXPECT_FALSE(s.remedy().empty());
  EXPECT_NE(s.Explain().find("KILN-E2000"), std::string::npos);
  // Valid protobuf of another message (a TensorProto) is not a model either.
  onnx::TensorProto t;
  t.set_name("t");
  t.add_dims(1);
  t.add_float_data(1);
  WriteFile(dir / "tensor.onnx", t.SerializeAsString());
  EXPECT_EQ(ImportFileStatus(dir / "tensor.onnx").code(), ErrorCode::kModelNotProtobuf);
  fs::remove_all(dir);
}

TEST(OnnxBadInput, EmptyFileIsTruncated) {
  fs::path dir = TestDir();
  WriteFile(dir / "empty.onnx", "");
  EXPECT_EQ(ImportFileStatus(dir / "empty.onnx").code(), ErrorCode::kModelTruncated);
  fs::remove_all(dir);
}

TEST(OnnxBadInput, MissingFileIsNotFound) {
  Status s = ImportFileStatus("/nonexistent/kiln/model.onnx");
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/kiln/model.onnx"), std::string::npos);
}

TEST(OnnxBadInput, TruncatedZooModelIsE2001) {
  std::string bytes = ReadFile(ZooModel("resnet_tiny"));
  ASSERT_GT(bytes.size(), 100000u);
  fs::path dir = TestDir();
  for (double fraction : {0.0001, 0.01, 0.3, 0.5, 0.9, 0.999}) {
    size_t cut = static_cast<size_t>(static_cast<double>(bytes.size()) * fraction);
    WriteFile(dir / "cut.onnx", bytes.substr(0, cut));
    Status s = ImportFileStatus(dir / "cut.onnx");
    EXPECT_EQ(s.code(), ErrorCode::kModelTruncated) << "cut at " << cut << ": " << s.ToString();
    EXPECT_NE(s.message().find("cut short"), std::string::npos) << s.message();
  }
  // No opset_import at all (or a copy cut exactly before it, stored after the graph): the model
  // is invalid, and the message says what is missing rather than guessing at a cut.
  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(bytes));
  m.clear_opset_import();
  WriteFile(dir / "no_opset.onnx", m.SerializeAsString());
  Status no_opset = ImportFileStatus(dir / "no_opset.onnx");
  EXPECT_EQ(no_opset.code(), ErrorCode::kInvalidModel) << no_opset.ToString();
  EXPECT_NE(no_opset.message().find("no opset_import"), std::string::npos) << no_opset.message();
  fs::remove_all(dir);
}

TEST(OnnxBadInput, TruncatedBytesAreE2001Too) {
  std::string bytes = ReadFile(ZooModel("squeezenet_tiny"));
  std::string cut = bytes.substr(0, bytes.size() / 2);
  Status s = ImportOnnxBytes(AsBytes(cut), "").status();
  EXPECT_EQ(s.code(), ErrorCode::kModelTruncated) << s.ToString();
}

TEST(OnnxBadInput, FlippedBytesGiveCatalogErrorsNeverCrashes) {
  // Mutations in the header and throughout the graph: every outcome is either a successful
  // import or an error from the 2xxx (model import) range with a message.
  std::string bytes = ReadFile(ZooModel("squeezenet_tiny"));
  std::mt19937 rng(1234);
  int failures = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string m = bytes;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      // Half the trials hit the first 4 KiB, where the structure (not weights) lives.
      size_t pos = trial % 2 ? rng() % 4096 : rng() % m.size();
      m[pos] = static_cast<char>(m[pos] ^ (1 << (rng() % 8)));
    }
    ImportOptions opts;
    opts.allow_unsupported_ops = true;
    Status s = ImportOnnxBytes(AsBytes(m), "", opts).status();
    if (s.ok()) continue;
    ++failures;
    int number = LookupError(s.code()).number;
    EXPECT_TRUE(number >= 2000 && number < 3000) << s.ToString();
    EXPECT_FALSE(s.message().empty());
  }
  EXPECT_GT(failures, 20);  // the mutations do break models
}

TEST(OnnxBadInput, CycleIsE2005) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  b.Node("Add", {"x", "b"}, {"a"}, "n1");
  b.Node("Relu", {"a"}, {"b"}, "n2");
  b.Output("b");
  std::string bytes = b.Bytes();
  Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
  EXPECT_EQ(s.code(), ErrorCode::kGraphCycle) << s.ToString();
}

TEST(OnnxBadInput, UndefinedValueIsE2006) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  b.Node("Add", {"x", "ghost"}, {"y"}, "n1");
  b.Output("y");
  std::string bytes = b.Bytes();
  Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
  EXPECT_EQ(s.code(), ErrorCode::kUndefinedValue) << s.ToString();
  EXPECT_NE(s.message().find("'ghost'"), std::string::npos);
}

TEST(OnnxBadInput, ValueDefinedTwiceIsInvalidModel) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
  b.Node("Relu", {"x"}, {"y"}, "n1");
  b.Node("Relu", {"x"}, {"y"}, "n2");
  b.Output("y");
  std::string bytes = b.Bytes();
  Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
  EXPECT_EQ(s.code(), ErrorCode::kInvalidModel) << s.ToString();
  EXPECT_NE(s.message().find("defined twice"), std::string::npos);
}

TEST(OnnxBadInput, OpsetTooNewIsE2003) {
  std::string bytes = ReadFile(ZooModel("resnet_tiny"));
  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(bytes));
  m.mutable_opset_import(0)->set_version(30);
  std::string out = m.SerializeAsString();
  Status s = ImportOnnxBytes(AsBytes(out), "").status();
  EXPECT_EQ(s.code(), ErrorCode::kOpsetTooNew);
  EXPECT_NE(s.message().find("opset 30"), std::string::npos);
}

TEST(OnnxBadInput, DeclaredTypeContradictingAConstantIsTypeMismatch) {
  ModelBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {int64_t{3}});
  b.Initializer("w", {1, 2, 3});
  b.Node("Add", {"x", "w"}, {"y"}, "add");
  b.Output("y");
  ModelBuilder::FillValueInfo(b.graph().add_value_info(), "w", onnx::TensorProto::INT64, {});
  std::string bytes = b.Bytes();
  Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
  EXPECT_EQ(s.code(), ErrorCode::kTypeMismatch) << s.ToString();
}

// Sizes past kiln's limits (ir/sizes.h) are refused at import, naming the tensor and the value,
// before anything is allocated: initializers and Constant values (2^32 x 2^32 once wrapped to 0
// elements) and graph inputs' static dims.
TEST(OnnxBadInput, HugeShapesAreE2015NamingTensorAndValue) {
  const int64_t k2to32 = int64_t{1} << 32;
  {
    ModelBuilder b(17);
    b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
    b.Initializer("w", {}, {k2to32, k2to32});
    b.Node("Add", {"x", "w"}, {"y"}, "add");
    b.Output("y");
    std::string bytes = b.Bytes();
    Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
    EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge) << s.ToString();
    EXPECT_NE(s.message().find("tensor 'w'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("[4294967296,4294967296]"), std::string::npos) << s.message();
  }
  {
    ModelBuilder b(17);
    b.Input("x", onnx::TensorProto::FLOAT, {int64_t{2}});
    auto* c = b.Node("Constant", {}, {"w"}, "const");
    auto* a = c->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    a->mutable_t()->add_dims(int64_t{1} << 62);
    b.Node("Add", {"x", "w"}, {"y"}, "add");
    b.Output("y");
    std::string bytes = b.Bytes();
    Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
    EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge) << s.ToString();
    EXPECT_NE(s.message().find("4611686018427387904"), std::string::npos) << s.message();
  }
  for (std::vector<DimSpec> dims : {std::vector<DimSpec>{int64_t{1}, int64_t{1} << 62},
                                    std::vector<DimSpec>{std::string("batch"), k2to32, k2to32}}) {
    ModelBuilder b(17);
    b.Input("x", onnx::TensorProto::FLOAT, dims);
    b.Node("Relu", {"x"}, {"y"}, "relu");
    b.Output("y");
    std::string bytes = b.Bytes();
    Status s = ImportOnnxBytes(AsBytes(bytes), "").status();
    EXPECT_EQ(s.code(), ErrorCode::kTensorTooLarge) << s.ToString();
    EXPECT_NE(s.message().find("graph input 'x'"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace kiln
