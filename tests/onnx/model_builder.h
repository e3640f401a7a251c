// Small helpers that write ONNX models from the tests themselves (no committed binary fixtures).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "kiln/onnx/onnx_internal.h"

namespace kiln::testing {

using DimSpec = std::variant<int64_t, std::string>;  // a number, a symbol, or "" (unknown)

class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 17, int64_t ir_version = 8) {
    model_.set_ir_version(ir_version);
    model_.set_producer_name("kiln-test");
    model_.set_producer_version("1");
    auto* o = model_.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    model_.mutable_graph()->set_name("test_graph");
  }

  onnx::ModelProto& model() { return model_; }
  onnx::GraphProto& graph() { return *model_.mutable_graph(); }

  ModelBuilder& Input(const std::string& name, int32_t elem, const std::vector<DimSpec>& dims) {
    FillValueInfo(graph().add_input(), name, elem, dims);
    return *this;
  }
  ModelBuilder& Output(const std::string& name, int32_t elem = onnx::TensorProto::FLOAT) {
    auto* vi = graph().add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
    return *this;
  }
  onnx::TensorProto* Initializer(const std::string& name, const std::vector<float>& values,
                                 std::vector<int64_t> dims = {}) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    if (dims.empty()) dims = {static_cast<int64_t>(values.size())};
    for (int64_t d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
    return t;
  }
  onnx::NodeProto* Node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::string& name = "",
                        const std::string& domain = "") {
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name);
    if (!domain.empty()) n->set_domain(domain);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return n;
  }

  std::string Bytes() const { return model_.SerializeAsString(); }

  static void FillValueInfo(onnx::ValueInfoProto* vi, const std::string& name, int32_t elem,
                            const std::vector<DimSpec>& dims) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* shape = tt->mutable_shape();
    for (const auto& d : dims) {
      auto* dim = shape->add_dim();
      if (const auto* v = std::get_if<int64_t>(&d)) {
        dim->set_dim_value(*v);
      } else if (!std::get<std::string>(d).empty()) {
        dim->set_dim_param(std::get<std::string>(d));
      }
    }
  }

 private:
  onnx::ModelProto model_;
};

// A node `op`(in) -> out appended to `g` (named `name` when given).
inline onnx::NodeProto* Add(onnx::GraphProto* g, const std::string& op,
                            const std::vector<std::string>& in, const std::vector<std::string>& out,
                            const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  if (!name.empty()) n->set_name(name);
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
  return n;
}

// A graph attribute (If's branches, Loop's and Scan's body).
inline void GraphAttr(onnx::NodeProto* n, const std::string& name, onnx::GraphProto g) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = std::move(g);
}

// Attribute helpers.
inline void AttrInt(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
inline void AttrFloat(onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
inline void AttrString(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}
inline void AttrInts(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
inline void AttrFloats(onnx::NodeProto* n, const std::string& name, const std::vector<float>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOATS);
  for (float x : v) a->add_floats(x);
}

// A fresh directory under the test temp dir, named after the running test; removed when the
// process exits (ctest runs each test in a process of its own, so none is left behind).
inline std::filesystem::path TestDir() {
  static std::vector<std::filesystem::path> made;
  static const bool registered = [] {
    std::atexit([] {
      std::error_code ec;
      for (const auto& d : made) std::filesystem::remove_all(d, ec);
    });
    return true;
  }();
  (void)registered;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              (std::string("kiln_onnx_") + info->test_suite_name() + "_" +
                               info->name() + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  made.push_back(dir);
  return dir;
}

inline void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

inline std::filesystem::path SourceDir() {
  const char* dir = std::getenv("KILN_SOURCE_DIR");
  return dir ? std::filesystem::path(dir) : std::filesystem::path(KILN_TEST_SOURCE_DIR);
}

}  // namespace kiln::testing
