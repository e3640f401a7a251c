// Runs every incident log set in tests/doctor/corpus through the library and checks the verdict,
// the root cause and the consequences and corrections against the case's expected.json.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "kiln/doctor/log_analyzer.h"

namespace kiln::doctor {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Cases() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(KILN_DOCTOR_CORPUS_DIR, ec)) {
    if (e.is_directory()) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> GroupIds(const std::vector<EventGroup>& groups) {
  std::vector<std::string> ids;
  for (const auto& g : groups) ids.push_back(g.id);
  return ids;
}

std::string VerdictName(const Diagnosis& d) {
  return d.verdict == Diagnosis::Verdict::kFailure    ? "failure"
         : d.verdict == Diagnosis::Verdict::kWarnings ? "warnings"
                                                      : "healthy";
}

void CheckAgainstExpected(const Diagnosis& d, const nlohmann::json& want) {
  EXPECT_EQ(VerdictName(d), want["verdict"].get<std::string>());
  EXPECT_EQ(d.ExitCode(), want["exit_code"].get<int>());
  const auto& root = want["root_cause"];
  if (root.is_null()) {
    EXPECT_EQ(d.root, -1);
    // A healthy set invents nothing.
    EXPECT_TRUE(d.consequences.empty()) << ::testing::PrintToString(GroupIds(d.consequences));
    EXPECT_TRUE(d.warnings.empty()) << ::testing::PrintToString(GroupIds(d.warnings));
    EXPECT_TRUE(d.remedies.empty());
    return;
  }
  ASSERT_GE(d.root, 0);
  const Event& r = d.events[d.root];
  EXPECT_EQ(r.id, root["id"].get<std::string>()) << d.root_summary;
  if (root.contains("host")) {
    EXPECT_EQ(r.host, root["host"].get<std::string>());
  }
  if (root.contains("rank")) {
    EXPECT_EQ(r.rank, root["rank"].get<int>());
  }
  if (root.contains("gpu")) {
    EXPECT_EQ(r.gpu, root["gpu"].get<std::string>());
  }
  EXPECT_FALSE(d.remedies.empty());
  EXPECT_FALSE(d.evidence.empty());
  EXPECT_EQ(d.evidence.front(), d.root);
  auto cons = GroupIds(d.consequences);
  for (const auto& id : want["consequences_include"]) {
    EXPECT_NE(std::find(cons.begin(), cons.end(), id.get<std::string>()), cons.end())
        << "missing consequence " << id << " in " << ::testing::PrintToString(cons);
  }
  auto warns = GroupIds(d.warnings);
  for (const auto& id : want["warnings_include"]) {
    EXPECT_NE(std::find(warns.begin(), warns.end(), id.get<std::string>()), warns.end())
        << "missing warning " << id << " in " << ::testing::PrintToString(warns);
  }
}

class CorpusTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CorpusTest, RootCauseMatchesExpected) {
  fs::path dir = fs::path(KILN_DOCTOR_CORPUS_DIR) / GetParam();
  std::ifstream in(dir / "expected.json");
  ASSERT_TRUE(in) << dir;
  nlohmann::json want = nlohmann::json::parse(in);
  auto d = DiagnoseLogs({(dir / "logs").string()});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  SCOPED_TRACE(GetParam() + ": " + d->root_summary);
  CheckAgainstExpected(*d, want);
}

TEST_P(CorpusTest, SameAnswerWithTinyChunks) {
  // 4 KiB chunks cut every file into several scans; lines, times and ranks must not change.
  fs::path dir = fs::path(KILN_DOCTOR_CORPUS_DIR) / GetParam();
  auto big = DiagnoseLogs({(dir / "logs").string()});
  AnalyzerOptions small;
  small.chunk_bytes = 4096;
  auto tiny = DiagnoseLogs({(dir / "logs").string()}, small);
  ASSERT_TRUE(big.ok() && tiny.ok());
  EXPECT_EQ(big->lines, tiny->lines);
  EXPECT_EQ(big->events.size(), tiny->events.size());
  EXPECT_EQ(big->root_summary, tiny->root_summary);
  if (big->root >= 0 && tiny->root >= 0) {
    EXPECT_EQ(big->events[big->root].line, tiny->events[tiny->root].line);
  }
}

INSTANTIATE_TEST_SUITE_P(Incidents, CorpusTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(Corpus, CoversTheRequiredIncidents) {
  auto cases = Cases();
  EXPECT_GE(cases.size(), 10u);
  int healthy = 0;
  for (const auto& c : cases) healthy += c.starts_with("healthy");
  EXPECT_GE(healthy, 2);
}

}  // namespace
}  // namespace kiln::doctor
