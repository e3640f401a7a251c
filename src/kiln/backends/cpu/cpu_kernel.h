// Shared scaffolding for CPU kernels. Most CPU kernels compute in FP32; CpuFloatProvider gives
// every such kernel FP16 and BF16 storage for free by converting operands to FP32 in the
// workspace (FP32 accumulation, as the precision rules require).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/cpu/small_vec.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/thread_pool.h"

namespace kiln::cpu {

// A provider whose kernels compute on FP32 operands. Subclasses implement the FP32 tactics and
// kernel creation; requests whose float operands are f16/bf16 are served by wrapping.
class CpuFloatProvider : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCpu; }
  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final;
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final;

 protected:
  // `request` has every float operand as f32 (constants converted). Tactic names should start
  // with "f32-"; the wrapper renames them "f16-..." / "bf16-...".
  virtual std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const = 0;
  virtual StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                                      const TacticConfig& tactic) const = 0;
  // Which operand dtypes (after f16/bf16 -> f32) this provider accepts; default: every float
  // operand f32, non-float operands anything. Override to restrict or allow ints.
  virtual bool AcceptsTypes(const KernelRequest& f32_request) const;
};

// The f32 view of a request; keeps converted constants alive.
struct F32Request {
  KernelRequest request;
  std::vector<std::unique_ptr<Tensor>> converted;
  DataType storage = DataType::kFloat32;  // the original float storage type
};
F32Request ToF32Request(const KernelRequest& request);

// Broadcast helper: for output index i (row-major over out_dims), the input's linear index.
// Precomputed strides make the inner loop cheap; used by binary elementwise ops.
struct BroadcastIndexer {
  BroadcastIndexer() = default;
  BroadcastIndexer(std::span<const int64_t> in_dims, std::span<const int64_t> out_dims);
  int64_t operator()(int64_t out_index) const;
  bool identity = false;           // in_dims == out_dims
  bool scalar = false;             // one element
  DimVec out_strides, in_strides;  // inline: built in Run without allocating
};

}  // namespace kiln::cpu
