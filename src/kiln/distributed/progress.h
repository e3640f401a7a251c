// What a build callback reports while it runs; the cache's heartbeat publishes the latest line so
// that waiting processes can show the builder's progress.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::distributed {

class ProgressSink {
 public:
  ProgressSink() = default;
  ProgressSink(const ProgressSink&) = delete;
  ProgressSink& operator=(const ProgressSink&) = delete;

  // Thread-safe: the build may report from any thread.
  void Update(std::string text) {
    std::lock_guard<std::mutex> lock(mu_);
    text_ = std::move(text);
    ++updates_;
  }
  std::string Latest() const {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  uint64_t updates() const {
    std::lock_guard<std::mutex> lock(mu_);
    return updates_;
  }

 private:
  mutable std::mutex mu_;
  std::string text_;
  uint64_t updates_ = 0;
};

// Builds the engine bytes. Runs in exactly one process per key and group.
using BuildFn = std::function<StatusOr<std::vector<std::byte>>(ProgressSink&)>;
// Checks bytes before they are used (the engine layer plugs its own header/checksum check in).
using VerifyFn = std::function<Status(std::span<const std::byte>)>;

}  // namespace kiln::distributed
