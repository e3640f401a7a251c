// High-level workflows the CLI is a thin shell over: ONNX file -> engine, engine + host tensors ->
// outputs, outputs vs reference, conformance directories, latency benchmarks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/builder/builder.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/runtime/runtime.h"

namespace kiln::app {

struct BuiltEngine {
  std::unique_ptr<EngineDesc> desc;
  BuildReport report;
};

// Reads the model (hashing its bytes for the content address), imports it and builds.
// `import` specialises sequence and optional graph inputs (onnx_import.h, ImportOptions); the
// specialisation is part of the engine's key.
StatusOr<BuiltEngine> BuildFromOnnxFile(const std::string& path, const BuilderConfig& config,
                                        const ImportOptions* import = nullptr);
// "NAME=LENGTH" or "NAME=LENGTH:RANK" (`kiln build --sequence-input`) into `options`.
Status ParseSequenceInputSpec(const std::string& spec, ImportOptions* options);
StatusOr<BuiltEngine> BuildFromOnnxBytes(std::span<const std::byte> bytes, const std::string& name,
                                         const BuilderConfig& config);

// Sets input shapes, binds host tensors (copying to the device when the backend is not host
// memory), executes, and returns the outputs as host tensors by name.
class HostRunner {
 public:
  static StatusOr<std::unique_ptr<HostRunner>> Create(std::shared_ptr<const Engine> engine,
                                                      const ExecutionOptions& options = {});
  // Binds inputs and sizes outputs; call again when shapes change. Allocation happens here, not
  // in Run.
  Status SetInputs(const std::map<std::string, Tensor>& inputs);
  // CopyInputs + Execute on the context's stream + CopyOutputs, then waits.
  Status Run();
  // The parts of Run, for timing them apart: host inputs to the device (waits), and device
  // outputs to the host (waits for everything enqueued before).
  Status CopyInputs();
  Status CopyOutputs();
  const std::map<std::string, Tensor>& outputs() const { return outputs_; }
  ExecutionContext& context() { return *context_; }

 private:
  std::shared_ptr<const Engine> engine_;
  std::unique_ptr<ExecutionContext> context_;
  std::map<std::string, Tensor> inputs_, outputs_;
  // Engines with data-dependent dims: each output's tensor at its bound (the bytes bound to the
  // context; shares them with outputs_ until a run reports smaller dims).
  std::map<std::string, Tensor> bound_outputs_;
  std::vector<DeviceBuffer> device_buffers_;
  std::vector<std::pair<void*, Tensor*>> to_host_;  // device output -> host tensor
  std::vector<std::pair<const Tensor*, void*>> to_device_;
};

struct Comparison {
  double max_abs = 0;
  double max_rel = 0;
  double rel_l2 = 0;       // ||a-b|| / ||b||
  int64_t mismatches = 0;  // elements outside atol + rtol*|expected|
  int64_t nan_mismatch = 0;
  bool shape_ok = true;
  bool dtype_ok = true;
  std::string ToString() const;
};
Comparison CompareTensors(const Tensor& actual, const Tensor& expected, double rtol, double atol);

// Random inputs for an engine at the given shapes (never all zeros; integer inputs in [0, high)).
// Each given shape is checked with Engine::CheckInputShape before anything is allocated.
StatusOr<std::map<std::string, Tensor>> RandomInputs(
    const Engine& engine, const std::map<std::string, std::vector<int64_t>>& shapes, uint64_t seed,
    int64_t int_high = 2);

}  // namespace kiln::app
