// The op table (ops.inc through op_table.h): every op has a shape rule and a traits row (precision
// class), traits are consistent, attribute readers give the table's defaults, op-type lookup.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kiln/ops/op_table.h"

namespace kiln {
namespace {

using namespace op_traits;

TEST(OpTable, EveryOpHasAShapeRule) {
  for (const OpSchema& s : AllOpSchemas()) EXPECT_NE(s.infer, nullptr) << s.name;
}

// An op without a KILN_OP_TRAITS row has no precision class: precision would treat it as
// reducible and the layout pass would stop at it, both silently.
TEST(OpTable, EveryOpHasATraitsRowAndPrecisionClass) {
  std::vector<std::string> missing;
  for (const OpSchema& s : AllOpSchemas()) {
    if (!GetOpTraits(s.type).declared) missing.emplace_back(s.name);
  }
  EXPECT_TRUE(missing.empty()) << "ops.inc lacks KILN_OP_TRAITS for: "
                               << ::testing::PrintToString(missing);
}

TEST(OpTable, TraitsAreConsistent) {
  for (const OpSchema& s : AllOpSchemas()) {
    SCOPED_TRACE(std::string(s.name));
    const OpTraits& t = GetOpTraits(s.type);
    EXPECT_GE(t.first_opset, 1);
    EXPECT_LE(t.first_opset, s.latest_opset);
    // Running unchanged on a permuted tensor needs elementwise semantics.
    if (t.flags & kLayoutAgnostic) {
      EXPECT_TRUE(t.flags & kElementwise);
    }
    // An epilogue is a one-input activation over the product.
    if (t.flags & kEpilogue) {
      EXPECT_TRUE((t.flags & kElementwise) && s.min_inputs == 1);
    }
    // Kept or untouched ops say why (the precision report shows it); reducible ones need not.
    if (t.precision != PrecisionClass::kReducible) {
      EXPECT_FALSE(t.precision_reason.empty());
    }
    if (t.fixed_inputs != 0) {
      EXPECT_LT(t.fixed_inputs, 1u << s.max_inputs);
    }
  }
}

TEST(OpTable, TraitsOfKnownOps) {
  EXPECT_TRUE(HasTrait(OpType::kRelu, kEpilogue));
  EXPECT_TRUE(HasTrait(OpType::kGelu, kEpilogue));
  EXPECT_FALSE(HasTrait(OpType::kTanh, kEpilogue));
  EXPECT_TRUE(HasTrait(OpType::kReshape, kView));
  EXPECT_FALSE(HasTrait(OpType::kTranspose, kView));
  EXPECT_TRUE(HasTrait(OpType::kConv, kChannelsLast));
  EXPECT_FALSE(HasTrait(OpType::kGlobalMaxPool, kChannelsLast));
  EXPECT_TRUE(HasTrait(OpType::kAdd, kLayoutAgnostic));
  EXPECT_FALSE(HasTrait(OpType::kEqual, kLayoutAgnostic));
  EXPECT_EQ(GetOpTraits(OpType::kExp).precision, PrecisionClass::kKeepFp32);
  EXPECT_EQ(GetOpTraits(OpType::kShape).precision, PrecisionClass::kUntouched);
  EXPECT_EQ(GetOpTraits(OpType::kConv).precision, PrecisionClass::kReducible);
  EXPECT_EQ(GetOpTraits(OpType::kResize).fixed_inputs, (1u << 1) | (1u << 2));
  EXPECT_EQ(GetOpTraits(OpType::kGelu).first_opset, 20);
  // Not a declared op: default traits, nothing declared.
  EXPECT_FALSE(GetOpTraits(OpType::kNumOps).declared);
  EXPECT_EQ(GetOpTraits(OpType::kNumOps).flags, 0u);
}

TEST(OpTable, LookupByName) {
  EXPECT_EQ(LookupOpType("LeakyRelu"), OpType::kLeakyRelu);
  EXPECT_EQ(LookupOpType("FusedConv"), OpType::kFusedConv);
  EXPECT_EQ(LookupOpType("leakyrelu"), std::nullopt);
  EXPECT_EQ(LookupOpType("NoSuchOp"), std::nullopt);
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, MakeShape({2}));
  Node* relu = g.AddNode("Relu", "r", {x}, {g.AddValue("y")});
  Node* foreign = g.AddNode("MyCustomOp", "c", {x}, {g.AddValue("z")});
  EXPECT_EQ(OpTypeOf(*relu), OpType::kRelu);
  EXPECT_TRUE(IsOp(*relu, OpType::kRelu));
  EXPECT_EQ(OpTypeOf(*foreign), OpType::kNumOps);
  relu->set_op_type("Sigmoid");  // a pass rewriting the op: the lookup follows
  EXPECT_EQ(OpTypeOf(*relu), OpType::kSigmoid);
}

TEST(OpTable, AttributeReadersGiveTheTableDefault) {
  AttributeMap none;
  EXPECT_FLOAT_EQ(attrs::LeakyRelu::alpha(none), 0.01f);
  EXPECT_FLOAT_EQ(attrs::Selu::alpha(none), 1.67326319217681884765625f);
  EXPECT_FLOAT_EQ(attrs::Selu::gamma(none), 1.05070102214813232421875f);
  EXPECT_FLOAT_EQ(attrs::HardSigmoid::beta(none), 0.5f);
  EXPECT_EQ(attrs::Gelu::approximate(none), "none");
  EXPECT_EQ(attrs::Softmax::axis(none), -1);
  EXPECT_EQ(attrs::ArgMax::axis(none), 0);
  EXPECT_EQ(attrs::Transpose::perm(none), std::vector<int64_t>{});
  EXPECT_TRUE(std::isinf(attrs::FusedConv::activation_min(none)));
  EXPECT_LT(attrs::FusedConv::activation_min(none), 0.f);

  AttributeMap set;
  set.Set("alpha", 0.2f);
  set.Set("approximate", std::string("tanh"));
  set.Set("perm", std::vector<int64_t>{1, 0});
  EXPECT_FLOAT_EQ(attrs::LeakyRelu::alpha(set), 0.2f);
  EXPECT_EQ(attrs::Gelu::approximate(set), "tanh");
  EXPECT_EQ(attrs::Transpose::perm(set), (std::vector<int64_t>{1, 0}));
  // A wrong-kind attribute reads as the default (the shape rule reports KILN-E2009).
  AttributeMap wrong;
  wrong.Set("alpha", std::string("3"));
  EXPECT_FLOAT_EQ(attrs::Elu::alpha(wrong), 1.0f);
}

TEST(OpTable, AttributeSpecsAreUniqueAndTyped) {
  std::set<std::pair<OpType, std::string_view>> seen;
  for (const AttrSpec& s : AllAttrSpecs()) {
    SCOPED_TRACE(std::string(GetOpSchema(s.op).name) + "." + std::string(s.name));
    EXPECT_TRUE(seen.insert({s.op, s.name}).second) << "declared twice";
    EXPECT_EQ(KindOf(s.default_value), s.kind);
  }
  const AttrSpec* alpha = FindAttrSpec(OpType::kLeakyRelu, "alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_FLOAT_EQ(std::get<float>(alpha->default_value), 0.01f);
  EXPECT_EQ(FindAttrSpec(OpType::kRelu, "alpha"), nullptr);
}

}  // namespace
}  // namespace kiln
