// Helpers for the precision tests: zoo paths, calibration directories written as TensorProtos,
// small graphs and running an engine against the FP32 reference.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/builder/builder.h"
#include "kiln/ir/graph.h"

namespace kiln::testing {

std::string SourceDir();
std::string ZooDir(const std::string& model);
// A fresh empty directory under the test's temporary directory.
std::string TempDir(const std::string& name);
// Writes `t` as a serialized onnx.TensorProto.
void WriteTensorProto(const std::string& path, const Tensor& t);
// Writes DIR/test_data_set_I/input_J.pb for every set.
void WriteDataSets(const std::string& dir, const std::vector<std::vector<Tensor>>& sets);
Tensor F32(std::vector<int64_t> dims, std::vector<float> values);
// Deterministic pseudo-random floats in [-scale, scale].
std::vector<float> Random(int64_t n, uint64_t seed, float scale = 1.0f);

// Builds `graph` (consumed) with `config`, runs the engine on `inputs` and returns the outputs.
StatusOr<std::map<std::string, Tensor>> BuildAndRun(std::unique_ptr<Graph> graph,
                                                    const BuilderConfig& config,
                                                    const std::map<std::string, Tensor>& inputs,
                                                    BuildReport* report = nullptr,
                                                    std::unique_ptr<EngineDesc>* keep = nullptr);
double RelL2(const Tensor& actual, const Tensor& expected);

}  // namespace kiln::testing
