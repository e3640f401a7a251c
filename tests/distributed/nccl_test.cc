// NCCL transport on a GPU: world size 1 broadcast, and a non-blocking init that times out and
// aborts when the other rank never joins. Skips where no CUDA device is present (CI).
#include "kiln/distributed/nccl_comm.h"

#include <gtest/gtest.h>

#include "kiln/core/hash.h"

namespace kiln::distributed {
namespace {

TEST(NcclTest, WorldSizeOneBroadcastKeepsBytes) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  StatusOr<NcclId> id = NewNcclId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  NcclOptions o;
  o.chunk_bytes = 1 << 20;  // several chunks for the 3.5 MiB below
  auto b = NcclBroadcaster::Create(0, 1, *id, Clock::now() + std::chrono::seconds(30), o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_GT((*b)->setup_seconds(), 0.0);
  std::vector<std::byte> bytes(3 * (1 << 20) + 12345);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 131 % 251);
  const Hash128 before = HashBytes(bytes);
  ASSERT_TRUE((*b)->Broadcast(bytes, 0, Clock::now() + std::chrono::seconds(30)).ok());
  EXPECT_EQ(HashBytes(bytes), before);
}

TEST(NcclTest, InitTimesOutAndAbortsWhenARankNeverJoins) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  StatusOr<NcclId> id = NewNcclId();
  ASSERT_TRUE(id.ok());
  const auto t0 = Clock::now();
  // Rank 0 of 2; rank 1 never exists.
  auto b =
      NcclBroadcaster::Create(0, 2, *id, Clock::now() + std::chrono::seconds(3), NcclOptions{});
  const double waited = SecondsSince(t0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kCommInitTimeout) << b.status().ToString();
  EXPECT_GE(waited, 3.0);
  EXPECT_LT(waited, 10.0);  // the bound plus the abort, never NCCL's own wait
}

}  // namespace
}  // namespace kiln::distributed
