// FP8 and INT8 edges (ops/quant_edge.h) among the layers whose tactics the builder chose: where an
// FP8 matrix product's only consumer is another FP8 matrix product, the producer writes its result
// as E4M3 with the consumer's scale and the consumer reads it as its quantized A. The value between
// them takes half FP16's bytes, and the consumer's own quantization pass over it (one kernel that
// reads FP16 and writes E4M3 per product) is gone. The graph is rewritten in place: the value's
// type, the producer's kFp8OutputAmaxAttr. Kernels are made from the rewritten graph, so an
// engine file records the edges and loads with them.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "kiln/backends/kernel.h"
#include "kiln/ir/graph.h"

namespace kiln {

// One chosen layer as the joining sees it.
struct ChosenLayer {
  Node* node = nullptr;
  const KernelProvider* provider = nullptr;
  KernelRequest* request = nullptr;  // what the tactic was chosen for; an edge's E4M3 side is set
  const TacticConfig* tactic = nullptr;
  std::string* precision_reason = nullptr;  // gains a note on each side of an edge
  bool joined = false;                      // set: the layer is on an edge (its kernel changed)
};

// Joins every producer -> value -> consumer where:
// - the consumer's provider reads its input 0 as E4M3 for its tactic (ReadsFp8Input), with a
//   usable kFp8InputAmaxAttr, and the value is its input 0 only;
// - the value has that one consumer, is no graph output and has an FP16/BF16 type;
// - the producer is a chosen layer whose provider writes it as E4M3 for its tactic
//   (WritesFp8Output), and it is output 0 of its producer;
// - a layer already on an edge is on a second one, in its other role, only where its provider
//   accepts the request with the first edge's type in it (the FP8 matrix products decline: they
//   read or write E4M3, not both; the CUDA INT8 products and convolution take int8 in and out).
// Returns how many edges it made.
int JoinFp8Edges(std::span<ChosenLayer> layers);

// INT8 edges, by the same rules with ReadsInt8Input / WritesInt8Output, the consumer's INT8
// activation scale (calibrated, or its model's with zero point 0) and FP32 values too: the
// producer gets kInt8OutputScaleAttr, the consumer kInt8InputEdgeAttr, the value type int8.
int JoinInt8Edges(std::span<ChosenLayer> layers);

// INT8 copies (ops/quant_edge.h), after JoinInt8Edges: where an INT8 consumer that reads its A
// as int8 (ReadsInt8Input) reads output 0 of a chosen layer that can also write it as an int8
// copy (WritesInt8Copy, an op with an QuantCopyOutputIndex), and that value has other readers (or
// is a graph output, or the producer cannot write it as int8 alone), the producer gains the copy
// as a new int8 value, quantized with the consumer's scale (kInt8CopyScaleAttr), and the consumer
// reads that instead (kInt8InputEdgeAttr). Consumers of one value with the same scale share one
// copy; one with another scale keeps quantizing its own. The requests and report notes change as
// on an edge. Returns how many consumers now read a copy.
int JoinInt8Copies(Graph& graph, std::span<ChosenLayer> layers);
// FP8 copies, after JoinFp8Edges, by the same rules: E4M3 with the readers' FP8 input amax
// (kFp8CopyAmaxAttr; ReadsFp8Input, WritesFp8Copy), the readers unmarked (their amax attribute
// makes the type rule take an E4M3 A), FP16/BF16 values only (as FP8 edges).
int JoinFp8Copies(Graph& graph, std::span<ChosenLayer> layers);

// Where the first edge note of kind `what` ("int8", "fp8") begins in a layer's precision reason
// (JoinInt8Edges/JoinFp8Edges append "; writes int8 for 'c'", "; reads int8 from 'p'" after
// everything else the reason says), or npos.
size_t FindEdgeNote(std::string_view note, std::string_view what);

// After the consumers' INT8 scales changed (refit's recalibration): every INT8 edge's producer
// writes with its consumer's scale again (kInt8OutputScaleAttr), else the consumer would read
// int8 quantized with the old scale as if it had the new one; an INT8 copy's producer likewise
// (kInt8CopyScaleAttr). Returns how many edges and copies it rescaled.
int RescaleInt8Edges(Graph& graph);

}  // namespace kiln
