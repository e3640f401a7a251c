// What environment variables really do: checks NCCL/CUDA/PyTorch/TensorRT variables against the
// known-problems table. Shared by the preflight (live environment) and log analysis (env dumps).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/doctor/finding.h"
#include "kiln/doctor/knowledge.h"

namespace kiln::doctor {

// Seconds one InfiniBand retry waits for NCCL_IB_TIMEOUT=n: 4.096 us x 2^n.
double IbTimeoutSeconds(int n);
// "4.3 s", "17 s", "73 min", "2.1 h".
std::string FormatDuration(double seconds);

// NCCL_SOCKET_IFNAME semantics: comma list of prefixes; a leading '^' excludes, '=' means exact.
// Returns the interfaces NCCL would consider.
std::vector<std::string> SocketIfnameMatches(std::string_view spec,
                                             const std::vector<std::string>& interfaces);

// Findings for one variable; empty when the table says nothing about it. `interfaces` is null when
// the host's interfaces are unknown (log analysis), which skips the NCCL_SOCKET_IFNAME check.
// The rule that produced a finding is returned through `rules` (same order) when not null.
std::vector<Finding> CheckEnvVar(const KnownProblems& kp, std::string_view name,
                                 std::string_view value, const std::vector<std::string>* interfaces,
                                 std::vector<const EnvRule*>* rules = nullptr);

std::vector<Finding> CheckEnvironment(const KnownProblems& kp,
                                      const std::map<std::string, std::string>& env,
                                      const std::vector<std::string>* interfaces);

}  // namespace kiln::doctor
