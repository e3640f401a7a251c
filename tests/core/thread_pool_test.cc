#include "kiln/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>

namespace kiln {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 1000, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(6, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(10, [&](int64_t b2, int64_t e2) { sum += (e2 - b2) * i; });
    }
  });
  EXPECT_EQ(sum.load(), 10 * (0 + 1 + 2 + 3 + 4 + 5));
}

}  // namespace
}  // namespace kiln
