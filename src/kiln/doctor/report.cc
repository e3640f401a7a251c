// Text and JSON output of `kiln doctor` and `kiln doctor logs`.
#include "kiln/doctor/report.h"

#include <algorithm>

namespace kiln::doctor {

namespace {

struct Style {
  bool on;
  std::string Red(std::string_view s) const { return Wrap("1;31", s); }
  std::string Yellow(std::string_view s) const { return Wrap("33", s); }
  std::string Green(std::string_view s) const { return Wrap("32", s); }
  std::string Bold(std::string_view s) const { return Wrap("1", s); }
  std::string Dim(std::string_view s) const { return Wrap("2", s); }
  std::string Wrap(std::string_view code, std::string_view s) const {
    return on ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : std::string(s);
  }
};

std::string Ranks(std::vector<int> r) {
  std::sort(r.begin(), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i ? fmt::format("{}-{}", r[i], r[j]) : fmt::format("{}", r[i]);
    i = j + 1;
  }
  return out;
}

std::string Join(const std::vector<std::string>& v, size_t max = 4, std::string_view sep = ",") {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max; ++i) {
    if (i) out += sep;
    out += v[i];
  }
  if (v.size() > max) out += fmt::format(",+{}", v.size() - max);
  return out;
}

const std::string& Or(const std::string& a, const std::string& b) { return a.empty() ? b : a; }

std::string Clip(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  size_t cut = n;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;  // UTF-8 boundary
  return std::string(s.substr(0, cut)) + "...";
}

std::string When(int64_t us, bool estimated) {
  if (us == kNoTime) return "(time unknown)";
  return FormatTimeUs(us) + (estimated ? "~" : "");
}

nlohmann::json EventJson(const Diagnosis& d, const SignatureDb& db, int i) {
  const Event& e = d.events[i];
  const Signature* s = e.sig >= 0 ? &db.signatures()[e.sig] : nullptr;
  nlohmann::json j;
  j["id"] = e.id;
  j["title"] = Or(e.title, s ? s->title : e.title);
  j["severity"] = ToString(e.severity);
  j["role"] = ToString(e.role);
  if (s) j["category"] = s->category;
  j["meaning"] = Or(e.meaning, s ? s->meaning : e.meaning);
  j["cause"] = Or(e.cause, s ? s->cause : e.cause);
  j["remedy"] = Or(e.remedy, s ? s->remedy : e.remedy);
  if (s && !s->references.empty()) j["references"] = s->references;
  j["file"] = e.file >= 0 ? d.files[e.file] : "";
  j["line"] = e.line;
  j["text"] = e.text;
  if (e.time_us != kNoTime) {
    j["time"] = FormatTimeUs(e.time_us);
    j["time_us"] = e.time_us;
    j["time_estimated"] = e.time_estimated;
  }
  if (!e.host.empty()) j["host"] = e.host;
  if (e.rank >= 0) j["rank"] = e.rank;
  if (e.local_rank >= 0) j["local_rank"] = e.local_rank;
  if (e.pid >= 0) j["pid"] = e.pid;
  if (!e.gpu.empty()) j["gpu"] = e.gpu;
  for (const auto& [k, v] : e.fields) j["fields"][k] = v;
  return j;
}

nlohmann::json GroupJson(const EventGroup& g) {
  nlohmann::json j;
  j["id"] = g.id;
  j["title"] = g.title;
  j["severity"] = ToString(g.severity);
  j["role"] = ToString(g.role);
  j["count"] = g.count;
  j["hosts"] = g.hosts;
  j["ranks"] = g.ranks;
  j["gpus"] = g.gpus;
  if (g.first_time_us != kNoTime) {
    j["first_time"] = FormatTimeUs(g.first_time_us);
    j["first_time_estimated"] = g.first_time_estimated;
  }
  return j;
}

}  // namespace

std::string RenderDiagnosisText(const Diagnosis& d, const SignatureDb& db, const RenderOptions& o) {
  Style st{o.color};
  std::string out;
  const auto& sigs = db.signatures();
  auto title_of = [&](const Event& e) { return !e.title.empty() ? e.title : sigs[e.sig].title; };
  auto field = [&](const Event& e, std::string Event::*own, std::string Signature::*sig) {
    const std::string& v = e.*own;
    return !v.empty() || e.sig < 0 ? v : sigs[e.sig].*sig;
  };
  std::string stats = fmt::format("{} file(s), {:.1f} MB, {} lines, {:.2f} s", d.files.size(),
                                  d.bytes / 1e6, d.lines, d.seconds);
  switch (d.verdict) {
    case Diagnosis::Verdict::kHealthy:
      out += st.Green("HEALTHY") + ": no failure and nothing suspicious in these logs (" + stats +
             ")\n";
      break;
    case Diagnosis::Verdict::kWarnings:
      out += st.Yellow("WARNINGS") + ": no failure found, but see below (" + stats + ")\n";
      break;
    case Diagnosis::Verdict::kFailure:
      out += st.Red("FAILURE") + " (" + stats + ")\n";
      break;
  }
  if (d.root >= 0) {
    const Event& r = d.events[d.root];
    out += "\n" + st.Red("ROOT CAUSE") + "  " + st.Bold(title_of(r)) + "\n";
    std::vector<std::string> where;
    if (!r.host.empty()) where.push_back("host " + r.host);
    if (!r.gpu.empty()) where.push_back("GPU " + r.gpu);
    if (r.rank >= 0)
      where.push_back(fmt::format("rank {}", r.rank));
    else if (r.local_rank >= 0)
      where.push_back(fmt::format("local rank {}", r.local_rank));
    where.push_back(When(r.time_us, r.time_estimated));
    out += fmt::format("  where     {}\n", Join(where, 8, ", "));
    out += fmt::format("  means     {}\n", field(r, &Event::meaning, &Signature::meaning));
    if (auto c = field(r, &Event::cause, &Signature::cause); !c.empty())
      out += fmt::format("  cause     {}\n", c);
    out += fmt::format("  why root  {}\n", d.root_note);
  }
  if (!d.consequences.empty()) {
    out += "\n" + st.Bold("THEN (consequences, in time order)") + "\n";
    for (const EventGroup& g : d.consequences) {
      std::string who;
      if (!g.ranks.empty()) who += (g.ranks.size() == 1 ? "  rank " : "  ranks ") + Ranks(g.ranks);
      if (!g.hosts.empty()) who += (g.hosts.size() == 1 ? " on " : " on hosts ") + Join(g.hosts);
      out += fmt::format("  {:<24} {:>4}x  {}{}\n", When(g.first_time_us, g.first_time_estimated),
                         g.count, g.title, st.Dim(who));
    }
  }
  if (!d.warnings.empty()) {
    out += "\n" +
           st.Yellow(d.root >= 0 ? "ALSO FOUND (wrong beliefs, risky settings, warnings)"
                                 : "WARNINGS") +
           "\n";
    for (const EventGroup& g : d.warnings) {
      const Event& e = d.events[g.first];
      std::string where;
      if (!g.hosts.empty()) where += " on " + Join(g.hosts);
      if (g.first_time_us != kNoTime)
        where += ", first " + When(g.first_time_us, g.first_time_estimated);
      out += fmt::format("  - {}{}{}\n", g.title, g.count > 1 ? fmt::format(" ({}x)", g.count) : "",
                         st.Dim(where));
      if (auto m = field(e, &Event::meaning, &Signature::meaning); !m.empty())
        out += fmt::format("      {}\n", st.Dim(m));
    }
  }
  if (!d.evidence.empty()) {
    out += "\n" + st.Bold("EVIDENCE") + "\n";
    for (int i : d.evidence) {
      const Event& e = d.events[i];
      out += fmt::format("  {}:{}\n      {}\n", d.files[e.file], e.line,
                         st.Dim(Clip(e.text, o.max_evidence_chars)));
    }
  }
  if (!d.remedies.empty()) {
    out += "\n" + st.Bold("WHAT TO DO") + "\n";
    for (size_t i = 0; i < d.remedies.size(); ++i)
      out += fmt::format("  {}. {}\n", i + 1, d.remedies[i]);
  }
  for (const std::string& n : d.notes) out += st.Dim("note: " + n) + "\n";
  return out;
}

nlohmann::json DiagnosisToJson(const Diagnosis& d, const SignatureDb& db) {
  nlohmann::json j;
  j["verdict"] = d.verdict == Diagnosis::Verdict::kFailure    ? "failure"
                 : d.verdict == Diagnosis::Verdict::kWarnings ? "warnings"
                                                              : "healthy";
  j["exit_code"] = d.ExitCode();
  if (d.root >= 0) {
    j["root_cause"] = EventJson(d, db, d.root);
    j["root_cause"]["summary"] = d.root_summary;
    j["root_cause"]["why_root"] = d.root_note;
  } else {
    j["root_cause"] = nullptr;
  }
  j["consequences"] = nlohmann::json::array();
  for (const auto& g : d.consequences) j["consequences"].push_back(GroupJson(g));
  j["warnings"] = nlohmann::json::array();
  for (const auto& g : d.warnings) {
    nlohmann::json w = GroupJson(g);
    w["first"] = EventJson(d, db, g.first);
    j["warnings"].push_back(std::move(w));
  }
  j["evidence"] = nlohmann::json::array();
  for (int i : d.evidence) {
    const Event& e = d.events[i];
    j["evidence"].push_back(
        {{"file", d.files[e.file]}, {"line", e.line}, {"id", e.id}, {"text", e.text}});
  }
  j["remedies"] = d.remedies;
  j["notes"] = d.notes;
  j["stats"] = {{"files", d.files.size()},
                {"bytes", d.bytes},
                {"lines", d.lines},
                {"matches", d.matches},
                {"seconds", d.seconds}};
  return j;
}

std::string RenderPreflightText(const PreflightReport& r, const RenderOptions& o) {
  Style st{o.color};
  int errors = 0, warnings = 0;
  for (const Finding& f : r.findings) {
    errors += f.severity >= Severity::kError;
    warnings += f.severity == Severity::kWarning;
  }
  std::string out;
  std::string head = errors     ? st.Red(fmt::format("{} error(s)", errors))
                     : warnings ? st.Yellow("no errors")
                                : st.Green("HEALTHY");
  out += fmt::format("kiln doctor: {}, {} warning(s) (exit {})\n", head, warnings, r.ExitCode());
  bool info_header = false;
  for (const Finding& f : r.findings) {
    if (f.severity >= Severity::kWarning) {
      std::string label = f.severity >= Severity::kError ? st.Red("ERROR  ") : st.Yellow("WARNING");
      out += fmt::format("\n{} {}\n", label, st.Bold(f.what));
      if (!f.why.empty()) out += fmt::format("        why: {}\n", f.why);
      if (!f.todo.empty()) out += fmt::format("        do:  {}\n", f.todo);
    } else {
      if (!info_header) {
        out += fmt::format("\n{}\n", st.Bold("facts"));
        info_header = true;
      }
      out += fmt::format("  {}\n", f.what);
    }
  }
  return out;
}

nlohmann::json PreflightToJson(const PreflightReport& r) {
  nlohmann::json j;
  j["exit_code"] = r.ExitCode();
  j["findings"] = nlohmann::json::array();
  for (const Finding& f : r.findings) {
    j["findings"].push_back({{"severity", ToString(f.severity)},
                             {"check", f.check},
                             {"what", f.what},
                             {"why", f.why},
                             {"todo", f.todo}});
  }
  const MachineFacts& m = r.facts;
  nlohmann::json facts;
  facts["kiln_version"] = m.kiln_version;
  facts["driver_version"] = m.driver_version;
  facts["cuda_driver_api"] = m.cuda_driver_api;
  facts["gpu_error"] = m.gpu_error;
  facts["gpus"] = nlohmann::json::array();
  for (const GpuFacts& g : m.gpus) {
    nlohmann::json gj = {{"index", g.index},
                         {"name", g.name},
                         {"pci_bus", g.pci_bus},
                         {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                         {"total_bytes", g.total_bytes},
                         {"compute_mode", g.compute_mode},
                         {"kernel_exec_timeout", g.kernel_exec_timeout}};
    if (g.free_bytes) gj["free_bytes"] = *g.free_bytes;
    facts["gpus"].push_back(std::move(gj));
  }
  facts["peer_access"] = m.peer;
  for (const LibraryFacts& l : m.libraries)
    facts["libraries"][l.name] = {{"found", l.found}, {"version", l.version}, {"detail", l.detail}};
  facts["interfaces"] = m.interfaces;
  j["facts"] = std::move(facts);
  return j;
}

}  // namespace kiln::doctor
