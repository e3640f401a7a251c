// Node-at-a-time CPU evaluation: shape rule -> heuristic tactic -> kernel -> run.
#include "kiln/backends/cpu/cpu_eval.h"

#include <cstring>

#include "kiln/backends/kernel.h"
#include "kiln/backends/reference.h"
#include "kiln/ops/op_schema.h"

namespace kiln::cpu {

StatusOr<std::vector<Tensor>> EvaluateNode(const Node& node,
                                           std::span<const Tensor* const> inputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<ConcreteOutput> out_info, InferNodeOnTensors(node, inputs));
  KernelRequest request;
  request.node = &node;
  for (const Tensor* t : inputs) {
    OperandDesc d;
    if (t) {
      d.dtype = t->dtype();
      d.shape = MakeShape(t->dims());
      d.max_dims = t->dims();
      d.constant = t;
    }
    request.inputs.push_back(std::move(d));
  }
  std::vector<Tensor> outputs;
  for (const ConcreteOutput& o : out_info) {
    request.outputs.push_back({o.dtype, o.shape, o.dims, nullptr});
    outputs.emplace_back(o.dtype, o.dims);
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
