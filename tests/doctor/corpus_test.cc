// Runs every incident log set in tests/doctor/incidents through the library and checks the verdict,
// the root cause, the consequences and corrections that must be reported and the findings that
// must not be (false alarms) against the case's expected.json; reports the corpus accuracy.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
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

// Every id the diagnosis reports: root, consequences, warnings.
std::vector<std::string> ReportedIds(const Diagnosis& d) {
  std::vector<std::string> ids = GroupIds(d.consequences);
  for (const auto& id : GroupIds(d.warnings)) ids.push_back(id);
  if (d.root >= 0) ids.push_back(d.events[d.root].id);
  return ids;
}

// The two accuracy criteria, as values: the expected root cause comes first, and nothing listed in
// "must_not_include" is reported.
bool RootCauseRight(const Diagnosis& d, const nlohmann::json& want) {
  const auto& root = want["root_cause"];
  if (root.is_null()) return d.root == -1 && VerdictName(d) == want["verdict"].get<std::string>();
  return d.root >= 0 && d.events[d.root].id == root["id"].get<std::string>() &&
         VerdictName(d) == want["verdict"].get<std::string>();
}
bool NoFalseAlarm(const Diagnosis& d, const nlohmann::json& want) {
  auto ids = ReportedIds(d);
  for (const auto& bad : want.value("must_not_include", nlohmann::json::array())) {
    if (std::find(ids.begin(), ids.end(), bad.get<std::string>()) != ids.end()) return false;
  }
  return true;
}

void CheckAgainstExpected(const Diagnosis& d, const nlohmann::json& want) {
  EXPECT_EQ(VerdictName(d), want["verdict"].get<std::string>());
  EXPECT_EQ(d.ExitCode(), want["exit_code"].get<int>());
  auto ids = ReportedIds(d);
  for (const auto& bad : want.value("must_not_include", nlohmann::json::array())) {
    EXPECT_EQ(std::find(ids.begin(), ids.end(), bad.get<std::string>()), ids.end())
        << "false alarm " << bad << " in " << ::testing::PrintToString(ids);
  }
  auto warns = GroupIds(d.warnings);
  for (const auto& id : want.value("warnings_include", nlohmann::json::array())) {
    EXPECT_NE(std::find(warns.begin(), warns.end(), id.get<std::string>()), warns.end())
        << "missing warning " << id << " in " << ::testing::PrintToString(warns);
  }
  const auto& root = want["root_cause"];
  if (root.is_null()) {
    EXPECT_EQ(d.root, -1);
    EXPECT_TRUE(d.consequences.empty()) << ::testing::PrintToString(GroupIds(d.consequences));
    if (want.value("warnings_include", nlohmann::json::array()).empty()) {
      // A healthy set invents nothing.
      EXPECT_TRUE(d.warnings.empty()) << ::testing::PrintToString(GroupIds(d.warnings));
      EXPECT_TRUE(d.remedies.empty());
    }
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
  if (root.contains("summary_contains")) {
    EXPECT_NE(d.root_summary.find(root["summary_contains"].get<std::string>()), std::string::npos)
        << d.root_summary;
  }
  EXPECT_FALSE(d.remedies.empty());
  EXPECT_FALSE(d.evidence.empty());
  EXPECT_EQ(d.evidence.front(), d.root);
  auto cons = GroupIds(d.consequences);
  for (const auto& id : want.value("consequences_include", nlohmann::json::array())) {
    EXPECT_NE(std::find(cons.begin(), cons.end(), id.get<std::string>()), cons.end())
        << "missing consequence " << id << " in " << ::testing::PrintToString(cons);
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
  EXPECT_GE(cases.size(), 40u);
  int healthy = 0;
  for (const auto& c : cases) healthy += c.starts_with("healthy");
  EXPECT_GE(healthy, 4);
  for (const auto& c : cases) {
    std::ifstream in(fs::path(KILN_DOCTOR_CORPUS_DIR) / c / "expected.json");
    nlohmann::json want = nlohmann::json::parse(in);
    EXPECT_TRUE(want.contains("must_not_include")) << c << ": every case names its false alarms";
  }
}

// The corpus score, printed for CI logs: the share of incidents whose expected root cause is
// reported first, and the share with no false alarm. Anything below 100% fails.
TEST(Corpus, Accuracy) {
  int total = 0, root_ok = 0, clean = 0;
  std::vector<std::string> wrong;
  for (const auto& c : Cases()) {
    fs::path dir = fs::path(KILN_DOCTOR_CORPUS_DIR) / c;
    std::ifstream in(dir / "expected.json");
    nlohmann::json want = nlohmann::json::parse(in);
    auto d = DiagnoseLogs({(dir / "logs").string()});
    ASSERT_TRUE(d.ok()) << c << ": " << d.status().ToString();
    ++total;
    bool r = RootCauseRight(*d, want), f = NoFalseAlarm(*d, want);
    root_ok += r;
    clean += f;
    if (!r || !f) wrong.push_back(c + " (" + d->root_summary + ")");
  }
  std::printf(
      "doctor corpus accuracy: %d incidents, root cause first %d/%d (%.1f%%), no false alarm "
      "%d/%d (%.1f%%)\n",
      total, root_ok, total, 100.0 * root_ok / std::max(total, 1), clean, total,
      100.0 * clean / std::max(total, 1));
  EXPECT_EQ(root_ok, total) << ::testing::PrintToString(wrong);
  EXPECT_EQ(clean, total) << ::testing::PrintToString(wrong);
}

}  // namespace
}  // namespace kiln::doctor
