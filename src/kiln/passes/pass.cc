// The pass manager (fixed-point iteration with shape re-inference), the default pipeline and the
// rewrite helpers shared by the passes.
#include "kiln/passes/pass.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/core/logging.h"
#include "kiln/ir/weight_program.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"

namespace kiln::passes {

const std::vector<Dim>* PassContext::dims_value(const Value* v) const {
  auto it = dims_values_.find(v);
  return it == dims_values_.end() ? nullptr : &it->second;
}

Status PassContext::EnsureShapes(Graph& graph) {
  if (staleness_ == Staleness::kFresh) return OkStatus();
  if (staleness_ == Staleness::kNewNodes && !options_.full_shape_inference) {
    KILN_RETURN_IF_ERROR(InferNewShapes(graph, dims_values_));
  } else {
    dims_values_.clear();
    KILN_ASSIGN_OR_RETURN(ShapeInferenceResult result, InferShapes(graph));
    dims_values_ = std::move(result.dims_values);
  }
  staleness_ = Staleness::kFresh;
  return OkStatus();
}

int64_t PassReport::rewrites(std::string_view pass) const {
  int64_t total = 0;
  for (const auto& e : passes) {
    if (e.pass == pass) total += e.stats.rewrites;
  }
  return total;
}

std::string PassReport::ToString() const {
  std::string out =
      fmt::format("passes: {} -> {} nodes in {} iteration(s){}\n", nodes_before, nodes_after,
                  iterations, reached_fixed_point ? "" : " (iteration limit reached)");
  for (const auto& e : passes) {
    out += fmt::format("  {:<24} rewrites {:>5}  removed {:>5}  added {:>5}\n", e.pass,
                       e.stats.rewrites, e.stats.nodes_removed, e.stats.nodes_added);
    for (const std::string& note : e.stats.notes) out += fmt::format("    {}\n", note);
  }
  return out;
}

void PassManager::Add(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }

std::vector<std::string> PassManager::pass_names() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.emplace_back(p->name());
  return names;
}

StatusOr<PassReport> PassManager::Run(
    Graph& graph, std::unordered_map<const Value*, std::vector<Dim>>* inferred) {
  PassReport report;
  report.nodes_before = static_cast<int64_t>(graph.num_nodes());
  PassContext ctx(options_);
  if (inferred) {
    ctx.dims_values_ = std::move(*inferred);
    ctx.staleness_ = PassContext::Staleness::kFresh;
  }
  std::vector<Pass*> enabled;
  for (auto& p : passes_) {
    if (std::find(options_.disabled.begin(), options_.disabled.end(), std::string(p->name())) ==
        options_.disabled.end()) {
      enabled.push_back(p.get());
      report.passes.push_back({std::string(p->name()), {}});
    }
  }
  int max_iterations = std::max(1, options_.max_iterations);
  for (int iter = 0; iter < max_iterations; ++iter) {
    bool changed = false;
    for (size_t i = 0; i < enabled.size(); ++i) {
      Pass* pass = enabled[i];
      KILN_RETURN_IF_ERROR_CTX(ctx.EnsureShapes(graph), "inferring shapes before pass '{}'",
                               pass->name());
      ctx.stats_ = {};
      KILN_RETURN_IF_ERROR_CTX(pass->Run(graph, ctx), "in graph pass '{}'", pass->name());
      if (ctx.stats_.rewrites > 0) {
        changed = true;
        graph.Compact();
        if (ctx.staleness_ == PassContext::Staleness::kFresh) {
          ctx.staleness_ = PassContext::Staleness::kNewNodes;
        }
        KILN_LOG(Debug, BUILD, "pass {} (round {}): {} rewrite(s), {} node(s) now", pass->name(),
                 iter + 1, ctx.stats_.rewrites, graph.num_nodes());
      }
      report.passes[i].stats.Add(ctx.stats_);
    }
    report.iterations = iter + 1;
    if (!changed) {
      report.reached_fixed_point = true;
      break;
    }
  }
  graph.Compact();
  KILN_RETURN_IF_ERROR_CTX(Verify(graph), "verifying the graph after the passes");
  KILN_RETURN_IF_ERROR_CTX(ctx.EnsureShapes(graph), "inferring shapes after the passes");
  report.nodes_after = static_cast<int64_t>(graph.num_nodes());
  return report;
}

std::unique_ptr<PassManager> MakeDefaultPassManager(const PassOptions& options) {
  auto pm = std::make_unique<PassManager>(options);
  pm->Add(MakeIdentityEliminationPass());
  // Before constant folding, which would make the weights' DequantizeLinear plain constants; after
  // identity elimination, which drops the no-op Cast PyTorch's export puts between Q and DQ.
  pm->Add(MakeQdqFusionPass());
  pm->Add(MakeShapeSimplificationPass());
  pm->Add(MakeConstantFoldingPass());
  pm->Add(MakeDeadNodeEliminationPass());
  pm->Add(MakeConvBatchNormFoldingPass());
  pm->Add(MakePatchifyPass());          // after the BatchNorm folding, which may give it the bias
  pm->Add(MakeStemSpaceToDepthPass());  // the same, and after patchify takes what tiles its input
  pm->Add(MakeLayerNormFusionPass());
  pm->Add(MakeRmsNormFusionPass());  // before the skip fusion, which takes its result
  pm->Add(MakeSkipLayerNormFusionPass());
  pm->Add(MakeRotaryFusionPass());
  pm->Add(MakeGeluFusionPass());
  pm->Add(MakeBatchUnflattenPass());
  pm->Add(MakeAttentionCanonicalizationPass());
  pm->Add(MakeAttentionFusionPass());
  pm->Add(MakeGatedActivationFusionPass());  // before gemm_fusion takes the activation
  pm->Add(MakeGemmFusionPass());
  // A scale after a projection goes into its weights before the Q/K/V fusion looks at the
  // projections (Whisper scales Q after its projection, before the head split).
  pm->Add(MakeMatMulScaleFoldingPass());
  // After gemm_fusion: the layout pass reads through a fused projection (FusedMatMul) of a
  // Transpose's input; row_transpose first, the layout pass reads what it leaves.
  pm->Add(MakeRowTransposePass());
  pm->Add(MakeAttentionLayoutPass());
  pm->Add(MakeQkvFusionPass());
  pm->Add(MakeGatedProjectionMergePass());
  pm->Add(MakeConvFusionPass());
  pm->Add(MakeGlobalPoolPass());  // after the fusions: it only renames a reduction
  pm->Add(MakeDeadNodeEliminationPass());
  return pm;
}

namespace {
// After the fusions and the layout: Transposes (the model's and the layout's) sink and cancel,
// which can leave a per-column scale right after a product. Run last so that the fusions above
// see the graph as the model wrote it.
std::unique_ptr<PassManager> MakeLatePassManager(const PassOptions& options) {
  auto pm = std::make_unique<PassManager>(options);
  // First: the fusions above leave twins (T5's per-layer sum of the shared masks).
  pm->Add(MakeCommonSubexpressionPass());
  pm->Add(MakeTransposeSinkingPass());
  pm->Add(MakeMatMulScaleFoldingPass());
  pm->Add(MakeSliceConcatFusionPass());
  pm->Add(MakeDeadNodeEliminationPass());
  return pm;
}
}  // namespace

StatusOr<PassReport> RunDefaultPasses(
    Graph& graph, const PassOptions& options,
    std::unordered_map<const Value*, std::vector<Dim>>* inferred) {
  KILN_ASSIGN_OR_RETURN(PassReport report, MakeDefaultPassManager(options)->Run(graph, inferred));
  auto append = [&](const PassReport& r) {
    report.passes.insert(report.passes.end(), r.passes.begin(), r.passes.end());
    report.nodes_after = r.nodes_after;
  };
  const bool layout = !options.conv_layout.empty() &&
                      std::find(options.disabled.begin(), options.disabled.end(), "layout_nhwc") ==
                          options.disabled.end();
  if (layout) {
    PassOptions layout_options = options;
    layout_options.max_iterations = 1;
    PassManager layout_pm(layout_options);
    layout_pm.Add(MakeConv1dLiftPass());
    layout_pm.Add(MakeLayoutNhwcPass());
    KILN_ASSIGN_OR_RETURN(PassReport layout_report, layout_pm.Run(graph));
    append(layout_report);
  }
  KILN_ASSIGN_OR_RETURN(PassReport late_report, MakeLatePassManager(options)->Run(graph));
  append(late_report);
  return report;
}

std::vector<std::string> DefaultPassNames() {
  std::vector<std::string> names;
  for (const std::string& n : MakeDefaultPassManager({})->pass_names()) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  names.emplace_back(MakeConv1dLiftPass()->name());
  names.emplace_back(MakeLayoutNhwcPass()->name());
  for (const std::string& n : MakeLatePassManager({})->pass_names()) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  return names;
}

std::optional<std::vector<int64_t>> StaticInts(const Value* v, const PassContext& ctx) {
  if (!v) return std::nullopt;
  if (v->is_constant() && IsInteger(v->constant()->dtype())) return v->constant()->ToInt64Vector();
  if (const std::vector<Dim>* dv = ctx.dims_value(v)) {
    std::vector<int64_t> out;
    for (const Dim& d : *dv) {
      if (!d.is_static()) return std::nullopt;
      out.push_back(d.value());
    }
    return out;
  }
  return std::nullopt;
}

Node* ReplaceMatched(Graph& graph, PassContext& ctx, const std::vector<Node*>& matched, Node* root,
                     std::string op_type, std::vector<Value*> inputs, AttributeMap attrs) {
  std::vector<Value*> outputs = {root->output(0)};
  std::string name = root->name();
  int64_t removed = 0;
  for (Node* n : matched) {
    if (n->is_dead()) continue;
    // Shared intermediates stay while something outside the match still reads them.
    bool read_outside = false;
    if (n != root) {
      for (Value* out : n->outputs()) {
        if (!out) continue;
        if (out->is_graph_output()) read_outside = true;
        for (Node* c : out->consumers()) {
          if (std::find(matched.begin(), matched.end(), c) == matched.end()) read_outside = true;
        }
      }
    }
    if (read_outside) continue;
    graph.RemoveNode(n);
    ++removed;
  }
  // RemoveNode on the root released its outputs; the new node produces them.
  Node* fused = graph.AddNode(std::move(op_type), graph.UniqueName(name + "_fused"),
                              std::move(inputs), outputs, std::move(attrs));
  ctx.stats().rewrites += 1;
  ctx.stats().nodes_removed += removed;
  ctx.stats().nodes_added += 1;
  return fused;
}

bool ForwardValue(Graph& graph, Value* v, Value* replacement) {
  if (v == replacement) return false;
  if (v->is_graph_output() && (replacement->is_graph_input() || replacement->is_graph_output() ||
                               replacement->is_constant())) {
    return false;
  }
  graph.ReplaceAllUses(v, replacement);
  return true;
}

Value* AddConstant(Graph& graph, const std::string& prefix, Tensor t) {
  return graph.AddConstant(graph.UniqueName(prefix), std::move(t));
}

Node* ProducerIf(const Value* v, OpType op) {
  Node* n = v ? v->producer() : nullptr;
  return n && IsOp(*n, op) ? n : nullptr;
}

bool ReadOnlyBy(const Value* v, const Node* reader) {
  return v && !v->is_graph_output() && v->consumers().size() == 1 && v->consumers()[0] == reader;
}

void RemoveUnread(Graph& graph, PassContext& ctx, std::span<Node* const> nodes) {
  for (Node* n : nodes) {
    if (n->is_dead()) continue;
    bool read = false;
    for (size_t i = 0; i < n->num_outputs() && !read; ++i) {
      const Value* out = n->output(i);
      read = out && (out->is_graph_output() || !out->consumers().empty());
    }
    if (read) continue;
    graph.RemoveNode(n);
    ctx.stats().nodes_removed += 1;
  }
}

Value* AddLiteralConstant(Graph& graph, const std::string& prefix, Tensor t) {
  Value* v = AddConstant(graph, prefix, std::move(t));
  v->set_provenance(LiteralExpr(*v->constant()));
  return v;
}

bool FitsShapeConstant(const Shape& shape) {
  return std::count_if(shape.begin(), shape.end(), [](const Dim& d) { return !d.is_static(); }) <=
         1;
}

Value* AddShapeConstant(Graph& graph, const std::string& prefix, const Shape& shape) {
  if (!FitsShapeConstant(shape)) return nullptr;
  std::vector<int64_t> dims;
  for (const Dim& d : shape) dims.push_back(d.is_static() ? d.value() : -1);
  const int64_t n = static_cast<int64_t>(dims.size());
  return AddLiteralConstant(graph, prefix,
                            Tensor::FromVector<int64_t>(DataType::kInt64, {n}, dims));
}

Value* AddReshapeTarget(Graph& graph, const std::string& prefix, const Shape& from,
                        const Shape& to) {
  std::vector<int64_t> dims;
  int inferred = 0;
  for (size_t k = 0; k < to.size(); ++k) {
    if (to[k].is_static()) {
      // A static 0 would read as "copy": only where the input's dim is 0 too.
      if (to[k].value() == 0 && !(k < from.size() && from[k] == to[k])) return nullptr;
      dims.push_back(to[k].value());
    } else if (k < from.size() && from[k] == to[k]) {
      dims.push_back(0);
    } else {
      if (++inferred > 1) return nullptr;
      dims.push_back(-1);
    }
  }
  const int64_t n = static_cast<int64_t>(dims.size());
  return AddLiteralConstant(graph, prefix,
                            Tensor::FromVector<int64_t>(DataType::kInt64, {n}, dims));
}

std::vector<Value*> DeriveConstants(Graph& graph, const std::vector<std::string>& prefixes,
                                    const std::string& op, const AttributeMap& attrs,
                                    const std::vector<Value*>& inputs) {
  auto derived = DeriveWithWeightOp(op, attrs, inputs, static_cast<int>(prefixes.size()));
  if (!derived.ok()) {
    KILN_LOG(Debug, BUILD, "weight op {} failed; the pattern stays: {}", op,
             derived.status().ToString());
    return {};
  }
  std::vector<Value*> out;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    Value* v = AddConstant(graph, prefixes[i], std::move((*derived)[i].value));
    v->set_provenance(std::move((*derived)[i].expr));
    out.push_back(v);
  }
  return out;
}

std::optional<ConstantWeightConv> AsConstantWeightConv(const Node& conv) {
  ConstantWeightConv c{conv.input(0), conv.input(1),
                       conv.num_inputs() > 2 ? conv.input(2) : nullptr, conv.output(0)};
  if (!c.x || !c.w || !c.y || !c.w->is_constant() || !c.x->has_shape() || !c.y->has_shape()) {
    return std::nullopt;
  }
  if (c.bias && !c.bias->is_constant()) return std::nullopt;
  if (conv.num_outputs() != 1 || HasModelInt8Attrs(conv)) return std::nullopt;
  return c;
}

Value* DeriveConstant(Graph& graph, const std::string& prefix, const std::string& op,
                      const AttributeMap& attrs, const std::vector<Value*>& inputs) {
  std::vector<Value*> out = DeriveConstants(graph, {prefix}, op, attrs, inputs);
  return out.empty() ? nullptr : out.front();
}

}  // namespace kiln::passes
