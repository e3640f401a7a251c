// Strided views: which values are another value's memory read with other strides.
//
// Exporters reach a kernel's operand through chains of data-movement ops that move nothing a
// strided read could not do itself: nn.MultiheadAttention's packed in-projection becomes
// Reshape -> Unsqueeze -> Transpose -> Squeeze -> Gather -> Reshape -> Transpose -> Reshape
// before Q reaches the attention. This analysis composes such a chain into one affine map from
// the operand's index to an element of the chain's source, over symbolic dims (so it holds for
// every batch size of a dynamic profile), and a pass then decides whether a kernel can read the
// source with those strides instead of running the chain.
//
// The ops it reads through: Reshape, Flatten, Squeeze, Unsqueeze (all "the same elements in
// another shape"), Transpose, Identity, Gather of one constant index, Slice with constant starts,
// ends and steps, and Split.
#pragma once

#include <optional>
#include <vector>

#include "kiln/ir/dim.h"
#include "kiln/ir/graph.h"

namespace kiln::passes {

class PassContext;

// One run of evenly strided elements: `size` indices `stride` elements apart.
struct ViewMode {
  Dim size;
  Dim stride;
};

// Element [i_0, ..., i_{n-1}] of the viewed value is an element of `source`'s row-major storage:
// offset plus, for each dim k, i_k split row-major over modes[k] (outermost first) times their
// strides. A dim of one mode is an ordinary strided dim; a dim of several is what a Reshape that
// merges dims of different strides makes (torch's [S, B*H, D] view of packed Q), which a later
// Reshape may split again. Size-1 modes are dropped, so a static size-1 dim has none.
struct StridedView {
  Value* source = nullptr;
  Shape shape;
  std::vector<std::vector<ViewMode>> modes;
  Dim offset = 0;

  // Dim k's stride when it is one run (0 for a size-1 dim); nullopt when it has several modes.
  std::optional<Dim> stride(size_t k) const;
};

// `v` over itself, row-major; nullopt without a shape.
std::optional<StridedView> ContiguousView(Value* v);
// A row-major tensor of `shape` read as itself (source unset).
StridedView ContiguousView(const Shape& shape);

// The same elements in `shape` (Reshape, Squeeze, Unsqueeze, Flatten); nullopt when the merged
// dims are not evenly strided (the reshape would need a copy) or the element counts differ.
std::optional<StridedView> ReshapeView(const StridedView& in, const Shape& shape);
// Dim k of the result is dim perm[k] of `in`.
StridedView TransposeView(const StridedView& in, const std::vector<int64_t>& perm);

// `n`'s output `output_index` as a view of the view `in` of its data input; nullopt when `n` is
// not one of the ops above or its parameters are not static.
std::optional<StridedView> ApplyView(const Node& n, size_t output_index, const StridedView& in,
                                     const PassContext& ctx);

// The chain of view ops that produces `v`: values[0] is v, nodes[k] (output index
// output_index[k]) makes values[k] from values[k + 1]; values.back() is the farthest source.
struct ViewChain {
  std::vector<Value*> values;
  std::vector<const Node*> nodes;
  std::vector<size_t> output_index;
};
ViewChain ViewChainOf(Value* v, int max_depth = 16);
// `start` (a view of chain.values[from]) carried down the chain to values[0]; nullopt where a
// step is not a strided view.
std::optional<StridedView> ApplyChain(const ViewChain& chain, size_t from, StridedView start,
                                      const PassContext& ctx);

// `v` as a view of each value on its view chain, farthest source first and `v` over itself
// last; only the sources the whole rest of the chain reads through.
std::vector<StridedView> ViewsOf(Value* v, const PassContext& ctx, int max_depth = 16);

// A Transpose's permutation for an input of `rank` (the default reverses), checked to be one;
// nullopt otherwise.
std::optional<std::vector<int64_t>> TransposePerm(const Node& n, size_t rank);

// The data input of a view op (input 0), or nullptr when `n` is not one.
Value* ViewInput(const Node& n);

// True when `view` reads a row-major tensor of `shape` exactly (offset 0, the contiguous strides
// wherever a dim is not 1): the view is the source's memory as that shape.
bool IsRowMajor(const StridedView& view, const Shape& shape);

// True when dim k of `view` is one run with stride `want`, or has size 1 (no stride matters).
bool HasStride(const StridedView& view, size_t k, const Dim& want);

}  // namespace kiln::passes
