// Helpers shared by the precision tests.
#include "tests/precision/test_util.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "kiln/app/pipeline.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ops/onnx_dtype.h"

namespace kiln::testing {

namespace fs = std::filesystem;

std::string SourceDir() {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  return root ? root : ".";
}

std::string ZooDir(const std::string& model) { return SourceDir() + "/zoo/" + model; }

std::string TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("kiln_precision_{}_{}", ::getpid(), name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void WriteTensorProto(const std::string& path, const Tensor& t) {
  onnx::TensorProto proto;
  proto.set_data_type(static_cast<int32_t>(OnnxDataTypeCode(t.dtype())));
  for (int64_t d : t.dims()) proto.add_dims(d);
  proto.set_raw_data(t.raw(), t.size_bytes());
  std::ofstream f(path, std::ios::binary);
  ASSERT_TRUE(proto.SerializeToOstream(&f)) << path;
}

void WriteDataSets(const std::string& dir, const std::vector<std::vector<Tensor>>& sets) {
  for (size_t s = 0; s < sets.size(); ++s) {
    fs::path d = fs::path(dir) / fmt::format("test_data_set_{}", s);
    fs::create_directories(d);
    for (size_t i = 0; i < sets[s].size(); ++i) {
      WriteTensorProto((d / fmt::format("input_{}.pb", i)).string(), sets[s][i]);
    }
  }
}

Tensor F32(std::vector<int64_t> dims, std::vector<float> values) {
  return Tensor::FromVector(DataType::kFloat32, std::move(dims), values);
}

std::vector<float> Random(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

StatusOr<std::map<std::string, Tensor>> BuildAndRun(std::unique_ptr<Graph> graph,
                                                    const BuilderConfig& config,
                                                    const std::map<std::string, Tensor>& inputs,
                                                    BuildReport* report,
                                                    std::unique_ptr<EngineDesc>* keep) {
  KILN_ASSIGN_OR_RETURN(
      auto desc, BuildEngine({std::move(graph), "test", HashString("test")}, config, report));
  KILN_ASSIGN_OR_RETURN(auto bytes, SerializeEngine(*desc));
  KILN_ASSIGN_OR_RETURN(auto runtime, Runtime::Create(config.backend));
  KILN_ASSIGN_OR_RETURN(auto engine, runtime->DeserializeEngine(bytes));
  KILN_ASSIGN_OR_RETURN(auto runner, app::HostRunner::Create(engine));
  KILN_RETURN_IF_ERROR(runner->SetInputs(inputs));
  KILN_RETURN_IF_ERROR(runner->Run());
  if (keep) *keep = std::move(desc);
  return runner->outputs();
}

double RelL2(const Tensor& actual, const Tensor& expected) {
  return app::CompareTensors(actual, expected, 0, 0).rel_l2;
}

}  // namespace kiln::testing
