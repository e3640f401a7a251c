// Merging projections of one input into one wider GEMM (projection_concat.h).
#include "kiln/passes/projection_concat.h"

#include <cstring>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

constexpr std::string_view kConcatOp = "ConcatAxis";

// The weight op: its inputs (one dtype, equal dims but along `axis`) side by side along `axis`.
StatusOr<std::vector<Tensor>> ConcatAxis(const AttributeMap& a, std::span<const Tensor* const> in) {
  if (in.empty() || !in[0]) return MakeError(ErrorCode::kInternal, "{}: no inputs", kConcatOp);
  const std::vector<int64_t>& d0 = in[0]->dims();
  const int64_t axis = a.GetInt("axis", 0);
  if (axis < 0 || axis >= static_cast<int64_t>(d0.size())) {
    return MakeError(ErrorCode::kInternal, "{}: axis {} of a rank-{} tensor", kConcatOp, axis,
                     d0.size());
  }
  std::vector<int64_t> dims = d0;
  dims[axis] = 0;
  for (const Tensor* t : in) {
    std::vector<int64_t> d = t ? t->dims() : std::vector<int64_t>();
    if (!t || t->dtype() != in[0]->dtype() || d.size() != d0.size()) {
      return MakeError(ErrorCode::kInternal, "{}: inputs differ in dtype or rank", kConcatOp);
    }
    dims[axis] += d[axis];
    d[axis] = d0[axis];
    if (d != d0) return MakeError(ErrorCode::kInternal, "{}: inputs differ in shape", kConcatOp);
  }
  Tensor out = Tensor::ForOverwrite(in[0]->dtype(), dims);  // every byte is copied below
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= d0[i];
  auto* dst = static_cast<std::byte*>(out.mutable_raw());
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* t : in) {
      const size_t block = t->size_bytes() / static_cast<size_t>(outer);
      std::memcpy(dst, static_cast<const std::byte*>(t->raw()) + o * block, block);
      dst += block;
    }
  }
  std::vector<Tensor> result;
  result.push_back(std::move(out));
  return result;
}

const bool kConcatRegistered = RegisterWeightOp(std::string(kConcatOp), ConcatAxis);

}  // namespace

const Node* ConstantProjection(const Value* v, const Node* reader) {
  const Node* n = v->producer();
  if (!n || !(IsOp(*n, OpType::kFusedMatMul) || IsOp(*n, OpType::kMatMul)) ||
      v->is_graph_output()) {
    return nullptr;
  }
  for (const Node* c : v->consumers()) {
    if (c != reader) return nullptr;
  }
  if (n->attrs().GetString("activation", "") != "" || n->attrs().GetInt("transA", 0) != 0) {
    return nullptr;
  }
  // A layer with a QDQ model's INT8 scales keeps its own weight (its scales are per layer).
  if (HasModelInt8Attrs(*n)) return nullptr;
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
  Value* a = p[0]->input(0);
  const int64_t trans_b = p[0]->attrs().GetInt("transB", 0);
  const float alpha = p[0]->attrs().GetFloat("alpha", 1.f);
  auto has_bias = [](const Node* proj) { return proj->num_inputs() > 2 && proj->input(2); };
  bool bias = false;  // any of them: the others get zeros (Whisper's key projection has none)
  const std::vector<int64_t>& wd = p[0]->input(1)->constant()->dims();
  for (const Node* proj : p) {
    bias = bias || has_bias(proj);
    if (proj->input(0) != a || proj->attrs().GetInt("transB", 0) != trans_b ||
        proj->attrs().GetFloat("alpha", 1.f) != alpha || proj->input(1)->constant()->dims() != wd) {
      return nullptr;
    }
  }
  const int64_t n = trans_b ? wd[0] : wd[1];
  for (const Node* proj : p) {
    if (has_bias(proj) && proj->input(2)->constant()->num_elements() != n) {
      return nullptr;  // nothing changed yet
    }
  }
  // W is [K, N] (or [N, K] with transB): concatenate along N.
  std::vector<Value*> weights, biases;
  Value* zeros = nullptr;
  for (const Node* proj : p) {
    weights.push_back(proj->input(1));
    if (!bias) continue;
    if (!has_bias(proj) && !zeros) {
      zeros = AddLiteralConstant(graph, p[0]->name() + suffix + "_zero_bias",
                                 Tensor(DataType::kFloat32, {n}));
    }
    biases.push_back(has_bias(proj) ? proj->input(2) : zeros);
  }
  AttributeMap along_n;
  along_n.Set("axis", int64_t{trans_b ? 0 : 1});
  Value* w = DeriveConstant(graph, p[0]->name() + suffix + "_weight", std::string(kConcatOp),
                            along_n, weights);
  if (!w) return nullptr;
  std::vector<Value*> inputs = {a, w};
  if (bias) {
    AttributeMap along_0;
    along_0.Set("axis", int64_t{0});
    Value* b = DeriveConstant(graph, p[0]->name() + suffix + "_bias", std::string(kConcatOp),
                              along_0, biases);
    if (!b) return nullptr;
    inputs.push_back(b);
  }
  Value* out = graph.AddValue(graph.UniqueName(p[0]->name() + suffix), a->dtype());
  graph.AddNode("FusedMatMul", graph.UniqueName(p[0]->name() + suffix), std::move(inputs), {out},
                p[0]->attrs());
  return out;
}

}  // namespace kiln::passes
