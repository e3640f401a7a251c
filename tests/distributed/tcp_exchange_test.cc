// The TCP control channel of launches without MPI, as real separate processes launched the way
// torchrun launches them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment, no
// mpirun): an opaque 128-byte value (an NCCL unique id's size) reaches every rank; a rank 0 that
// never starts, a missing rank and a wrong world size each fail every rank within the bound with
// an error naming the rank and the address; BuildOnce's NCCL path runs its control over it.
#include "kiln/distributed/tcp_exchange.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "kiln/core/hash.h"
#include "kiln/distributed/build_once.h"

namespace kiln::distributed {
namespace {

// Ports differ per test process and per test, so parallel ctest runs do not collide.
int TestPort(int which) { return 20000 + (getpid() % 2000) * 8 + which; }

struct Outcome {
  std::string line;  // "ok <hex>" or "<KILN-E id> <message>"
  double seconds = 0;
  bool exited = false;
};

// Runs `fn(rank)` in a forked child per entry of `ranks` with the torchrun variables set, each
// started `stagger_ms` apart in the listed order; collects each child's one-line answer.
// Children that outlive `bound` are killed (and reported as not exited).
std::vector<Outcome> RunRanks(const std::vector<int>& ranks, int world, int port,
                              const std::function<std::string(int)>& fn,
                              std::chrono::milliseconds bound, int stagger_ms = 0,
                              const std::vector<int>& claimed_world = {}) {
  struct Child {
    pid_t pid;
    int fd;
    Clock::time_point start;
  };
  std::vector<Child> children;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0 && stagger_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stagger_ms));
    int p[2];
    if (pipe(p) != 0) return {};
    const Clock::time_point start = Clock::now();
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      const int w = i < claimed_world.size() ? claimed_world[i] : world;
      setenv("RANK", std::to_string(ranks[i]).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(w).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(ranks[i]).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(w).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      for (const char* v : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_SIZE",
                            "PMI_RANK", "SLURM_PROCID", "SLURM_NTASKS"}) {
        unsetenv(v);
      }
      const std::string line = fn(ranks[i]) + "\n";
      (void)!write(p[1], line.data(), line.size());
      _exit(0);
    }
    close(p[1]);
    children.push_back({pid, p[0], start});
  }
  std::vector<Outcome> out(children.size());
  const Deadline deadline = Clock::now() + bound;
  for (size_t i = 0; i < children.size(); ++i) {
    std::string text;
    char buf[4096];
    for (;;) {
      pollfd p{children[i].fd, POLLIN, 0};
      const int left = static_cast<int>(std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
      if (poll(&p, 1, left) <= 0) break;
      const ssize_t n = read(children[i].fd, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    out[i].seconds = SecondsSince(children[i].start);
    close(children[i].fd);
    // EOF on the pipe means the child is exiting; reaping it may lag a moment behind.
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(children[i].pid, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      kill(children[i].pid, SIGKILL);
      waitpid(children[i].pid, &status, 0);
    } else {
      out[i].exited = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    while (!text.empty() && text.back() == '\n') text.pop_back();
    out[i].line = text;
  }
  return out;
}

std::vector<std::byte> Blob() {
  std::vector<std::byte> v(128);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::byte(static_cast<uint8_t>(i * 37 + 11));
  return v;
}

std::string Describe(const Status& s) { return s.Id() + " " + std::string(s.message()); }

// A child: discover the rank from the environment as a real process would, then exchange.
std::function<std::string(int)> Exchange(std::chrono::milliseconds bound) {
  return [bound](int) -> std::string {
    StatusOr<RankInfo> me = DiscoverRank();
    if (!me.ok()) return Describe(me.status());
    const std::vector<std::byte> blob = Blob();
    StatusOr<std::vector<std::byte>> got = TcpExchange(
        *me, me->rank == 0 ? std::span<const std::byte>(blob) : std::span<const std::byte>(),
        blob.size(), Clock::now() + bound);
    if (!got.ok()) return Describe(got.status());
    return "ok " + HashBytes(*got).Hex();
  };
}

TEST(TcpExchangeTest, EveryProcessReceivesRankZerosBlob) {
  const std::string want = "ok " + HashBytes(Blob()).Hex();
  // Rank 0 starts last, 150 ms after the others: they must retry until it listens.
  std::vector<Outcome> got = RunRanks({3, 2, 1, 0}, 4, TestPort(0),
                                      Exchange(std::chrono::seconds(10)), std::chrono::seconds(20),
                                      /*stagger_ms=*/50);
  ASSERT_EQ(got.size(), 4u);
  for (const Outcome& o : got) {
    EXPECT_TRUE(o.exited);
    EXPECT_EQ(o.line, want);
  }
}

TEST(TcpExchangeTest, RankZeroThatNeverStartsFailsEveryRankWithinTheBoundNamingTheAddress) {
  const int port = TestPort(1);
  const auto bound = std::chrono::milliseconds(800);
  std::vector<Outcome> got = RunRanks({1, 2}, 3, port, Exchange(bound), std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 2u);
  const std::string where =
      fmt::format("127.0.0.1:{} (MASTER_PORT {} + offset {})", port + kTcpExchangePortOffset, port,
                  kTcpExchangePortOffset);
  for (const Outcome& o : got) {
    EXPECT_TRUE(o.exited);
    EXPECT_TRUE(o.line.starts_with("KILN-E7003 ")) << o.line;
    EXPECT_NE(o.line.find("could not reach rank 0 at " + where), std::string::npos) << o.line;
    EXPECT_GE(o.seconds, 0.8);
    EXPECT_LT(o.seconds, 0.8 + 1.5) << "the bound was 0.8 s";  // fork + exit slack on 2 cores
  }
  EXPECT_NE(got[0].line.find("rank 1 could not"), std::string::npos) << got[0].line;
  EXPECT_NE(got[1].line.find("rank 2 could not"), std::string::npos) << got[1].line;
}

TEST(TcpExchangeTest, MissingRankIsNamedOnEveryRankWithinTheBound) {
  const auto bound = std::chrono::milliseconds(800);
  std::vector<Outcome> got =
      RunRanks({1, 0}, 3, TestPort(2), Exchange(bound), std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 2u);
  for (const Outcome& o : got) {
    EXPECT_TRUE(o.exited);
    EXPECT_TRUE(o.line.starts_with("KILN-E7003 ")) << o.line;
    EXPECT_NE(o.line.find("missing rank(s) 2"), std::string::npos) << o.line;
    EXPECT_LT(o.seconds, 0.8 + 1.5);
  }
}

TEST(TcpExchangeTest, WrongWorldSizeFailsEveryRankNamingTheRankAndBothSizes) {
  // Rank 2 was started with WORLD_SIZE=4; ranks 0 and 1 with 3.
  std::vector<Outcome> got =
      RunRanks({0, 1, 2}, 3, TestPort(3), Exchange(std::chrono::seconds(5)),
               std::chrono::seconds(10), /*stagger_ms=*/0, /*claimed_world=*/{3, 3, 4});
  ASSERT_EQ(got.size(), 3u);
  for (const Outcome& o : got) {
    EXPECT_TRUE(o.exited);
    EXPECT_TRUE(o.line.starts_with("KILN-E7001 ")) << o.line;
    EXPECT_NE(o.line.find("rank 2 (pid"), std::string::npos) << o.line;
    EXPECT_NE(o.line.find("claims world size 4"), std::string::npos) << o.line;
    EXPECT_NE(o.line.find("has world size 3"), std::string::npos) << o.line;
    // Rank 0 rejects at once instead of waiting for a rank 3 that cannot come.
    EXPECT_LT(o.seconds, 4.0);
  }
}

TEST(TcpExchangeTest, NeedsMasterAddress) {
  RankInfo r;
  r.rank = 1;
  r.world_size = 2;
  StatusOr<std::vector<std::byte>> got = TcpExchange(r, {}, 4, Clock::now());
  EXPECT_EQ(got.status().code(), ErrorCode::kRankEnvInvalid);
  EXPECT_NE(got.status().message().find("MASTER_ADDR"), std::string::npos);
}

TEST(TcpExchangeTest, WorldSizeOneNeedsNoAddress) {
  RankInfo r;  // world size 1, no MASTER_ADDR
  const std::vector<std::byte> blob = Blob();
  StatusOr<std::vector<std::byte>> got = TcpExchange(r, blob, blob.size(), Clock::now());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, blob);
}

// Collectives over the channel: an all-gather, and a broadcast from a rank other than 0 (relayed
// by rank 0), among 3 processes.
TEST(TcpExchangeTest, AllGatherAndRelayedBroadcastAcrossProcesses) {
  auto fn = [](int) -> std::string {
    StatusOr<RankInfo> me = DiscoverRank();
    if (!me.ok()) return Describe(me.status());
    StatusOr<std::unique_ptr<Communicator>> comm =
        TcpConnect(*me, Clock::now() + std::chrono::seconds(10));
    if (!comm.ok()) return Describe(comm.status());
    const int32_t mine = 100 + me->rank;
    StatusOr<std::vector<std::byte>> all = (*comm)->AllGather(
        std::as_bytes(std::span(&mine, 1)), Clock::now() + std::chrono::seconds(5), "test");
    if (!all.ok()) return Describe(all.status());
    std::string text;
    for (size_t i = 0; i < all->size(); i += 4) {
      int32_t v;
      std::memcpy(&v, all->data() + i, 4);
      text += std::to_string(v) + ",";
    }
    std::vector<std::byte> b(1000, std::byte{0});
    if (me->rank == 2) b.assign(1000, std::byte{0x5a});
    Status s = (*comm)->Broadcast(b, 2, Clock::now() + std::chrono::seconds(5), "test");
    if (!s.ok()) return Describe(s);
    return "ok " + text + " " + HashBytes(b).Hex();
  };
  const std::string bcast = HashBytes(std::vector<std::byte>(1000, std::byte{0x5a})).Hex();
  std::vector<Outcome> got = RunRanks({0, 1, 2}, 3, TestPort(4), fn, std::chrono::seconds(20));
  ASSERT_EQ(got.size(), 3u);
  for (const Outcome& o : got) EXPECT_EQ(o.line, "ok 100,101,102, " + bcast);
}

// BuildOnce with --transport nccl, launched torchrun-style without MPI: the control messages and
// the (here fake) NCCL unique id go over TCP; a stand-in bulk transport checks that every rank got
// rank 0's id, then moves the bytes over the same channel, as NCCL would on a GPU.
class IdCheckingTransport final : public BulkTransport {
 public:
  IdCheckingTransport(Communicator& group, double setup_s = 0) : group_(group), setup_s_(setup_s) {}
  std::string_view kind() const override { return "fake-nccl"; }
  Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline) override {
    return group_.Broadcast(bytes, root, deadline, "fake NCCL bytes");
  }
  double setup_seconds() const override { return setup_s_; }

 private:
  Communicator& group_;
  double setup_s_;
};

TEST(TcpExchangeTest, BuildOnceNcclTransportUsesTcpWithoutMpi) {
  auto fn = [](int) -> std::string {
    BuildOnceOptions o;
    o.transport = Transport::kNccl;
    o.join_timeout = std::chrono::seconds(10);
    o.bulk_factory = [](Communicator& group, const RankInfo&,
                        Deadline deadline) -> StatusOr<std::unique_ptr<BulkTransport>> {
      std::vector<std::byte> id(128);
      if (group.rank() == 0) id = Blob();
      KILN_RETURN_IF_ERROR(group.Broadcast(id, 0, deadline, "NCCL unique id"));
      if (id != Blob()) return MakeError(ErrorCode::kTransferCorrupt, "wrong id");
      // A distinct set-up time per rank, so the report's per-rank table can be checked.
      return std::unique_ptr<BulkTransport>(
          new IdCheckingTransport(group, 0.25 * (group.rank() + 1)));
    };
    int calls = 0;
    BuildFn build = [&calls](ProgressSink&) -> StatusOr<std::vector<std::byte>> {
      ++calls;
      return std::vector<std::byte>(4096, std::byte{0x17});
    };
    const CacheKey key = KeyBuilder().Config("case", "tcp-nccl").Target("cpu", "test").Build();
    StatusOr<BuildOnceResult> r = BuildOnce(key, o, build);
    if (!r.ok()) return Describe(r.status());
    std::string setup;  // every rank's NCCL set-up time, as this rank's report has them
    for (const RankReport& rr : r->report.ranks)
      setup += fmt::format("{}:{} ", rr.rank, rr.bulk_setup_s);
    return fmt::format("ok calls={} transport={} world={} builders={} setup={}{} bytes={}", calls,
                       r->report.transport, r->report.world_size, r->report.builders.size(), setup,
                       r->report.bulk_setup_s, HashBytes(r->bytes).Hex());
  };
  const std::string bytes = HashBytes(std::vector<std::byte>(4096, std::byte{0x17})).Hex();
  std::vector<Outcome> got =
      RunRanks({1, 2, 0}, 3, TestPort(5), fn, std::chrono::seconds(30), /*stagger_ms=*/50);
  ASSERT_EQ(got.size(), 3u);
  // Listed order is 1, 2, 0: only rank 0 (the last) builds.
  const std::string table = "setup=0:0.25 1:0.5 2:0.75 ";
  EXPECT_EQ(got[0].line,
            "ok calls=0 transport=nccl world=3 builders=1 " + table + "0.5 bytes=" + bytes);
  EXPECT_EQ(got[1].line,
            "ok calls=0 transport=nccl world=3 builders=1 " + table + "0.75 bytes=" + bytes);
  EXPECT_EQ(got[2].line,
            "ok calls=1 transport=nccl world=3 builders=1 " + table + "0.25 bytes=" + bytes);
}

// A rank that takes the NCCL unique id and then never completes ncclCommInitRank (stuck, as a
// rank whose GPU hangs would be): the others' set-up times out (here a stand-in that fails with
// kCommInitTimeout at its deadline, as NcclBroadcaster does after ncclCommAbort), and every one of
// them fails within --join-timeout (plus the verdict grace) with an error naming the stuck rank.
TEST(TcpExchangeTest, NcclSetUpTimeoutNamesTheRankThatNeverFinishedItOnEveryOtherRank) {
  const auto join = std::chrono::milliseconds(2500);
  auto fn = [join](int) -> std::string {
    BuildOnceOptions o;
    o.transport = Transport::kNccl;
    o.join_timeout = join;
    o.bulk_factory = [](Communicator& group, const RankInfo&,
                        Deadline deadline) -> StatusOr<std::unique_ptr<BulkTransport>> {
      std::vector<std::byte> id(128);
      if (group.rank() == 0) id = Blob();
      KILN_RETURN_IF_ERROR(group.Broadcast(id, 0, deadline, "NCCL unique id"));
      if (group.rank() == 2) {  // stuck well past everyone's bound
        std::this_thread::sleep_for(std::chrono::seconds(8));
        return MakeError(ErrorCode::kCommFailed, "gave up");
      }
      std::this_thread::sleep_until(deadline);
      return MakeError(ErrorCode::kCommInitTimeout, "fake NCCL init did not complete");
    };
    BuildFn build = [](ProgressSink&) -> StatusOr<std::vector<std::byte>> {
      return std::vector<std::byte>(4096, std::byte{0x17});
    };
    const CacheKey key =
        KeyBuilder().Config("case", "tcp-nccl-stuck").Target("cpu", "test").Build();
    StatusOr<BuildOnceResult> r = BuildOnce(key, o, build);
    return r.ok() ? std::string("ok") : Describe(r.status());
  };
  std::vector<Outcome> got =
      RunRanks({0, 1, 2}, 3, TestPort(6), fn, std::chrono::seconds(30), /*stagger_ms=*/20);
  ASSERT_EQ(got.size(), 3u);
  for (int i : {0, 1}) {
    SCOPED_TRACE(got[i].line);
    EXPECT_TRUE(got[i].exited);
    EXPECT_EQ(got[i].line.rfind("KILN-E7013 ", 0), 0u);
    EXPECT_NE(got[i].line.find("rank(s) 2 did not contribute"), std::string::npos);
    EXPECT_NE(got[i].line.find("NCCL communicator was not set up on every rank"),
              std::string::npos);
    // The join bound, plus the hello exchange and the verdict grace of non-zero ranks.
    EXPECT_LT(got[i].seconds, 2.5 + 2.5);
    EXPECT_GT(got[i].seconds, 2.5 - 0.6);
    EXPECT_NE(got[i].line.find("(this rank after "), std::string::npos);  // its own timeout too
    EXPECT_NE(got[i].line.find("fake NCCL init did not complete"), std::string::npos);
  }
}

// Every rank's set-up fails (NCCL itself cannot connect): every rank gets every rank's reason.
TEST(TcpExchangeTest, NcclSetUpFailureOnEveryRankListsEveryRanksReason) {
  auto fn = [](int) -> std::string {
    BuildOnceOptions o;
    o.transport = Transport::kNccl;
    o.join_timeout = std::chrono::seconds(10);
    o.bulk_factory = [](Communicator& group, const RankInfo&,
                        Deadline) -> StatusOr<std::unique_ptr<BulkTransport>> {
      return MakeError(ErrorCode::kCommFailed, "no route (rank {})", group.rank());
    };
    BuildFn build = [](ProgressSink&) -> StatusOr<std::vector<std::byte>> {
      return std::vector<std::byte>(64, std::byte{1});
    };
    const CacheKey key = KeyBuilder().Config("case", "tcp-nccl-fail").Target("cpu", "test").Build();
    StatusOr<BuildOnceResult> r = BuildOnce(key, o, build);
    return r.ok() ? std::string("ok") : Describe(r.status());
  };
  std::vector<Outcome> got = RunRanks({0, 1}, 2, TestPort(7), fn, std::chrono::seconds(30));
  ASSERT_EQ(got.size(), 2u);
  for (const Outcome& o : got) {
    SCOPED_TRACE(o.line);
    EXPECT_EQ(o.line.rfind("KILN-E7014 the NCCL communicator set-up failed on 2 of 2 ranks: rank 0 "
                           "after ",
                           0),
              0u);
    EXPECT_NE(o.line.find("no route (rank 0); rank 1 after "), std::string::npos);
    EXPECT_NE(o.line.find("no route (rank 1)"), std::string::npos);
    EXPECT_LT(o.seconds, 5.0);  // nobody waits for a bound when every rank has reported
  }
}

}  // namespace
}  // namespace kiln::distributed
