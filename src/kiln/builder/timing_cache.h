// The timing cache: layer signature -> chosen tactic and its time, for one device and library set.
// A file any number of processes may share: loads tolerate corruption (warning, then ignored),
// saves merge with what is on disk under a lock and replace the file atomically.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"

namespace kiln {

struct TimingEntry {
  std::string provider_id;
  TacticConfig tactic;
  double time_ms = 0;
};

class TimingCache {
 public:
  // The device and libraries the timings are valid for; entries from another device are foreign.
  explicit TimingCache(std::string device_key) : device_key_(std::move(device_key)) {}

  // Loads `path` if it exists. A corrupt or foreign file is ignored with a KILN-E3005 warning
  // (returned as the Status so callers can report it); a missing file is not an error.
  Status Load(const std::string& path);
  // Merges this cache into the file at `path` (entries on disk that this cache lacks are kept)
  // and replaces it atomically, under an exclusive lock (bounded wait).
  Status Save(const std::string& path) const;

  const TimingEntry* Find(const std::string& signature) const;
  void Insert(const std::string& signature, TimingEntry entry);
  size_t size() const;
  // Whether Insert was called since construction (a cache only loaded need not be saved).
  bool modified() const;
  const std::string& device_key() const { return device_key_; }

  std::string Serialize() const;
  // Parses text written by Serialize; KILN-E3005 when corrupt or for another device.
  Status Parse(const std::string& text);

 private:
  std::string device_key_;
  mutable std::mutex mu_;
  std::map<std::string, TimingEntry> entries_;
  bool modified_ = false;
};

// A layer's signature: op type, attributes, operand dtypes, shapes at the profile's opt and max,
// which operands are constants (and their content hash): everything that changes its timing.
std::string LayerSignature(const KernelRequest& request,
                           const std::vector<std::vector<int64_t>>& opt_dims);

}  // namespace kiln
