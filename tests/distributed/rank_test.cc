// Rank discovery from fake launcher environments.
#include "kiln/distributed/rank.h"

#include <gtest/gtest.h>

#include <map>

namespace kiln::distributed {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(RankTest, NoLauncherIsWorldSizeOne) {
  StatusOr<RankInfo> r = DiscoverRank({}, FakeEnv({}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->world_size, 1);
  EXPECT_EQ(r->launcher, "single");
  EXPECT_EQ(r->node, r->host);
}

TEST(RankTest, Torchrun) {
  StatusOr<RankInfo> r = DiscoverRank({}, FakeEnv({{"RANK", "5"},
                                                   {"WORLD_SIZE", "8"},
                                                   {"LOCAL_RANK", "1"},
                                                   {"LOCAL_WORLD_SIZE", "4"},
                                                   {"MASTER_ADDR", "node0"},
                                                   {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->launcher, "torchrun");
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->local_world_size, 4);
  EXPECT_EQ(r->master_addr, "node0");
  EXPECT_EQ(r->master_port, 29500);
}

TEST(RankTest, OpenMpi) {
  StatusOr<RankInfo> r = DiscoverRank({}, FakeEnv({{"OMPI_COMM_WORLD_RANK", "2"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->launcher, "openmpi");
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_world_size, 2);
}

TEST(RankTest, SlurmWithNodeId) {
  StatusOr<RankInfo> r = DiscoverRank({}, FakeEnv({{"SLURM_PROCID", "3"},
                                                   {"SLURM_NTASKS", "16"},
                                                   {"SLURM_LOCALID", "3"},
                                                   {"SLURM_NODEID", "1"}}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->launcher, "slurm");
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 16);
  EXPECT_EQ(r->local_rank, 3);
  EXPECT_EQ(r->node_id, 1);
}

TEST(RankTest, InnermostLauncherWins) {
  // torchrun started inside a Slurm allocation: torchrun's ranks are the ones that matter.
  StatusOr<RankInfo> r = DiscoverRank(
      {},
      FakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"RANK", "7"}, {"WORLD_SIZE", "16"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->launcher, "torchrun");
  EXPECT_EQ(r->rank, 7);
  StatusOr<RankInfo> m = DiscoverRank({}, FakeEnv({{"SLURM_PROCID", "0"},
                                                   {"SLURM_NTASKS", "2"},
                                                   {"OMPI_COMM_WORLD_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"}}));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->launcher, "openmpi");
  EXPECT_EQ(m->world_size, 4);
}

TEST(RankTest, ExplicitFlagsOverride) {
  RankOverrides o;
  o.rank = 1;
  o.world_size = 2;
  o.node = "fake-node";
  StatusOr<RankInfo> r =
      DiscoverRank(o, FakeEnv({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"KILN_DIST_NODE", "x"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->launcher, "explicit");
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->node, "fake-node");
}

TEST(RankTest, NodeFromEnvironment) {
  StatusOr<RankInfo> r = DiscoverRank({}, FakeEnv({{"KILN_DIST_NODE", "rack3-node7"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->node, "rack3-node7");
}

TEST(RankTest, MalformedValuesAreCatalogErrors) {
  StatusOr<RankInfo> r = DiscoverRank({}, FakeEnv({{"RANK", "two"}, {"WORLD_SIZE", "4"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kRankEnvInvalid);
  EXPECT_NE(r.status().message().find("RANK='two'"), std::string::npos) << r.status().message();

  r = DiscoverRank({}, FakeEnv({{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kRankEnvInvalid);
  EXPECT_NE(r.status().message().find("rank 4 is not inside world size 4"), std::string::npos);

  r = DiscoverRank({}, FakeEnv({{"RANK", "1"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("WORLD_SIZE is not"), std::string::npos)
      << r.status().message();

  r = DiscoverRank({}, FakeEnv({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(r.status().code(), ErrorCode::kRankEnvInvalid);
}

}  // namespace
}  // namespace kiln::distributed
