#include "kiln/ir/graph.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(Graph, BuildOrderAndVerify) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4});
  Value* w = g.AddConstant("w", Tensor(DataType::kFloat32, {4}));
  Value* y = g.AddValue("y");
  Value* z = g.AddValue("z");
  g.AddNode("Relu", "second", {y}, {z});  // added first, runs second
  g.AddNode("Add", "first", {x, w}, {y});
  g.MarkOutput(z);
  ASSERT_TRUE(Verify(g).ok());
  auto order = g.TopologicalOrder();
  ASSERT_TRUE(order.ok());
  ASSERT_EQ(order->size(), 2u);
  EXPECT_EQ((*order)[0]->name(), "first");
  EXPECT_EQ((*order)[1]->name(), "second");
  EXPECT_EQ(y->consumers().size(), 1u);
  EXPECT_EQ(w->shape()[0], Dim(4));
}

TEST(Graph, DetectsCycle) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2});
  Value* a = g.AddValue("a");
  Value* b = g.AddValue("b");
  g.AddNode("Add", "n1", {x, b}, {a});
  g.AddNode("Relu", "n2", {a}, {b});
  g.MarkOutput(b);
  Status s = Verify(g);
  EXPECT_EQ(s.code(), ErrorCode::kGraphCycle);
  EXPECT_NE(s.message().find("'n1'"), std::string::npos);
}

TEST(Graph, DetectsUndefinedValue) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2});
  Value* ghost = g.AddValue("ghost");
  Value* y = g.AddValue("y");
  g.AddNode("Add", "adder", {x, ghost}, {y});
  g.MarkOutput(y);
  Status s = Verify(g);
  EXPECT_EQ(s.code(), ErrorCode::kUndefinedValue);
  EXPECT_NE(s.message().find("'ghost' (read by node 'adder')"), std::string::npos);
}

TEST(Graph, ReplaceAllUsesKeepsOutputName) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2});
  Value* mid = g.AddValue("mid");
  Value* out = g.AddValue("out");
  g.AddNode("Relu", "r1", {x}, {mid});
  Node* id = g.AddNode("Identity", "id", {mid}, {out});
  g.MarkOutput(out);
  g.RemoveNode(id);
  g.ReplaceAllUses(out, mid);
  g.Compact();
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.outputs()[0]->name(), "out");
  EXPECT_EQ(g.outputs()[0]->producer()->name(), "r1");
  EXPECT_EQ(g.num_nodes(), 1u);
  EXPECT_TRUE(Verify(g).ok());
}

TEST(Graph, TopologicalOrderFollowsEveryEdit) {
  // The order is cached between edits; each kind of edit must be seen by the next call.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2});
  Value* a = g.AddValue("a");
  Value* b = g.AddValue("b");
  Node* n1 = g.AddNode("Relu", "n1", {x}, {a});
  Node* n2 = g.AddNode("Relu", "n2", {x}, {b});
  g.MarkOutput(a);
  g.MarkOutput(b);
  auto names = [&] {
    auto order = g.TopologicalOrder();
    EXPECT_TRUE(order.ok()) << order.status().ToString();
    std::vector<std::string> out;
    if (order.ok()) {
      for (Node* n : *order) out.push_back(n->name());
    }
    return out;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(names(), (std::vector<std::string>{"n1", "n2"}));  // cached, same answer
  g.SetInput(n1, 0, b);                                        // n1 now reads n2's output
  EXPECT_EQ(names(), (std::vector<std::string>{"n2", "n1"}));
  Value* c = g.AddValue("c");
  g.AddNode("Relu", "n0", {x}, {c});
  g.SetInput(n2, 0, c);  // n0 -> n2 -> n1
  EXPECT_EQ(names(), (std::vector<std::string>{"n0", "n2", "n1"}));
  Value* d = g.AddValue("d");
  g.AddNode("Relu", "n3", {x}, {d});
  g.MarkOutput(d);
  EXPECT_EQ(names(), (std::vector<std::string>{"n0", "n2", "n1", "n3"}));
  g.ReplaceAllUses(c, x);  // n2 reads x again: ready first, it goes first (lower id)
  EXPECT_EQ(names(), (std::vector<std::string>{"n2", "n1", "n0", "n3"}));
  g.RemoveNode(n1);
  EXPECT_EQ(names(), (std::vector<std::string>{"n2", "n0", "n3"}));
  g.Compact();
  EXPECT_EQ(names(), (std::vector<std::string>{"n2", "n0", "n3"}));
  g.SetInput(n2, 0, b);  // a cycle: n2 reads its own output; not cached as an order
  EXPECT_EQ(g.TopologicalOrder().status().code(), ErrorCode::kGraphCycle);
  EXPECT_EQ(g.TopologicalOrder().status().code(), ErrorCode::kGraphCycle);
  g.SetInput(n2, 0, x);
  EXPECT_EQ(names(), (std::vector<std::string>{"n2", "n0", "n3"}));
}

}  // namespace
}  // namespace kiln
