// Shared by the in-process benchmarks (bench/build, bench/refit): timing helpers and the zoo's
// optimization profile for a model directory (info.json "profile": min/opt/max per input).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/plan/profile.h"

namespace kiln::bench {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The profile the zoo suggests for the model in `dir`.
inline StatusOr<OptimizationProfile> ZooProfile(const std::filesystem::path& dir) {
  std::ifstream in(dir / "info.json");
  if (!in) return MakeError(ErrorCode::kNotFound, "no info.json in '{}'", dir.string());
  nlohmann::json info = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (info.is_discarded() || !info.contains("profile")) {
    return MakeError(ErrorCode::kInvalidArgument, "'{}' has no profile", dir.string());
  }
  OptimizationProfile profile;
  for (const auto& [name, p] : info["profile"].items()) {
    InputProfile ip;
    ip.input = name;
    ip.min = p["min"].get<std::vector<int64_t>>();
    ip.opt = p["opt"].get<std::vector<int64_t>>();
    ip.max = p["max"].get<std::vector<int64_t>>();
    profile.inputs.push_back(std::move(ip));
  }
  return profile;
}

}  // namespace kiln::bench
