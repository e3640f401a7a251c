// FP8 and INT8 edges among chosen layers (builder/quant_edges.h): which producer/consumer pairs are
// joined, what the rewrite sets (the value's type, the producer's output amax, the requests, the
// report notes), and that the rewritten graph still passes shape and type inference. The providers
// are fakes that say yes or no; the CUDA kernels behind a real edge are tested in
// cuda_quant_test.cc.
#include "kiln/builder/quant_edges.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/quant_edge.h"

namespace kiln {
namespace {

// Says yes or no to each role; one_side: as the matrix products, no to writing once its input is
// an edge and no to reading once its output is (a layer on one edge only).
class FakeProvider final : public KernelProvider {
 public:
  FakeProvider(bool writes, bool reads, bool one_side = false)
      : writes_(writes), reads_(reads), one_side_(one_side) {}
  std::string_view id() const override { return "test.fp8.fake"; }
  std::string_view op_type() const override { return "MatMul"; }
  BackendKind backend() const override { return BackendKind::kCuda; }
  std::vector<TacticConfig> Tactics(const KernelRequest&) const override { return {}; }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest&,
                                           const TacticConfig&) const override {
    return MakeError(ErrorCode::kUnimplemented, "fake");
  }
  bool WritesFp8Output(const KernelRequest& r, const TacticConfig&) const override {
    return writes_ && !(one_side_ && r.inputs[0].dtype == kFp8EdgeType);
  }
  bool ReadsFp8Input(const KernelRequest& r, const TacticConfig&) const override {
    return reads_ && !(one_side_ && r.outputs[0].dtype == kFp8EdgeType);
  }
  bool WritesInt8Output(const KernelRequest& r, const TacticConfig&) const override {
    return writes_ && !(one_side_ && r.inputs[0].dtype == kInt8EdgeType);
  }
  bool ReadsInt8Input(const KernelRequest& r, const TacticConfig&) const override {
    return reads_ && !(one_side_ && r.outputs[0].dtype == kInt8EdgeType);
  }
  bool WritesInt8Copy(const KernelRequest&, const TacticConfig&) const override { return writes_; }
  bool WritesFp8Copy(const KernelRequest&, const TacticConfig&) const override { return writes_; }

 private:
  bool writes_, reads_, one_side_;
};

const FakeProvider kBoth(true, true);
const FakeProvider kOneSide(true, true, /*one_side=*/true);

TacticConfig Named(const char* name) {
  TacticConfig t;
  t.name = name;
  return t;
}
const FakeProvider kNeither(false, false);

// A chain of MatMul layers x -> m0 -> v0 -> m1 -> v1 ... -> out in `type`, each with an FP8
// (or, with int8 set, INT8) input amax of 1 + its index, and the layers as the builder would hand
// them over.
struct Chain {
  Graph g;
  std::vector<Node*> nodes;
  std::deque<KernelRequest> requests;
  TacticConfig tactic = Named("f8-matmul-fake");
  std::vector<std::string> reasons;
  std::vector<ChosenLayer> layers;

  Chain(int n, DataType type, const std::vector<const KernelProvider*>& providers,
        bool int8 = false) {
    Value* x = g.AddInput("x", type, {4, 32});
    reasons.resize(n);
    for (int i = 0; i < n; ++i) {
      Value* w = g.AddConstant(fmt::format("w{}", i), Tensor(type, {32, 32}));
      Value* y = g.AddValue(fmt::format("v{}", i));
      AttributeMap attrs;
      attrs.Set(std::string(int8 ? kInt8InputAmaxAttr : kFp8InputAmaxAttr),
                1.f + static_cast<float>(i));
      nodes.push_back(g.AddNode("MatMul", fmt::format("m{}", i), {x, w}, {y}, std::move(attrs)));
      x = y;
    }
    g.MarkOutput(x);
    EXPECT_TRUE(InferShapes(g).ok());
    for (int i = 0; i < n; ++i) {
      KernelRequest& r = requests.emplace_back();
      r.node = nodes[i];
      for (Value* v : nodes[i]->inputs()) r.inputs.push_back({v->dtype(), v->shape(), {4, 32}});
      r.outputs.push_back({type, nodes[i]->output(0)->shape(), {4, 32}});
      layers.push_back({nodes[i], providers[i], &r, &tactic, &reasons[i]});
    }
  }
};

TEST(Fp8Edges, JoinsAProducerAndItsOnlyConsumerOnce) {
  // m0 -> m1 -> m2: m1 joins m0, so its provider (one side only, as the products) declines to
  // also write for m2.
  Chain c(3, DataType::kFloat16, {&kOneSide, &kOneSide, &kOneSide});
  EXPECT_EQ(JoinFp8Edges(c.layers), 1);
  EXPECT_EQ(c.nodes[0]->output(0)->dtype(), kFp8EdgeType);
  EXPECT_EQ(c.nodes[1]->output(0)->dtype(), DataType::kFloat16);
  // The producer quantizes with the consumer's scale.
  EXPECT_EQ(c.nodes[0]->attrs().GetFloat(kFp8OutputAmaxAttr, 0.f), 2.f);
  EXPECT_FALSE(c.nodes[1]->attrs().Has(kFp8OutputAmaxAttr));
  EXPECT_TRUE(c.layers[0].joined);
  EXPECT_TRUE(c.layers[1].joined);
  EXPECT_FALSE(c.layers[2].joined);
  EXPECT_EQ(c.requests[0].outputs[0].dtype, kFp8EdgeType);
  EXPECT_EQ(c.requests[1].inputs[0].dtype, kFp8EdgeType);
  EXPECT_EQ(c.requests[1].outputs[0].dtype, DataType::kFloat16);
  EXPECT_NE(c.reasons[0].find("writes E4M3 for 'm1'"), std::string::npos) << c.reasons[0];
  EXPECT_NE(c.reasons[1].find("reads E4M3 from 'm0'"), std::string::npos) << c.reasons[1];
  EXPECT_TRUE(c.reasons[2].empty());
  // The type rules accept the rewrite and give the same types again.
  ASSERT_TRUE(InferShapes(c.g).ok());
  EXPECT_EQ(c.nodes[0]->output(0)->dtype(), kFp8EdgeType);
  EXPECT_EQ(c.nodes[1]->output(0)->dtype(), DataType::kFloat16);
  EXPECT_EQ(c.nodes[2]->output(0)->dtype(), DataType::kFloat16);
}

// A layer whose provider takes both roles (the CUDA INT8 convolution) is on two edges: m1 reads
// int8 from m0 and writes int8 for m2, and the graph's types follow. The providers are asked in
// graph order, m1 as a writer with its input edge already in its request.
TEST(Int8Edges, ALayerWhoseProviderTakesBothRolesIsOnTwoEdges) {
  Chain c(3, DataType::kFloat16, {&kBoth, &kBoth, &kBoth}, /*int8=*/true);
  EXPECT_EQ(JoinInt8Edges(c.layers), 2);
  EXPECT_EQ(c.nodes[0]->output(0)->dtype(), kInt8EdgeType);
  EXPECT_EQ(c.nodes[1]->output(0)->dtype(), kInt8EdgeType);
  EXPECT_EQ(c.requests[1].inputs[0].dtype, kInt8EdgeType);
  EXPECT_EQ(c.requests[1].outputs[0].dtype, kInt8EdgeType);
  EXPECT_FLOAT_EQ(c.nodes[1]->attrs().GetFloat(kInt8OutputScaleAttr, 0.f), 3.f / 127.f);
  EXPECT_NE(c.reasons[1].find("reads int8 from 'm0'"), std::string::npos) << c.reasons[1];
  EXPECT_NE(c.reasons[1].find("writes int8 for 'm2'"), std::string::npos) << c.reasons[1];
  auto again = InferShapes(c.g);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(c.nodes[1]->output(0)->dtype(), kInt8EdgeType);  // computes in B's f16, writes int8
  EXPECT_EQ(c.nodes[2]->output(0)->dtype(), DataType::kFloat16);

  // A one-sided provider in the middle breaks the chain after its first edge.
  Chain mixed(3, DataType::kFloat16, {&kBoth, &kOneSide, &kBoth}, true);
  EXPECT_EQ(JoinInt8Edges(mixed.layers), 1);
  EXPECT_EQ(mixed.nodes[1]->output(0)->dtype(), DataType::kFloat16);
}

TEST(Fp8Edges, NeedsBothProvidersToSayYes) {
  Chain producer_no(2, DataType::kFloat16, {&kNeither, &kBoth});
  EXPECT_EQ(JoinFp8Edges(producer_no.layers), 0);
  Chain consumer_no(2, DataType::kBFloat16, {&kBoth, &kNeither});
  EXPECT_EQ(JoinFp8Edges(consumer_no.layers), 0);
  for (Chain* c : {&producer_no, &consumer_no}) {
    EXPECT_NE(c->nodes[0]->output(0)->dtype(), kFp8EdgeType);
    EXPECT_FALSE(c->nodes[0]->attrs().Has(kFp8OutputAmaxAttr));
    EXPECT_FALSE(c->layers[0].joined || c->layers[1].joined);
  }
  Chain bf16(2, DataType::kBFloat16, {&kBoth, &kBoth});
  EXPECT_EQ(JoinFp8Edges(bf16.layers), 1);
}

TEST(Fp8Edges, LeavesValuesOthersReadOrThatAreNotHalfPrecision) {
  // FP32 values stay FP32 (cuBLASLt's E4M3 output takes an FP16/BF16 C).
  Chain f32(2, DataType::kFloat32, {&kBoth, &kBoth});
  EXPECT_EQ(JoinFp8Edges(f32.layers), 0);

  // A second reader of v0 (a residual Add) needs the FP16 value.
  Chain shared(2, DataType::kFloat16, {&kBoth, &kBoth});
  Value* sum = shared.g.AddValue("sum");
  shared.g.AddNode("Add", "residual", {shared.nodes[0]->output(0), shared.nodes[1]->output(0)},
                   {sum});
  shared.g.MarkOutput(sum);
  EXPECT_EQ(JoinFp8Edges(shared.layers), 0);
  EXPECT_EQ(shared.nodes[0]->output(0)->dtype(), DataType::kFloat16);

  // A graph output keeps its type.
  Chain out(2, DataType::kFloat16, {&kBoth, &kBoth});
  out.g.MarkOutput(out.nodes[0]->output(0));
  EXPECT_EQ(JoinFp8Edges(out.layers), 0);

  // A consumer without a usable FP8 input amax has nothing to quantize with.
  Chain no_amax(2, DataType::kFloat16, {&kBoth, &kBoth});
  no_amax.nodes[1]->mutable_attrs().Set(std::string(kFp8InputAmaxAttr), 0.f);
  EXPECT_EQ(JoinFp8Edges(no_amax.layers), 0);

  // A producer that is not a chosen layer (a graph input feeds m0).
  Chain one(1, DataType::kFloat16, {&kBoth});
  EXPECT_EQ(JoinFp8Edges(one.layers), 0);
}

TEST(Int8Edges, JoinLikeFp8EdgesWithTheConsumersScale) {
  // m0 -> m1 -> m2 in FP32 (INT8 edges take FP32 values too): m0 writes int8 for m1.
  Chain c(3, DataType::kFloat32, {&kOneSide, &kOneSide, &kOneSide}, /*int8=*/true);
  EXPECT_EQ(JoinInt8Edges(c.layers), 1);
  EXPECT_EQ(c.nodes[0]->output(0)->dtype(), kInt8EdgeType);
  EXPECT_EQ(c.nodes[1]->output(0)->dtype(), DataType::kFloat32);
  // The producer quantizes with the consumer's scale, amax 2 / 127; the consumer is marked.
  EXPECT_FLOAT_EQ(c.nodes[0]->attrs().GetFloat(kInt8OutputScaleAttr, 0.f), 2.f / 127.f);
  EXPECT_TRUE(c.nodes[1]->attrs().Has(kInt8InputEdgeAttr));
  EXPECT_FALSE(c.nodes[0]->attrs().Has(kInt8InputEdgeAttr));
  EXPECT_FALSE(c.nodes[1]->attrs().Has(kInt8OutputScaleAttr));
  EXPECT_EQ(c.requests[0].outputs[0].dtype, kInt8EdgeType);
  EXPECT_EQ(c.requests[1].inputs[0].dtype, kInt8EdgeType);
  EXPECT_NE(c.reasons[0].find("writes int8 for 'm1'"), std::string::npos) << c.reasons[0];
  EXPECT_NE(c.reasons[1].find("reads int8 from 'm0'"), std::string::npos) << c.reasons[1];
  // The type rules accept the rewrite: m1 computes in B's type.
  ASSERT_TRUE(InferShapes(c.g).ok());
  EXPECT_EQ(c.nodes[0]->output(0)->dtype(), kInt8EdgeType);
  EXPECT_EQ(c.nodes[1]->output(0)->dtype(), DataType::kFloat32);
  EXPECT_EQ(c.nodes[2]->output(0)->dtype(), DataType::kFloat32);

  // Both providers must say yes; FP8 attributes make no INT8 edge, nor INT8 ones an FP8 edge.
  Chain no(2, DataType::kFloat16, {&kBoth, &kNeither}, true);
  EXPECT_EQ(JoinInt8Edges(no.layers), 0);
  EXPECT_EQ(JoinFp8Edges(no.layers), 0);
  Chain fp8(2, DataType::kFloat16, {&kBoth, &kBoth});
  EXPECT_EQ(JoinInt8Edges(fp8.layers), 0);
  Chain int8(2, DataType::kFloat16, {&kBoth, &kBoth}, true);
  EXPECT_EQ(JoinFp8Edges(int8.layers), 0);
  EXPECT_EQ(JoinInt8Edges(int8.layers), 1);

  // A consumer whose INT8 scale is unusable (amax 0) has nothing for the producer.
  Chain zero(2, DataType::kFloat16, {&kBoth, &kBoth}, true);
  zero.nodes[1]->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 0.f);
  EXPECT_EQ(JoinInt8Edges(zero.layers), 0);
  EXPECT_EQ(zero.nodes[0]->output(0)->dtype(), DataType::kFloat16);
}

// Refit's recalibration gives the consumers new scales: each edge's producer then writes with its
// consumer's new scale, and layers that are on no edge keep what they had.
TEST(Int8Edges, RescalingFollowsTheConsumersNewScale) {
  Chain c(4, DataType::kFloat32, {&kOneSide, &kOneSide, &kOneSide, &kOneSide}, /*int8=*/true);
  ASSERT_EQ(JoinInt8Edges(c.layers), 2);  // m0 -> m1, m2 -> m3
  ASSERT_TRUE(c.nodes[2]->attrs().Has(kInt8OutputScaleAttr));
  c.nodes[1]->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 5.f);
  c.nodes[3]->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 0.5f);
  c.nodes[2]->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 7.f);  // reads no edge
  EXPECT_EQ(RescaleInt8Edges(c.g), 2);
  EXPECT_FLOAT_EQ(c.nodes[0]->attrs().GetFloat(kInt8OutputScaleAttr, 0.f), 5.f / 127.f);
  EXPECT_FLOAT_EQ(c.nodes[2]->attrs().GetFloat(kInt8OutputScaleAttr, 0.f), 0.5f / 127.f);
  EXPECT_FALSE(c.nodes[1]->attrs().Has(kInt8OutputScaleAttr));
  EXPECT_FALSE(c.nodes[3]->attrs().Has(kInt8OutputScaleAttr));
  // A graph without edges has none to rescale.
  Chain none(2, DataType::kFloat32, {&kNeither, &kNeither}, true);
  ASSERT_EQ(JoinInt8Edges(none.layers), 0);
  EXPECT_EQ(RescaleInt8Edges(none.g), 0);
  EXPECT_FALSE(none.nodes[0]->attrs().Has(kInt8OutputScaleAttr));
}

// INT8 edges between channels-last convolutions (conv_int8.cc reads and writes them): the type
// rules of Conv and FusedConv accept the rewrite, the consumer computing in its weight's float
// type with a float residual Z; an int8 X without the edge mark is still a type error.
TEST(Int8Edges, ConvolutionsJoinAndKeepTheirTypeRules) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat16, {2, 6, 6, 16});  // NHWC
  Value* z = g.AddInput("z", DataType::kFloat16, {2, 6, 6, 32});
  auto conv = [&](const std::string& name, const char* op, std::vector<Value*> ins, int64_t k,
                  int64_t c) {
    ins.insert(ins.begin() + 1,
               g.AddConstant(name + ".w", Tensor(DataType::kFloat16, {k, c, 3, 3})));
    Value* y = g.AddValue(name + ".y");
    AttributeMap attrs;
    attrs.Set("kernel_shape", std::vector<int64_t>{3, 3});
    attrs.Set("pads", std::vector<int64_t>{1, 1, 1, 1});
    attrs.Set("kiln_layout", std::string("NHWC"));
    attrs.Set(std::string(kInt8InputAmaxAttr), 2.f);
    if (std::string_view(op) == "FusedConv") attrs.Set("activation", std::string("relu"));
    return g.AddNode(op, name, std::move(ins), {y}, std::move(attrs));
  };
  Node* c0 = conv("c0", "Conv", {x}, 32, 16);
  Node* c1 = conv("c1", "FusedConv", {c0->output(0), nullptr, z}, 32, 32);  // no bias; Z
  g.MarkOutput(c1->output(0));
  ASSERT_TRUE(InferShapes(g).ok());
  std::deque<KernelRequest> requests;
  TacticConfig tactic = Named("i8-conv-fake");
  std::vector<std::string> reasons(2);
  std::vector<ChosenLayer> layers;
  for (Node* n : {c0, c1}) {
    KernelRequest& r = requests.emplace_back();
    r.node = n;
    for (Value* v : n->inputs()) {
      r.inputs.push_back({v ? v->dtype() : DataType::kUndefined, v ? v->shape() : Shape{}, {}});
    }
    r.outputs.push_back({n->output(0)->dtype(), n->output(0)->shape(), {}});
    layers.push_back({n, &kBoth, &r, &tactic, &reasons[layers.size()]});
  }
  EXPECT_EQ(JoinInt8Edges(layers), 1);
  EXPECT_FLOAT_EQ(c0->attrs().GetFloat(kInt8OutputScaleAttr, 0.f), 2.f / 127.f);
  EXPECT_TRUE(c1->attrs().Has(kInt8InputEdgeAttr));
  auto again = InferShapes(g);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(c0->output(0)->dtype(), kInt8EdgeType);
  EXPECT_EQ(c1->output(0)->dtype(), DataType::kFloat16);
  EXPECT_EQ(ToString(c1->output(0)->shape()), "[2,6,6,32]");

  // Unmarked, the int8 X is not a float one: Conv's rule refuses it.
  c1->mutable_attrs().Erase(kInt8InputEdgeAttr);
  auto refused = InferShapes(g);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().ToString().find("c1"), std::string::npos)
      << refused.status().ToString();
}

// A transformer's LayerNorm: y = SkipLayerNormalization(x, skip, gamma) read by three INT8 (with
// fp8, FP8) products (q and k with one scale, o with another) and a residual Add, in FP16.
struct NormFeedsProducts {
  Graph g;
  Node *ln = nullptr, *q = nullptr, *k = nullptr, *o = nullptr, *res = nullptr;
  std::deque<KernelRequest> requests;
  TacticConfig tactic = Named("i8-fake");
  std::vector<std::string> reasons = std::vector<std::string>(4);
  std::vector<ChosenLayer> layers;

  NormFeedsProducts(const KernelProvider* norm, const KernelProvider* products, bool fp8 = false) {
    Value* x = g.AddInput("x", DataType::kFloat16, {4, 32});
    Value* skip = g.AddInput("skip", DataType::kFloat16, {4, 32});
    Value* gamma = g.AddConstant("gamma", Tensor(DataType::kFloat16, {32}));
    Value* y = g.AddValue("y");
    ln = g.AddNode("SkipLayerNormalization", "ln", {x, skip, gamma}, {y});
    auto product = [&](const char* name, float amax) {
      AttributeMap attrs;
      attrs.Set(std::string(fp8 ? kFp8InputAmaxAttr : kInt8InputAmaxAttr), amax);
      Value* w = g.AddConstant(std::string(name) + ".w", Tensor(DataType::kFloat16, {32, 32}));
      Node* n = g.AddNode("MatMul", name, {y, w}, {g.AddValue(std::string(name) + ".y")},
                          std::move(attrs));
      g.MarkOutput(n->output(0));
      return n;
    };
    q = product("q", 2.f);
    k = product("k", 2.f);
    o = product("o", 3.f);
    res = g.AddNode("Add", "res", {y, x}, {g.AddValue("res.y")});
    g.MarkOutput(res->output(0));
    EXPECT_TRUE(InferShapes(g).ok());
    for (Node* n : {ln, q, k, o}) {
      KernelRequest& r = requests.emplace_back();
      r.node = n;
      for (Value* v : n->inputs()) r.inputs.push_back({v->dtype(), v->shape(), {4, 32}});
      r.outputs.push_back({n->output(0)->dtype(), n->output(0)->shape(), {4, 32}});
      layers.push_back({n, n == ln ? norm : products, &r, &tactic, &reasons[layers.size()]});
    }
  }
};

// The norm writes one int8 copy of y beside y itself, shared by the products with its scale; the
// residual and the product with another scale read y as before.
TEST(Int8Copies, ANormWritesAnInt8CopyForTheProductsWithOneScale) {
  NormFeedsProducts t(&kBoth, &kOneSide);
  Value* y = t.ln->output(0);
  EXPECT_EQ(JoinInt8Edges(t.layers), 0);  // y has other readers: no edge
  EXPECT_EQ(JoinInt8Copies(t.g, t.layers), 2);
  ASSERT_EQ(t.ln->num_outputs(), 3u);
  EXPECT_EQ(t.ln->output(1), nullptr);  // Sum stays omitted
  Value* copy = t.ln->output(2);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->dtype(), kInt8EdgeType);
  EXPECT_EQ(copy->producer(), t.ln);
  EXPECT_EQ(t.q->input(0), copy);
  EXPECT_EQ(t.k->input(0), copy);
  EXPECT_EQ(t.o->input(0), y);
  EXPECT_EQ(t.res->input(0), y);
  EXPECT_EQ(y->dtype(), DataType::kFloat16);
  EXPECT_FLOAT_EQ(t.ln->attrs().GetFloat(kInt8CopyScaleAttr, 0.f), 2.f / 127.f);
  EXPECT_FALSE(t.ln->attrs().Has(kInt8OutputScaleAttr));
  EXPECT_TRUE(t.q->attrs().Has(kInt8InputEdgeAttr));
  EXPECT_TRUE(t.k->attrs().Has(kInt8InputEdgeAttr));
  EXPECT_FALSE(t.o->attrs().Has(kInt8InputEdgeAttr));
  EXPECT_TRUE(t.layers[0].joined && t.layers[1].joined && t.layers[2].joined);
  EXPECT_FALSE(t.layers[3].joined);
  // The requests: the norm's third output is the int8 copy, its second still omitted.
  ASSERT_EQ(t.requests[0].outputs.size(), 3u);
  EXPECT_EQ(t.requests[0].outputs[1].dtype, DataType::kUndefined);
  EXPECT_EQ(t.requests[0].outputs[2].dtype, kInt8EdgeType);
  EXPECT_EQ(t.requests[0].outputs[2].max_dims, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(t.requests[1].inputs[0].dtype, kInt8EdgeType);
  EXPECT_EQ(t.requests[3].inputs[0].dtype, DataType::kFloat16);
  EXPECT_NE(t.reasons[0].find("writes int8 for 'q'"), std::string::npos) << t.reasons[0];
  EXPECT_NE(t.reasons[0].find("writes int8 for 'k'"), std::string::npos) << t.reasons[0];
  EXPECT_NE(t.reasons[1].find("reads int8 from 'ln'"), std::string::npos) << t.reasons[1];
  EXPECT_TRUE(t.reasons[3].empty()) << t.reasons[3];
  // The type rules accept the rewrite: the copy is int8, y and the products' results FP16.
  auto again = InferShapes(t.g);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(copy->dtype(), kInt8EdgeType);
  EXPECT_EQ(ToString(copy->shape()), "[4,32]");
  EXPECT_EQ(y->dtype(), DataType::kFloat16);
  EXPECT_EQ(t.q->output(0)->dtype(), DataType::kFloat16);

  // Refit's recalibration: the copy follows its readers' new scale.
  t.q->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 4.f);
  t.k->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 4.f);
  EXPECT_EQ(RescaleInt8Edges(t.g), 2);
  EXPECT_FLOAT_EQ(t.ln->attrs().GetFloat(kInt8CopyScaleAttr, 0.f), 4.f / 127.f);
  EXPECT_FALSE(t.ln->attrs().Has(kInt8OutputScaleAttr));
}

// FP8 copies: the same rewrite with E4M3 and the readers' amax; the readers carry no mark (their
// FP8 amax makes the type rule read an E4M3 A), and INT8 copies do not join FP8 readers.
TEST(Int8Copies, Fp8ReadersGetAnE4M3Copy) {
  NormFeedsProducts t(&kBoth, &kOneSide, /*fp8=*/true);
  EXPECT_EQ(JoinInt8Copies(t.g, t.layers), 0);
  EXPECT_EQ(JoinFp8Copies(t.g, t.layers), 2);
  Value* copy = t.ln->output(2);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->dtype(), kFp8EdgeType);
  EXPECT_EQ(t.q->input(0), copy);
  EXPECT_EQ(t.k->input(0), copy);
  EXPECT_EQ(t.o->input(0), t.ln->output(0));
  EXPECT_FLOAT_EQ(t.ln->attrs().GetFloat(kFp8CopyAmaxAttr, 0.f), 2.f);
  EXPECT_FALSE(t.ln->attrs().Has(kInt8CopyScaleAttr));
  EXPECT_FALSE(t.q->attrs().Has(kInt8InputEdgeAttr));
  EXPECT_EQ(t.requests[0].outputs[2].dtype, kFp8EdgeType);
  EXPECT_EQ(t.requests[1].inputs[0].dtype, kFp8EdgeType);
  EXPECT_NE(t.reasons[0].find("writes E4M3 for 'q'"), std::string::npos) << t.reasons[0];
  EXPECT_NE(t.reasons[2].find("reads E4M3 from 'ln'"), std::string::npos) << t.reasons[2];
  auto again = InferShapes(t.g);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(copy->dtype(), kFp8EdgeType);
  EXPECT_EQ(t.ln->output(0)->dtype(), DataType::kFloat16);
  EXPECT_EQ(t.q->output(0)->dtype(), DataType::kFloat16);
  // Output Yq without a copy attribute is refused by the type rule.
  t.ln->mutable_attrs().Erase(kFp8CopyAmaxAttr);
  EXPECT_FALSE(InferShapes(t.g).ok());
}

TEST(Int8Copies, NeedTheNormToWriteAndTheProductsToRead) {
  NormFeedsProducts norm_no(&kNeither, &kOneSide);
  EXPECT_EQ(JoinInt8Copies(norm_no.g, norm_no.layers), 0);
  EXPECT_EQ(norm_no.ln->num_outputs(), 1u);
  NormFeedsProducts products_no(&kBoth, &kNeither);
  EXPECT_EQ(JoinInt8Copies(products_no.g, products_no.layers), 0);
  EXPECT_EQ(products_no.ln->num_outputs(), 1u);
  EXPECT_FALSE(products_no.ln->attrs().Has(kInt8CopyScaleAttr));
  for (Node* n : {products_no.q, products_no.k, products_no.o}) {
    EXPECT_EQ(n->input(0), products_no.ln->output(0));
  }
  // A product not chosen as INT8 (no usable scale) gets no copy.
  NormFeedsProducts zero(&kBoth, &kOneSide);
  for (Node* n : {zero.q, zero.k, zero.o}) {
    n->mutable_attrs().Set(std::string(kInt8InputAmaxAttr), 0.f);
  }
  EXPECT_EQ(JoinInt8Copies(zero.g, zero.layers), 0);
  // An op without a copy output (a MatMul producer) makes none, whatever its provider says.
  Chain chain(2, DataType::kFloat16, {&kBoth, &kBoth}, /*int8=*/true);
  EXPECT_EQ(JoinInt8Copies(chain.g, chain.layers), 0);
}

// y read by one INT8 product only (a pre-LN transformer's norm, whose Sum is the residual): an
// ordinary edge, y itself int8, which the SkipLayerNormalization type rule accepts.
TEST(Int8Copies, ANormWithOneReaderIsAnOrdinaryEdge) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat16, {4, 32});
  Value* skip = g.AddInput("skip", DataType::kFloat16, {4, 32});
  Value* gamma = g.AddConstant("gamma", Tensor(DataType::kFloat16, {32}));
  Value* y = g.AddValue("y");
  Value* sum = g.AddValue("sum");
  Node* ln = g.AddNode("SkipLayerNormalization", "ln", {x, skip, gamma}, {y, sum});
  g.MarkOutput(sum);
  AttributeMap attrs;
  attrs.Set(std::string(kInt8InputAmaxAttr), 2.f);
  Node* q = g.AddNode("MatMul", "q", {y, g.AddConstant("w", Tensor(DataType::kFloat16, {32, 8}))},
                      {g.AddValue("q.y")}, std::move(attrs));
  g.MarkOutput(q->output(0));
  ASSERT_TRUE(InferShapes(g).ok());
  std::deque<KernelRequest> requests;
  TacticConfig tactic = Named("i8-fake");
  std::vector<std::string> reasons(2);
  std::vector<ChosenLayer> layers;
  for (Node* n : {ln, q}) {
    KernelRequest& r = requests.emplace_back();
    r.node = n;
    for (Value* v : n->inputs()) r.inputs.push_back({v->dtype(), v->shape(), {}});
    for (Value* v : n->outputs()) r.outputs.push_back({v->dtype(), v->shape(), {}});
    layers.push_back({n, n == ln ? &kBoth : &kOneSide, &r, &tactic, &reasons[layers.size()]});
  }
  EXPECT_EQ(JoinInt8Edges(layers), 1);
  EXPECT_EQ(JoinInt8Copies(g, layers), 0);
  EXPECT_EQ(ln->num_outputs(), 2u);
  EXPECT_FLOAT_EQ(ln->attrs().GetFloat(kInt8OutputScaleAttr, 0.f), 2.f / 127.f);
  auto again = InferShapes(g);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(y->dtype(), kInt8EdgeType);
  EXPECT_EQ(sum->dtype(), DataType::kFloat16);
  EXPECT_EQ(q->output(0)->dtype(), DataType::kFloat16);
}

}  // namespace
}  // namespace kiln
