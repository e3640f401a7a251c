// FP8 and INT8 edges between matrix products: the attributes that let a Gemm/MatMul-family node
// write its output, or read its input 0, as FP8 E4M3 or as int8 instead of its float storage type,
// and the type rule they imply. The precision pass sets kFp8InputAmaxAttr on FP8 candidates
// (backends/fp8_quant.h has the FP8 contract); the builder joins a producer and its only consumer
// when both layers' FP8 kernels can (builder/quant_edges.h): the producer then quantizes its result
// with the consumer's scale (kFp8OutputAmaxAttr, the consumer's calibrated input amax) and the
// value between them has type f8e4m3fn, half the bytes of FP16, with no separate quantization pass
// over it.
#pragma once

#include <optional>
#include <string_view>

#include "kiln/ir/dtype.h"
#include "kiln/ir/graph.h"

namespace kiln {

inline constexpr const char* kFp8InputAmaxAttr = "kiln_fp8_input_amax";
inline constexpr const char* kFp8OutputAmaxAttr = "kiln_fp8_output_amax";
inline constexpr DataType kFp8EdgeType = DataType::kFloat8E4M3FN;

// INT8 edges, the same between INT8 layers: the producer quantizes its result with the consumer's
// activation scale (kInt8OutputScaleAttr: scale, not amax, so a QDQ model's own scale serves too)
// by the INT8 contract (backends/int8_quant.h), and the consumer, marked kInt8InputEdgeAttr, reads
// the int8 value as its quantized A. ONNX's Gemm and MatMul take no int8 A, so the mark only
// makes the rule below explicit.
inline constexpr const char* kInt8OutputScaleAttr = "kiln_int8_output_scale";
inline constexpr const char* kInt8InputEdgeAttr = "kiln_int8_input_edge";
inline constexpr DataType kInt8EdgeType = DataType::kInt8;

// INT8 and FP8 copies: a producer whose float output is also read by other layers (a
// transformer's LayerNorm feeds the next products and the residual) writes it once more,
// quantized for one kind of reader, to an extra output that those readers read as their A: int8
// with their INT8 activation scale (kInt8CopyScaleAttr; the readers are marked kInt8InputEdgeAttr,
// as on an edge) or E4M3 with their FP8 input amax (kFp8CopyAmaxAttr). SkipLayerNormalization's
// copy is its output 2 (QuantCopyOutputIndex).
inline constexpr const char* kInt8CopyScaleAttr = "kiln_int8_copy_scale";
inline constexpr const char* kFp8CopyAmaxAttr = "kiln_fp8_copy_amax";
// The output a copy takes on a node of this op; nullopt: the op has none.
inline std::optional<size_t> QuantCopyOutputIndex(std::string_view op_type) {
  if (op_type == "SkipLayerNormalization") return 2;
  return std::nullopt;
}
// The copy's type on `node`: int8, E4M3, or kUndefined where the node has no copy attribute.
inline DataType QuantCopyType(const Node& node) {
  if (node.attrs().Has(kInt8CopyScaleAttr)) return kInt8EdgeType;
  if (node.attrs().Has(kFp8CopyAmaxAttr)) return kFp8EdgeType;
  return DataType::kUndefined;
}

// The float type a matrix product computes in, given its A (input 0) and B (input 1) types:
// A's, or B's when A arrives as E4M3 from an FP8 producer (the node carries kFp8InputAmaxAttr) or
// as int8 from an INT8 producer.
inline DataType ProductFloatType(const Node& node, DataType a, DataType b) {
  if (a == kFp8EdgeType && node.attrs().Has(kFp8InputAmaxAttr)) return b;
  if (a == kInt8EdgeType && node.attrs().Has(kInt8InputEdgeAttr)) return b;
  return a;
}

// Y's type: E4M3 or int8 when the node writes its result for an FP8 or INT8 consumer, else
// `product`.
inline DataType ProductOutputType(const Node& node, DataType product) {
  if (node.attrs().Has(kFp8OutputAmaxAttr)) return kFp8EdgeType;
  if (node.attrs().Has(kInt8OutputScaleAttr)) return kInt8EdgeType;
  return product;
}

}  // namespace kiln
