#include "kiln/builder/timing_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace kiln {
namespace {

TEST(TimingCache, RoundTripsAndMergesOnSave) {
  std::string path =
      (std::filesystem::temp_directory_path() / "kiln_timing_cache_test.json").string();
  std::filesystem::remove(path);
  TimingCache a("cpu|x86_64|v1");
  a.Insert("Conv:1", {"cpu.conv", {"f32-conv-cpu-onednn", {1, 2}, 4096}, 0.25});
  ASSERT_TRUE(a.Save(path).ok());
  TimingCache b("cpu|x86_64|v1");
  b.Insert("Gemm:2", {"cpu.gemm", {"f32-gemm-cpu-openblas", {}, 0}, 0.5});
  ASSERT_TRUE(b.Save(path).ok());  // merges with a's entry on disk
  TimingCache c("cpu|x86_64|v1");
  ASSERT_TRUE(c.Load(path).ok());
  ASSERT_EQ(c.size(), 2u);
  const TimingEntry* e = c.Find("Conv:1");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->tactic.name, "f32-conv-cpu-onednn");
  EXPECT_EQ(e->tactic.params, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(e->tactic.workspace_bytes, 4096u);
  EXPECT_DOUBLE_EQ(e->time_ms, 0.25);
  std::filesystem::remove(path);
}

TEST(TimingCache, ForeignOrCorruptCachesAreRejected) {
  TimingCache mine("cuda|sm_90|v1");
  TimingCache other("cpu|x86_64|v1");
  other.Insert("Conv:1", {"cpu.conv", {"t", {}, 0}, 1.0});
  Status s = mine.Parse(other.Serialize());
  EXPECT_EQ(s.code(), ErrorCode::kTimingCacheInvalid);
  EXPECT_NE(s.message().find("cpu|x86_64|v1"), std::string::npos);
  EXPECT_EQ(mine.size(), 0u);
  EXPECT_EQ(mine.Parse("garbage").code(), ErrorCode::kTimingCacheInvalid);
  EXPECT_EQ(
      mine.Parse(
              R"({"format":"kiln-timing-cache-v1","device":"cuda|sm_90|v1","entries":{"x":{"provider":1}}})")
          .code(),
      ErrorCode::kTimingCacheInvalid);
  EXPECT_EQ(mine.size(), 0u);  // nothing from a bad file is trusted
}

}  // namespace
}  // namespace kiln
