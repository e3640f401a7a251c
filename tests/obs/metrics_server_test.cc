// MetricsServer: free-port selection, port-in-use error, scrapes during concurrent updates.
#include "kiln/obs/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/obs/http_get.h"
#include "tests/obs/metrics_text.h"

namespace kiln::obs {
namespace {

using testing::HttpGet;
using testing::SampleValue;

TEST(MetricsServer, PortZeroPicksAFreePortAndServesMetrics) {
  KilnMetrics m;
  m.AddTacticsTimed(9);
  auto server = MetricsServer::Start({"127.0.0.1", 0}, &m);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int port = (*server)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*server)->Url(), "http://127.0.0.1:" + std::to_string(port) + "/metrics");
  std::string body = HttpGet(port);
  EXPECT_EQ(SampleValue(body, "kiln_build_tactics_timed_total"), 9.0);
  EXPECT_EQ(SampleValue(body, "kiln_up"), 1.0);
}

TEST(MetricsServer, TwoServersOnPortZeroGetDifferentPorts) {
  KilnMetrics m;
  auto a = MetricsServer::Start({"127.0.0.1", 0}, &m);
  auto b = MetricsServer::Start({"127.0.0.1", 0}, &m);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->port(), (*b)->port());
}

TEST(MetricsServer, PortInUseIsACatalogError) {
  // Hold a listening socket on a kernel-chosen port, then ask kiln for that port.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);

  KilnMetrics m;
  auto server = MetricsServer::Start({"127.0.0.1", port}, &m);
  ::close(fd);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), ErrorCode::kMetricsPortInUse);
  EXPECT_EQ(server.status().Id(), "KILN-E8000");
  EXPECT_NE(server.status().message().find(std::to_string(port)), std::string::npos);
  EXPECT_NE(server.status().remedy().find("--metrics-port 0"), std::string::npos);
}

TEST(MetricsServer, BadAddressAndPortAreRejected) {
  KilnMetrics m;
  auto bad_port = MetricsServer::Start({"127.0.0.1", 70000}, &m);
  EXPECT_EQ(bad_port.status().code(), ErrorCode::kInvalidArgument);
  auto bad_addr = MetricsServer::Start({"not-an-address", 0}, &m);
  EXPECT_EQ(bad_addr.status().code(), ErrorCode::kMetricsServerFailed);
  // An address that is not on this host cannot be bound (TEST-NET-1, never assigned).
  auto foreign = MetricsServer::Start({"192.0.2.1", 0}, &m);
  EXPECT_EQ(foreign.status().code(), ErrorCode::kMetricsServerFailed);
}

TEST(MetricsServer, OutOfRangeQuadIsNotAnAddress) {
  KilnMetrics m;
  auto s = MetricsServer::Start({"999.1.1.1", 0}, &m);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kMetricsServerFailed);
  EXPECT_NE(s.status().message().find("999.1.1.1"), std::string::npos);
}

// A loopback TCP connection that sends nothing (an idle or stalled client); -1 on failure.
int ConnectIdle(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(MetricsServer, EightIdleConnectionsDoNotDelayAScrape) {
  KilnMetrics m;
  m.AddTacticsTimed(3);
  auto server = MetricsServer::Start({"127.0.0.1", 0}, &m);  // default workers and read bound
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    int fd = ConnectIdle((*server)->port());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the server take them
  const auto start = std::chrono::steady_clock::now();
  std::string body = HttpGet((*server)->port());
  const double took = SecondsSince(start);
  for (int fd : idle) ::close(fd);
  EXPECT_EQ(SampleValue(body, "kiln_build_tactics_timed_total"), 3.0);
  // Before the event loop, two idle clients held civetweb's two workers for 30 s each.
  EXPECT_LT(took, 1.0);
}

TEST(MetricsServer, MoreIdleClientsThanConnectionsStillLetAScrapeThrough) {
  KilnMetrics m;
  MetricsServerOptions o;
  o.bind_address = "127.0.0.1";
  o.max_connections = 4;
  o.io_timeout = std::chrono::milliseconds(800);
  auto server = MetricsServer::Start(o, &m);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<int> idle;
  for (int i = 0; i < 12; ++i) {
    int fd = ConnectIdle((*server)->port());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  std::string body = HttpGet((*server)->port());
  const double took = SecondsSince(start);
  EXPECT_EQ(SampleValue(body, "kiln_up"), 1.0);
  // The newcomer takes the place of the oldest silent client at once; no waiting for timeouts.
  EXPECT_LT(took, 0.5);
  // Every stalled connection was closed by the server (evicted, or at the 0.8 s bound): recv
  // sees the end of the stream, not this test's 3 s receive timeout.
  for (int fd : idle) {
    timeval tv{3, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[512];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    EXPECT_EQ(n, 0) << "a stalled connection was still open after 3 s";
    ::close(fd);
  }
}

TEST(MetricsServer, AnswersOnlyGetAndHeadOfKnownPaths) {
  KilnMetrics m;
  auto server = MetricsServer::Start({"127.0.0.1", 0}, &m);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(HttpGet((*server)->port(), "/nothing-here").find("kiln_up"), std::string::npos);
  EXPECT_NE(HttpGet((*server)->port(), "/metrics?x=1").find("kiln_up"), std::string::npos);
}

TEST(MetricsServer, ConnectionCapAndTimeoutAreChecked) {
  KilnMetrics m;
  MetricsServerOptions o;
  o.max_connections = 0;
  EXPECT_EQ(MetricsServer::Start(o, &m).status().code(), ErrorCode::kInvalidArgument);
  o.max_connections = 4;
  o.io_timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(MetricsServer::Start(o, &m).status().code(), ErrorCode::kInvalidArgument);
}

// A scrape during a build: values in each scrape are consistent (a histogram's count equals its
// +Inf bucket and the sum of observations so far; counters never go back) and the writers keep
// going while scrapes happen.
TEST(MetricsServer, ScrapesDuringUpdatesAreConsistent) {
  KilnMetrics m;
  auto server = MetricsServer::Start({"127.0.0.1", 0}, &m);
  ASSERT_TRUE(server.ok());
  constexpr int kWriters = 2;
  constexpr int kPerWriter = 20000;
  std::atomic<int> writers_done{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < kPerWriter; ++i) {
        m.ObserveKernel(0.001);  // every observation is 1 ms: sum == count * 0.001
        m.AddTacticsTimed(1);
      }
      writers_done.fetch_add(1);
    });
  }
  double last_count = 0, last_tactics = 0;
  int scrapes = 0;
  while (writers_done.load() < kWriters || scrapes < 3) {
    std::string body = HttpGet((*server)->port());
    ASSERT_FALSE(body.empty());
    ++scrapes;
    auto count = SampleValue(body, "kiln_kernel_seconds_count");
    auto inf = SampleValue(body, "kiln_kernel_seconds_bucket{le=\"+Inf\"}");
    auto sum = SampleValue(body, "kiln_kernel_seconds_sum");
    auto le1ms = SampleValue(body, "kiln_kernel_seconds_bucket{le=\"0.001\"}");
    auto tactics = SampleValue(body, "kiln_build_tactics_timed_total");
    ASSERT_TRUE(count && inf && sum && le1ms && tactics);
    EXPECT_EQ(*count, *inf);
    EXPECT_EQ(*count, *le1ms);
    EXPECT_NEAR(*sum, *count * 0.001, 1e-6 * (*count + 1));
    EXPECT_GE(*count, last_count);
    EXPECT_GE(*tactics, last_tactics);
    last_count = *count;
    last_tactics = *tactics;
  }
  for (auto& t : writers) t.join();
  std::string final_body = HttpGet((*server)->port());
  EXPECT_EQ(SampleValue(final_body, "kiln_kernel_seconds_count"), kWriters * kPerWriter);
  EXPECT_EQ(SampleValue(final_body, "kiln_build_tactics_timed_total"), kWriters * kPerWriter);
  EXPECT_GE(scrapes, 3);
}

TEST(MetricsExport, ServesAndWritesTheTextfileAtStartAndFinish) {
  KilnMetrics m;
  std::string path = ::testing::TempDir() + "/kiln_export_test.prom";
  auto exp = MetricsExport::Start({0, "127.0.0.1", path}, &m);
  ASSERT_TRUE(exp.ok()) << exp.status().ToString();
  ASSERT_NE((*exp)->server(), nullptr);
  EXPECT_EQ(SampleValue(HttpGet((*exp)->server()->port()), "kiln_up"), 1.0);
  std::ifstream first(path);
  std::stringstream a;
  a << first.rdbuf();
  EXPECT_EQ(SampleValue(a.str(), "kiln_up"), 1.0);
  m.ObserveEngineBuild(12);
  ASSERT_TRUE((*exp)->Finish().ok());
  std::ifstream last(path);
  std::stringstream b;
  b << last.rdbuf();
  EXPECT_EQ(SampleValue(b.str(), "kiln_up"), 0.0);
  EXPECT_EQ(SampleValue(b.str(), "kiln_engine_build_seconds_count"), 1.0);
  std::remove(path.c_str());
}

TEST(MetricsExport, BadFileFailsBeforeTheWork) {
  KilnMetrics m;
  auto exp = MetricsExport::Start({std::nullopt, "0.0.0.0", "/nonexistent-kiln-dir/x.prom"}, &m);
  EXPECT_EQ(exp.status().code(), ErrorCode::kMetricsFileWriteFailed);
  auto none = MetricsExport::Start({}, &m);  // neither port nor file: nothing to do, no error
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->server(), nullptr);
  EXPECT_TRUE((*none)->Finish().ok());
}

}  // namespace
}  // namespace kiln::obs
