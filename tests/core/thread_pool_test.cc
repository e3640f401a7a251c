#include "kiln/core/thread_pool.h"

#include <gtest/gtest.h>

#include <memory>

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>

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

// Many back-to-back jobs of varying width (some workers get no chunk) with waits that spin,
// sleep at once (spin 0) or outlast the spin (workers fall asleep between jobs): every index is
// covered exactly once, every time.
TEST(ThreadPool, HandOffIsExactWhetherWorkersSpinOrSleep) {
  for (int64_t spin_us : {int64_t{0}, int64_t{50}, int64_t{100000}}) {
    ThreadPool pool(4, spin_us);
    std::vector<int64_t> seen(8);
    for (int round = 0; round < 3000; ++round) {
      int64_t n = 1 + round % 7;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "spin " << spin_us << " round " << round << " i " << i;
      }
      if (spin_us == 50 && round % 500 == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin: sleep
      }
    }
  }
}

// Destroying a pool whose workers are spinning or asleep returns (no lost stop signal).
TEST(ThreadPool, DestructionWakesSpinningAndSleepingWorkers) {
  for (int64_t spin_us : {int64_t{0}, int64_t{1000000}}) {
    auto pool = std::make_unique<ThreadPool>(3, spin_us);
    std::atomic<int64_t> sum{0};
    pool->ParallelFor(3, [&](int64_t b, int64_t e) { sum += e - b; });
    pool.reset();
    EXPECT_EQ(sum.load(), 3);
  }
}

}  // namespace
}  // namespace kiln
