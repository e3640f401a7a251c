// FP8 and INT8 edges among the chosen layers (quant_edges.h).
#include "kiln/builder/quant_edges.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "kiln/backends/fp8_quant.h"
#include "kiln/backends/int8_quant.h"

namespace kiln {
namespace {

// What differs between the two kinds of edge.
struct EdgeKind {
  DataType type;
  const char* what;     // in the report notes
  bool float32_values;  // whether an FP32 value may become an edge
  // The consumer's quantization parameter for its producer; nullopt: none usable.
  std::optional<float> (*param)(const Node& consumer);
  bool (*reads)(const ChosenLayer& consumer);
  bool (*writes)(const ChosenLayer& producer);
  void (*mark)(Node& producer, Node& consumer, float param);
};

// The notes an edge appends to its layers' precision reasons (FindEdgeNote finds them).
std::string WritesNote(std::string_view what, std::string_view consumer) {
  return fmt::format("; writes {} for '{}'", what, consumer);
}
std::string ReadsNote(std::string_view what, std::string_view producer) {
  return fmt::format("; reads {} from '{}'", what, producer);
}

using LayersByNode = std::unordered_map<const Node*, ChosenLayer*>;
LayersByNode ByNode(std::span<ChosenLayer> layers) {
  LayersByNode by_node;
  for (ChosenLayer& l : layers) by_node[l.node] = &l;
  return by_node;
}

// The chosen layer whose output 0 is `c`'s A (input 0, and no other input of c): a computed value
// (no graph input, no constant) of FP16/BF16, or FP32 with float32_values; nullptr otherwise.
ChosenLayer* ProducerOfA(const Node& c, const LayersByNode& by_node, bool float32_values) {
  Value* x = c.num_inputs() > 0 ? c.input(0) : nullptr;
  if (!x || x->is_graph_input() || x->is_constant() || x->producer_output() != 0) return nullptr;
  const bool float_type = x->dtype() == DataType::kFloat16 || x->dtype() == DataType::kBFloat16 ||
                          (float32_values && x->dtype() == DataType::kFloat32);
  if (!float_type) return nullptr;
  for (size_t i = 1; i < c.num_inputs(); ++i) {
    if (c.input(i) == x) return nullptr;
  }
  auto it = x->producer() ? by_node.find(x->producer()) : by_node.end();
  return it == by_node.end() ? nullptr : it->second;
}

int JoinEdges(std::span<ChosenLayer> layers, const EdgeKind& kind) {
  const LayersByNode by_node = ByNode(layers);
  int edges = 0;
  // In graph order, so a producer's own input edge is settled (its request says so) before it is
  // asked to write: a layer on two edges, reading and writing the quantized type, is one whose
  // provider accepts that request.
  for (ChosenLayer& consumer : layers) {
    Node& c = *consumer.node;
    ChosenLayer* const found = ProducerOfA(c, by_node, kind.float32_values);
    if (!found) continue;
    Value* x = c.input(0);
    const std::optional<float> param = kind.param(c);
    if (!param || x->is_graph_output() || x->consumers().size() != 1) continue;
    Node* p = x->producer();
    ChosenLayer& producer = *found;
    if (!kind.reads(consumer) || !kind.writes(producer)) continue;
    x->set_dtype(kind.type);
    kind.mark(*p, c, *param);
    consumer.request->inputs[0].dtype = kind.type;
    producer.request->outputs[0].dtype = kind.type;
    consumer.joined = producer.joined = true;
    if (producer.precision_reason) *producer.precision_reason += WritesNote(kind.what, c.name());
    if (consumer.precision_reason) *consumer.precision_reason += ReadsNote(kind.what, p->name());
    ++edges;
  }
  return edges;
}

// The scale an INT8 edge's producer writes with for `consumer`: its activation scale, where the
// calibrated contract (zero point 0) can produce it.
std::optional<float> Int8EdgeScale(const Node& consumer) {
  const std::optional<Int8Activation> a = Int8ActivationOf(consumer);
  if (!a || a->zero_point != 0 || !std::isfinite(a->scale) || a->scale <= 0.f) return std::nullopt;
  return a->scale;
}

}  // namespace

int JoinFp8Edges(std::span<ChosenLayer> layers) {
  static constexpr EdgeKind kFp8{
      kFp8EdgeType,
      "E4M3",
      false,
      [](const Node& c) { return Fp8InputAmax(c); },
      [](const ChosenLayer& c) { return c.provider->ReadsFp8Input(*c.request, *c.tactic); },
      [](const ChosenLayer& p) { return p.provider->WritesFp8Output(*p.request, *p.tactic); },
      [](Node& producer, Node&, float amax) {
        producer.mutable_attrs().Set(std::string(kFp8OutputAmaxAttr), amax);
      }};
  return JoinEdges(layers, kFp8);
}

int JoinInt8Edges(std::span<ChosenLayer> layers) {
  static constexpr EdgeKind kInt8{
      kInt8EdgeType,
      "int8",
      true,
      [](const Node& c) { return Int8EdgeScale(c); },
      [](const ChosenLayer& c) { return c.provider->ReadsInt8Input(*c.request, *c.tactic); },
      [](const ChosenLayer& p) { return p.provider->WritesInt8Output(*p.request, *p.tactic); },
      [](Node& producer, Node& consumer, float scale) {
        producer.mutable_attrs().Set(std::string(kInt8OutputScaleAttr), scale);
        consumer.mutable_attrs().Set(std::string(kInt8InputEdgeAttr), int64_t{1});
      }};
  return JoinEdges(layers, kInt8);
}

namespace {

// What differs between the two kinds of copy.
struct CopyKind {
  DataType type;
  const char* what;           // in the report notes
  const char* attr;           // the producer's quantization parameter
  const char* consumer_mark;  // set on a reader of the copy; nullptr: none
  bool float32_values;        // whether an FP32 value may have a copy
  std::optional<float> (*param)(const Node& consumer);
  bool (*reads)(const ChosenLayer& consumer);
  bool (*writes)(const ChosenLayer& producer);
};

int JoinCopies(Graph& graph, std::span<ChosenLayer> layers, const CopyKind& kind) {
  const LayersByNode by_node = ByNode(layers);
  int copies = 0;
  for (ChosenLayer& consumer : layers) {
    Node& c = *consumer.node;
    // A reader already reading its A quantized (an edge) has an 8-bit A: no float producer.
    ChosenLayer* const found = ProducerOfA(c, by_node, kind.float32_values);
    if (!found) continue;
    Value* x = c.input(0);
    Node* p = x->producer();
    const std::optional<float> param = kind.param(c);
    const std::optional<size_t> index = QuantCopyOutputIndex(p->op_type());
    if (!param || !index) continue;
    ChosenLayer& producer = *found;
    if (!kind.reads(consumer)) continue;
    Value* copy = p->output(*index);
    if (copy) {
      // One copy per value: a second reader shares it only with the same kind and parameter.
      if (copy->dtype() != kind.type || p->attrs().GetFloat(kind.attr, 0.f) != *param) continue;
    } else {
      if (!kind.writes(producer)) continue;
      copy =
          graph.AddValue(graph.UniqueName(fmt::format("{}_{}", x->name(), kind.what)), kind.type);
      copy->set_shape(x->shape());
      if (!graph.SetOutput(p, *index, copy).ok()) continue;
      p->mutable_attrs().Set(std::string(kind.attr), *param);
      std::vector<OperandDesc>& outs = producer.request->outputs;
      if (outs.size() <= *index) outs.resize(*index + 1);
      outs[*index] = outs[0];
      outs[*index].dtype = kind.type;
      producer.joined = true;
    }
    graph.SetInput(&c, 0, copy);
    if (kind.consumer_mark) c.mutable_attrs().Set(std::string(kind.consumer_mark), int64_t{1});
    consumer.request->inputs[0].dtype = kind.type;
    consumer.joined = true;
    if (producer.precision_reason) *producer.precision_reason += WritesNote(kind.what, c.name());
    if (consumer.precision_reason) *consumer.precision_reason += ReadsNote(kind.what, p->name());
    ++copies;
  }
  return copies;
}

}  // namespace

int JoinInt8Copies(Graph& graph, std::span<ChosenLayer> layers) {
  static constexpr CopyKind kInt8{
      kInt8EdgeType,
      "int8",
      kInt8CopyScaleAttr,
      kInt8InputEdgeAttr,
      true,
      [](const Node& c) { return Int8EdgeScale(c); },
      [](const ChosenLayer& c) { return c.provider->ReadsInt8Input(*c.request, *c.tactic); },
      [](const ChosenLayer& p) { return p.provider->WritesInt8Copy(*p.request, *p.tactic); }};
  return JoinCopies(graph, layers, kInt8);
}

int JoinFp8Copies(Graph& graph, std::span<ChosenLayer> layers) {
  static constexpr CopyKind kFp8{
      kFp8EdgeType,
      "E4M3",
      kFp8CopyAmaxAttr,
      nullptr,
      false,
      [](const Node& c) { return Fp8InputAmax(c); },
      [](const ChosenLayer& c) { return c.provider->ReadsFp8Input(*c.request, *c.tactic); },
      [](const ChosenLayer& p) { return p.provider->WritesFp8Copy(*p.request, *p.tactic); }};
  return JoinCopies(graph, layers, kFp8);
}

size_t FindEdgeNote(std::string_view note, std::string_view what) {
  // The notes' beginnings, up to the other layer's name.
  const std::string writes = WritesNote(what, ""), reads = ReadsNote(what, "");
  return std::min(note.find(writes.substr(0, writes.size() - 1)),
                  note.find(reads.substr(0, reads.size() - 1)));
}

int RescaleInt8Edges(Graph& graph) {
  int rescaled = 0;
  for (Node* c : graph.nodes()) {
    if (!c->attrs().Has(kInt8InputEdgeAttr)) continue;
    if (c->num_inputs() == 0 || !c->input(0) || !c->input(0)->producer()) continue;
    const std::optional<float> scale = Int8EdgeScale(*c);
    if (!scale) continue;
    Node* p = c->input(0)->producer();
    const std::optional<size_t> copy = QuantCopyOutputIndex(p->op_type());
    const bool is_copy = copy && static_cast<size_t>(c->input(0)->producer_output()) == *copy;
    p->mutable_attrs().Set(std::string(is_copy ? kInt8CopyScaleAttr : kInt8OutputScaleAttr),
                           *scale);
    ++rescaled;
  }
  return rescaled;
}

}  // namespace kiln
