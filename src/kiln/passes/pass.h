// Graph passes: the Pass interface, the context they run in, the manager that runs them to a
// fixed point, and the default pipeline the builder uses. Passes depend on ir and ops only; the
// one thing they need from a backend (evaluating a node, for constant folding) comes in as a
// function.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/evaluator.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"

namespace kiln::passes {

// Evaluates one node on host tensors (ir/evaluator.h). The builder passes the reference
// (backends/reference.h: the CPU backend's).
using NodeEvaluator = kiln::NodeEvaluator;

// What one pass did (summed over the manager's iterations).
struct PassStats {
  int64_t rewrites = 0;  // pattern instances rewritten / nodes folded
  int64_t nodes_removed = 0;
  int64_t nodes_added = 0;
  // What a reader of the build report should know (e.g. where the layout pass put transposes).
  std::vector<std::string> notes;
  void Add(const PassStats& o) {
    rewrites += o.rewrites;
    nodes_removed += o.nodes_removed;
    nodes_added += o.nodes_added;
    notes.insert(notes.end(), o.notes.begin(), o.notes.end());
  }
};

struct PassOptions {
  NodeEvaluator evaluator;  // constant folding is skipped without one
  // Constant folding does not materialise outputs larger than this (a huge Expand or
  // ConstantOfShape stays a node rather than becoming weights).
  int64_t fold_size_limit_bytes = int64_t{16} << 20;
  // Rounds of the whole pipeline at most; the manager stops earlier at a fixed point.
  int max_iterations = 8;
  // Names of passes not to run (e.g. "attention_fusion").
  std::vector<std::string> disabled;
  // The activation layout the target backend prefers for convolutions at the build's precision:
  // "NHWC" runs the layout pass (layout_nhwc.cc) after the default pipeline; "" leaves ONNX's
  // channels-first layout.
  std::string conv_layout;
  // Re-run whole-graph shape inference after every pass that changed the graph, instead of
  // inferring only what the pass touched (InferNewShapes). Slower; the tests compare the two.
  bool full_shape_inference = false;
  // The target backend's fused attention takes head dims up to this (0: any). attention_fusion
  // leaves attention with larger heads (GPT-J's and Gemma-7B's 256) as the model wrote it, whose
  // products and softmax the backend runs, rather than make an Attention it cannot.
  int64_t attention_max_head_dim = 0;
  // Strided convolutions of few channels become stride-1 ones over blocks moved into channels
  // (stem_space_to_depth.cc): for a backend whose INT8 convolution pads channels to 16.
  bool stem_space_to_depth = false;
};

// State shared by the passes of one run.
class PassContext {
 public:
  explicit PassContext(const PassOptions& options) : options_(options) {}
  const PassOptions& options() const { return options_; }
  // Stats of the pass now running; passes add to it.
  PassStats& stats() { return stats_; }
  // Dims-values (the elements of small shape tensors) from the latest shape inference.
  const std::unordered_map<const Value*, std::vector<Dim>>& dims_values() const {
    return dims_values_;
  }
  const std::vector<Dim>* dims_value(const Value* v) const;
  // Re-runs shape inference if a pass changed the graph since the last run: over the nodes the
  // passes touched (and what depends on them), or all of it when marked stale or when
  // options().full_shape_inference.
  Status EnsureShapes(Graph& graph);
  void MarkShapesStale() { staleness_ = Staleness::kAll; }

 private:
  friend class PassManager;
  enum class Staleness { kFresh, kNewNodes, kAll };
  const PassOptions& options_;
  PassStats stats_;
  std::unordered_map<const Value*, std::vector<Dim>> dims_values_;
  Staleness staleness_ = Staleness::kAll;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  // Rewrites `graph` in place, adding what it did to ctx.stats(). Shapes are inferred before a
  // pass runs; a pass that creates values gives them dtype and shape when it can (the manager
  // re-infers before the next pass anyway).
  virtual Status Run(Graph& graph, PassContext& ctx) = 0;
};

struct PassReportEntry {
  std::string pass;
  PassStats stats;
};
struct PassReport {
  std::vector<PassReportEntry> passes;  // in pipeline order
  int iterations = 0;
  bool reached_fixed_point = false;
  int64_t nodes_before = 0, nodes_after = 0;
  int64_t rewrites(std::string_view pass) const;
  std::string ToString() const;  // one line per pass, for logs and the build report
};

class PassManager {
 public:
  explicit PassManager(PassOptions options) : options_(std::move(options)) {}
  PassManager(const PassManager&) = delete;
  PassManager& operator=(const PassManager&) = delete;
  void Add(std::unique_ptr<Pass> pass);
  // Runs every pass in order, repeating the pipeline until no pass changes anything (or
  // max_iterations). Re-infers shapes between passes that changed the graph; compacts and
  // verifies at the end.
  // `inferred`: the dims-values of a shape inference just run on this graph (its values' shapes
  // are fresh), so the first pass does not infer again; taken over by the run.
  StatusOr<PassReport> Run(Graph& graph,
                           std::unordered_map<const Value*, std::vector<Dim>>* inferred = nullptr);
  std::vector<std::string> pass_names() const;

 private:
  PassOptions options_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

// The passes, one per file.
std::unique_ptr<Pass> MakeQdqFusionPass();  // Q/DQ around Conv/Gemm/MatMul -> an INT8 layer
std::unique_ptr<Pass> MakeConstantFoldingPass();
std::unique_ptr<Pass> MakeDeadNodeEliminationPass();
std::unique_ptr<Pass> MakeShapeSimplificationPass();
std::unique_ptr<Pass> MakeIdentityEliminationPass();
std::unique_ptr<Pass> MakeConvBatchNormFoldingPass();
// A convolution whose windows tile its input, reading few channels (ViT's patch embedding, Swin's
// and ConvNeXt's stems) => Transpose of the patches and one Gemm (patchify.cc).
std::unique_ptr<Pass> MakePatchifyPass();
// A Conv's operands, for the passes that rewrite a convolution of constant weights (patchify,
// stem_space_to_depth): x and y with shapes, w constant, the bias constant or absent (nullptr).
struct ConstantWeightConv {
  Value* x;
  Value* w;
  Value* bias;
  Value* y;
};
// nullopt for any other Conv: a weight or bias computed at run time, x or y without a shape, more
// than one output, or a layer the model quantized (qdq_fusion), which keeps its INT8 convolution.
std::optional<ConstantWeightConv> AsConstantWeightConv(const Node& conv);
// The weight op of stem_space_to_depth's convolution weights: an engine whose constants were made
// by it was built with the rewrite (recalibration builds its calibration graph so too).
inline constexpr std::string_view kStemSpaceToDepthWeightsOp = "StemSpaceToDepthWeights";
// A strided convolution of a few-channel input (ResNet's 7x7 stride-2 stem from 3 channels) =>
// blocks of the input moved into channels and a stride-1 convolution of fewer taps, when
// PassOptions::stem_space_to_depth (stem_space_to_depth.cc).
std::unique_ptr<Pass> MakeStemSpaceToDepthPass();
// Where the layout pass runs (conv_layout "NHWC"): a 1-D convolution as the 2-D one of height 1
// (conv1d_lift.cc), so that it joins the channels-last stacks.
std::unique_ptr<Pass> MakeConv1dLiftPass();
std::unique_ptr<Pass> MakeGeluFusionPass();
std::unique_ptr<Pass> MakeLayerNormFusionPass();
std::unique_ptr<Pass> MakeSkipLayerNormFusionPass();    // residual Add + Layer/RMSNormalization
std::unique_ptr<Pass> MakeRmsNormFusionPass();          // x * rsqrt(mean(x^2) + eps) * w
std::unique_ptr<Pass> MakeRotaryFusionPass();           // x * cos + rotate_half(x) * sin
std::unique_ptr<Pass> MakeGatedActivationFusionPass();  // act(a) * b (SwiGLU, GeGLU)
std::unique_ptr<Pass> MakeGatedProjectionMergePass();   // gate/up -> one GEMM (after gemm_fusion)
std::unique_ptr<Pass> MakeBatchUnflattenPass();         // bmm over [B*H, ...] views -> [B, H, ...]
std::unique_ptr<Pass> MakeAttentionCanonicalizationPass();  // decoders' score masks, fusable order
std::unique_ptr<Pass> MakeAttentionFusionPass();
std::unique_ptr<Pass> MakeRowTransposePass();      // row permutes above row-wise products
std::unique_ptr<Pass> MakeAttentionLayoutPass();   // heads read in place (Attention layout)
std::unique_ptr<Pass> MakeQkvFusionPass();         // Q/K/V projections -> one (after gemm_fusion)
std::unique_ptr<Pass> MakeGemmFusionPass();        // Gemm/MatMul + bias + activation
std::unique_ptr<Pass> MakeConvFusionPass();        // Conv + bias + residual + activation
std::unique_ptr<Pass> MakeGlobalPoolPass();        // ReduceMean over H, W -> GlobalAveragePool
std::unique_ptr<Pass> MakeLayoutNhwcPass();        // channels-last convolution stacks (conv_layout)
std::unique_ptr<Pass> MakeTransposeSinkingPass();  // Transposes sunk and cancelled (after layout)
std::unique_ptr<Pass> MakeMatMulScaleFoldingPass();   // MatMul then a per-column Mul -> one MatMul
std::unique_ptr<Pass> MakeSliceConcatFusionPass();    // Concat of axis ranges read in place
std::unique_ptr<Pass> MakeCommonSubexpressionPass();  // twins (same op, inputs, attributes) -> one

// The default pipeline, in order: simplifications first (so patterns see constants and no
// no-op nodes), then fusions from the largest pattern to the smallest (GELU before
// MatMul+bias+activation, so the activation it produces can be fused), then cleanup.
// RunDefaultPasses then runs the layout pass once on the fused graph when options.conv_layout
// asks for NHWC (it sees final FusedConv nodes, so no fusion has to understand layouts).
std::unique_ptr<PassManager> MakeDefaultPassManager(const PassOptions& options);
// The names RunDefaultPasses may run (PassOptions::disabled takes them), in pipeline order.
std::vector<std::string> DefaultPassNames();
StatusOr<PassReport> RunDefaultPasses(
    Graph& graph, const PassOptions& options,
    std::unordered_map<const Value*, std::vector<Dim>>* inferred = nullptr);

// ---- helpers for writing passes

// The integer elements of `v` when they are known statically: a constant's, or the dims-value
// the latest shape inference found (a shape computed from static dims); nullopt otherwise.
std::optional<std::vector<int64_t>> StaticInts(const Value* v, const PassContext& ctx);

// Replaces the match's root with one new node computing the root's first output (that value is
// reused, so its name and graph-output mark stay; the root's other outputs must be unused) and
// removes every matched node nothing else reads. Returns the new node and counts the rewrite.
Node* ReplaceMatched(Graph& graph, PassContext& ctx, const std::vector<Node*>& matched, Node* root,
                     std::string op_type, std::vector<Value*> inputs, AttributeMap attrs);
// The node writing `v` when it is an `op` node; nullptr otherwise (a graph input, a constant, an
// other op).
Node* ProducerIf(const Value* v, OpType op);
// True when `reader` is `v`'s one reader (once) and `v` is not a graph output.
bool ReadOnlyBy(const Value* v, const Node* reader);
// Removes each of `nodes` (readers before what they read) that is alive and whose outputs nothing
// reads and no graph output is, counting it in the context's stats: what a rewrite bypassed,
// gone at once so that the passes later in the round see the new chain's values read by it
// alone.
void RemoveUnread(Graph& graph, PassContext& ctx, std::span<Node* const> nodes);
// Makes `v`'s readers read `replacement` instead, and keeps graph outputs' names. False when `v`
// is a graph output that cannot take the replacement's place without renaming a graph input.
bool ForwardValue(Graph& graph, Value* v, Value* replacement);
// A new constant value. Its provenance is unrecorded: refit reports it as non-refittable, so a
// constant made from weights is made with DeriveConstants, and one that is not with
// AddLiteralConstant.
Value* AddConstant(Graph& graph, const std::string& prefix, Tensor t);
// A new constant independent of the model's initializers (ones, a shape): refit keeps it.
Value* AddLiteralConstant(Graph& graph, const std::string& prefix, Tensor t);
// True when `shape` has at most one symbolic dim: a literal Reshape target can name it.
bool FitsShapeConstant(const Shape& shape);
// A literal Reshape target for `shape`: its static dims, and -1 for its one symbolic dim;
// nullptr (and nothing added) when more than one dim is symbolic.
Value* AddShapeConstant(Graph& graph, const std::string& prefix, const Shape& shape);
// A Reshape target taking a value of shape `from` to `to`: a dim of `to` equal to `from`'s at the
// same index is 0 (ONNX's "copy this dim"), static dims are themselves, and one other symbolic
// dim is -1. nullptr (and nothing added) when more than one symbolic dim is left for -1.
Value* AddReshapeTarget(Graph& graph, const std::string& prefix, const Shape& from,
                        const Shape& to);
// The weight op that gives a constant new dims over the same bytes (attribute "dims"; registered
// in gemm_fusion.cc): for DeriveConstant by the passes that reshape weights.
inline constexpr std::string_view kReshapeBytesOp = "ReshapeBytes";
// The weight op that pads a constant with leading ones to the rank of its attribute "perm" (numpy
// broadcasting), then transposes it by perm (registered in transpose_sinking.cc).
inline constexpr std::string_view kTransposeBroadcastOp = "TransposeBroadcast";
// New constants computed from constants by the weight op `op` (ir/weight_program.h), one per
// entry of `prefixes`, with the step recorded so that refit replays the same code on new
// weights. Empty when the op fails (a pass then leaves the graph as it was).
std::vector<Value*> DeriveConstants(Graph& graph, const std::vector<std::string>& prefixes,
                                    const std::string& op, const AttributeMap& attrs,
                                    const std::vector<Value*>& inputs);
// `t` padded with leading ones to perm's rank (numpy broadcasting), then transposed by perm (a
// permutation; t's rank at most perm's). The constants of transpose_sinking and layout_nhwc.
Tensor TransposePadded(const Tensor& t, std::span<const int64_t> perm);
// The one-output form; nullptr when the op fails.
Value* DeriveConstant(Graph& graph, const std::string& prefix, const std::string& op,
                      const AttributeMap& attrs, const std::vector<Value*>& inputs);

}  // namespace kiln::passes
