// ReadAttentionAttrs: the fused Attention op's attributes, read once for every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kiln/ops/fused.h"

namespace kiln {
namespace {

TEST(AttentionAttrs, DefaultsAreBhsdNoMaskAndTheDefaultScale) {
  auto a = ReadAttentionAttrs(AttributeMap());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->mask, AttentionMask::kNone);
  EXPECT_EQ(a->layout, AttentionLayout::kBhsd);
  EXPECT_TRUE(a->default_scale);
  EXPECT_FALSE(a->qkv_packed);
  EXPECT_TRUE(std::isinf(a->mask_fill) && a->mask_fill < 0);
}

TEST(AttentionAttrs, PackedBsdWithHeadsScaleAndFill) {
  AttributeMap m;
  m.Set("mask_kind", std::string("boolean"));
  m.Set("layout", std::string("bsd"));
  m.Set("num_heads", int64_t{12});
  m.Set("qkv_packed", int64_t{1});
  m.Set("scale", 0.125f);
  m.Set("mask_fill", -1e4f);
  auto a = ReadAttentionAttrs(m);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->mask, AttentionMask::kBoolean);
  EXPECT_EQ(a->layout, AttentionLayout::kBsd);
  EXPECT_EQ(a->heads, 12);
  EXPECT_TRUE(a->qkv_packed);
  EXPECT_FALSE(a->default_scale);
  EXPECT_EQ(a->scale, 0.125f);
  EXPECT_EQ(a->mask_fill, -1e4f);
}

TEST(AttentionAttrs, BadAttributesAreInvalidAttributeErrorsThatSayWhy) {
  auto expect_error = [](const AttributeMap& m, const std::string& says) {
    auto a = ReadAttentionAttrs(m);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidAttribute);
    EXPECT_NE(a.status().message().find(says), std::string::npos) << a.status().message();
  };
  AttributeMap kind;
  kind.Set("mask_kind", std::string("sliding"));
  expect_error(kind, "mask_kind 'sliding' is not one of none, additive, boolean, causal");
  AttributeMap layout;
  layout.Set("layout", std::string("sbhd"));
  expect_error(layout, "layout 'sbhd' is not one of bhsd, bshd, bsd");
  AttributeMap heads;
  heads.Set("layout", std::string("bsd"));
  expect_error(heads, "needs num_heads > 0 (got 0)");
  AttributeMap packed;
  packed.Set("qkv_packed", int64_t{1});
  expect_error(packed, "qkv_packed needs layout 'bsd'");
}

}  // namespace
}  // namespace kiln
