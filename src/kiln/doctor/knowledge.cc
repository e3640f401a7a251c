// Loading and validating the doctor's data files (signature database, known-problems table).
#include "kiln/doctor/knowledge.h"

#include <nlohmann/json.hpp>

#include <cctype>

#include "kiln/doctor/embedded_data.h"

namespace kiln::doctor {

namespace {

using nlohmann::json;

constexpr std::string_view kSeverityNames[] = {"info", "warning", "error", "critical"};
constexpr std::string_view kRoleNames[] = {"info",  "stall",    "myth",   "consequence",
                                           "fault", "resource", "config", "hardware"};

std::string GetString(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

std::vector<std::string> GetStrings(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

Status Invalid(std::string_view origin, std::string_view what) {
  return MakeError(ErrorCode::kSignatureDbInvalid, "{}: {}", origin, what);
}

StatusOr<json> ParseJson(std::string_view text, std::string_view origin) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(origin, "not a JSON object");
  return j;
}

}  // namespace

std::string_view ToString(Severity s) { return kSeverityNames[static_cast<int>(s)]; }

bool ParseSeverity(std::string_view text, Severity* out) {
  for (size_t i = 0; i < std::size(kSeverityNames); ++i) {
    if (text == kSeverityNames[i]) {
      *out = static_cast<Severity>(i);
      return true;
    }
  }
  return false;
}

int ExitCodeFor(std::span<const Finding> findings) {
  int code = 0;
  for (const Finding& f : findings) {
    if (f.severity >= Severity::kError) return 2;
    if (f.severity == Severity::kWarning) code = 1;
  }
  return code;
}

std::string_view ToString(Role r) { return kRoleNames[static_cast<int>(r)]; }

bool ParseRole(std::string_view text, Role* out) {
  for (size_t i = 0; i < std::size(kRoleNames); ++i) {
    if (text == kRoleNames[i]) {
      *out = static_cast<Role>(i);
      return true;
    }
  }
  return false;
}

bool IsCauseRole(Role r) {
  return r == Role::kHardware || r == Role::kResource || r == Role::kFault || r == Role::kConfig;
}

StatusOr<std::shared_ptr<const SignatureDb>> SignatureDb::Load(std::string_view json_text,
                                                               std::string_view origin) {
  KILN_ASSIGN_OR_RETURN(json root, ParseJson(json_text, origin));
  auto sigs = root.find("signatures");
  if (sigs == root.end() || !sigs->is_array()) return Invalid(origin, "no 'signatures' array");
  auto db = std::make_shared<SignatureDb>();
  for (size_t i = 0; i < sigs->size(); ++i) {
    const json& e = (*sigs)[i];
    if (!e.is_object()) return Invalid(origin, fmt::format("signature #{} is not an object", i));
    Signature s;
    s.id = GetString(e, "id");
    if (s.id.empty()) return Invalid(origin, fmt::format("signature #{} has no 'id'", i));
    auto where = [&](std::string_view what) {
      return Invalid(origin, fmt::format("signature '{}': {}", s.id, what));
    };
    if (db->by_id_.count(s.id)) return where("duplicate id");
    s.pattern = GetString(e, "pattern");
    s.category = GetString(e, "category");
    s.title = GetString(e, "title");
    s.meaning = GetString(e, "meaning");
    s.cause = GetString(e, "cause");
    s.remedy = GetString(e, "remedy");
    s.references = GetStrings(e, "references");
    s.kind = GetString(e, "kind");
    s.phase = GetString(e, "phase");
    s.phase_title = GetString(e, "phase_title");
    if (s.phase_title.empty()) s.phase_title = s.phase;
    const std::string edge = GetString(e, "edge");
    s.phase_begin = edge == "begin";
    s.phase_progress = edge == "progress";
    s.handler = GetString(e, "handler");
    s.caseless = e.value("caseless", false);
    s.generic = e.value("generic", false);
    if (s.category.empty() || s.title.empty()) return where("needs 'category' and 'title'");
    if (!ParseSeverity(GetString(e, "severity"), &s.severity))
      return where("'severity' must be info, warning, error or critical");
    if (!ParseRole(GetString(e, "role"), &s.role))
      return where(
          "'role' must be one of info, stall, myth, consequence, fault, resource, config, "
          "hardware");
    if (s.severity >= Severity::kWarning && s.handler.empty() &&
        (s.meaning.empty() || s.remedy.empty()))
      return where("a warning or error needs 'meaning' and 'remedy'");
    if (!s.phase.empty() && s.role != Role::kStall) return where("'phase' needs role 'stall'");
    if (s.role == Role::kStall && edge != "begin" && edge != "end" && edge != "progress")
      return where("a stall entry needs 'edge': begin, end or progress");
    std::string fields = GetString(e, "fields");
    if (!fields.empty()) {
      RE2::Options opts;
      opts.set_log_errors(false);
      s.fields = std::make_unique<RE2>(fields, opts);
      if (!s.fields->ok()) return where(fmt::format("'fields' regex: {}", s.fields->error()));
    }
    db->by_id_.emplace(s.id, static_cast<int>(db->signatures_.size()));
    db->signatures_.push_back(std::move(s));
  }
  return std::shared_ptr<const SignatureDb>(std::move(db));
}

StatusOr<std::shared_ptr<const SignatureDb>> SignatureDb::Default() {
  return Load(embedded::Signatures(), "data/doctor/signatures.json (embedded)");
}

int SignatureDb::Find(std::string_view id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? -1 : it->second;
}

StatusOr<std::shared_ptr<const KnownProblems>> KnownProblems::Load(std::string_view json_text,
                                                                   std::string_view origin) {
  KILN_ASSIGN_OR_RETURN(json root, ParseJson(json_text, origin));
  auto kp = std::make_shared<KnownProblems>();
  auto read_common = [&](const json& e, auto& rule, std::string_view name) -> Status {
    if (!ParseSeverity(GetString(e, "severity"), &rule.severity))
      return Invalid(origin, fmt::format("'{}': bad 'severity'", name));
    rule.what = GetString(e, "what");
    rule.why = GetString(e, "why");
    rule.todo = GetString(e, "todo");
    if (rule.what.empty() || rule.todo.empty())
      return Invalid(origin, fmt::format("'{}': needs 'what' and 'todo'", name));
    return OkStatus();
  };
  if (auto v = root.find("versions"); v != root.end() && v->is_array()) {
    for (const json& e : *v) {
      VersionRule r;
      r.id = GetString(e, "id");
      r.component = GetString(e, "component");
      r.below = GetString(e, "below");
      if (r.id.empty() || r.component.empty() || r.below.empty())
        return Invalid(origin, "a version rule needs 'id', 'component' and 'below'");
      if (auto w = e.find("when"); w != e.end() && w->is_object()) {
        r.when_component = GetString(*w, "component");
        r.when_at_least = GetString(*w, "at_least");
      }
      KILN_RETURN_IF_ERROR(read_common(e, r, r.id));
      kp->versions_.push_back(std::move(r));
    }
  }
  if (auto v = root.find("environment"); v != root.end() && v->is_array()) {
    for (const json& e : *v) {
      EnvRule r;
      r.name = GetString(e, "name");
      r.kind = GetString(e, "kind");
      static const std::string_view kKinds[] = {
          "nonexistent", "slow_when", "exponent_ib_timeout", "enum", "socket_ifname", "deprecated"};
      if (r.name.empty() ||
          std::find(std::begin(kKinds), std::end(kKinds), r.kind) == std::end(kKinds))
        return Invalid(origin, fmt::format("environment rule '{}': bad 'name' or 'kind'", r.name));
      r.value = GetString(e, "value");
      r.allowed = GetStrings(e, "allowed");
      r.replacement = GetString(e, "replacement");
      r.warn_at_least = e.value("warn_at_least", int64_t{0});
      r.explains = GetStrings(e, "explains");
      KILN_RETURN_IF_ERROR(read_common(e, r, r.name));
      kp->environment_.push_back(std::move(r));
    }
  }
  return std::shared_ptr<const KnownProblems>(std::move(kp));
}

StatusOr<std::shared_ptr<const KnownProblems>> KnownProblems::Default() {
  return Load(embedded::KnownProblems(), "data/doctor/known_problems.json (embedded)");
}

int CompareVersions(std::string_view a, std::string_view b) {
  auto next = [](std::string_view& s) -> int64_t {
    int64_t v = 0;
    size_t i = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      v = v * 10 + (s[i] - '0');
      ++i;
    }
    while (i < s.size() && !std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    s.remove_prefix(i);
    return v;
  };
  while (!a.empty() || !b.empty()) {
    int64_t x = next(a), y = next(b);
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

}  // namespace kiln::doctor
