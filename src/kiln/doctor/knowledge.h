// The doctor's knowledge, loaded from data files (data/doctor/*.json, embedded at build time):
// the log signature database and the known-problems table (versions, environment variables).
#pragma once

#include <re2/re2.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/doctor/finding.h"

namespace kiln::doctor {

// Where an event sits in a causal chain (see data/doctor/signatures.json, "about").
enum class Role : uint8_t {
  kInfo,
  kStall,
  kMyth,
  kConsequence,
  kFault,
  kResource,
  kConfig,
  kHardware
};

std::string_view ToString(Role r);
bool ParseRole(std::string_view text, Role* out);
// Root-cause candidates: hardware, resource, fault and config.
bool IsCauseRole(Role r);

struct Signature {
  std::string id;
  std::string pattern;  // Hyperscan syntax; empty for entries only handlers emit
  std::string category;
  Severity severity = Severity::kInfo;
  Role role = Role::kInfo;
  std::string title, meaning, cause, remedy;
  std::vector<std::string> references;
  bool caseless = false;
  bool generic = false;     // dropped when a specific entry matched the same line
  std::string kind;         // "timeout", "network", "store_timeout": what a consequence is
  std::string phase;        // for stall entries: the phase name
  std::string phase_title;  // "building a TensorRT engine"
  bool phase_begin = false;
  bool phase_progress = false;  // a line inside the phase (neither opens nor closes it)
  std::string handler;          // "env", "kiln_catalog", "smi_header", "smi_row"
  std::unique_ptr<RE2> fields;  // named groups, run only on matching lines
};

class SignatureDb {
 public:
  // Parses and validates the JSON text (`origin` names it in errors). Patterns are compiled later
  // by the scanner; RE2 field expressions are compiled here.
  static StatusOr<std::shared_ptr<const SignatureDb>> Load(std::string_view json_text,
                                                           std::string_view origin);
  // The database embedded in the binary from data/doctor/signatures.json.
  static StatusOr<std::shared_ptr<const SignatureDb>> Default();

  const std::vector<Signature>& signatures() const { return signatures_; }
  // Index of the entry with this id, or -1.
  int Find(std::string_view id) const;

 private:
  std::vector<Signature> signatures_;
  std::map<std::string, int, std::less<>> by_id_;
};

struct VersionRule {
  std::string id, component, below;
  std::string when_component, when_at_least;  // optional condition on another component
  Severity severity = Severity::kWarning;
  std::string what, why, todo;
};

struct EnvRule {
  std::string name;
  std::string kind;  // nonexistent, slow_when, exponent_ib_timeout, enum, socket_ifname, deprecated
  std::string value;                  // slow_when: the value that costs speed
  std::vector<std::string> allowed;   // enum
  std::string replacement;            // deprecated
  int64_t warn_at_least = 0;          // exponent_ib_timeout
  std::vector<std::string> explains;  // consequence kinds this misconfiguration can explain
  Severity severity = Severity::kWarning;
  std::string what, why, todo;
};

class KnownProblems {
 public:
  static StatusOr<std::shared_ptr<const KnownProblems>> Load(std::string_view json_text,
                                                             std::string_view origin);
  static StatusOr<std::shared_ptr<const KnownProblems>> Default();

  const std::vector<VersionRule>& versions() const { return versions_; }
  const std::vector<EnvRule>& environment() const { return environment_; }

 private:
  std::vector<VersionRule> versions_;
  std::vector<EnvRule> environment_;
};

// Compares dotted versions numerically part by part ("525.60.13" < "580"); -1, 0 or 1.
// Missing parts count as 0; non-digits end a part.
int CompareVersions(std::string_view a, std::string_view b);

}  // namespace kiln::doctor
