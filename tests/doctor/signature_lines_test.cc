// Every signature of data/doctor/signatures.json against at least two real-format lines
// (tests/doctor/signature_lines.json): each line, fed to the analyzer alone, yields the
// signature's event. A signature without lines fails the test, so the data cannot grow untested.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>

#include "kiln/doctor/log_analyzer.h"

namespace kiln::doctor {
namespace {

nlohmann::json Lines() {
  std::ifstream in(KILN_DOCTOR_SIGNATURE_LINES);
  EXPECT_TRUE(in) << KILN_DOCTOR_SIGNATURE_LINES;
  return nlohmann::json::parse(in)["lines"];
}

TEST(SignatureLines, EverySignatureHasTwoRealLines) {
  auto db = SignatureDb::Default();
  ASSERT_TRUE(db.ok());
  nlohmann::json lines = Lines();
  for (const Signature& s : (*db)->signatures()) {
    if (s.pattern.empty()) continue;  // emitted by handlers or the correlation, not by a pattern
    ASSERT_TRUE(lines.contains(s.id)) << s.id << " has no test lines";
    const nlohmann::json& e = lines[s.id];
    size_t n = e.is_array() ? e.size() : e["lines"].size();
    EXPECT_GE(n, 2u) << s.id;
  }
  for (const auto& [id, e] : lines.items()) EXPECT_GE((*db)->Find(id), 0) << id << " is unknown";
}

TEST(SignatureLines, EachLineYieldsItsSignature) {
  auto db = SignatureDb::Default();
  auto kp = KnownProblems::Default();
  ASSERT_TRUE(db.ok() && kp.ok());
  auto analyzer = LogAnalyzer::Create(*db, *kp);
  ASSERT_TRUE(analyzer.ok());
  // One buffer per line (its own "file"), so the lines cannot help each other.
  struct Want {
    std::string sig, line, expect, prefix;
    std::vector<std::string> any;
    int rank = -1;
  };
  std::vector<Want> wants;
  const nlohmann::json all = Lines();
  for (const auto& [id, e] : all.items()) {
    Want w;
    w.sig = id;
    const nlohmann::json& list = e.is_array() ? e : e["lines"];
    if (e.is_object()) {
      w.expect = e.value("expect", "");
      w.prefix = e.value("expect_prefix", "");
      w.any = e.value("expect_any", std::vector<std::string>{});
      w.rank = e.value("expect_rank", -1);
    }
    if (w.expect.empty() && w.prefix.empty() && w.any.empty()) w.expect = id;
    for (const auto& l : list) {
      w.line = l.get<std::string>();
      (*analyzer)->AddBuffer(std::to_string(wants.size()), w.line + "\n");
      wants.push_back(w);
    }
  }
  Diagnosis d = (*analyzer)->Finish();
  std::vector<std::vector<const Event*>> by_file(wants.size());
  for (const Event& e : d.events) by_file[e.file].push_back(&e);
  for (size_t i = 0; i < wants.size(); ++i) {
    const Want& w = wants[i];
    bool found = false;
    std::vector<std::string> got;
    for (const Event* e : by_file[i]) {
      got.push_back(e->id);
      bool match = !w.expect.empty() ? e->id == w.expect
                   : !w.prefix.empty()
                       ? e->id.starts_with(w.prefix)
                       : std::find(w.any.begin(), w.any.end(), e->id) != w.any.end();
      if (match && (w.rank < 0 || e->rank == w.rank)) found = true;
    }
    EXPECT_TRUE(found) << w.sig << ": " << w.line << "\n  got " << ::testing::PrintToString(got);
  }
}

}  // namespace
}  // namespace kiln::doctor
