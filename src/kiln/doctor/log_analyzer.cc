// Log analysis: one Hyperscan pass over each chunk, field extraction on matching lines only, then
// timeline correlation and root-cause selection (see log_analyzer.h and docs/doctor.md).
#include "kiln/doctor/log_analyzer.h"

#include <fcntl.h>
#include <hs/hs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "kiln/core/file_io.h"
#include "kiln/core/hash.h"
#include "kiln/core/logging.h"
#include "kiln/doctor/env_check.h"

namespace kiln::doctor {

namespace {

namespace fs = std::filesystem;

// Hardware faults logged up to this long after another fault on the same host still count as its
// cause: the kernel log and the application clocks differ, and the application often sees the
// failure before the driver prints the Xid.
constexpr int64_t kHardwareWindowUs = 30'000'000;
// Lines searched backwards for a timestamp when a matched line has none (NCCL lines).
constexpr int kInheritLines = 64;

struct Match {
  unsigned id;
  unsigned long long to;
};

int OnMatch(unsigned int id, unsigned long long /*from*/, unsigned long long to,
            unsigned int /*flags*/, void* ctx) {
  static_cast<std::vector<Match>*>(ctx)->push_back({id, to});
  return 0;
}

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "0000:c6:00" / "00000000:C6:00.0" / "c6000" (NCCL busId) -> "c6".
std::string PciBus(std::string_view gpu) {
  if (gpu.empty() || gpu.starts_with("cuda:")) return {};
  size_t colon = gpu.find(':');
  if (colon != std::string_view::npos) {
    std::string_view rest = gpu.substr(colon + 1);
    return ToLower(rest.substr(0, rest.find(':')));
  }
  // NCCL busId: bus, device, function as "c6000" (bus = all but the last 3 digits).
  if (gpu.size() > 3)
    return ToLower(gpu.substr(0, gpu.size() - 3)).substr(gpu.size() > 5 ? gpu.size() - 5 : 0);
  return {};
}

std::string NormalizeGpu(std::string_view gpu) {
  std::string g = ToLower(gpu);
  // "00000000:c6:00.0" -> "0000:c6:00"
  if (g.size() >= 16 && g[8] == ':') g = g.substr(4);
  if (g.size() > 10 && g[10] == '.') g = g.substr(0, 10);
  return g;
}

int YearOf(int64_t us) {
  std::string t = FormatTimeUs(us);
  return std::atoi(t.substr(0, 4).c_str());
}

std::string RankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i + 1 ? fmt::format("{}-{}", ranks[i], ranks[j])
                     : (j == i + 1 ? fmt::format("{},{}", ranks[i], ranks[j])
                                   : fmt::format("{}", ranks[i]));
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string_view Event::Field(std::string_view name) const {
  for (const auto& [k, v] : fields) {
    if (k == name) return v;
  }
  return {};
}

std::string SanitizeText(std::string_view s, size_t max_chars) {
  std::string out;
  out.reserve(std::min(s.size(), max_chars + 8));
  size_t chars = 0;
  for (size_t i = 0; i < s.size() && chars < max_chars;) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0x1b) {  // ANSI escape: skip "ESC [ ... letter"
      ++i;
      if (i < s.size() && s[i] == '[') {
        ++i;
        while (i < s.size() && !std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
        if (i < s.size()) ++i;
      }
      continue;
    }
    if (c < 0x80) {
      out += (c < 0x20 || c == 0x7f) ? ' ' : static_cast<char>(c);
      ++i;
      ++chars;
      continue;
    }
    int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len == 2 && c < 0xc2) ok = false;  // overlong
    if (ok && len == 3) {
      unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) ok = false;
    }
    if (ok && len == 4) {
      unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xf0 && c1 < 0x90) || c > 0xf4 || (c == 0xf4 && c1 >= 0x90)) ok = false;
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    }
    ++chars;
  }
  return out;
}

struct LogAnalyzer::Impl {
  std::shared_ptr<const SignatureDb> db;
  std::shared_ptr<const KnownProblems> kp;
  AnalyzerOptions opt;
  hs_database_t* hs_db = nullptr;
  hs_scratch_t* scratch = nullptr;
  std::vector<int> hs_to_sig;
  int sig_kiln = -1, sig_memory_full = -1, sig_ecc = -1, sig_concurrent = -1;

  struct FileState {
    std::string name;
    LineTime last_time;  // last timestamp seen before the current chunk
    std::vector<std::string> smi_columns;
    std::set<std::string> hosts;  // hosts named on this file's matched lines (capped)
  };
  std::set<std::string> all_hosts;
  std::vector<FileState> files;
  std::vector<Event> events;
  std::vector<uint64_t> kept_per_sig, seen_per_sig;
  struct Anchor {
    std::string host;
    int64_t rel_us;
    LineTime time;
  };
  std::vector<Anchor> anchors;
  std::map<std::pair<std::string, int64_t>, int> pid_rank;
  std::map<std::pair<std::string, std::string>, int> bus_rank;  // (host, pci bus) -> rank
  std::map<std::pair<std::string, int64_t>, std::string> pid_bus;
  std::map<int, int> years;
  std::vector<uint64_t> body_hash;  // per event, for de-duplication
  std::vector<Match> matches;
  uint64_t bytes = 0, lines = 0, nmatches = 0;
  std::vector<std::string> notes;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  ~Impl() {
    if (scratch) hs_free_scratch(scratch);
    if (hs_db) hs_free_database(hs_db);
  }

  Status Compile() {
    std::vector<const char*> exprs;
    std::vector<unsigned> flags, ids;
    const auto& sigs = db->signatures();
    for (size_t i = 0; i < sigs.size(); ++i) {
      if (sigs[i].pattern.empty()) continue;
      exprs.push_back(sigs[i].pattern.c_str());
      flags.push_back(HS_FLAG_MULTILINE | (sigs[i].caseless ? HS_FLAG_CASELESS : 0u));
      ids.push_back(static_cast<unsigned>(hs_to_sig.size()));
      hs_to_sig.push_back(static_cast<int>(i));
    }
    if (exprs.empty())
      return MakeError(ErrorCode::kSignatureDbInvalid, "no signature has a pattern");
    hs_compile_error_t* err = nullptr;
    if (hs_compile_multi(exprs.data(), flags.data(), ids.data(),
                         static_cast<unsigned>(exprs.size()), HS_MODE_BLOCK, nullptr, &hs_db,
                         &err) != HS_SUCCESS) {
      std::string which = err && err->expression >= 0 ? sigs[hs_to_sig[err->expression]].id
                                                      : std::string("(database)");
      std::string msg = err ? err->message : "unknown";
      hs_free_compile_error(err);
      return MakeError(ErrorCode::kSignatureDbInvalid,
                       "signature '{}': Hyperscan cannot compile the pattern: {}", which, msg);
    }
    if (hs_alloc_scratch(hs_db, &scratch) != HS_SUCCESS)
      return MakeError(ErrorCode::kInternal, "hs_alloc_scratch failed");
    sig_kiln = db->Find("kiln.catalog");
    sig_memory_full = db->Find("smi.memory-full");
    sig_ecc = db->Find("smi.ecc-uncorrected");
    sig_concurrent = db->Find("build.concurrent");
    kept_per_sig.assign(sigs.size(), 0);
    seen_per_sig.assign(sigs.size(), 0);
    return OkStatus();
  }

  int AddFileState(std::string_view name) {
    files.push_back(FileState{std::string(name), {}, {}, {}});
    return static_cast<int>(files.size() - 1);
  }

  // Scans [data, data+len) which ends at a line boundary (or is cut); `line_no` is the line
  // number of its first byte and is advanced past it.
  void ScanChunk(int file, const char* data, size_t len, uint64_t* line_no) {
    matches.clear();
    if (hs_scan(hs_db, data, static_cast<unsigned>(len), 0, scratch, OnMatch, &matches) !=
        HS_SUCCESS) {
      notes.push_back(fmt::format("{}: a chunk could not be scanned", files[file].name));
    }
    std::stable_sort(matches.begin(), matches.end(),
                     [](const Match& a, const Match& b) { return a.to < b.to; });
    nmatches += matches.size();
    size_t cursor = 0;  // newlines counted up to here
    uint64_t cur_line = *line_no;
    std::vector<int> line_sigs;
    size_t i = 0;
    while (i < matches.size()) {
      size_t end_pos = matches[i].to == 0 ? 0 : matches[i].to - 1;
      const char* nl_before =
          end_pos == 0 ? nullptr : static_cast<const char*>(memrchr(data, '\n', end_pos));
      size_t ls = nl_before ? static_cast<size_t>(nl_before - data) + 1 : 0;
      const char* nl_after = static_cast<const char*>(memchr(data + end_pos, '\n', len - end_pos));
      size_t le = nl_after ? static_cast<size_t>(nl_after - data) : len;
      line_sigs.clear();
      while (i < matches.size() && matches[i].to <= le + 1 && matches[i].to > ls) {
        int s = hs_to_sig[matches[i].id];
        if (std::find(line_sigs.begin(), line_sigs.end(), s) == line_sigs.end())
          line_sigs.push_back(s);
        ++i;
      }
      cur_line += std::count(data + cursor, data + ls, '\n');
      cursor = ls;
      ProcessLine(file, cur_line, std::string_view(data + ls, le - ls), line_sigs, data, ls);
    }
    cur_line += std::count(data + cursor, data + len, '\n');
    lines += cur_line - *line_no;
    *line_no = cur_line;
    // Remember the last timestamp of this chunk for untimed lines at the start of the next one.
    LineTime t = FindTimeBefore(data, len, kInheritLines);
    if (t.kind != LineTime::Kind::kNone) files[file].last_time = t;
  }

  // The nearest timestamp on one of the `max_lines` lines ending before `pos`.
  static LineTime FindTimeBefore(const char* data, size_t pos, int max_lines) {
    size_t end = pos;
    for (int k = 0; k < max_lines && end > 0; ++k) {
      size_t e = end;
      if (data[e - 1] == '\n') --e;
      const char* nl = e == 0 ? nullptr : static_cast<const char*>(memrchr(data, '\n', e));
      size_t s = nl ? static_cast<size_t>(nl - data) + 1 : 0;
      LineInfo li = ParseLine(std::string_view(data + s, std::min<size_t>(e - s, 200)));
      if (li.time.kind != LineTime::Kind::kNone) return li.time;
      if (s == 0) break;
      end = s;
    }
    return {};
  }

  void Keep(Event ev, uint64_t hash) {
    if (ev.sig >= 0) {
      ++seen_per_sig[ev.sig];
      if (kept_per_sig[ev.sig] >= opt.max_events_per_signature) return;
      ++kept_per_sig[ev.sig];
    }
    events.push_back(std::move(ev));
    body_hash.push_back(hash);
  }

  void ProcessLine(int file, uint64_t line_no, std::string_view line, std::vector<int>& sigs,
                   const char* chunk, size_t line_start) {
    const auto& all = db->signatures();
    bool specific = false;
    for (int s : sigs) specific |= !all[s].generic;
    if (specific) {
      sigs.erase(std::remove_if(sigs.begin(), sigs.end(), [&](int s) { return all[s].generic; }),
                 sigs.end());
    } else if (sigs.size() > 1) {
      // Several fallbacks of one category ("Error Code 1: Cuda Runtime" is also a TensorRT
      // error): the one listed first in the database is the narrower and stands for the line.
      std::sort(sigs.begin(), sigs.end());
      std::vector<std::string_view> categories;
      sigs.erase(std::remove_if(sigs.begin(), sigs.end(),
                                [&](int s) {
                                  std::string_view cat = all[s].category;
                                  if (std::find(categories.begin(), categories.end(), cat) !=
                                      categories.end())
                                    return true;
                                  categories.push_back(cat);
                                  return false;
                                }),
                 sigs.end());
    }
    std::sort(sigs.begin(), sigs.end(), [&](int a, int b) {
      return !all[a].handler.empty() > !all[b].handler.empty();  // handlers first
    });
    LineInfo info = ParseLine(line);
    if (info.time.kind == LineTime::Kind::kAbsolute) ++years[YearOf(info.time.us)];
    if (!info.host.empty() && files[file].hosts.size() < 64) {
      if (files[file].hosts.emplace(info.host).second && all_hosts.size() < 100000)
        all_hosts.emplace(info.host);
    }
    if (info.time.kernel_rel_us >= 0 && !info.host.empty() && anchors.size() < 100000)
      anchors.push_back({std::string(info.host), info.time.kernel_rel_us, info.time});
    uint64_t hash = HashString(info.body).low;

    auto base_event = [&](int sig) {
      Event ev;
      ev.sig = sig;
      ev.id = all[sig].id;
      ev.severity = all[sig].severity;
      ev.role = all[sig].role;
      ev.file = file;
      ev.line = line_no + 1;
      ev.raw_time = info.time;
      ev.host = SanitizeText(info.host, 128);
      ev.rank = info.rank;
      ev.local_rank = info.local_rank;
      ev.pid = info.pid;
      if (info.cuda_dev >= 0) ev.gpu = fmt::format("cuda:{}", info.cuda_dev);
      return ev;
    };
    bool env_finding = false;
    bool text_needed = false;
    for (int s : sigs) {
      const Signature& sig = all[s];
      if (sig.role == Role::kMyth && env_finding) continue;  // the env finding already says it
      if (sig.handler == "env") {
        env_finding |= HandleEnv(base_event(s), info.body, hash);
        continue;
      }
      if (sig.handler == "kiln_catalog") {
        HandleKiln(base_event(s), line, info, hash);
        continue;
      }
      if (sig.handler == "smi_header") {
        HandleSmiHeader(file, info.unwrapped);
        continue;
      }
      if (sig.handler == "smi_row") {
        HandleSmiRow(base_event(s), info.unwrapped, hash);
        continue;
      }
      if (sig.role != Role::kInfo && kept_per_sig[s] >= opt.max_events_per_signature) {
        ++seen_per_sig[s];  // past the cap only the count matters: skip the parsing
        continue;
      }
      Event ev = base_event(s);
      if (sig.fields) ExtractFields(*sig.fields, line, ev);
      if (auto g = ev.Field("gpu"); !g.empty()) ev.gpu = NormalizeGpu(g);
      if (auto p = ev.Field("pid"); !p.empty() && ev.pid < 0)
        ev.pid = std::atoll(std::string(p).c_str());
      if (auto lr = ev.Field("local_rank"); !lr.empty() && ev.local_rank < 0)
        ev.local_rank = std::atoi(std::string(lr).c_str());
      if (sig.role == Role::kInfo) {
        // Rank mapping lines (NCCL init) feed the maps and are not kept.
        if (auto r = ev.Field("rank"); !r.empty() && !ev.host.empty() && ev.pid >= 0) {
          int rank = std::atoi(std::string(r).c_str());
          pid_rank[{ev.host, ev.pid}] = rank;
          if (auto b = ev.Field("bus"); !b.empty()) {
            bus_rank[{ev.host, PciBus(b)}] = rank;
            pid_bus[{ev.host, ev.pid}] = PciBus(b);
          }
        }
        ++seen_per_sig[s];
        continue;
      }
      text_needed = true;
      ev.text = SanitizeText(line, opt.max_line_chars);
      Keep(std::move(ev), hash);
    }
    // Lines without their own time (NCCL) take the nearest earlier time of the same file.
    if (text_needed && info.time.kind == LineTime::Kind::kNone) {
      LineTime t = FindTimeBefore(chunk, line_start, kInheritLines);
      if (t.kind == LineTime::Kind::kNone) t = files[file].last_time;
      if (t.kind != LineTime::Kind::kNone) {
        for (size_t k = events.size();
             k-- > 0 && events[k].file == file && events[k].line == line_no + 1;) {
          events[k].raw_time = t;
          events[k].time_estimated = true;
        }
      }
    }
  }

  static void ExtractFields(const RE2& re, std::string_view line, Event& ev) {
    int n = re.NumberOfCapturingGroups();
    if (n <= 0) return;
    std::vector<re2::StringPiece> groups(n + 1);
    if (!re.Match(re2::StringPiece(line.data(), line.size()), 0, line.size(), RE2::UNANCHORED,
                  groups.data(), n + 1))
      return;
    for (const auto& [name, idx] : re.NamedCapturingGroups()) {
      if (idx <= n && groups[idx].data() != nullptr && !groups[idx].empty())
        ev.fields.emplace_back(
            name, SanitizeText(std::string_view(groups[idx].data(), groups[idx].size()), 120));
    }
    std::sort(ev.fields.begin(), ev.fields.end());
  }

  bool HandleEnv(Event base, std::string_view body, uint64_t hash) {
    for (std::string_view p : {"export ", "declare -x ", "env: ", "env:"}) {
      if (body.starts_with(p)) body.remove_prefix(p.size());
    }
    size_t eq = body.find('=');
    if (eq == std::string_view::npos) return false;
    std::string name(body.substr(0, eq));
    std::string_view value = body.substr(eq + 1);
    if (size_t hash_pos = value.find(" #"); hash_pos != std::string_view::npos)
      value = value.substr(0, hash_pos);
    std::vector<const EnvRule*> rules;
    std::vector<Finding> found = CheckEnvVar(*kp, name, value, nullptr, &rules);
    bool any = false;
    for (size_t i = 0; i < found.size(); ++i) {
      const Finding& f = found[i];
      if (f.severity < Severity::kWarning) continue;
      Event ev = base;
      ev.id = "env." + name;
      ev.severity = f.severity;
      ev.role = Role::kMyth;
      ev.title = f.what;
      ev.meaning = f.why;
      ev.remedy = fmt::format("{}: {}", name, f.todo);
      ev.explains = rules[i]->explains;
      ev.fields.emplace_back("value", SanitizeText(value, 120));
      ev.text = SanitizeText(body, opt.max_line_chars);
      Keep(std::move(ev), hash);
      any = true;
    }
    return any;
  }

  void HandleKiln(Event base, std::string_view line, const LineInfo& info, uint64_t hash) {
    std::vector<std::string_view> seen;
    for (size_t p = line.find("KILN-E"); p != std::string_view::npos;
         p = line.find("KILN-E", p + 6)) {
      std::string_view code = line.substr(p, 10);
      if (std::find(seen.begin(), seen.end(), code) != seen.end()) continue;  // "msg" and "code"
      seen.push_back(code);
      Event ev = base;
      ev.text = SanitizeText(line, opt.max_line_chars);
      const ErrorInfo* e = FindError(code);
      if (!e) {
        ev.id = fmt::format("kiln.{}", SanitizeText(code, 10));
        ev.severity = Severity::kWarning;
        ev.role = Role::kMyth;
        ev.title = fmt::format("{}: not in this kiln's error catalog", code);
        ev.meaning = "the log names a kiln error code this kiln does not know";
        ev.remedy = "read it with the kiln version that wrote the log (`kiln errors CODE`)";
        Keep(std::move(ev), hash);
        continue;
      }
      ev.id = "kiln." + e->Id();
      ev.severity = info.level == 'W' ? Severity::kWarning
                    : (info.level == 'I' || info.level == 'D' || info.level == 'T')
                        ? Severity::kInfo
                        : Severity::kError;
      if (ev.severity == Severity::kInfo) continue;
      std::string_view name = e->name;
      ev.role = name.find("Timeout") != std::string_view::npos ? Role::kConsequence
                : (name.find("Memory") != std::string_view::npos ||
                   name.find("Budget") != std::string_view::npos)
                    ? Role::kResource
                    : Role::kFault;
      ev.title = fmt::format("{} {}: {}", e->Id(), e->name, e->summary);
      ev.meaning = std::string(e->summary);
      ev.cause =
          fmt::format("raised by kiln's {} layer; the log line gives the details", e->subsystem);
      ev.remedy = std::string(e->remedy);
      ev.fields.emplace_back("code", e->Id());
      Keep(std::move(ev), hash);
    }
  }

  static std::vector<std::string_view> SplitCsv(std::string_view line) {
    std::vector<std::string_view> out;
    while (true) {
      size_t c = line.find(',');
      std::string_view item = line.substr(0, c);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\r')) item.remove_suffix(1);
      out.push_back(item);
      if (c == std::string_view::npos) break;
      line.remove_prefix(c + 1);
    }
    return out;
  }

  void HandleSmiHeader(int file, std::string_view line) {
    files[file].smi_columns.clear();
    for (std::string_view col : SplitCsv(line)) {
      files[file].smi_columns.emplace_back(col.substr(0, col.find(" [")));
    }
  }

  void HandleSmiRow(Event base, std::string_view line, uint64_t hash) {
    const auto& cols = files[base.file].smi_columns;
    if (cols.empty()) return;
    auto values = SplitCsv(line);
    auto get = [&](std::string_view name) -> std::string_view {
      for (size_t i = 0; i < cols.size() && i < values.size(); ++i) {
        if (cols[i] == name) return values[i];
      }
      return {};
    };
    auto num = [](std::string_view v) { return std::atof(std::string(v).c_str()); };
    std::string_view bus = get("pci.bus_id");
    std::string_view index = get("index");
    base.gpu = !bus.empty() ? NormalizeGpu(bus) : fmt::format("cuda:{}", index);
    base.text = SanitizeText(line, opt.max_line_chars);
    double used = num(get("memory.used")), total = num(get("memory.total"));
    if (sig_memory_full >= 0 && total > 0 && used / total >= 0.97) {
      Event ev = base;
      ev.sig = sig_memory_full;
      ev.id = db->signatures()[sig_memory_full].id;
      ev.severity = db->signatures()[sig_memory_full].severity;
      ev.role = db->signatures()[sig_memory_full].role;
      ev.fields.emplace_back("used_mib", fmt::format("{:.0f}", used));
      ev.fields.emplace_back("total_mib", fmt::format("{:.0f}", total));
      Keep(std::move(ev), hash);
    }
    std::string_view ecc = get("ecc.errors.uncorrected.volatile.total");
    if (sig_ecc >= 0 && !ecc.empty() && num(ecc) > 0) {
      Event ev = base;
      ev.sig = sig_ecc;
      ev.id = db->signatures()[sig_ecc].id;
      ev.severity = db->signatures()[sig_ecc].severity;
      ev.role = db->signatures()[sig_ecc].role;
      ev.fields.emplace_back("uncorrected", std::string(ecc));
      Keep(std::move(ev), hash);
    }
  }

  void Scan(int file, int fd) {
    const size_t cap = opt.chunk_bytes;
    std::vector<char> buf(cap);
    size_t carry = 0;
    uint64_t line_no = 0;
    uint64_t read_total = 0;
    bool first = true;
    while (true) {
      if (read_total >= opt.max_file_bytes) {
        if (carry > 0) ScanChunk(file, buf.data(), carry, &line_no);
        char probe;
        if (read(fd, &probe, 1) > 0) {
          notes.push_back(fmt::format(
              "{}: only the first {} MiB were read (the per-file cap, --max-mib); the rest was "
              "not scanned",
              files[file].name, opt.max_file_bytes >> 20));
        }
        break;
      }
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(cap - carry, opt.max_file_bytes - read_total));
      ssize_t n = read(fd, buf.data() + carry, want);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (carry > 0) ScanChunk(file, buf.data(), carry, &line_no);
        break;
      }
      if (first && n >= 2 && static_cast<unsigned char>(buf[0]) == 0x1f &&
          static_cast<unsigned char>(buf[1]) == 0x8b) {
        notes.push_back(
            fmt::format("{}: gzip-compressed, skipped (decompress it first)", files[file].name));
        return;
      }
      first = false;
      bytes += static_cast<uint64_t>(n);
      read_total += static_cast<uint64_t>(n);
      size_t total = carry + static_cast<size_t>(n);
      const char* nl = static_cast<const char*>(memrchr(buf.data(), '\n', total));
      if (nl) {
        size_t upto = static_cast<size_t>(nl - buf.data()) + 1;
        ScanChunk(file, buf.data(), upto, &line_no);
        carry = total - upto;
        std::memmove(buf.data(), buf.data() + upto, carry);
      } else if (total == cap) {
        ScanChunk(file, buf.data(), total, &line_no);  // one line longer than a chunk: cut it
        carry = 0;
      } else {
        carry = total;
      }
    }
  }

  Diagnosis Finish();
  void ResolveTimes(Diagnosis& d);
  void ChooseRoot(Diagnosis& d);
  void BlameConcurrentBuilds(Diagnosis& d);
  void PickRoot(Diagnosis& d, const std::vector<int>& failures, const std::vector<int>& candidates,
                const std::function<bool(int, int)>& before);
  void GroupEvents(Diagnosis& d, const std::vector<int>& failures,
                   const std::function<bool(int, int)>& before);
};

void LogAnalyzer::Impl::ResolveTimes(Diagnosis& d) {
  std::vector<Event>& ev = d.events;
  int year = opt.default_year;
  if (!years.empty()) {
    year = std::max_element(years.begin(), years.end(), [](auto& a, auto& b) {
             return a.second < b.second;
           })->first;
  }
  if (year == 0) {
    year = YearOf(std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
  }
  auto absolute = [&](const LineTime& t) -> int64_t {
    if (t.kind == LineTime::Kind::kAbsolute) return t.us;
    if (t.kind == LineTime::Kind::kNoYear) return NoYearToUnixUs(year, t.month, t.day, t.us);
    return kNoTime;
  };
  // Hosts: the names seen in lines; files without one (dmesg) take a host named in their path.
  // A file whose matched lines name exactly one host belongs to it; otherwise a host named in the
  // file's path (".../gpu-node-a/dmesg.txt", "gpu-node-a-dmesg.txt").
  std::vector<std::string> file_host(files.size());
  for (size_t f = 0; f < files.size(); ++f) {
    if (files[f].hosts.size() == 1) {
      file_host[f] = *files[f].hosts.begin();
      continue;
    }
    std::string best;
    for (const std::string& h : all_hosts) {
      if (files[f].name.find(h) != std::string::npos && h.size() > best.size()) best = h;
    }
    file_host[f] = best;
  }
  // Boot time per host, from syslog lines carrying both clocks.
  std::map<std::string, int64_t> boot;
  std::map<int64_t, std::pair<std::string, int64_t>> by_rel;
  for (const Anchor& a : anchors) {
    int64_t abs = absolute(a.time);
    if (abs == kNoTime) continue;
    auto [it, fresh] = boot.emplace(a.host, abs - a.rel_us);
    // Syslog stamps are truncated to the second, so the largest difference is the best estimate.
    if (!fresh) it->second = std::max(it->second, abs - a.rel_us);
    by_rel.emplace(a.rel_us, std::make_pair(a.host, abs - a.rel_us));
  }
  // A dmesg file whose relative stamps appear in some host's syslog belongs to that host.
  std::vector<std::string> file_boot_host(files.size());
  for (const Event& e : ev) {
    if (e.raw_time.kind != LineTime::Kind::kBootRelative) continue;
    auto it = by_rel.find(e.raw_time.us);
    if (it != by_rel.end() && file_boot_host[e.file].empty())
      file_boot_host[e.file] = it->second.first;
  }
  std::map<int, uint64_t> unanchored;
  for (Event& e : ev) {
    if (e.host.empty())
      e.host = !file_boot_host[e.file].empty() ? file_boot_host[e.file] : file_host[e.file];
    if (e.raw_time.kind == LineTime::Kind::kBootRelative) {
      auto b = boot.find(e.host);
      if (b != boot.end()) {
        e.time_us = b->second + e.raw_time.us;
      } else {
        ++unanchored[e.file];
      }
    } else {
      e.time_us = absolute(e.raw_time);
    }
  }
  for (auto& [f, n] : unanchored) {
    d.notes.push_back(fmt::format(
        "{}: {} kernel event(s) have boot-relative times that no syslog line anchors; they are "
        "ordered by file position only (add kern.log/syslog of {} to place them in time)",
        files[f].name, n, file_host[f].empty() ? "that host" : file_host[f]));
  }
  // Ranks: from the file name ("rank3"), NCCL pid and PCI bus mappings.
  std::vector<int> file_rank(files.size(), -1);
  for (size_t f = 0; f < files.size(); ++f) {
    std::string base = fs::path(files[f].name).filename().string();
    size_t p = base.find("rank");
    if (p != std::string::npos && p + 4 < base.size() &&
        std::isdigit(static_cast<unsigned char>(base[p + 4])))
      file_rank[f] = std::atoi(base.c_str() + p + 4);
  }
  for (Event& e : ev) {
    if (e.rank < 0 && e.pid >= 0) {
      auto it = pid_rank.find({e.host, e.pid});
      if (it != pid_rank.end()) e.rank = it->second;
    }
    if (e.pid >= 0 && (e.gpu.empty() || e.gpu.starts_with("cuda:"))) {
      auto it = pid_bus.find({e.host, e.pid});
      if (it != pid_bus.end()) e.gpu = fmt::format("bus {}", it->second);
    }
    if (e.rank < 0 && !e.gpu.empty()) {
      auto it = bus_rank.find({e.host, PciBus(e.gpu)});
      if (it != bus_rank.end()) e.rank = it->second;
    }
    if (e.rank < 0) e.rank = file_rank[e.file];
  }
  // A rank that NCCL placed on exactly one host names the host of lines that carry only the rank.
  std::map<int, std::string> rank_host;
  std::set<int> ambiguous;
  for (const auto& [key, rank] : pid_rank) {
    auto [it, fresh] = rank_host.emplace(rank, key.first);
    if (!fresh && it->second != key.first) ambiguous.insert(rank);
  }
  for (Event& e : ev) {
    if (e.host.empty() && e.rank >= 0 && !ambiguous.count(e.rank)) {
      auto it = rank_host.find(e.rank);
      if (it != rank_host.end()) e.host = it->second;
    }
  }
  // Untimed events take the time of the nearest timed event of the same file (earlier first).
  std::vector<int> order(ev.size());
  for (size_t i = 0; i < ev.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return ev[a].file != ev[b].file ? ev[a].file < ev[b].file : ev[a].line < ev[b].line;
  });
  for (size_t k = 0; k < order.size(); ++k) {
    Event& e = ev[order[k]];
    if (e.time_us != kNoTime || e.raw_time.kind == LineTime::Kind::kBootRelative) continue;
    for (size_t j = k; j-- > 0 && ev[order[j]].file == e.file;) {
      if (ev[order[j]].time_us != kNoTime) {
        e.time_us = ev[order[j]].time_us;
        e.time_estimated = true;
        break;
      }
    }
    for (size_t j = k + 1; e.time_us == kNoTime && j < order.size() && ev[order[j]].file == e.file;
         ++j) {
      if (ev[order[j]].time_us != kNoTime) {
        e.time_us = ev[order[j]].time_us;
        e.time_estimated = true;
      }
    }
  }
}

void LogAnalyzer::Impl::ChooseRoot(Diagnosis& d) {
  std::vector<Event>& ev = d.events;
  auto before = [&](int a, int b) {
    int64_t ta = ev[a].time_us, tb = ev[b].time_us;
    if (ta != tb) {
      if (ta == kNoTime) return false;
      if (tb == kNoTime) return true;
      return ta < tb;
    }
    return ev[a].file != ev[b].file ? ev[a].file < ev[b].file : ev[a].line < ev[b].line;
  };
  auto is_failure = [&](const Event& e) {
    return e.severity >= Severity::kError && e.role != Role::kInfo && e.role != Role::kStall;
  };
  std::vector<int> failures, candidates;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (!is_failure(ev[i])) continue;
    failures.push_back(static_cast<int>(i));
    if (IsCauseRole(ev[i].role)) candidates.push_back(static_cast<int>(i));
  }
  std::sort(failures.begin(), failures.end(), before);
  std::sort(candidates.begin(), candidates.end(), before);
  bool any_warning = false;
  for (const Event& e : ev) any_warning |= e.severity == Severity::kWarning;
  if (failures.empty()) {
    d.verdict = any_warning ? Diagnosis::Verdict::kWarnings : Diagnosis::Verdict::kHealthy;
  } else {
    d.verdict = Diagnosis::Verdict::kFailure;
    PickRoot(d, failures, candidates, before);
    BlameConcurrentBuilds(d);
  }
  GroupEvents(d, failures, before);
}

// Engine builds that overlapped in time on one host, when memory ran out during them and the
// root cause so far is a memory or TensorRT failure: the out-of-memory errors (and the "no
// implementation" errors that follow from tactics skipped for memory) are consequences of N
// builders sharing one node's GPU memory at once. The cure is to build once, not a bigger
// workspace.
void LogAnalyzer::Impl::BlameConcurrentBuilds(Diagnosis& d) {
  std::vector<Event>& ev = d.events;
  const auto& sigs = db->signatures();
  if (d.root < 0 || sig_concurrent < 0) return;
  const Event& root = ev[d.root];
  if (root.sig < 0) return;
  const Signature& rs = sigs[root.sig];
  if (!(rs.kind == "memory" || rs.category == "tensorrt")) return;
  // One builder: a rank (or local rank, pid, else file) on a host, from its first build line
  // (begin or progress) to its end line or last TensorRT line.
  struct Build {
    std::string host;
    int rank = -1;
    int64_t begin = kNoTime, end = kNoTime;
    int first = -1;
    bool began = false;
  };
  std::map<std::tuple<std::string, char, int64_t>, Build> builds;
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    if (e.sig < 0 || e.time_us == kNoTime) continue;
    const Signature& s = sigs[e.sig];
    bool phase = s.role == Role::kStall && s.phase == "trt_build";
    if (!phase && s.category != "tensorrt") continue;
    auto key = e.rank >= 0         ? std::make_tuple(e.host, 'r', int64_t{e.rank})
               : e.local_rank >= 0 ? std::make_tuple(e.host, 'l', int64_t{e.local_rank})
               : e.pid >= 0        ? std::make_tuple(e.host, 'p', e.pid)
                                   : std::make_tuple(e.host, 'f', int64_t{e.file});
    Build& b = builds[key];
    b.host = e.host;
    b.rank = e.rank >= 0 ? e.rank : e.local_rank;
    if (phase && !s.phase_progress && !s.phase_begin) {  // an end line closes the build
      if (b.began) b.end = std::max(b.end, e.time_us);
      continue;
    }
    if (phase && (b.begin == kNoTime || e.time_us < b.begin)) {
      b.begin = e.time_us;
      b.first = static_cast<int>(i);
      b.began = true;
    }
    if (b.end == kNoTime || e.time_us > b.end) b.end = e.time_us;
  }
  // Per host: the largest set of builds running at one moment (sweep over begin/end).
  std::map<std::string, std::vector<const Build*>> by_host;
  for (const auto& [key, b] : builds) {
    if (b.began) by_host[b.host].push_back(&b);
  }
  const Build* best_last = nullptr;
  std::vector<const Build*> best;
  for (auto& [host, list] : by_host) {
    if (!root.host.empty() && !host.empty() && host != root.host) continue;
    for (const Build* b : list) {
      // The builds running when `b` started, b included.
      std::vector<const Build*> running;
      for (const Build* o : list) {
        if (o->begin <= b->begin && o->end >= b->begin) running.push_back(o);
      }
      if (running.size() > best.size()) {
        best = running;
        best_last = b;
      }
    }
  }
  if (best.size() < 2) return;
  int64_t from = best_last->begin, to = best_last->begin;
  for (const Build* b : best) to = std::max(to, b->end);
  // Memory ran out while they ran (or within a minute after the last of them).
  constexpr int64_t kAfterUs = 60'000'000;
  int memory_events = 0;
  for (const Event& e : ev) {
    if (e.sig < 0 || sigs[e.sig].kind != "memory" || e.time_us == kNoTime) continue;
    if (!best_last->host.empty() && !e.host.empty() && e.host != best_last->host) continue;
    if (e.time_us >= from && e.time_us <= to + kAfterUs) ++memory_events;
  }
  if (memory_events == 0) return;
  std::vector<int> ranks;
  for (const Build* b : best) {
    if (b->rank >= 0) ranks.push_back(b->rank);
  }
  Event c = ev[best_last->first];
  c.sig = sig_concurrent;
  c.id = sigs[sig_concurrent].id;
  c.severity = Severity::kError;
  c.role = sigs[sig_concurrent].role;
  c.time_estimated = false;
  c.rank = -1;
  c.local_rank = -1;
  c.pid = -1;
  c.gpu.clear();
  std::string where = best_last->host.empty() ? "one node" : "host " + best_last->host;
  c.title = fmt::format(
      "{} ranks built TensorRT engines at once on {}{}, and GPU memory ran out", best.size(), where,
      ranks.size() == best.size() ? fmt::format(" (ranks {})", RankList(ranks)) : std::string());
  c.meaning = fmt::format(
      "{} engine builds overlapped from {}; {} out-of-memory sign(s) came while they ran. Each "
      "builder times tactics with its own workspace, so N builders need N times the memory; the "
      "out-of-memory errors and the failures after them (tactics skipped, 'could not find any "
      "implementation') follow from that",
      best.size(), FormatTimeUs(from, false), memory_events);
  c.fields.clear();
  c.fields.emplace_back("builders", fmt::format("{}", best.size()));
  ev.push_back(std::move(c));
  d.root = static_cast<int>(ev.size() - 1);
  d.root_summary = fmt::format("{} ({}, at {})", ev[d.root].title, where, FormatTimeUs(from));
  d.root_note =
      "several engine builds ran at the same time on one node when memory ran out; the "
      "earliest out-of-memory error is their consequence, not the cause";
}

void LogAnalyzer::Impl::PickRoot(Diagnosis& d, const std::vector<int>& failures,
                                 const std::vector<int>& candidates,
                                 const std::function<bool(int, int)>& before) {
  std::vector<Event>& ev = d.events;
  const auto& sigs = db->signatures();
  auto where = [&](const Event& e) {
    std::vector<std::string> parts;
    if (!e.host.empty()) parts.push_back("host " + e.host);
    if (!e.gpu.empty()) parts.push_back("GPU " + e.gpu);
    if (e.rank >= 0)
      parts.push_back(fmt::format("rank {}", e.rank));
    else if (e.local_rank >= 0)
      parts.push_back(fmt::format("local rank {}", e.local_rank));
    if (e.time_us != kNoTime) parts.push_back("at " + FormatTimeUs(e.time_us));
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
    return out;
  };
  auto title = [&](const Event& e) -> std::string {
    return !e.title.empty() ? e.title : sigs[e.sig].title;
  };

  if (!candidates.empty()) {
    int root = candidates.front();
    // A hardware fault reported by the kernel (Xid) close to the first fault on the same host is
    // its cause (see kHardwareWindowUs), as is one whose time is unknown (unanchored dmesg) on that
    // host: the application's error is what the driver's fault looks like from user space.
    auto kernel_level = [&](const Event& e) {
      return e.sig >= 0 && (sigs[e.sig].category == "xid" || sigs[e.sig].category == "kernel");
    };
    auto override_with = [&](bool want_kernel) {
      for (int c : candidates) {
        const Event& h = ev[c];
        if (c == root || h.role != Role::kHardware || (want_kernel && !kernel_level(h))) continue;
        bool same_host = h.host.empty() || ev[root].host.empty() || h.host == ev[root].host;
        bool close = h.time_us == kNoTime || ev[root].time_us == kNoTime ||
                     h.time_us <= ev[root].time_us + kHardwareWindowUs;
        if (same_host && close) {
          root = c;
          d.root_note =
              "a hardware fault on the same host at about the same time outranks the "
              "errors it causes in software";
          return true;
        }
      }
      return false;
    };
    if (!(ev[root].role == Role::kHardware && kernel_level(ev[root]))) {
      if (!override_with(true) && ev[root].role != Role::kHardware) override_with(false);
    }
    d.root = root;
    d.root_summary = fmt::format("{} ({})", title(ev[root]), where(ev[root]));
    if (d.root_note.empty()) d.root_note = "the earliest fault in time across all files";
  } else {
    // Only consequences. A rank stuck in a long phase while the others timed out is the cause.
    std::set<int> timed_out;
    int64_t first_timeout = kNoTime;
    for (int f : failures) {
      if (ev[f].sig >= 0 && sigs[ev[f].sig].kind == "timeout") {
        if (ev[f].rank >= 0) timed_out.insert(ev[f].rank);
        if (first_timeout == kNoTime) first_timeout = ev[f].time_us;
      }
    }
    int stall = -1;
    if (!timed_out.empty()) {
      // Last begin/end per (phase, rank or file): a begin with no end after it is still open.
      std::map<std::tuple<std::string, int, int>, int> open;
      std::vector<int> order;
      for (size_t i = 0; i < ev.size(); ++i) {
        if (ev[i].role == Role::kStall) order.push_back(static_cast<int>(i));
      }
      std::sort(order.begin(), order.end(), before);
      for (int i : order) {
        const Signature& s = sigs[ev[i].sig];
        auto key = std::make_tuple(s.phase, ev[i].rank, ev[i].rank >= 0 ? -1 : ev[i].file);
        if (s.phase_progress) continue;
        if (s.phase_begin)
          open.emplace(key, i);  // keep the first begin of an open phase
        else
          open.erase(key);
      }
      for (auto& [key, i] : open) {
        if (first_timeout != kNoTime && ev[i].time_us != kNoTime && ev[i].time_us > first_timeout)
          continue;
        bool outsider = ev[i].rank < 0 || !timed_out.count(ev[i].rank);
        if (stall < 0 || (outsider && !(ev[stall].rank < 0 || !timed_out.count(ev[stall].rank))))
          stall = i;
      }
    }
    if (stall >= 0) {
      Event& s = ev[stall];
      std::vector<int> ranks(timed_out.begin(), timed_out.end());
      std::string who = s.rank >= 0 ? fmt::format("rank {}", s.rank) : "one rank";
      s.severity = Severity::kError;
      const std::string& phase = sigs[s.sig].phase_title;
      std::string started =
          s.time_us != kNoTime ? " (started " + FormatTimeUs(s.time_us, false) + ", never finished)"
                               : " (never finished)";
      s.title = fmt::format("{} was still {}{} when ranks {} timed out in a collective", who, phase,
                            started, RankList(ranks));
      s.meaning = fmt::format(
          "ranks {} waited in a collective that {} had not joined: it was busy {}, so the "
          "framework's collective timeout fired on the others",
          RankList(ranks), who, phase);
      s.cause = "one rank doing long work (an engine build) while the others wait in a collective";
      s.remedy =
          "build the engine once and share it (kiln build-once / shared engine cache), or "
          "build before the process group's first collective; bound the build with "
          "kiln build --deadline. Raising the timeout only hides it.";
      d.root = stall;
      d.root_summary = fmt::format("{} ({})", s.title, where(s));
      d.root_note = "the ranks that timed out were waiting for a rank still inside a long phase";
    } else {
      // A misconfiguration that explains the kind of consequence seen.
      std::set<std::string> kinds;
      for (int f : failures) {
        if (ev[f].sig >= 0 && !sigs[ev[f].sig].kind.empty()) kinds.insert(sigs[ev[f].sig].kind);
      }
      int config = -1;
      for (size_t i = 0; i < ev.size() && config < 0; ++i) {
        for (const std::string& k : ev[i].explains) {
          if (kinds.count(k)) config = static_cast<int>(i);
        }
      }
      if (config >= 0) {
        ev[config].severity = Severity::kError;
        d.root = config;
        d.root_summary = fmt::format("{} ({})", title(ev[config]), where(ev[config]));
        d.root_note =
            "no fault was found in these logs; this setting explains the kind of failure seen";
      } else {
        d.root = failures.front();
        d.root_summary = fmt::format("{} ({})", title(ev[d.root]), where(ev[d.root]));
        d.root_note =
            "the first failure in time; no underlying fault (Xid, CUDA error, out of "
            "memory) is in these logs, so the cause may be in logs not given (other "
            "ranks' logs, kernel logs)";
      }
    }
  }
}

void LogAnalyzer::Impl::GroupEvents(Diagnosis& d, const std::vector<int>& failures,
                                    const std::function<bool(int, int)>& before) {
  std::vector<Event>& ev = d.events;
  const auto& sigs = db->signatures();
  auto title = [&](const Event& e) -> std::string {
    return !e.title.empty() ? e.title : sigs[e.sig].title;
  };
  // Consequences: every other failure, grouped by signature, in time order.
  std::map<std::string, size_t> group_of;
  auto add_to = [&](std::vector<EventGroup>& groups, std::map<std::string, size_t>& index, int i) {
    const Event& e = ev[i];
    auto [it, fresh] = index.emplace(e.id, groups.size());
    if (fresh) {
      EventGroup g;
      g.id = e.id;
      g.title = title(e);
      g.severity = e.severity;
      g.role = e.role;
      g.first = i;
      g.first_time_us = e.time_us;
      g.first_time_estimated = e.time_estimated;
      groups.push_back(std::move(g));
    }
    EventGroup& g = groups[it->second];
    ++g.count;
    if (!e.host.empty() && std::find(g.hosts.begin(), g.hosts.end(), e.host) == g.hosts.end())
      g.hosts.push_back(e.host);
    if (e.rank >= 0 && std::find(g.ranks.begin(), g.ranks.end(), e.rank) == g.ranks.end())
      g.ranks.push_back(e.rank);
    if (!e.gpu.empty() && std::find(g.gpus.begin(), g.gpus.end(), e.gpu) == g.gpus.end())
      g.gpus.push_back(e.gpu);
  };
  for (int f : failures) {
    if (f != d.root) add_to(d.consequences, group_of, f);
  }
  // Past the per-signature cap the groups still count every match.
  for (EventGroup& g : d.consequences) {
    int sig = ev[g.first].sig;
    if (sig >= 0 && g.id == sigs[sig].id && seen_per_sig[sig] > kept_per_sig[sig]) {
      g.count += seen_per_sig[sig] - kept_per_sig[sig];
    }
  }
  std::map<std::string, size_t> warn_of;
  std::vector<int> warn_events;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (static_cast<int>(i) != d.root && ev[i].severity == Severity::kWarning &&
        (d.root < 0 || ev[i].id != ev[d.root].id))
      warn_events.push_back(static_cast<int>(i));
  }
  std::sort(warn_events.begin(), warn_events.end(), before);
  for (int w : warn_events) add_to(d.warnings, warn_of, w);
}

Diagnosis LogAnalyzer::Impl::Finish() {
  Diagnosis d;
  d.events = std::move(events);
  events.clear();
  for (const auto& f : files) d.files.push_back(f.name);
  d.notes = std::move(notes);
  ResolveTimes(d);
  // De-duplicate the same kernel event read from both dmesg and kern.log (and repeated files).
  {
    // Who wrote the line is part of the key: eight ranks printing the same line in the same
    // second are eight events.
    std::set<std::tuple<std::string, std::string, int64_t, uint64_t, int, int, int64_t>> seen;
    std::vector<Event> kept;
    for (size_t i = 0; i < d.events.size(); ++i) {
      Event& e = d.events[i];
      // Kernel lines are keyed by their boot-relative stamp, which dmesg and kern.log share.
      int64_t t = e.raw_time.kernel_rel_us >= 0                      ? -1 - e.raw_time.kernel_rel_us
                  : e.raw_time.kind == LineTime::Kind::kBootRelative ? -1 - e.raw_time.us
                                                                     : e.time_us;
      if (t != kNoTime && !e.time_estimated &&
          !seen.insert({e.id, e.host, t, body_hash[i], e.rank, e.local_rank, e.pid}).second)
        continue;
      kept.push_back(std::move(e));
    }
    d.events = std::move(kept);
  }
  const auto& sigs = db->signatures();
  for (size_t s = 0; s < sigs.size(); ++s) {
    if (seen_per_sig[s] > kept_per_sig[s] && sigs[s].role != Role::kInfo) {
      d.notes.push_back(fmt::format("'{}' matched {} lines; the first {} are kept as events",
                                    sigs[s].id, seen_per_sig[s], kept_per_sig[s]));
    }
  }
  ChooseRoot(d);
  // Evidence: the root line, the first line of each consequence and warning group.
  // Kept short so the report reads in seconds; --json has every group's first line.
  if (d.root >= 0) d.evidence.push_back(d.root);
  for (const auto& g : d.consequences) {
    if (d.evidence.size() < 6) d.evidence.push_back(g.first);
  }
  for (const auto& g : d.warnings) {
    if (g.role == Role::kMyth && d.evidence.size() < 10) d.evidence.push_back(g.first);
  }
  // Remedies: the root's first, then corrections of myths and misconfigurations.
  auto remedy_of = [&](const Event& e) -> std::string {
    return !e.remedy.empty() ? e.remedy : (e.sig >= 0 ? sigs[e.sig].remedy : std::string());
  };
  auto add_remedy = [&](std::string r) {
    if (!r.empty() && std::find(d.remedies.begin(), d.remedies.end(), r) == d.remedies.end())
      d.remedies.push_back(std::move(r));
  };
  if (d.root >= 0) add_remedy(remedy_of(d.events[d.root]));
  for (const auto& g : d.warnings) {
    if (g.role == Role::kMyth || g.role == Role::kConfig) add_remedy(remedy_of(d.events[g.first]));
  }
  d.bytes = bytes;
  d.lines = lines;
  d.matches = nmatches;
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return d;
}

LogAnalyzer::LogAnalyzer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LogAnalyzer::~LogAnalyzer() = default;

StatusOr<std::unique_ptr<LogAnalyzer>> LogAnalyzer::Create(std::shared_ptr<const SignatureDb> db,
                                                           std::shared_ptr<const KnownProblems> kp,
                                                           AnalyzerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->db = std::move(db);
  impl->kp = std::move(kp);
  impl->opt = options;
  if (impl->opt.chunk_bytes < 4096) impl->opt.chunk_bytes = 4096;
  // Hyperscan block mode takes an unsigned length.
  if (impl->opt.chunk_bytes > (1u << 30)) impl->opt.chunk_bytes = 1u << 30;
  KILN_RETURN_IF_ERROR(impl->Compile());
  return std::unique_ptr<LogAnalyzer>(new LogAnalyzer(std::move(impl)));
}

Status LogAnalyzer::AddFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the flag is dropped once the file is
  // known to be one we read.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return MakeError(ErrorCode::kIoError, "cannot open log '{}': {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return MakeError(ErrorCode::kIoError, "cannot stat log '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode) && !impl_->opt.allow_special_files) {
    close(fd);
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                                              : "not a regular file";
    return MakeError(ErrorCode::kLogFileNotRegular, "log '{}' is {}, not a regular file", path,
                     kind);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  int file = impl_->AddFileState(path);
  impl_->Scan(file, fd);
  close(fd);
  return OkStatus();
}

void LogAnalyzer::AddBuffer(std::string_view name, std::string_view data) {
  int file = impl_->AddFileState(name);
  impl_->bytes += data.size();
  uint64_t line_no = 0;
  // Same chunking as files so tests exercise the boundaries.
  size_t pos = 0;
  while (pos < data.size()) {
    size_t want = std::min(impl_->opt.chunk_bytes, data.size() - pos);
    size_t upto = want;
    if (pos + want < data.size()) {
      const char* nl = static_cast<const char*>(memrchr(data.data() + pos, '\n', want));
      if (nl) upto = static_cast<size_t>(nl - (data.data() + pos)) + 1;
    }
    impl_->ScanChunk(file, data.data() + pos, upto, &line_no);
    pos += upto;
  }
}

Diagnosis LogAnalyzer::Finish() { return impl_->Finish(); }

StatusOr<std::vector<std::string>> ExpandLogPaths(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) {
      return MakeError(ErrorCode::kNotFound, "log path '{}' does not exist", p);
    }
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(
               p, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec)) found.push_back(it->path().string());
      }
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      out.push_back(p);
    }
  }
  if (out.empty())
    return MakeError(ErrorCode::kNoLogFiles, "no files in: {}", fmt::join(paths, ", "));
  return out;
}

StatusOr<Diagnosis> DiagnoseLogs(const std::vector<std::string>& paths, AnalyzerOptions options) {
  KILN_ASSIGN_OR_RETURN(auto db, SignatureDb::Default());
  KILN_ASSIGN_OR_RETURN(auto kp, KnownProblems::Default());
  KILN_ASSIGN_OR_RETURN(auto analyzer, LogAnalyzer::Create(db, kp, options));
  KILN_ASSIGN_OR_RETURN(auto files, ExpandLogPaths(paths));
  for (const std::string& f : files) KILN_RETURN_IF_ERROR(analyzer->AddFile(f));
  return analyzer->Finish();
}

}  // namespace kiln::doctor
