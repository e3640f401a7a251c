// TcpExchange: the value reaches every rank; a rank that never connects is named within the bound.
#include "kiln/dist/tcp_exchange.h"

#include <gtest/gtest.h>

#include <thread>

namespace kiln::dist {
namespace {

RankInfo Rank(int rank, int world, int port) {
  RankInfo r;
  r.rank = rank;
  r.world_size = world;
  r.master_addr = "127.0.0.1";
  r.master_port = port;
  return r;
}

int TestPort() { return 20000 + (getpid() % 20000); }

TEST(TcpExchangeTest, EveryRankReceivesRankZerosValue) {
  const int port = TestPort();
  std::vector<std::byte> value(128);
  for (size_t i = 0; i < value.size(); ++i) value[i] = std::byte(i);
  std::vector<StatusOr<std::vector<std::byte>>> got(4, MakeError(ErrorCode::kInternal, "unset"));
  std::vector<std::thread> threads;
  for (int r = 3; r >= 0; --r) {  // clients first: they must retry until rank 0 listens
    threads.emplace_back([&, r] {
      got[r] =
          TcpExchange(Rank(r, 4, port),
                      r == 0 ? std::span<const std::byte>(value) : std::span<const std::byte>(),
                      value.size(), Clock::now() + std::chrono::seconds(10));
    });
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].status().ToString();
    EXPECT_EQ(*got[r], value);
  }
}

TEST(TcpExchangeTest, MissingRankIsNamedWithinTheBound) {
  const int port = TestPort() + 1;
  std::vector<std::byte> value(16, std::byte{1});
  StatusOr<std::vector<std::byte>> client = MakeError(ErrorCode::kInternal, "unset");
  std::thread t([&] {
    client = TcpExchange(Rank(1, 3, port), {}, 16, Clock::now() + std::chrono::seconds(5));
  });
  const auto t0 = Clock::now();
  StatusOr<std::vector<std::byte>> root =
      TcpExchange(Rank(0, 3, port), value, 16, Clock::now() + std::chrono::milliseconds(700));
  const double waited = SecondsSince(t0);
  t.join();
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().code(), ErrorCode::kRankMissing);
  EXPECT_NE(root.status().message().find("missing rank(s) 2"), std::string::npos)
      << root.status().message();
  EXPECT_GE(waited, 0.7);
  EXPECT_LT(waited, 2.0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();  // rank 1 was served before the bound
}

TEST(TcpExchangeTest, ClientNamesAMissingRankZero) {
  const auto t0 = Clock::now();
  StatusOr<std::vector<std::byte>> r = TcpExchange(Rank(2, 3, TestPort() + 2), {}, 16,
                                                   Clock::now() + std::chrono::milliseconds(500));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kRankMissing);
  EXPECT_NE(r.status().message().find("rank 0 did not accept"), std::string::npos);
  EXPECT_LT(SecondsSince(t0), 2.0);
}

TEST(TcpExchangeTest, NeedsMasterAddress) {
  RankInfo r = Rank(1, 2, 0);
  EXPECT_EQ(TcpExchange(r, {}, 4, Clock::now()).status().code(), ErrorCode::kRankEnvInvalid);
}

}  // namespace
}  // namespace kiln::dist
