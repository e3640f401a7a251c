// What environment variables really mean (NCCL_IB_TIMEOUT is an exponent, CUDA_WATCHDOG_TIMEOUT
// does not exist, NCCL_SOCKET_IFNAME against real interfaces).
#include <gtest/gtest.h>

#include "kiln/doctor/env_check.h"

namespace kiln::doctor {
namespace {

const KnownProblems& Kp() {
  static auto kp = *KnownProblems::Default();
  return *kp;
}

std::vector<Finding> Check(std::string_view name, std::string_view value,
                           const std::vector<std::string>* ifaces = nullptr) {
  return CheckEnvVar(Kp(), name, value, ifaces);
}

TEST(EnvCheck, IbTimeoutIsAnExponent) {
  EXPECT_NEAR(IbTimeoutSeconds(20), 4.295, 0.001);
  EXPECT_NEAR(IbTimeoutSeconds(30), 4398.05, 0.01);
  EXPECT_EQ(FormatDuration(IbTimeoutSeconds(20)), "4.3 s");
  EXPECT_EQ(FormatDuration(IbTimeoutSeconds(30)), "73 min");
  auto f = Check("NCCL_IB_TIMEOUT", "30");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].severity, Severity::kWarning);
  EXPECT_NE(f[0].what.find("73 min per InfiniBand retry"), std::string::npos) << f[0].what;
  EXPECT_NE(f[0].what.find("not 30 s"), std::string::npos);
  auto ok = Check("NCCL_IB_TIMEOUT", "\"20\"");  // quoted, as `declare -x` prints it
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].severity, Severity::kInfo);
  EXPECT_NE(ok[0].what.find("4.3 s"), std::string::npos);
  EXPECT_EQ(Check("NCCL_IB_TIMEOUT", "40")[0].severity, Severity::kError);
  EXPECT_EQ(Check("NCCL_IB_TIMEOUT", "abc")[0].severity, Severity::kError);
}

TEST(EnvCheck, VariablesThatDoNothingOrCostSpeed) {
  auto w = Check("CUDA_WATCHDOG_TIMEOUT", "10");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].severity, Severity::kWarning);
  EXPECT_NE(w[0].why.find("does not exist"), std::string::npos);
  ASSERT_EQ(Check("CUDA_LAUNCH_BLOCKING", "1").size(), 1u);
  EXPECT_TRUE(Check("CUDA_LAUNCH_BLOCKING", "0").empty());
  EXPECT_EQ(Check("NCCL_ASYNC_ERROR_HANDLING", "1").size(), 1u);
  EXPECT_TRUE(Check("CUDA_VISIBLE_DEVICES", "0,1").empty());
  EXPECT_TRUE(Check("NCCL_DEBUG", "INFO").empty());
  EXPECT_EQ(Check("NCCL_DEBUG", "VERBOSE").size(), 1u);
}

TEST(EnvCheck, P2pLevelValues) {
  EXPECT_TRUE(Check("NCCL_P2P_LEVEL", "NVL").empty());
  EXPECT_TRUE(Check("NCCL_P2P_LEVEL", "sys").empty());
  auto bad = Check("NCCL_P2P_LEVEL", "NVLINK");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].severity, Severity::kError);
}

TEST(EnvCheck, SocketIfnameAgainstInterfaces) {
  std::vector<std::string> ifaces = {"docker0", "ens5", "ib0", "lo"};
  EXPECT_EQ(SocketIfnameMatches("eth0", ifaces), std::vector<std::string>{});
  EXPECT_EQ(SocketIfnameMatches("ens", ifaces), std::vector<std::string>{"ens5"});
  EXPECT_EQ(SocketIfnameMatches("=ens", ifaces), std::vector<std::string>{});
  EXPECT_EQ(SocketIfnameMatches("=ens5", ifaces), std::vector<std::string>{"ens5"});
  EXPECT_EQ(SocketIfnameMatches("^docker,lo", ifaces), (std::vector<std::string>{"ens5", "ib0"}));
  EXPECT_EQ(SocketIfnameMatches("ib,ens", ifaces), (std::vector<std::string>{"ens5", "ib0"}));
  auto bad = Check("NCCL_SOCKET_IFNAME", "eth0", &ifaces);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].severity, Severity::kError);
  EXPECT_NE(bad[0].what.find("docker0, ens5, ib0, lo"), std::string::npos);
  auto good = Check("NCCL_SOCKET_IFNAME", "ens", &ifaces);
  ASSERT_EQ(good.size(), 1u);
  EXPECT_EQ(good[0].severity, Severity::kInfo);
  // Interfaces unknown (log analysis): nothing to say.
  EXPECT_TRUE(Check("NCCL_SOCKET_IFNAME", "eth0").empty());
}

TEST(EnvCheck, WholeEnvironmentAndExitCode) {
  std::map<std::string, std::string> env = {
      {"CUDA_WATCHDOG_TIMEOUT", "10"}, {"NCCL_IB_TIMEOUT", "30"}, {"HOME", "/root"}};
  auto f = CheckEnvironment(Kp(), env, nullptr);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_EQ(ExitCodeFor(f), 1);
  env["NCCL_P2P_LEVEL"] = "FAST";
  EXPECT_EQ(ExitCodeFor(CheckEnvironment(Kp(), env, nullptr)), 2);
  EXPECT_EQ(ExitCodeFor({}), 0);
}

}  // namespace
}  // namespace kiln::doctor
