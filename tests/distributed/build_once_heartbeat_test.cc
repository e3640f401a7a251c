// BuildOnce's heartbeats, with two ranks as two threads over an in-process communicator: the
// waiting rank sees the builder's progress lines, and a builder whose heartbeats stop is named in
// KILN-E7003 after heartbeat_timeout, long before wait_timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/distributed/build_once.h"

namespace kiln::distributed {
namespace {

// Two ranks' mailboxes: collectives are matched by their sequence number.
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::byte>> gathered[2];  // per rank, per AllGather
  std::vector<std::vector<std::byte>> broadcasts;   // rank 0's, in order
  std::atomic<bool> rank0_silent{false};            // rank 0's broadcasts stop arriving
};

class ThreadComm : public Communicator {
 public:
  ThreadComm(Exchange* ex, int rank) : ex_(ex), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string_view kind() const override { return "threads"; }

  StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine, Deadline deadline,
                                             std::string_view what) override {
    std::unique_lock<std::mutex> lock(ex_->mu);
    size_t seq = ex_->gathered[rank_].size();
    ex_->gathered[rank_].emplace_back(mine.begin(), mine.end());
    ex_->cv.notify_all();
    int other = 1 - rank_;
    if (!ex_->cv.wait_until(lock, deadline, [&] { return ex_->gathered[other].size() > seq; })) {
      return MakeError(ErrorCode::kRankMissing, "{}: rank {} did not arrive", what, other);
    }
    std::vector<std::byte> all = ex_->gathered[0][seq];
    all.insert(all.end(), ex_->gathered[1][seq].begin(), ex_->gathered[1][seq].end());
    return all;
  }

  Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline,
                   std::string_view what) override {
    std::unique_lock<std::mutex> lock(ex_->mu);
    if (rank_ == root) {
      if (!ex_->rank0_silent) ex_->broadcasts.emplace_back(bytes.begin(), bytes.end());
      ex_->cv.notify_all();
      return OkStatus();
    }
    size_t seq = received_++;
    if (!ex_->cv.wait_until(lock, deadline, [&] { return ex_->broadcasts.size() > seq; })) {
      return MakeError(ErrorCode::kCollectiveTimeout, "{}: nothing from rank {}", what, root);
    }
    std::memcpy(bytes.data(), ex_->broadcasts[seq].data(), bytes.size());
    return OkStatus();
  }

  StatusOr<std::unique_ptr<Communicator>> Split(int, int) override {
    return MakeError(ErrorCode::kUnimplemented, "no split");
  }

 private:
  Exchange* ex_;
  int rank_;
  size_t received_ = 0;
};

CacheKey TestKey() {
  return KeyBuilder().Config("case", "heartbeat").Target("cpu", "cpu-test").Build();
}

BuildOnceOptions Options(ThreadComm* comm, int rank) {
  BuildOnceOptions o;
  o.transport = Transport::kMpi;
  o.comm = comm;
  o.rank_overrides.rank = rank;
  o.rank_overrides.world_size = 2;
  o.join_timeout = std::chrono::seconds(2);  // also how long rank 0 waits for a rank 1 that gave up
  o.wait_timeout = std::chrono::seconds(30);
  o.transfer_timeout = std::chrono::seconds(10);
  o.heartbeat_interval = std::chrono::milliseconds(50);
  o.heartbeat_timeout = std::chrono::milliseconds(500);
  return o;
}

// Rank 0 builds for `build_ms`, reporting a line per step; rank 1 waits.
struct PairRun {
  StatusOr<BuildOnceResult> results[2] = {Status(ErrorCode::kInternal, "not run"),
                                          Status(ErrorCode::kInternal, "not run")};
  std::vector<std::string> seen;  // rank 1's relayed lines
  double rank1_seconds = 0;
};

PairRun RunPair(Exchange& ex, int steps, std::function<void(int)> on_step) {
  PairRun run;
  ThreadComm c0(&ex, 0), c1(&ex, 1);
  BuildFn build = [&](ProgressSink& sink) -> StatusOr<std::vector<std::byte>> {
    for (int i = 0; i < steps; ++i) {
      sink.Update("tactics " + std::to_string(i) + "/" + std::to_string(steps));
      on_step(i);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
    return std::vector<std::byte>(100, std::byte{7});
  };
  std::thread t0([&] { run.results[0] = BuildOnce(TestKey(), Options(&c0, 0), build); });
  std::thread t1([&] {
    BuildOnceOptions o = Options(&c1, 1);
    o.on_progress = [&](const std::string& line) { run.seen.push_back(line); };
    const Clock::time_point start = Clock::now();
    run.results[1] = BuildOnce(TestKey(), o, build);
    run.rank1_seconds = SecondsSince(start);
  });
  t1.join();
  ex.rank0_silent = false;
  ex.cv.notify_all();
  t0.join();
  return run;
}

TEST(BuildOnceHeartbeatTest, WaitingRankSeesTheBuildersProgress) {
  Exchange ex;
  PairRun run = RunPair(ex, 10, [](int) {});
  ASSERT_TRUE(run.results[0].ok()) << run.results[0].status().ToString();
  ASSERT_TRUE(run.results[1].ok()) << run.results[1].status().ToString();
  EXPECT_EQ(run.results[1]->bytes, run.results[0]->bytes);
  EXPECT_EQ(run.results[1]->bytes.size(), 100u);
  ASSERT_GE(run.seen.size(), 3u);  // 400 ms of building, a heartbeat every 50 ms
  for (const std::string& line : run.seen) EXPECT_EQ(line.rfind("tactics ", 0), 0u) << line;
}

TEST(BuildOnceHeartbeatTest, SilentBuilderIsNamedAfterTheHeartbeatBound) {
  Exchange ex;
  // After a few steps rank 0's messages stop arriving (a stopped process), and the build goes on
  // for far longer than the heartbeat bound.
  PairRun run = RunPair(ex, 50, [&](int step) {
    if (step == 3) ex.rank0_silent = true;
  });
  ASSERT_FALSE(run.results[1].ok());
  EXPECT_EQ(run.results[1].status().code(), ErrorCode::kRankMissing)
      << run.results[1].status().ToString();
  EXPECT_NE(run.results[1].status().message().find("heartbeat"), std::string::npos);
  EXPECT_LT(run.rank1_seconds, 1.9);  // 0.5 s bound, not the 30 s wait_timeout
  EXPECT_GE(run.rank1_seconds, 0.5);
}

}  // namespace
}  // namespace kiln::distributed
