// Merging projections of one input into one wider GEMM (projection_concat.h).
#include "kiln/passes/projection_concat.h"

#include <cstring>

namespace kiln::passes {

const Node* ConstantProjection(const Value* v, const Node* reader) {
  const Node* n = v->producer();
  if (!n || (n->op_type() != "FusedMatMul" && n->op_type() != "MatMul") || v->is_graph_output()) {
    return nullptr;
  }
  for (const Node* c : v->consumers()) {
    if (c != reader) return nullptr;
  }
  if (n->attrs().GetString("activation", "") != "" || n->attrs().GetInt("transA", 0) != 0) {
    return nullptr;
  }
  const Value* a = n->input(0);
  const Value* w = n->input(1);
  if (!a || a->is_constant() || !w || !w->is_constant() ||
      w->constant()->dtype() != DataType::kFloat32 || w->constant()->dims().size() != 2) {
    return nullptr;
  }
  if (n->num_inputs() > 2 && n->input(2)) {
    const Value* b = n->input(2);
    if (!b->is_constant() || b->constant()->dtype() != DataType::kFloat32 ||
        b->constant()->dims().size() != 1) {
      return nullptr;
    }
  }
  return n;
}

Value* ConcatProjections(Graph& graph, std::span<const Node* const> p, const std::string& suffix) {
  if (p.empty()) return nullptr;
  const int64_t k = static_cast<int64_t>(p.size());
  Value* a = p[0]->input(0);
  const int64_t trans_b = p[0]->attrs().GetInt("transB", 0);
  const float alpha = p[0]->attrs().GetFloat("alpha", 1.f);
  const bool bias = p[0]->num_inputs() > 2 && p[0]->input(2);
  const std::vector<int64_t>& wd = p[0]->input(1)->constant()->dims();
  for (size_t i = 1; i < p.size(); ++i) {
    const bool has_bias = p[i]->num_inputs() > 2 && p[i]->input(2);
    if (p[i]->input(0) != a || p[i]->attrs().GetInt("transB", 0) != trans_b ||
        p[i]->attrs().GetFloat("alpha", 1.f) != alpha || has_bias != bias ||
        p[i]->input(1)->constant()->dims() != wd) {
      return nullptr;
    }
  }
  // W is [K, N] (or [N, K] with transB): concatenate along N.
  const int64_t rows = wd[0], cols = wd[1];
  const int64_t n = trans_b ? rows : cols;
  for (size_t i = 0; bias && i < p.size(); ++i) {
    if (p[i]->input(2)->constant()->num_elements() != n) return nullptr;  // nothing changed yet
  }
  Tensor w(DataType::kFloat32,
           trans_b ? std::vector<int64_t>{k * rows, cols} : std::vector<int64_t>{rows, k * cols});
  float* wp = w.mutable_data<float>();
  for (int64_t i = 0; i < k; ++i) {
    const float* src = p[i]->input(1)->constant()->data<float>();
    if (trans_b) {
      std::memcpy(wp + i * rows * cols, src, sizeof(float) * rows * cols);
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(wp + r * k * cols + i * cols, src + r * cols, sizeof(float) * cols);
      }
    }
  }
  std::vector<Value*> inputs = {
      a, graph.AddConstant(graph.UniqueName(p[0]->name() + suffix + "_weight"), std::move(w))};
  if (bias) {
    Tensor b(DataType::kFloat32, {k * n});
    for (int64_t i = 0; i < k; ++i) {
      const Tensor& src = *p[i]->input(2)->constant();
      std::memcpy(b.mutable_data<float>() + i * n, src.data<float>(), sizeof(float) * n);
    }
    inputs.push_back(
        graph.AddConstant(graph.UniqueName(p[0]->name() + suffix + "_bias"), std::move(b)));
  }
  Value* out = graph.AddValue(graph.UniqueName(p[0]->name() + suffix), a->dtype());
  graph.AddNode("FusedMatMul", graph.UniqueName(p[0]->name() + suffix), std::move(inputs), {out},
                p[0]->attrs());
  return out;
}

}  // namespace kiln::passes
