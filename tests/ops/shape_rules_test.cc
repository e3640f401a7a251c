// Shape and type rules: symbolic dims through the exported shape subgraphs (BERT/GPT/ViT
// patterns), slicing, splitting, squeezing, broadcasting errors and attribute validation.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "kiln/ops/onnx_dtype.h"
#include "kiln/ops/op_schema.h"

namespace kiln {

// Readable failure messages for shapes.
void PrintTo(const Dim& d, std::ostream* os) { *os << d.ToString(); }

namespace {

using enum DataType;
const Dim kBatch = Dim::Symbol("batch");
const Dim kSeq = Dim::Symbol("seq");

Tensor I64(std::vector<int64_t> dims, std::vector<int64_t> v) {
  return Tensor::FromVector(kInt64, std::move(dims), v);
}

Tensor F32(std::vector<int64_t> dims, std::vector<float> v) {
  return Tensor::FromVector(kFloat32, std::move(dims), v);
}

AttributeMap Attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  AttributeMap m;
  for (auto& [k, v] : kv) m.Set(k, v);
  return m;
}

// Builds graphs node by node and infers them: a small helper for rule tests.
class GraphBuilder {
 public:
  Value* In(DataType t, Shape s) { return g.AddInput(Name("in"), t, std::move(s)); }
  Value* Const(Tensor t) { return g.AddConstant(Name("c"), std::move(t)); }
  Value* Op(const std::string& op, std::vector<Value*> ins, AttributeMap attrs = {}) {
    return OpN(op, std::move(ins), 1, std::move(attrs))[0];
  }
  std::vector<Value*> OpN(const std::string& op, std::vector<Value*> ins, int outs,
                          AttributeMap attrs = {}) {
    std::vector<Value*> out;
    for (int i = 0; i < outs; ++i) out.push_back(g.AddValue(Name(op)));
    g.AddNode(op, Name(op), std::move(ins), out, std::move(attrs));
    return out;
  }
  // Infers the whole graph; the status of the first failing node.
  Status Infer() {
    auto r = InferShapes(g);
    if (r.ok()) dims = std::move(r->dims_values);
    return r.ok() ? OkStatus() : r.status();
  }
  std::optional<std::vector<Dim>> DimsValue(Value* v) const {
    auto it = dims.find(v);
    if (it == dims.end()) return std::nullopt;
    return it->second;
  }

  Graph g;
  std::unordered_map<const Value*, std::vector<Dim>> dims;

 private:
  std::string Name(const std::string& p) { return g.UniqueName(p); }
};

// x.view(x.size()[:-1] + (heads, head_dim)) as HF BERT exports it:
// Shape -> Gather(0), Shape -> Gather(1), Unsqueeze each, Concat with constants, Reshape.
TEST(ShapeRules, BertReshapeSubgraphGivesSymbolicTarget) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, kSeq, 64});
  Value* shape = b.Op("Shape", {x});
  Value* d0 = b.Op("Gather", {shape, b.Const(I64({}, {0}))}, Attrs({{"axis", int64_t{0}}}));
  Value* d1 = b.Op("Gather", {shape, b.Const(I64({}, {1}))}, Attrs({{"axis", int64_t{0}}}));
  Value* u0 = b.Op("Unsqueeze", {d0, b.Const(I64({1}, {0}))});
  Value* u1 = b.Op("Unsqueeze", {d1, b.Const(I64({1}, {0}))});
  Value* target = b.Op("Concat", {u0, u1, b.Const(I64({1}, {4})), b.Const(I64({1}, {16}))},
                       Attrs({{"axis", int64_t{0}}}));
  Value* y = b.Op("Reshape", {x, target});
  Value* t = b.Op("Transpose", {y}, Attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(shape->dtype(), kInt64);
  EXPECT_EQ(shape->shape(), (Shape{3}));
  EXPECT_EQ(d0->shape(), Shape{});
  EXPECT_EQ(target->shape(), (Shape{4}));
  EXPECT_EQ(*b.DimsValue(target), (std::vector<Dim>{kBatch, kSeq, 4, 16}));
  EXPECT_EQ(y->shape(), (Shape{kBatch, kSeq, 4, 16}));
  EXPECT_EQ(t->shape(), (Shape{kBatch, 4, kSeq, 16}));
}

TEST(ShapeRules, ReshapeZeroMinusOneAndErrors) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, kSeq, 64});
  Value* keep = b.Op("Reshape", {x, b.Const(I64({3}, {0, 0, -1}))});
  Value* flat = b.Op("Reshape", {x, b.Const(I64({2}, {-1, 64}))});
  Value* split = b.Op("Reshape", {x, b.Const(I64({4}, {0, 0, 4, -1}))});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(keep->shape(), (Shape{kBatch, kSeq, 64}));
  EXPECT_EQ(flat->shape(), (Shape{kBatch * kSeq, 64}));
  EXPECT_EQ(split->shape(), (Shape{kBatch, kSeq, 4, 16}));

  GraphBuilder bad;
  bad.Op("Reshape", {bad.In(kFloat32, {2, 3}), bad.Const(I64({1}, {7}))});
  Status s = bad.Infer();
  EXPECT_EQ(s.code(), ErrorCode::kShapeMismatch);
  EXPECT_NE(s.message().find("[2,3]"), std::string::npos) << s.message();

  // A target computed from data cannot be known at build time.
  GraphBuilder dyn;
  dyn.Op("Reshape", {dyn.In(kFloat32, {2, 3}), dyn.In(kInt64, {2})});
  EXPECT_EQ(dyn.Infer().code(), ErrorCode::kDataDependentShape);
}

TEST(ShapeRules, SliceNegativeClampedAndOnShapeValues) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, kSeq, 64});
  Value* tail = b.Op(
      "Slice", {x, b.Const(I64({1}, {-16})), b.Const(I64({1}, {kMax})), b.Const(I64({1}, {-1}))});
  Value* head =
      b.Op("Slice", {x, b.Const(I64({1}, {0})), b.Const(I64({1}, {-1})), b.Const(I64({1}, {1}))});
  Value* clamp = b.Op("Slice", {x, b.Const(I64({1}, {10})), b.Const(I64({1}, {1000})),
                                b.Const(I64({1}, {2})), b.Const(I64({1}, {2}))});
  Value* rev = b.Op("Slice", {x, b.Const(I64({1}, {-1})), b.Const(I64({1}, {-kMax})),
                              b.Const(I64({1}, {2})), b.Const(I64({1}, {-2}))});
  // x.shape[:-1]
  Value* lead =
      b.Op("Slice", {b.Op("Shape", {x}), b.Const(I64({1}, {0})), b.Const(I64({1}, {-1}))});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(tail->shape(), (Shape{kBatch, kSeq, 16}));
  EXPECT_EQ(head->shape(), (Shape{kBatch, kSeq - 1, 64}));
  EXPECT_EQ(clamp->shape(), (Shape{kBatch, kSeq, 27}));
  EXPECT_EQ(rev->shape(), (Shape{kBatch, kSeq, 32}));
  EXPECT_EQ(*b.DimsValue(lead), (std::vector<Dim>{kBatch, kSeq}));

  GraphBuilder bad;
  bad.Op("Slice", {bad.In(kFloat32, {4}), bad.Const(I64({1}, {0})), bad.Const(I64({1}, {2})),
                   bad.Const(I64({1}, {0})), bad.Const(I64({1}, {0}))});
  EXPECT_EQ(bad.Infer().code(), ErrorCode::kInvalidAttribute);
}

TEST(ShapeRules, SplitByInputAndByNumOutputs) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, 10, 3});
  auto parts = b.OpN("Split", {x, b.Const(I64({2}, {3, 7}))}, 2, Attrs({{"axis", int64_t{1}}}));
  auto even = b.OpN("Split", {x}, 3, Attrs({{"axis", int64_t{1}}, {"num_outputs", int64_t{3}}}));
  auto qkv = b.OpN("Split", {b.In(kFloat32, {kBatch, kSeq, 192})}, 3,
                   Attrs({{"axis", int64_t{-1}}, {"num_outputs", int64_t{3}}}));
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(parts[0]->shape(), (Shape{kBatch, 3, 3}));
  EXPECT_EQ(parts[1]->shape(), (Shape{kBatch, 7, 3}));
  EXPECT_EQ(even[0]->shape(), (Shape{kBatch, 4, 3}));
  EXPECT_EQ(even[2]->shape(), (Shape{kBatch, 2, 3}));
  EXPECT_EQ(qkv[1]->shape(), (Shape{kBatch, kSeq, 64}));

  GraphBuilder bad;
  bad.OpN("Split", {bad.In(kFloat32, {10}), bad.Const(I64({2}, {3, 4}))}, 2);
  Status s = bad.Infer();
  EXPECT_EQ(s.code(), ErrorCode::kShapeMismatch);
  EXPECT_NE(s.message().find("sum to 7"), std::string::npos) << s.message();
}

TEST(ShapeRules, SqueezeAndUnsqueeze) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {1, kSeq, 1, 8});
  Value* all = b.Op("Squeeze", {x});
  Value* one = b.Op("Squeeze", {x, b.Const(I64({1}, {-2}))});
  Value* un = b.Op("Unsqueeze", {x, b.Const(I64({2}, {0, -1}))});
  // attention_mask[:, None, None, :]
  Value* mask = b.Op("Unsqueeze", {b.In(kInt64, {kBatch, kSeq}), b.Const(I64({2}, {1, 2}))});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(all->shape(), (Shape{kSeq, 8}));
  EXPECT_EQ(one->shape(), (Shape{1, kSeq, 8}));
  EXPECT_EQ(un->shape(), (Shape{1, 1, kSeq, 1, 8, 1}));
  EXPECT_EQ(mask->shape(), (Shape{kBatch, 1, 1, kSeq}));

  GraphBuilder bad;
  bad.Op("Squeeze", {bad.In(kFloat32, {2, 3}), bad.Const(I64({1}, {0}))});
  EXPECT_EQ(bad.Infer().code(), ErrorCode::kShapeMismatch);
  GraphBuilder dup;
  dup.Op("Unsqueeze", {dup.In(kFloat32, {2}), dup.Const(I64({2}, {0, 0}))});
  EXPECT_EQ(dup.Infer().code(), ErrorCode::kInvalidAttribute);
}

TEST(ShapeRules, BroadcastErrorsNameBothShapes) {
  GraphBuilder b;
  b.Op("Add", {b.In(kFloat32, {kBatch, 3, 4}), b.In(kFloat32, {5, 4})});
  Status s = b.Infer();
  EXPECT_EQ(s.code(), ErrorCode::kShapeMismatch);
  EXPECT_NE(s.message().find("[batch,3,4]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[5,4]"), std::string::npos) << s.message();

  GraphBuilder ok;
  Value* y = ok.Op("Mul", {ok.In(kFloat32, {kBatch, 1, kSeq}), ok.In(kFloat32, {4, 1})});
  Value* eq = ok.Op("Equal", {ok.In(kInt64, {kBatch, kSeq}), ok.Const(I64({}, {0}))});
  ASSERT_TRUE(ok.Infer().ok());
  EXPECT_EQ(y->shape(), (Shape{kBatch, 4, kSeq}));
  EXPECT_EQ(eq->dtype(), kBool);

  GraphBuilder types;
  types.Op("Add", {types.In(kFloat32, {2}), types.In(kInt64, {2})});
  EXPECT_EQ(types.Infer().code(), ErrorCode::kTypeMismatch);
}

TEST(ShapeRules, BadAttributesAreE2009) {
  struct Case {
    const char* op;
    AttributeMap attrs;
    Shape shape;
  };
  std::vector<Case> cases = {
      {"Transpose", Attrs({{"perm", std::vector<int64_t>{0, 0}}}), {2, 3}},
      {"Transpose", Attrs({{"perm", std::vector<int64_t>{0}}}), {2, 3}},
      {"Concat", {}, {2, 3}},  // axis is required
      {"Concat", Attrs({{"axis", int64_t{2}}}), {2, 3}},
      {"Gelu", Attrs({{"approximate", std::string("fast")}}), {2}},
      {"Cast", Attrs({{"to", int64_t{8}}}), {2}},  // string
      {"Softmax", Attrs({{"axis", int64_t{5}}}), {2, 3}},
      {"Softmax", Attrs({{"axis", std::string("last")}}), {2, 3}},  // wrong kind
      {"Flatten", Attrs({{"axis", int64_t{-4}}}), {2, 3}},
      {"LayerNormalization", Attrs({{"epsilon", -1.0f}}), {2, 3}},
      {"Trilu", Attrs({{"upper", int64_t{2}}}), {2, 3}},
      {"DepthToSpace",
       Attrs({{"blocksize", int64_t{2}}, {"mode", std::string("XYZ")}}),
       {1, 8, 2, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    GraphBuilder b;
    b.Op(c.op, {b.In(kFloat32, c.shape)}, c.attrs);
    Status s = b.Infer();
    EXPECT_EQ(s.code(), ErrorCode::kInvalidAttribute) << s.ToString();
    // Errors name the node.
    EXPECT_NE(s.message().find(c.op), std::string::npos) << s.message();
  }
}

// GPT-2 / Expand exports: Where(Equal(shape, -1), ones, shape) must fold to the shape.
TEST(ShapeRules, WhereEqualOnShapeValuesFolds) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, 1, 1, kSeq});
  Value* ids = b.In(kInt64, {kBatch, kSeq});
  Value* shape = b.Op("Shape", {ids});
  Value* target = b.Op("Concat",
                       {b.Op("Gather", {shape, b.Const(I64({1}, {0}))}), b.Const(I64({2}, {4, -1})),
                        b.Op("Gather", {shape, b.Const(I64({1}, {1}))})},
                       Attrs({{"axis", int64_t{0}}}));
  Value* is_neg = b.Op("Equal", {target, b.Const(I64({}, {-1}))});
  Value* ones =
      b.Op("ConstantOfShape", {b.Const(I64({1}, {4}))}, Attrs({{"value", I64({1}, {1})}}));
  Value* fixed = b.Op("Where", {is_neg, ones, target});
  Value* y = b.Op("Expand", {x, fixed});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(*b.DimsValue(is_neg), (std::vector<Dim>{0, 0, 1, 0}));
  EXPECT_EQ(*b.DimsValue(fixed), (std::vector<Dim>{kBatch, 4, 1, kSeq}));
  EXPECT_EQ(y->shape(), (Shape{kBatch, 4, 1, kSeq}));
}

// torch's expand(B, -1, -1) (ViT cls token): ones = ConstantOfShape(Shape(size)),
// Where(Equal(size, ones * -1), ones, size).
TEST(ShapeRules, TorchExpandMinusOnePatternFolds) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, 3, 32, 32});
  Value* cls = b.Const(Tensor(kFloat32, {1, 1, 64}));
  Value* batch = b.Op("Unsqueeze", {b.Op("Gather", {b.Op("Shape", {x}), b.Const(I64({}, {0}))}),
                                    b.Const(I64({1}, {0}))});
  Value* size = b.Op("Concat", {batch, b.Const(I64({2}, {-1, -1}))}, Attrs({{"axis", int64_t{0}}}));
  Value* ones = b.Op("ConstantOfShape", {b.Op("Shape", {size})}, Attrs({{"value", I64({1}, {1})}}));
  Value* neg = b.Op("Mul", {ones, b.Const(I64({}, {-1}))});
  Value* fixed = b.Op("Where", {b.Op("Equal", {size, neg}), ones, size});
  Value* y = b.Op("Expand", {cls, fixed});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(*b.DimsValue(fixed), (std::vector<Dim>{kBatch, 1, 1}));
  EXPECT_EQ(y->shape(), (Shape{kBatch, 1, 64}));
}

TEST(ShapeRules, ArithmeticCastRangeAndConstantOfShapeOnDims) {
  GraphBuilder b;
  Value* x = b.In(kFloat32, {kBatch, kSeq, 64});
  Value* shape = b.Op("Shape", {x});
  Value* seq = b.Op("Gather", {shape, b.Const(I64({}, {1}))});
  // positions = Range(0, seq, 1) (GPT-2), then Unsqueeze(0).
  Value* pos = b.Op("Range", {b.Const(I64({}, {0})), seq, b.Const(I64({}, {1}))});
  Value* pos2 = b.Op("Unsqueeze", {pos, b.Const(I64({1}, {0}))});
  // head_dim = hidden / heads; seq * 2 + 1; Cast to int32 keeps the value.
  Value* hidden = b.Op("Gather", {shape, b.Const(I64({}, {2}))});
  Value* head = b.Op("Div", {hidden, b.Const(I64({}, {4}))});
  Value* lin = b.Op("Add", {b.Op("Mul", {seq, b.Const(I64({}, {2}))}), b.Const(I64({}, {1}))});
  Value* cast = b.Op("Cast", {lin}, Attrs({{"to", int64_t{6}}}));
  Value* f = b.Op("Cast", {seq}, Attrs({{"to", int64_t{1}}}));
  // A float Range over a cast dim (the window ops' expansions): whole-number float constants
  // and the cast dim size it; a half cast is not exact for every dim and keeps no dims.
  Value* frange = b.Op("Range", {b.Const(F32({}, {0.f})), f, b.Const(F32({}, {1.f}))});
  Value* half = b.Op("Cast", {seq}, Attrs({{"to", int64_t{10}}}));
  Value* zeros = b.Op("ConstantOfShape", {shape});
  Value* size = b.Op("Size", {x});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(pos->shape(), (Shape{kSeq}));
  EXPECT_EQ(pos->dtype(), kInt64);
  EXPECT_EQ(pos2->shape(), (Shape{1, kSeq}));
  EXPECT_EQ(*b.DimsValue(head), (std::vector<Dim>{16}));
  EXPECT_EQ(*b.DimsValue(cast), (std::vector<Dim>{kSeq * 2 + 1}));
  EXPECT_EQ(cast->dtype(), kInt32);
  EXPECT_EQ(f->dtype(), kFloat32);
  EXPECT_EQ(*b.DimsValue(f), (std::vector<Dim>{kSeq}));
  EXPECT_EQ(frange->shape(), (Shape{kSeq}));
  EXPECT_EQ(frange->dtype(), kFloat32);
  EXPECT_FALSE(b.DimsValue(half).has_value());
  EXPECT_EQ(zeros->shape(), (Shape{kBatch, kSeq, 64}));
  EXPECT_EQ(zeros->dtype(), kFloat32);
  EXPECT_EQ(*b.DimsValue(size), (std::vector<Dim>{kBatch * kSeq * 64}));
}

TEST(ShapeRules, ReductionsSoftmaxLayerNormTopKTypes) {
  GraphBuilder b;
  Value* x = b.In(kFloat16, {kBatch, kSeq, 64});
  Value* mean = b.Op("ReduceMean", {x, b.Const(I64({1}, {-1}))});
  Value* sum = b.Op("ReduceSum", {x, b.Const(I64({2}, {0, 2}))}, Attrs({{"keepdims", int64_t{0}}}));
  Value* all = b.Op("ReduceMax", {x}, Attrs({{"keepdims", int64_t{0}}}));
  Value* noop = b.Op("ReduceMin", {x}, Attrs({{"noop_with_empty_axes", int64_t{1}}}));
  Value* arg = b.Op("ArgMax", {x}, Attrs({{"axis", int64_t{-1}}, {"keepdims", int64_t{0}}}));
  Value* sm = b.Op("Softmax", {x});
  auto ln = b.OpN("LayerNormalization", {x, b.In(kFloat16, {64}), b.In(kFloat16, {64})}, 3);
  auto topk = b.OpN("TopK", {x, b.Const(I64({1}, {5}))}, 2);
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(mean->shape(), (Shape{kBatch, kSeq, 1}));
  EXPECT_EQ(sum->shape(), (Shape{kSeq}));
  EXPECT_EQ(all->shape(), Shape{});
  EXPECT_EQ(noop->shape(), (Shape{kBatch, kSeq, 64}));
  EXPECT_EQ(arg->shape(), (Shape{kBatch, kSeq}));
  EXPECT_EQ(arg->dtype(), kInt64);
  EXPECT_EQ(sm->dtype(), kFloat16);
  EXPECT_EQ(ln[0]->shape(), (Shape{kBatch, kSeq, 64}));
  EXPECT_EQ(ln[1]->shape(), (Shape{kBatch, kSeq, 1}));
  EXPECT_EQ(ln[2]->dtype(), kFloat32);
  EXPECT_EQ(topk[0]->shape(), (Shape{kBatch, kSeq, 5}));
  EXPECT_EQ(topk[1]->dtype(), kInt64);
}

TEST(ShapeRules, NewTypesLossesAndEmptyOperands) {
  GraphBuilder b;
  Value* x = b.In(kFloat64, {kBatch, 4, 6});
  // An `axes` graph input of static length 0 is known to be empty: every axis is reduced.
  Value* all = b.Op("ReduceSum", {x, b.In(kInt64, {0})});
  Value* l1 = b.Op("ReduceL1", {b.In(kUInt32, {3, 5}), b.Const(I64({1}, {1}))});
  Value* sub = b.Op("Sub", {b.In(kUInt16, {3}), b.In(kUInt16, {1})});
  Value* shift = b.Op("BitShift", {b.In(kUInt8, {3}), b.In(kUInt8, {3})},
                      Attrs({{"direction", std::string("LEFT")}}));
  Value* nll = b.Op("NegativeLogLikelihoodLoss", {x, b.In(kInt64, {kBatch, 6})},
                    Attrs({{"reduction", std::string("none")}}));
  auto sce = b.OpN("SoftmaxCrossEntropyLoss", {x, b.In(kInt32, {kBatch, 6})}, 2);
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(all->shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(all->dtype(), kFloat64);
  EXPECT_EQ(l1->shape(), (Shape{3, 1}));
  EXPECT_EQ(sub->dtype(), kUInt16);
  EXPECT_EQ(shift->shape(), (Shape{3}));
  EXPECT_EQ(nll->shape(), (Shape{kBatch, 6}));
  EXPECT_EQ(sce[0]->shape(), Shape{});
  EXPECT_EQ(sce[1]->shape(), (Shape{kBatch, 4, 6}));

  // BitShift takes unsigned types only and needs a direction; a loss target must match.
  GraphBuilder bad;
  bad.Op("BitShift", {bad.In(kInt32, {3}), bad.In(kInt32, {3})},
         Attrs({{"direction", std::string("LEFT")}}));
  EXPECT_EQ(bad.Infer().code(), ErrorCode::kTypeMismatch);
  GraphBuilder nodir;
  nodir.Op("BitShift", {nodir.In(kUInt8, {3}), nodir.In(kUInt8, {3})});
  EXPECT_EQ(nodir.Infer().code(), ErrorCode::kInvalidAttribute);
  GraphBuilder cast;
  cast.Op("BitCast", {cast.In(kFloat32, {3})}, Attrs({{"to", int64_t{7}}}));  // f32 -> i64
  EXPECT_EQ(cast.Infer().code(), ErrorCode::kTypeMismatch);
  GraphBuilder q;
  Value* scale = q.In(kFloat32, {});
  Value* zp = q.In(kInt8, {});
  Value* qy = q.Op("QLinearMatMul", {q.In(kInt8, {kBatch, 2, 4}), scale, zp, q.In(kInt8, {4, 3}),
                                     scale, zp, scale, q.In(kUInt8, {})});
  auto dq = q.OpN("DynamicQuantizeLinear", {q.In(kFloat32, {kBatch, 5})}, 3);
  ASSERT_TRUE(q.Infer().ok());
  EXPECT_EQ(qy->shape(), (Shape{kBatch, 2, 3}));
  EXPECT_EQ(qy->dtype(), kUInt8);
  EXPECT_EQ(dq[0]->dtype(), kUInt8);
  EXPECT_EQ(dq[1]->shape(), Shape{});
  GraphBuilder rnn;
  AttributeMap lstm_attrs = Attrs({{"hidden_size", int64_t{5}},
                                   {"layout", int64_t{1}},
                                   {"direction", std::string("bidirectional")}});
  auto lstm = rnn.OpN("LSTM",
                      {rnn.In(kFloat32, {kBatch, 7, 3}), rnn.In(kFloat32, {2, 20, 3}),
                       rnn.In(kFloat32, {2, 20, 5})},
                      3, lstm_attrs);
  ASSERT_TRUE(rnn.Infer().ok());
  EXPECT_EQ(lstm[0]->shape(), (Shape{kBatch, 7, 2, 5}));
  EXPECT_EQ(lstm[1]->shape(), (Shape{kBatch, 2, 5}));
  GraphBuilder bad_w;
  bad_w.OpN("GRU",
            {bad_w.In(kFloat32, {7, 2, 3}), bad_w.In(kFloat32, {1, 12, 3}),
             bad_w.In(kFloat32, {1, 15, 5})},
            2, Attrs({{"hidden_size", int64_t{5}}}));
  EXPECT_EQ(bad_w.Infer().code(), ErrorCode::kShapeMismatch);  // W needs 3 * 5 rows
  GraphBuilder target;
  target.Op("NegativeLogLikelihoodLoss",
            {target.In(kFloat32, {2, 4, 6}), target.In(kInt64, {2, 5})});
  EXPECT_EQ(target.Infer().code(), ErrorCode::kShapeMismatch);
}

TEST(ShapeRules, TensorOpsShapes) {
  GraphBuilder b;
  Value* img = b.In(kFloat32, {kBatch, 3, 32, 32});
  Value* flat = b.Op("Flatten", {img});
  Value* pad = b.Op("Pad", {img, b.Const(I64({8}, {0, 0, 1, 2, 0, 0, 3, 4}))});
  Value* tile = b.Op("Tile", {img, b.Const(I64({4}, {1, 2, 1, 1}))});
  Value* d2s = b.Op("DepthToSpace", {b.In(kFloat32, {kBatch, 12, 4, 4})},
                    Attrs({{"blocksize", int64_t{2}}}));
  Value* gath = b.Op("Gather", {b.In(kFloat32, {1000, 64}), b.In(kInt64, {kBatch, kSeq})});
  Value* oh = b.Op("OneHot", {b.In(kInt64, {kBatch}), b.Const(I64({}, {10})), b.In(kFloat32, {2})});
  Value* cat = b.Op("Concat", {b.In(kFloat32, {kBatch, 1, 64}), b.In(kFloat32, {kBatch, 16, 64})},
                    Attrs({{"axis", int64_t{1}}}));
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(flat->shape(), (Shape{kBatch, 3 * 32 * 32}));
  EXPECT_EQ(pad->shape(), (Shape{kBatch, 3, 36, 38}));
  EXPECT_EQ(tile->shape(), (Shape{kBatch, 6, 32, 32}));
  EXPECT_EQ(d2s->shape(), (Shape{kBatch, 3, 8, 8}));
  EXPECT_EQ(gath->shape(), (Shape{kBatch, kSeq, 64}));
  EXPECT_EQ(oh->shape(), (Shape{kBatch, 10}));
  EXPECT_EQ(cat->shape(), (Shape{kBatch, 17, 64}));

  GraphBuilder bad;
  bad.Op("Concat", {bad.In(kFloat32, {2, 3}), bad.In(kFloat32, {2, 4})},
         Attrs({{"axis", int64_t{0}}}));
  EXPECT_EQ(bad.Infer().code(), ErrorCode::kShapeMismatch);
}

TEST(ShapeRules, GatherNdScatterElementsScatterNd) {
  GraphBuilder b;
  Value* boxes = b.In(kFloat32, {kBatch, 100, 4});
  Value* picks =
      b.Op("GatherND", {boxes, b.In(kInt64, {kBatch, 7, 1})}, Attrs({{"batch_dims", int64_t{1}}}));
  Value* cells = b.Op("GatherND", {b.In(kFloat32, {5, 6, 7}), b.In(kInt32, {kSeq, 2})});
  Value* scat =
      b.Op("ScatterElements",
           {b.In(kFloat32, {kBatch, 9}), b.In(kInt64, {kBatch, 3}), b.In(kFloat32, {kBatch, 3})},
           Attrs({{"axis", int64_t{-1}}, {"reduction", std::string("max")}}));
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(picks->shape(), (Shape{kBatch, 7, 4}));
  EXPECT_EQ(cells->shape(), (Shape{kSeq, 7}));
  EXPECT_EQ(scat->shape(), (Shape{kBatch, 9}));
  GraphBuilder along;  // longer than data on the gather axis itself is allowed
  Value* ge = along.Op("GatherElements", {along.In(kFloat32, {2, 3}), along.In(kInt64, {2, 7})},
                       Attrs({{"axis", int64_t{1}}}));
  ASSERT_TRUE(along.Infer().ok());
  EXPECT_EQ(ge->shape(), (Shape{2, 7}));
  GraphBuilder nd;
  Value* rows = nd.Op("ScatterND", {nd.In(kFloat32, {kBatch, 5}), nd.In(kInt64, {kSeq, 1}),
                                    nd.In(kFloat32, {kSeq, 5})});
  ASSERT_TRUE(nd.Infer().ok());
  EXPECT_EQ(rows->shape(), (Shape{kBatch, 5}));

  struct Bad {
    const char* what;
    std::function<void(GraphBuilder&)> add;
    ErrorCode code;
  };
  std::vector<Bad> bad = {
      {"tuple longer than data",
       [](GraphBuilder& g) {
         g.Op("GatherND", {g.In(kFloat32, {2, 3}), g.In(kInt64, {4, 3})});
       },
       ErrorCode::kShapeMismatch},
      {"symbolic tuple length",
       [](GraphBuilder& g) {
         g.Op("GatherND", {g.In(kFloat32, {2, 3}), g.In(kInt64, {4, kSeq})});
       },
       ErrorCode::kShapeMismatch},
      {"batch dims differ",
       [](GraphBuilder& g) {
         g.Op("GatherND", {g.In(kFloat32, {2, 3}), g.In(kInt64, {3, 1})},
              Attrs({{"batch_dims", int64_t{1}}}));
       },
       ErrorCode::kShapeMismatch},
      {"batch_dims too large",
       [](GraphBuilder& g) {
         g.Op("GatherND", {g.In(kFloat32, {2, 3}), g.In(kInt64, {2, 1})},
              Attrs({{"batch_dims", int64_t{2}}}));
       },
       ErrorCode::kInvalidAttribute},
      {"float indices",
       [](GraphBuilder& g) {
         g.Op("GatherND", {g.In(kFloat32, {2, 3}), g.In(kFloat32, {1, 1})});
       },
       ErrorCode::kTypeMismatch},
      {"updates shape differs",
       [](GraphBuilder& g) {
         g.Op("ScatterElements",
              {g.In(kFloat32, {4, 4}), g.In(kInt64, {2, 2}), g.In(kFloat32, {2, 3})});
       },
       ErrorCode::kShapeMismatch},
      {"indices rank differs",
       [](GraphBuilder& g) {
         g.Op("ScatterElements", {g.In(kFloat32, {4, 4}), g.In(kInt64, {2}), g.In(kFloat32, {2})});
       },
       ErrorCode::kShapeMismatch},
      {"bad reduction",
       [](GraphBuilder& g) {
         g.Op("ScatterElements", {g.In(kFloat32, {4}), g.In(kInt64, {2}), g.In(kFloat32, {2})},
              Attrs({{"reduction", std::string("mean")}}));
       },
       ErrorCode::kInvalidAttribute},
      {"axis out of range",
       [](GraphBuilder& g) {
         g.Op("ScatterElements", {g.In(kFloat32, {4}), g.In(kInt64, {2}), g.In(kFloat32, {2})},
              Attrs({{"axis", int64_t{1}}}));
       },
       ErrorCode::kInvalidAttribute},
      {"updates type differs",
       [](GraphBuilder& g) {
         g.Op("ScatterElements", {g.In(kFloat32, {4}), g.In(kInt64, {2}), g.In(kInt64, {2})});
       },
       ErrorCode::kTypeMismatch},
      {"GatherElements indices longer than data off the axis",
       [](GraphBuilder& g) {
         g.Op("GatherElements", {g.In(kFloat32, {2, 3}), g.In(kInt64, {3, 5})},
              Attrs({{"axis", int64_t{1}}}));
       },
       ErrorCode::kShapeMismatch},
      {"ScatterElements indices longer than data off the axis",
       [](GraphBuilder& g) {
         g.Op("ScatterElements",
              {g.In(kFloat32, {2, 3}), g.In(kInt64, {1, 4}), g.In(kFloat32, {1, 4})});
       },
       ErrorCode::kShapeMismatch},
      {"ScatterND tuple longer than data",
       [](GraphBuilder& g) {
         g.Op("ScatterND", {g.In(kFloat32, {4, 4}), g.In(kInt64, {2, 3}), g.In(kFloat32, {2})});
       },
       ErrorCode::kShapeMismatch},
      {"ScatterND updates too short",
       [](GraphBuilder& g) {
         g.Op("ScatterND", {g.In(kFloat32, {4, 5}), g.In(kInt64, {2, 1}), g.In(kFloat32, {2, 4})});
       },
       ErrorCode::kShapeMismatch},
      {"ScatterND updates of another rank",
       [](GraphBuilder& g) {
         g.Op("ScatterND", {g.In(kFloat32, {4, 5}), g.In(kInt64, {2, 2}), g.In(kFloat32, {2, 1})});
       },
       ErrorCode::kShapeMismatch},
  };
  for (const Bad& c : bad) {
    SCOPED_TRACE(c.what);
    GraphBuilder g;
    c.add(g);
    EXPECT_EQ(g.Infer().code(), c.code);
  }
}

// At run time the same rules see integers: InferNode on concrete shapes.
TEST(ShapeRules, ConcreteDimsAtRunTime) {
  Graph g;
  Value* x = g.AddInput("x", kFloat32, {2, 5, 64});
  Value* t = g.AddConstant("t", I64({4}, {0, 0, 4, -1}));
  Value* y = g.AddValue("y");
  Node* n = g.AddNode("Reshape", "r", {x, t}, {y});
  ValueInfo xi{kFloat32, {2, 5, 64}, nullptr, std::nullopt};
  ValueInfo ti{kInt64, {4}, t->constant(), std::nullopt};
  std::vector<const ValueInfo*> ins = {&xi, &ti};
  std::vector<ValueInfo> outs(1);
  ASSERT_TRUE(InferNode(*n, ins, outs).ok());
  EXPECT_EQ(StaticDims(outs[0].shape), (std::vector<int64_t>{2, 5, 4, 16}));
}

TEST(ShapeRules, OnnxDtypeMappingRoundTrips) {
  for (int64_t code :
       {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26}) {
    auto t = DataTypeFromOnnx(code);
    ASSERT_TRUE(t.has_value()) << code;
    EXPECT_EQ(OnnxDataTypeCode(*t), code);
  }
  EXPECT_FALSE(DataTypeFromOnnx(8).has_value());   // string
  EXPECT_FALSE(DataTypeFromOnnx(14).has_value());  // complex64
  EXPECT_EQ(*DataTypeFromOnnx(17), kFloat8E4M3FN);
  EXPECT_EQ(*DataTypeFromOnnx(22), kInt4);
  EXPECT_EQ(*DataTypeFromOnnx(26), kInt2);
  EXPECT_EQ(*DataTypeFromOnnx(11), kFloat64);
  EXPECT_EQ(*DataTypeFromOnnx(5), kInt16);
  EXPECT_EQ(*DataTypeFromOnnx(13), kUInt64);
  EXPECT_EQ(*DataTypeFromOnnx(10), kFloat16);
  EXPECT_EQ(*DataTypeFromOnnx(16), kBFloat16);
}

TEST(ShapeRules, ArityIsChecked) {
  GraphBuilder b;
  b.Op("Where", {b.In(kBool, {2}), b.In(kFloat32, {2})});
  Status s = b.Infer();
  EXPECT_EQ(s.code(), ErrorCode::kInvalidModel);
  EXPECT_NE(s.message().find("2 inputs"), std::string::npos) << s.message();
  EXPECT_NE(FindOpSchema("LayerNormalization"), nullptr);
  EXPECT_NE(FindOpSchema("NonZero"),
            nullptr);  // data-dependent output shape (ops/data_dependent.cc)
  EXPECT_EQ(FindOpSchema("NoSuchOp"), nullptr);
}

}  // namespace
}  // namespace kiln
