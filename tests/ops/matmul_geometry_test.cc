// ResolveMatMulGeometry: the MatMul batch/broadcast geometry every backend's MatMul plans from.
#include "kiln/ops/matmul_geometry.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln {
namespace {

using Dims = std::vector<int64_t>;

TEST(MatMulGeometry, BatchedAWithUnbatchedBFoldsIntoOneGemm) {
  auto g = ResolveMatMulGeometry(false, false, Dims{2, 3, 4, 5}, Dims{5, 7}, true);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->m, 4);
  EXPECT_EQ(g->k, 5);
  EXPECT_EQ(g->n, 7);
  EXPECT_EQ(g->batch_dims, (Dims{2, 3}));
  EXPECT_EQ(g->batch, 6);
  EXPECT_TRUE(g->fold);
  EXPECT_TRUE(g->a_offsets.empty());  // no per-batch offsets when folded
}

TEST(MatMulGeometry, TwoSidedBroadcastGivesPerBatchOffsets) {
  // A [2,1,3,4] x B [1,3,4,5] -> [2,3,3,5]: A steps over dim 0 only, B over dim 1 only.
  auto g = ResolveMatMulGeometry(false, false, Dims{2, 1, 3, 4}, Dims{1, 3, 4, 5}, true);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_FALSE(g->fold);
  EXPECT_EQ(g->batch_dims, (Dims{2, 3}));
  EXPECT_EQ(g->a_offsets, (Dims{0, 0, 0, 12, 12, 12}));
  EXPECT_EQ(g->b_offsets, (Dims{0, 20, 40, 0, 20, 40}));
}

TEST(MatMulGeometry, TransposesApplyToMatricesNotToVectors) {
  auto g = ResolveMatMulGeometry(true, true, Dims{3, 5, 4}, Dims{3, 7, 5}, false);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->ta);
  EXPECT_TRUE(g->tb);
  EXPECT_EQ(g->m, 4);
  EXPECT_EQ(g->k, 5);
  EXPECT_EQ(g->n, 7);
  EXPECT_FALSE(g->fold);              // B is batched
  EXPECT_TRUE(g->a_offsets.empty());  // not asked for
  // A 1-D A is [1, K] and is never transposed; a 1-D B is [K, 1].
  auto v = ResolveMatMulGeometry(true, true, Dims{5}, Dims{5}, true);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_FALSE(v->ta);
  EXPECT_FALSE(v->tb);
  EXPECT_EQ(v->m, 1);
  EXPECT_EQ(v->k, 5);
  EXPECT_EQ(v->n, 1);
  EXPECT_EQ(v->batch, 1);
}

TEST(MatMulGeometry, BadShapesAreShapeMismatchesThatSayWhy) {
  auto inner = ResolveMatMulGeometry(false, false, Dims{3, 4}, Dims{5, 6}, false);
  ASSERT_FALSE(inner.ok());
  EXPECT_EQ(inner.status().code(), ErrorCode::kShapeMismatch);
  EXPECT_NE(inner.status().message().find("inner dims differ (4 vs 5)"), std::string::npos);
  auto batch = ResolveMatMulGeometry(false, false, Dims{2, 3, 4}, Dims{3, 4, 5}, false);
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.status().message().find("batch dims 2 and 3 do not broadcast"),
            std::string::npos);
  auto scalar = ResolveMatMulGeometry(false, false, Dims{}, Dims{3}, false);
  ASSERT_FALSE(scalar.ok());
  EXPECT_EQ(scalar.status().code(), ErrorCode::kShapeMismatch);
}

}  // namespace
}  // namespace kiln
