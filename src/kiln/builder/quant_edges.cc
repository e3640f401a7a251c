// FP8 edges among the chosen layers (quant_edges.h).
#include "kiln/builder/quant_edges.h"

#include <fmt/format.h>

#include <unordered_map>
#include <unordered_set>

#include "kiln/backends/fp8_quant.h"

namespace kiln {

int JoinFp8Edges(std::span<ChosenLayer> layers) {
  std::unordered_map<const Node*, ChosenLayer*> by_node;
  for (ChosenLayer& l : layers) by_node[l.node] = &l;
  std::unordered_set<const Node*> on_edge;
  int edges = 0;
  for (ChosenLayer& consumer : layers) {
    Node& c = *consumer.node;
    if (on_edge.count(&c) || c.num_inputs() == 0 || !c.input(0)) continue;
    Value* x = c.input(0);
    const std::optional<float> amax = Fp8InputAmax(c);
    if (!amax || x->is_graph_output() || x->is_graph_input() || x->is_constant() ||
        x->consumers().size() != 1 ||
        (x->dtype() != DataType::kFloat16 && x->dtype() != DataType::kBFloat16)) {
      continue;
    }
    bool only_input0 = true;
    for (size_t i = 1; i < c.num_inputs(); ++i) only_input0 &= c.input(i) != x;
    Node* p = x->producer();
    auto it = p ? by_node.find(p) : by_node.end();
    if (!only_input0 || it == by_node.end() || x->producer_output() != 0 || on_edge.count(p)) {
      continue;
    }
    ChosenLayer& producer = *it->second;
    if (!consumer.provider->ReadsFp8Input(*consumer.request, *consumer.tactic) ||
        !producer.provider->WritesFp8Output(*producer.request, *producer.tactic)) {
      continue;
    }
    x->set_dtype(kFp8EdgeType);
    p->mutable_attrs().Set(std::string(kFp8OutputAmaxAttr), *amax);
    consumer.request->inputs[0].dtype = kFp8EdgeType;
    producer.request->outputs[0].dtype = kFp8EdgeType;
    consumer.joined = producer.joined = true;
    on_edge.insert(p);
    on_edge.insert(&c);
    if (producer.precision_reason) {
      *producer.precision_reason += fmt::format("; writes E4M3 for '{}'", c.name());
    }
    if (consumer.precision_reason) {
      *consumer.precision_reason += fmt::format("; reads E4M3 from '{}'", p->name());
    }
    ++edges;
  }
  return edges;
}

}  // namespace kiln
