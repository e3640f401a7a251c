// The single-op harness for the CPU nn/matmul kernel tests.
#include "nn_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"

namespace kiln::testing {

Tensor RandomTensor(std::vector<int64_t> dims, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(NumElements(dims)));
  for (auto& x : v) x = dist(rng);
  if (!v.empty()) v[0] = v[0] == 0.f ? 0.5f : v[0];
  return Tensor::FromVector(DataType::kFloat32, std::move(dims), v);
}

namespace {
struct Built {
  std::unique_ptr<Graph> graph;
  Node* node = nullptr;
  std::vector<Tensor> inputs;  // cast to the test dtype
};

StatusOr<Built> Build(const OpCase& c, DataType dtype) {
  Built b;
  b.graph = std::make_unique<Graph>();
  std::vector<Value*> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (t.empty()) {
      ins.push_back(nullptr);
      b.inputs.emplace_back();
      continue;
    }
    Tensor cast = IsFloat(t.dtype()) ? t.CastTo(dtype) : t;
    bool is_const = i < c.constant.size() && c.constant[i];
    std::string name = fmt::format("in{}", i);
    ins.push_back(is_const ? b.graph->AddConstant(name, cast)
                           : b.graph->AddInput(name, cast.dtype(), MakeShape(cast.dims())));
    b.inputs.push_back(std::move(cast));
  }
  std::vector<Value*> outs;
  for (size_t i = 0; i < c.num_outputs; ++i)
    outs.push_back(b.graph->AddValue(fmt::format("out{}", i)));
  b.node = b.graph->AddNode(c.op, "node", ins, outs, c.attrs);
  for (Value* v : outs) b.graph->MarkOutput(v);
  KILN_RETURN_IF_ERROR(InferShapes(*b.graph).status());
  return b;
}
}  // namespace

StatusOr<std::vector<int64_t>> InferOutputDims(const OpCase& c) {
  KILN_ASSIGN_OR_RETURN(Built b, Build(c, DataType::kFloat32));
  auto dims = StaticDims(b.node->output(0)->shape());
  if (!dims) return MakeError(ErrorCode::kShapeMismatch, "output shape is symbolic");
  return *dims;
}

StatusOr<Tensor> RunFirstTactic(const OpCase& c, size_t k) {
  KILN_ASSIGN_OR_RETURN(Built built, Build(c, DataType::kFloat32));
  Node* node = built.node;
  KernelRequest request;
  request.node = node;
  for (size_t i = 0; i < built.inputs.size(); ++i) {
    OperandDesc d;
    if (!built.inputs[i].empty()) {
      d.dtype = built.inputs[i].dtype();
      d.shape = MakeShape(built.inputs[i].dims());
      d.max_dims = built.inputs[i].dims();
      d.constant = node->input(i)->constant();
    }
    request.inputs.push_back(d);
  }
  std::vector<Tensor> outs;
  for (size_t i = 0; i < node->num_outputs(); ++i) {
    OperandDesc d;
    d.dtype = node->output(i)->dtype();
    d.shape = node->output(i)->shape();
    d.max_dims = *StaticDims(d.shape);
    request.outputs.push_back(d);
    outs.emplace_back(d.dtype, d.max_dims);
  }
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, c.op)) {
    for (const TacticConfig& t : p->Tactics(request)) {
      KILN_ASSIGN_OR_RETURN(auto kernel, p->Create(request, t));
      std::vector<TensorView> in_views, out_views;
      for (const Tensor& in : built.inputs) {
        in_views.push_back(in.empty() ? TensorView{} : in.view());
      }
      for (const Tensor& out : outs) out_views.push_back(out.view());
      KILN_ASSIGN_OR_RETURN(size_t ws, kernel->Prepare(in_views, out_views));
      std::vector<std::byte> workspace(ws + 64);
      KILN_RETURN_IF_ERROR(kernel->Run({in_views, out_views, workspace.data(), ws, nullptr}));
      return std::move(outs[k]);
    }
  }
  return MakeError(ErrorCode::kUnimplemented, "no CPU tactic for {}", c.op);
}

std::vector<TacticResult> CheckAllTactics(const OpCase& c, const Reference& reference, double atol,
                                          double rtol, DataType dtype) {
  std::vector<TacticResult> results;
  auto built = Build(c, dtype);
  if (!built.ok()) {
    ADD_FAILURE() << c.op << ": " << built.status().ToString();
    return results;
  }
  Node* node = built->node;
  KernelRequest request;
  request.node = node;
  for (size_t i = 0; i < built->inputs.size(); ++i) {
    OperandDesc d;
    if (!built->inputs[i].empty()) {
      d.dtype = built->inputs[i].dtype();
      d.shape = MakeShape(built->inputs[i].dims());
      d.max_dims = built->inputs[i].dims();
      d.constant = node->input(i)->constant();
    }
    request.inputs.push_back(d);
  }
  std::vector<int64_t> out_dims = *StaticDims(node->output(0)->shape());
  for (size_t i = 0; i < node->num_outputs(); ++i) {
    OperandDesc d;
    d.dtype = node->output(i)->dtype();
    d.shape = node->output(i)->shape();
    d.max_dims = *StaticDims(d.shape);
    request.outputs.push_back(d);
  }
  // The reference sees exactly the (possibly rounded) values the kernel sees.
  std::vector<Tensor> ref_inputs;
  for (const Tensor& t : built->inputs) {
    ref_inputs.push_back(t.empty() || !IsFloat(t.dtype()) ? t : t.CastTo(DataType::kFloat32));
  }
  std::vector<double> expected = reference(ref_inputs, out_dims);
  auto providers = KernelRegistry::Get().Providers(BackendKind::kCpu, c.op);
  if (providers.empty()) ADD_FAILURE() << "no CPU provider for " << c.op;
  for (const KernelProvider* p : providers) {
    for (const TacticConfig& t : p->Tactics(request)) {
      TacticResult r{std::string(p->id()), t.name, t.workspace_bytes};
      auto kernel = p->Create(request, t);
      if (!kernel.ok()) {
        ADD_FAILURE() << t.name << ": " << kernel.status().ToString();
        continue;
      }
      std::vector<TensorView> in_views, out_views;
      for (const Tensor& in : built->inputs) {
        in_views.push_back(in.empty() ? TensorView{} : in.view());
      }
      Tensor out(node->output(0)->dtype(), out_dims);
      out_views.push_back(out.view());
      auto ws = (*kernel)->Prepare(in_views, out_views);
      if (!ws.ok()) {
        ADD_FAILURE() << t.name << ": " << ws.status().ToString();
        continue;
      }
      // The builder plans memory with Kernel::QueryWorkspace on a kernel it never prepares: the
      // figure must be Prepare's.
      if (auto fresh = p->Create(request, t); fresh.ok()) {
        auto query = (*fresh)->QueryWorkspace(in_views, out_views);
        EXPECT_TRUE(query.ok()) << t.name << ": " << query.status().ToString();
        if (query.ok()) EXPECT_EQ(*query, *ws) << t.name << " (" << ToString(dtype) << ")";
      }
      // Workspace is filled with NaNs so a kernel that reads it before writing shows up.
      std::vector<float> workspace(*ws / 4 + 16, std::nanf(""));
      auto* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(workspace.data()) + 63) &
                                              ~uintptr_t{63});
      KernelRunArgs args{in_views, out_views, aligned, *ws, nullptr};
      Status st = (*kernel)->Run(args);
      if (!st.ok()) {
        ADD_FAILURE() << t.name << ": " << st.ToString();
        continue;
      }
      EXPECT_EQ(out.num_elements(), static_cast<int64_t>(expected.size())) << t.name;
      int64_t bad = 0;
      for (int64_t i = 0; i < out.num_elements() && i < static_cast<int64_t>(expected.size());
           ++i) {
        double y = out.GetDouble(i), e = expected[i];
        double err = std::fabs(y - e);
        r.max_abs_err = std::max(r.max_abs_err, std::isnan(err) ? INFINITY : err);
        r.max_ref = std::max(r.max_ref, std::fabs(e));
        if (!(err <= atol + rtol * std::fabs(e)) && bad++ < 3) {
          ADD_FAILURE() << c.op << " " << t.name << " (" << ToString(dtype) << "): element " << i
                        << " is " << y << ", expected " << e;
        }
      }
      results.push_back(r);
    }
  }
  if (results.empty()) ADD_FAILURE() << "no tactic ran for " << c.op;
  return results;
}

}  // namespace kiln::testing
