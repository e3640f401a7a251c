// Refit's record of how each engine constant was made from the model's initializers: every
// constant Value carries its provenance (a WeightExpr), the passes and precision that derive
// constants record the step they ran, and the builder flattens the provenance of the engine's
// constants into a WeightProgram. Refit replays the program on new initializers with the same
// code the build ran, so the new constants are the bytes a fresh build would make.
// docs/refit.md describes the design.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/attribute.h"
#include "kiln/ir/evaluator.h"
#include "kiln/ir/tensor.h"

namespace kiln {

class Graph;
class Node;
class Value;

// The domain of the weight ops below (steps that exist only to derive constants); a step of any
// other domain is an ONNX op run by the reference evaluator.
inline constexpr std::string_view kWeightOpDomain = "kiln.weights";

struct WeightExpr;
using WeightExprPtr = std::shared_ptr<const WeightExpr>;

// One recorded step: an op with attributes over earlier expressions (nullptr: omitted input).
struct WeightStep {
  std::string op_type;
  std::string domain;  // "" (ONNX) or kWeightOpDomain
  AttributeMap attrs;
  std::vector<WeightExprPtr> inputs;
  int num_outputs = 1;
};

// Where a constant's bytes come from. A constant without one (nullptr) was made by code that
// records nothing; refit cannot renew it.
struct WeightExpr {
  enum class Kind : uint8_t {
    kInitializer,  // a model initializer, by name (dtype and dims as the model had them)
    kLiteral,      // independent of the initializers (ONNX Constant nodes, shape arithmetic)
    kStep,         // output `output` of `step`
    kOpaque,       // depends on initializers in a way that cannot be replayed (`reason`)
  };
  Kind kind = Kind::kLiteral;
  std::string name;  // kInitializer: the initializer; kOpaque: the reason
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> dims;  // kInitializer
  Tensor value;               // kLiteral: the value, kept for steps that read it (shares bytes)
  std::shared_ptr<const WeightStep> step;
  int output = 0;
};

WeightExprPtr InitializerExpr(const std::string& name, const Tensor& t);
WeightExprPtr LiteralExpr(const Tensor& t);
WeightExprPtr OpaqueExpr(std::string reason);
// The provenance of a constant Value: its recorded one, or, for a constant without one, an opaque
// expression naming it.
WeightExprPtr ProvenanceOf(const Value& v);
// The outputs of a step over `inputs` (provenance of each input value; nullptr for omitted ones):
// literals when every input is a literal (the result is independent of the weights: no step is
// kept), the first opaque input's expression when one is opaque, else step outputs.
std::vector<WeightExprPtr> StepOutputs(std::string op_type, std::string domain, AttributeMap attrs,
                                       std::vector<WeightExprPtr> inputs,
                                       std::span<const Tensor> outputs);
// The same for a node of `graph` whose inputs are all known (folded at build time): the inputs'
// provenance is their constants' (or, for a known non-constant input such as a static shape, a
// literal of `known[i]`).
std::vector<WeightExprPtr> FoldedNodeOutputs(const Node& node, std::span<const Tensor* const> known,
                                             std::span<const Tensor> outputs);

// ---- weight ops: derivations with no ONNX op of the same bytes, registered by the layer that
// uses them (passes, precision) and run the same way at build and at refit.
using WeightOpFn = std::function<StatusOr<std::vector<Tensor>>(
    const AttributeMap& attrs, std::span<const Tensor* const> inputs)>;
// An elementwise form of a weight op of one input whose output has the input's shape and
// out[i] depends on in[i] alone: refit splits a large step of it over threads. `run` must write
// elements [begin, end) of `out` exactly as the whole op writes them.
struct ElementwiseWeightOp {
  std::function<DataType(const AttributeMap& attrs, const Tensor& in)> out_dtype;
  std::function<void(const AttributeMap& attrs, const Tensor& in, Tensor& out, int64_t begin,
                     int64_t end)>
      run;
};
bool RegisterWeightOp(std::string name, WeightOpFn fn,
                      std::optional<ElementwiseWeightOp> elementwise = std::nullopt);
const WeightOpFn* FindWeightOp(std::string_view name);
const ElementwiseWeightOp* FindElementwiseWeightOp(std::string_view name);

// Runs one step: a weight op by its registered function, an ONNX op with `evaluate` (KILN-E1000
// when the evaluator is missing or the weight op unknown).
StatusOr<std::vector<Tensor>> RunWeightStep(const std::string& op_type, const std::string& domain,
                                            const AttributeMap& attrs,
                                            std::span<const Tensor* const> inputs, int num_outputs,
                                            const NodeEvaluator& evaluate);

// A weight op applied to constant values: runs it and returns the outputs with their provenance
// recorded. The build's passes call this, refit replays the step: one code path.
struct DerivedTensor {
  Tensor value;
  WeightExprPtr expr;
};
StatusOr<std::vector<DerivedTensor>> DeriveWithWeightOp(const std::string& op,
                                                        const AttributeMap& attrs,
                                                        std::span<Value* const> inputs,
                                                        int num_outputs = 1);

// The flattened record an engine stores. Slots: one per source, then each step's outputs in order.
struct WeightProgram {
  struct Source {
    std::string name;
    DataType dtype = DataType::kUndefined;
    std::vector<int64_t> dims;
  };
  struct Step {
    std::string op_type;
    std::string domain;
    AttributeMap attrs;
    std::vector<int32_t> inputs;  // slots; -1 omitted
    int32_t num_outputs = 1;
  };
  // Literal inputs of steps, by slot (after the sources' and steps' slots).
  struct Target {
    std::string constant;  // the engine constant's value name
    int32_t slot = -1;
  };
  // An initializer no engine constant is made from: the build read its value (a fusion matched
  // it, or a layout decision depended on it), so refit requires it unchanged.
  struct Fixed {
    std::string name;
    DataType dtype = DataType::kUndefined;
    std::vector<int64_t> dims;
    std::string hash;  // Hash128::Hex of its bytes
  };
  struct NonRefittable {
    std::string constant;
    std::string reason;
  };
  bool recorded = false;  // false: an engine built without a program (refit refuses it)
  std::vector<Source> sources;
  std::vector<Tensor> literals;  // slots sources + step outputs + i
  std::vector<Step> steps;
  std::vector<Target> targets;
  std::vector<Fixed> fixed;
  std::vector<NonRefittable> non_refittable;

  int32_t num_slots() const;
};

// The model's initializers as imported (before any pass), for the program's checks.
struct InitializerInfo {
  std::string name;
  Tensor value;  // shares the import's bytes
};
std::vector<InitializerInfo> CollectInitializers(const Graph& graph);

// Flattens the provenance of every constant of `graph` (the engine's final graph). Literal
// constants need nothing; constants made by code that records nothing (or from an opaque
// derivation) are listed as non-refittable with the reason; initializers no target reads become
// fixed (hashed).
WeightProgram RecordWeightProgram(const Graph& graph,
                                  std::span<const InitializerInfo> initializers);

// Where a replay's time went: thread-seconds per step op (a level's steps run in parallel, so the
// sum exceeds the wall time), the wall time of the checks and of the steps, and the longest step.
struct WeightProgramStats {
  std::map<std::string, double> op_seconds;
  std::map<std::string, int64_t> op_steps;
  double check_seconds = 0;
  double steps_seconds = 0;
  int64_t split_steps = 0;  // large elementwise steps run over several threads
  std::string longest_op;
  double longest_seconds = 0;
};

// Refit's replay: checks `initializers` against the program's sources and fixed initializers
// (KILN-E4008 naming the first mismatch: missing, another dtype or shape, extra, a fixed one
// changed), runs the steps and returns each target constant's new value by name.
StatusOr<std::map<std::string, Tensor>> RunWeightProgram(
    const WeightProgram& program, const std::map<std::string, Tensor>& initializers,
    const NodeEvaluator& evaluate, WeightProgramStats* stats = nullptr);

}  // namespace kiln
