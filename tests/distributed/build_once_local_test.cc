// BuildOnce in a single process (world size 1) and through the cache alone; the multi-rank
// paths run under mpirun (mpi_cases.py).
#include "kiln/distributed/build_once.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace kiln::distributed {
namespace {

CacheKey TestKey(std::string_view arch = "cpu-test") {
  return KeyBuilder().Config("case", "build-once-local").Target("cpu", arch).Build();
}

BuildFn Builder(int* calls, size_t n) {
  return [calls, n](ProgressSink& s) -> StatusOr<std::vector<std::byte>> {
    ++*calls;
    s.Update("building");
    return std::vector<std::byte>(n, std::byte{0x42});
  };
}

TEST(BuildOnceLocalTest, WorldSizeOneBuildsHereAndReports) {
  int calls = 0;
  StatusOr<BuildOnceResult> r = BuildOnce(TestKey(), BuildOnceOptions{}, Builder(&calls, 1234));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r->bytes.size(), 1234u);
  EXPECT_EQ(r->report.transport, "local");
  EXPECT_EQ(r->report.world_size, 1);
  EXPECT_EQ(r->report.builders, std::vector<int>{0});
  EXPECT_EQ(r->report.cache, "none");
  ASSERT_EQ(r->report.ranks.size(), 1u);
  EXPECT_EQ(r->report.ranks[0].role, "built");
  nlohmann::json j = nlohmann::json::parse(r->report.ToJson());
  EXPECT_EQ(j["bytes"], 1234);
  EXPECT_EQ(j["key"], TestKey().Hex());
  EXPECT_EQ(j["checksum"], HashBytes(r->bytes).Hex());
}

TEST(BuildOnceLocalTest, CacheTurnsTheSecondCallIntoAHit) {
  char tmpl[] = "/tmp/kiln-bo-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  BuildOnceOptions o;
  o.transport = Transport::kCache;
  o.cache = CacheOptions{};
  o.cache->dir = tmpl;
  int calls = 0;
  StatusOr<BuildOnceResult> first = BuildOnce(TestKey(), o, Builder(&calls, 100));
  StatusOr<BuildOnceResult> second = BuildOnce(TestKey(), o, Builder(&calls, 100));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(first->report.cache, "built");
  EXPECT_EQ(second->report.cache, "hit");
  EXPECT_EQ(second->report.ranks[0].role, "cache-hit");
  EXPECT_EQ(first->bytes, second->bytes);
  std::filesystem::remove_all(tmpl);
}

TEST(BuildOnceLocalTest, TimeoutsMustBePositive) {
  int calls = 0;
  for (int which = 0; which < 3; ++which) {
    BuildOnceOptions o;
    (which == 0   ? o.join_timeout
     : which == 1 ? o.wait_timeout
                  : o.transfer_timeout) = std::chrono::milliseconds(-1000);
    StatusOr<BuildOnceResult> r = BuildOnce(TestKey(), o, Builder(&calls, 8));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().ToString();
  }
  EXPECT_EQ(calls, 0);
}

// The pid of a process that has exited and been reaped: kill(pid, 0) answers ESRCH.
int64_t GonePid() {
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

TEST(BuildOnceLocalTest, ADeadBuilderIsNotACommunicatorTimeout) {
  // What the waiting rank's Broadcast ends with when its builder was killed mid-build.
  Status wait = MakeError(ErrorCode::kCommInitTimeout,
                          "duplicating the MPI communicator did not complete within the bound");
  Status dead = ExplainBuilderWait(wait, "rank 0 (host h1, pid 7)", "h1", GonePid(), "h1");
  EXPECT_EQ(dead.code(), ErrorCode::kBuilderLost) << dead.ToString();
  EXPECT_EQ(dead.Id(), "KILN-E7020");
  EXPECT_NE(dead.message().find("process is gone"), std::string::npos) << dead.message();
  EXPECT_EQ(dead.remedy().find("MASTER_ADDR"), std::string::npos) << dead.remedy();

  // On another host the process cannot be checked: still the builder's loss, said honestly.
  Status remote = ExplainBuilderWait(wait, "rank 0 (host h2, pid 7)", "h2", 7, "h1");
  EXPECT_EQ(remote.code(), ErrorCode::kBuilderLost);
  EXPECT_NE(remote.message().find("cannot be checked"), std::string::npos) << remote.message();

  // Alive here (this very process) but silent past the bound: a wait timeout.
  Status slow = ExplainBuilderWait(
      MakeError(ErrorCode::kCollectiveTimeout, "broadcast of result header stopped"), "rank 0",
      "h1", getpid(), "h1");
  EXPECT_EQ(slow.code(), ErrorCode::kCacheWaitTimeout) << slow.ToString();

  // The builder's own verdicts and other errors keep their code.
  Status other = ExplainBuilderWait(MakeError(ErrorCode::kTransferCorrupt, "bad hash"), "rank 0",
                                    "h1", GonePid(), "h1");
  EXPECT_EQ(other.code(), ErrorCode::kTransferCorrupt);
}

TEST(BuildOnceLocalTest, AProcessGroupThatLostItsBuilderNamesTheBuilder) {
  // A torch.distributed group (the C API's kiln_comm) whose builder died: the collective fails
  // (the peer closed its connection) while the dead builder may still be a zombie that its
  // launcher has not reaped.
  Status wait = MakeError(ErrorCode::kProcessGroupFailed,
                          "result header over the process group failed: connection closed");
  pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  // Until the parent reaps it the child stays a zombie: kill(pid, 0) still succeeds.
  for (int i = 0; i < 200 && ::kill(zombie, 0) == 0; ++i) {
    std::ifstream stat("/proc/" + std::to_string(zombie) + "/stat");
    std::string line;
    std::getline(stat, line);
    if (line.find(") Z") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Status dead = ExplainBuilderWait(wait, "rank 0 (host h1, pid 9)", "h1", zombie, "h1");
  int status = 0;
  waitpid(zombie, &status, 0);
  EXPECT_EQ(dead.code(), ErrorCode::kBuilderLost) << dead.ToString();
  EXPECT_NE(dead.message().find("process is gone"), std::string::npos) << dead.message();
  EXPECT_EQ(ExplainBuilderWait(wait, "rank 0", "h1", GonePid(), "h1").code(),
            ErrorCode::kBuilderLost);
  // The builder alive here: another rank broke the group, which stays what it is.
  EXPECT_EQ(ExplainBuilderWait(wait, "rank 0", "h1", getpid(), "h1").code(),
            ErrorCode::kProcessGroupFailed);
}

TEST(BuildOnceLocalTest, BuildErrorsKeepTheirCode) {
  StatusOr<BuildOnceResult> r = BuildOnce(
      TestKey(), BuildOnceOptions{}, [](ProgressSink&) -> StatusOr<std::vector<std::byte>> {
        return MakeError(ErrorCode::kMemoryBudgetExceeded, "needs 3 GiB");
      });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kMemoryBudgetExceeded);
}

TEST(BuildOnceLocalTest, VerifyRejectsBeforeSharing) {
  BuildOnceOptions o;
  o.verify = [](std::span<const std::byte>) {
    return MakeError(ErrorCode::kEngineChecksum, "bad engine");
  };
  int calls = 0;
  StatusOr<BuildOnceResult> r = BuildOnce(TestKey(), o, Builder(&calls, 10));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kEngineChecksum);
}

TEST(BuildOnceLocalTest, CacheTransportNeedsADirectory) {
  BuildOnceOptions o;
  o.transport = Transport::kCache;
  int calls = 0;
  StatusOr<BuildOnceResult> r = BuildOnce(TestKey(), o, Builder(&calls, 10));
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(calls, 0);
}

TEST(BuildOnceLocalTest, WithoutMpiSeveralRanksMeetInTheCacheOrAreToldWhatToDo) {
  BuildOnceOptions o;
  o.rank_overrides.rank = 1;
  o.rank_overrides.world_size = 2;  // as torchrun would say, with no MPI running
  int calls = 0;
  StatusOr<BuildOnceResult> r = BuildOnce(TestKey(), o, Builder(&calls, 10));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kTransportUnavailable);
  EXPECT_NE(r.status().message().find("MPI is not running"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(calls, 0);

  char tmpl[] = "/tmp/kiln-bo-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  o.cache = CacheOptions{};
  o.cache->dir = tmpl;
  r = BuildOnce(TestKey(), o, Builder(&calls, 10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->report.transport, "cache");
  EXPECT_EQ(r->report.rank, 1);
  EXPECT_EQ(r->report.world_size, 2);
  EXPECT_EQ(calls, 1);
  std::filesystem::remove_all(tmpl);
}

TEST(BuildOnceLocalTest, ParsesFlags) {
  EXPECT_EQ(*ParseBuildOn("per-arch"), BuildOn::kPerArch);
  EXPECT_EQ(*ParseTransport("nccl"), Transport::kNccl);
  EXPECT_EQ(ParseBuildOn("per-rack").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ToString(BuildOn::kPerNode), "per-node");
}

}  // namespace
}  // namespace kiln::distributed
