// The doctor's data files: they load, cover what the issue asks for, and invalid data is refused
// with a catalog error naming the entry.
#include <gtest/gtest.h>

#include "kiln/doctor/log_analyzer.h"

namespace kiln::doctor {
namespace {

TEST(Knowledge, SignatureDatabaseCoversTheRequiredFailures) {
  auto db = SignatureDb::Default();
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  for (int xid : {13, 31, 43, 45, 48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154}) {
    EXPECT_GE((*db)->Find(fmt::format("xid.{}", xid)), 0) << xid;
  }
  for (const char* id : {"cuda.700",
                         "cuda.702",
                         "cuda.719",
                         "cuda.999",
                         "cuda.oom",
                         "nccl.result-1",
                         "nccl.result-2",
                         "nccl.result-3",
                         "nccl.result-6",
                         "nccl.warn",
                         "torch.watchdog-timeout",
                         "torch.heartbeat",
                         "torch.store-timeout",
                         "trt.oom",
                         "trt.no-implementation",
                         "trt.insufficient-workspace",
                         "kiln.catalog",
                         "myth.watchdog-timeout-env",
                         "myth.719-watchdog",
                         "myth.nccl-internal-code-2",
                         "myth.trt-builder-timeout",
                         "myth.max-workspace-size",
                         "trt.max-workspace-size-removed"}) {
    EXPECT_GE((*db)->Find(id), 0) << id;
  }
  // The facts that the report got wrong are stated right.
  const auto& sigs = (*db)->signatures();
  EXPECT_NE(sigs[(*db)->Find("cuda.719")].meaning.find("NOT a watchdog"), std::string::npos);
  EXPECT_NE(sigs[(*db)->Find("nccl.result-2")].title.find("system error"), std::string::npos);
}

TEST(Knowledge, EveryPatternCompilesIntoOneDatabase) {
  auto db = SignatureDb::Default();
  auto kp = KnownProblems::Default();
  ASSERT_TRUE(kp.ok()) << kp.status().ToString();
  EXPECT_TRUE(LogAnalyzer::Create(*db, *kp).ok());
  EXPECT_FALSE((*kp)->versions().empty());
  EXPECT_FALSE((*kp)->environment().empty());
}

TEST(Knowledge, InvalidDataIsRefusedWithItsName) {
  EXPECT_EQ(SignatureDb::Load("not json", "t").status().code(), ErrorCode::kSignatureDbInvalid);
  EXPECT_EQ(SignatureDb::Load("{}", "t").status().code(), ErrorCode::kSignatureDbInvalid);
  auto bad_sev = SignatureDb::Load(
      R"({"signatures":[{"id":"x","pattern":"a","category":"c","title":"t","severity":"huge","role":"fault"}]})",
      "t");
  EXPECT_EQ(bad_sev.status().code(), ErrorCode::kSignatureDbInvalid);
  EXPECT_NE(bad_sev.status().message().find("'x'"), std::string::npos);
  auto no_remedy = SignatureDb::Load(
      R"({"signatures":[{"id":"y","pattern":"a","category":"c","title":"t","severity":"error","role":"fault"}]})",
      "t");
  EXPECT_EQ(no_remedy.status().code(), ErrorCode::kSignatureDbInvalid);
  auto dup = SignatureDb::Load(
      R"({"signatures":[{"id":"z","pattern":"a","category":"c","title":"t","severity":"info","role":"info"},
                        {"id":"z","pattern":"b","category":"c","title":"t","severity":"info","role":"info"}]})",
      "t");
  EXPECT_EQ(dup.status().code(), ErrorCode::kSignatureDbInvalid);
  // A pattern Hyperscan cannot compile is named when the scanner is built.
  auto bad_pattern = SignatureDb::Load(
      R"({"signatures":[{"id":"broken","pattern":"(unclosed","category":"c","title":"t","severity":"info","role":"info"}]})",
      "t");
  ASSERT_TRUE(bad_pattern.ok());
  auto a = LogAnalyzer::Create(*bad_pattern, *KnownProblems::Default());
  EXPECT_EQ(a.status().code(), ErrorCode::kSignatureDbInvalid);
  EXPECT_NE(a.status().message().find("'broken'"), std::string::npos);
  EXPECT_EQ(
      KnownProblems::Load(R"({"environment":[{"name":"X","kind":"magic"}]})", "t").status().code(),
      ErrorCode::kSignatureDbInvalid);
}

TEST(Knowledge, CompareVersions) {
  EXPECT_LT(CompareVersions("525.60.13", "580"), 0);
  EXPECT_GT(CompareVersions("580.65.06", "580"), 0);
  EXPECT_EQ(CompareVersions("2.14", "2.14.0"), 0);
  EXPECT_LT(CompareVersions("2.9.9", "2.14"), 0);
  EXPECT_GT(CompareVersions("13.0", "12.9"), 0);
}

}  // namespace
}  // namespace kiln::doctor
