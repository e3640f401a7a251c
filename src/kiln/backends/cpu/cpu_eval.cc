// Node-at-a-time CPU evaluation: shape rule -> heuristic tactic -> kernel -> run.
#include "kiln/backends/cpu/cpu_eval.h"

#include <cstring>

#include "kiln/backends/kernel.h"
#include "kiln/backends/reference.h"
#include "kiln/ops/op_schema.h"

namespace kiln::cpu {

StatusOr<std::vector<Tensor>> EvaluateNode(const Node& node,
                                           std::span<const Tensor* const> inputs) {
  std::vector<ValueInfo> in_info(inputs.size());
  std::vector<const ValueInfo*> in_ptrs(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    in_info[i].dtype = inputs[i]->dtype();
    in_info[i].shape = MakeShape(inputs[i]->dims());
    in_info[i].constant = inputs[i];
    in_ptrs[i] = &in_info[i];
  }
  std::vector<ValueInfo> out_info(node.num_outputs());
  KILN_RETURN_IF_ERROR(InferNode(node, in_ptrs, out_info));
  // Data-dependent outputs are allocated at their bounds and cut to what the kernel reports.
  KILN_RETURN_IF_ERROR(BindDataDependentDims(node, out_info, {}));

  KernelRequest request;
  request.node = &node;
  for (size_t i = 0; i < inputs.size(); ++i) {
    OperandDesc d;
    if (inputs[i]) {
      d.dtype = inputs[i]->dtype();
      d.shape = in_info[i].shape;
      d.max_dims = inputs[i]->dims();
      d.constant = inputs[i];
    }
    request.inputs.push_back(std::move(d));
  }
  std::vector<Tensor> outputs;
  for (const ValueInfo& o : out_info) {
    auto dims = StaticDims(o.shape);
    if (!dims) {
      return MakeError(ErrorCode::kInternal, "node '{}': output shape {} is not concrete",
                       node.name(), ToString(o.shape));
    }
    request.outputs.push_back({o.dtype, o.shape, *dims, nullptr});
    outputs.emplace_back(o.dtype, *dims);
  }
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, node)) {
    auto tactics = p->Tactics(request);
    if (tactics.empty()) continue;
    KILN_ASSIGN_OR_RETURN(auto kernel, p->Create(request, tactics.front()));
    std::vector<TensorView> in_views, out_views;
    for (const Tensor* t : inputs) in_views.push_back(t ? t->view() : TensorView{});
    for (Tensor& t : outputs) out_views.push_back({t.dtype(), t.dims(), t.mutable_raw()});
    KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel->Prepare(in_views, out_views));
    Tensor workspace(DataType::kUInt8, {static_cast<int64_t>(ws_bytes)});
    KernelRunArgs args;
    args.inputs = in_views;
    args.outputs = out_views;
    args.workspace = ws_bytes ? workspace.mutable_raw() : nullptr;
    args.workspace_bytes = ws_bytes;
    KILN_RETURN_IF_ERROR_CTX(kernel->Run(args), "running node '{}' with {}", node.name(),
                             tactics.front().name);
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::vector<int64_t>* got = kernel->RunOutputDims(i);
      if (!got || *got == outputs[i].dims()) continue;
      Tensor actual(outputs[i].dtype(), *got);
      if (actual.size_bytes() > outputs[i].size_bytes()) {
        return MakeError(ErrorCode::kInternal, "node '{}': output {} reported dims past its bound",
                         node.name(), i);
      }
      if (actual.size_bytes() > 0) {
        std::memcpy(actual.mutable_raw(), outputs[i].raw(), actual.size_bytes());
      }
      outputs[i] = std::move(actual);
    }
    return outputs;
  }
  return MakeError(ErrorCode::kNoTactic, "node '{}': no CPU kernel for {} with these operand types",
                   node.name(), node.op_type());
}

StatusOr<std::map<std::string, Tensor>> EvaluateGraph(const Graph& graph,
                                                      const std::map<std::string, Tensor>& inputs) {
  return EvaluateGraphOutputs(graph, inputs, EvaluateNode);
}

namespace {
// The CPU backend is the reference (DESIGN.md): passes and precision evaluate with this.
const bool kReferenceRegistered = RegisterReferenceEvaluator(EvaluateNode);
}  // namespace

}  // namespace kiln::cpu
