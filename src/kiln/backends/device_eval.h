// Evaluation on a backend's device, so that what precision runs over many batches (calibration's
// statistics, the INT8/FP8 sensitivity) runs on the GPU the engine is built for instead of the CPU
// reference. Two interfaces:
// - EvaluateStats (ir/evaluator.h's GraphStatsEvaluator): a whole graph per call, its values kept
//   on the device and reduced there; what calibration's passes and the sensitivity's reruns use.
// - Evaluate (a NodeEvaluator): one node on host tensors, which stay the values' truth.
//
// Each node runs with its provider's heuristic tactic, as the CPU reference does. What is kept on
// the device between calls:
// - residency: every output it computed, and every constant it uploaded, keeps its device copy,
//   keyed by the host buffer (whose storage it holds, so that buffer is never modified in place:
//   ir/tensor.h copies shared storage on write). A later node reading that tensor takes the
//   device copy, so an evaluation of a graph uploads its feed and weights once and downloads each
//   output once. Bounded by `max_resident_bytes`: past it, buffers nobody else holds go first,
//   then the least recently used.
// - kernels: one per (node, operand types and dims, constant operands), created and prepared once
//   with their workspace, run again for every batch.
// A node no device kernel takes (no native provider, or none for these operands) runs on the
// host with the reference evaluator (backends/reference.h) and is counted.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"
#include "kiln/ir/evaluator.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"
#include "kiln/ops/op_schema.h"

namespace kiln {

struct DeviceEvalOptions {
  size_t max_resident_bytes = size_t{4} << 30;  // device copies kept between calls
  size_t max_kernels = 4096;                    // past it the kernel cache starts again
};

struct DeviceEvalStats {
  int64_t nodes_on_device = 0;
  int64_t nodes_on_host = 0;  // no device kernel: the reference ran them
  int64_t kernels_created = 0;
  int64_t kernel_cache_hits = 0;
  int64_t uploads = 0;
  int64_t upload_bytes = 0;
  int64_t resident_hits = 0;  // operands read from a device copy (no upload)
  int64_t downloads = 0;
  int64_t download_bytes = 0;
  int64_t evictions = 0;
  int64_t pool_hits = 0;  // EvaluateStats outputs in a buffer an earlier value gave back
  std::map<std::string, int64_t> host_ops;  // op type -> nodes the reference ran
};

// Not thread-safe. Kernels are keyed by node address: an evaluator must not outlive the graphs
// whose nodes it ran (make one per calibration).
class DeviceEvaluator {
 public:
  // KILN-E6000 when the backend is not built or has no device here.
  static StatusOr<std::unique_ptr<DeviceEvaluator>> Create(BackendKind kind,
                                                           DeviceEvalOptions options = {});
  ~DeviceEvaluator();
  DeviceEvaluator(const DeviceEvaluator&) = delete;
  DeviceEvaluator& operator=(const DeviceEvaluator&) = delete;

  StatusOr<std::vector<Tensor>> Evaluate(const Node& node, std::span<const Tensor* const> inputs);
  // A NodeEvaluator that calls Evaluate; valid while this object lives.
  NodeEvaluator AsNodeEvaluator();

  // A whole graph for its statistics (ir/evaluator.h's GraphStatsEvaluator, what calibration's
  // passes ask): values stay on the device from their producer to their last reader, in buffers
  // reused from one value to the next, and are reduced there (Backend::AccumulateAbsStats). Only
  // the numbers, the kept values, small integer operands and what a host node or a shape needs
  // are downloaded. The feed and the constants stay resident between calls. Gives what
  // EvaluateValueStats over Evaluate gives, up to the device's FP32 rounding.
  StatusOr<ValueStats> EvaluateStats(const Graph& graph, const std::map<std::string, Tensor>& feed,
                                     const ValueStatsRequest& request);
  GraphStatsEvaluator AsGraphStatsEvaluator();

  BackendKind kind() const { return kind_; }
  const DeviceEvalStats& stats() const { return stats_; }
  size_t resident_bytes() const { return resident_bytes_; }
  // Frees every device copy and kernel (the stats stay).
  void Clear();

 private:
  struct Resident {
    std::shared_ptr<const void> storage;  // keeps the host bytes where they are and unchanged
    const void* host = nullptr;
    size_t bytes = 0;
    DeviceBuffer device;
    std::list<const void*>::iterator lru;
  };
  struct CachedKernel {
    std::unique_ptr<Kernel> kernel;
    DeviceBuffer workspace;
    size_t workspace_bytes = 0;
    std::vector<std::shared_ptr<const void>> constants;  // what the key's pointers name
    std::vector<Tensor> constant_copies;                 // request.constant targets
    std::unique_ptr<KernelRequest> request;
    bool prepared = false;
  };
  // An operand as FindKernel sees it: `host` when its values are at hand (constants, host
  // values), passed to the kernel as a constant when `as_constant`.
  struct Operand {
    bool present = false;
    DataType dtype = DataType::kUndefined;
    std::vector<int64_t> dims;
    const Tensor* host = nullptr;
    bool as_constant = false;
  };
  struct WalkValue;

  DeviceEvaluator(BackendKind kind, Backend* backend, DeviceHandle stream,
                  DeviceEvalOptions options);
  // The device copy of `t`, uploading it when none is kept.
  StatusOr<void*> DeviceCopy(const Tensor& t);
  // Keeps `device` as the copy of `t` (which owns its storage); may evict others first.
  void Keep(const Tensor& t, DeviceBuffer device);
  void MakeRoom(size_t bytes);
  StatusOr<std::vector<Tensor>> OnHost(const Node& node, std::span<const Tensor* const> inputs);
  // The cached kernel for these operands, created on first use; nullptr: no device kernel.
  StatusOr<CachedKernel*> FindKernel(const Node& node, std::span<const Operand> operands,
                                     const std::vector<ConcreteOutput>& out_info);
  // Prepares the kernel on its first run (workspace), then enqueues it.
  Status RunKernel(const Node& node, CachedKernel& cached, std::span<const TensorView> in_views,
                   std::span<const TensorView> out_views);
  // EvaluateStats' output buffers: an exact-size one given back earlier, else a new one.
  StatusOr<DeviceBuffer> TakeBuffer(size_t bytes);
  void GiveBack(DeviceBuffer buf);
  StatusOr<const Tensor*> HostOf(WalkValue& v);  // downloads once
  StatusOr<void*> DeviceOf(WalkValue& v);

  BackendKind kind_;
  Backend* backend_;
  DeviceHandle stream_;
  DeviceEvalOptions options_;
  DeviceEvalStats stats_;
  std::unordered_map<const void*, Resident> resident_;
  std::list<const void*> lru_;  // front: most recently used
  size_t resident_bytes_ = 0;
  std::unordered_map<std::string, CachedKernel> kernels_;
  std::unordered_set<const void*> pinned_;  // operands of the node being run: never evicted
  std::vector<DeviceBuffer> scratch_;       // uploads of tensors without a storage to hold
  std::unordered_multimap<size_t, DeviceBuffer> pool_;  // by size, bounded by max_resident_bytes
  size_t pool_bytes_ = 0;
};

}  // namespace kiln
