// Rendering doctor results for people (root cause first, readable in seconds; colour only when
// asked, i.e. on a TTY) and for machines (JSON).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "kiln/doctor/log_analyzer.h"
#include "kiln/doctor/preflight.h"

namespace kiln::doctor {

struct RenderOptions {
  bool color = false;
  size_t max_evidence_chars = 200;
};

std::string RenderDiagnosisText(const Diagnosis& d, const SignatureDb& db, const RenderOptions& o);
nlohmann::json DiagnosisToJson(const Diagnosis& d, const SignatureDb& db);

std::string RenderPreflightText(const PreflightReport& r, const RenderOptions& o);
nlohmann::json PreflightToJson(const PreflightReport& r);

}  // namespace kiln::doctor
