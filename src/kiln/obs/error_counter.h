// Counts log events that carry an error-catalog code into kiln_errors_total{code}. Core logging
// has a single sink, so the counter is a sink that forwards every event onward.
#pragma once

#include "kiln/core/logging.h"
#include "kiln/obs/metrics.h"

namespace kiln::obs {

// A sink that counts events at Warn or above with a "code" field, then passes the event to
// `next`, or, when `next` is empty, writes it to stderr formatted as `format` (what core logging
// would have done without a sink). The sink runs under core logging's lock: it must not log.
LogSink MakeErrorCountingSink(KilnMetrics* metrics, LogSink next, LogFormat format);

// Installs the counting sink for its lifetime and restores the previous sink afterwards.
class ScopedErrorCounting {
 public:
  ScopedErrorCounting(KilnMetrics* metrics, LogFormat format);
  ~ScopedErrorCounting();
  ScopedErrorCounting(const ScopedErrorCounting&) = delete;
  ScopedErrorCounting& operator=(const ScopedErrorCounting&) = delete;

 private:
  LogSink previous_;
};

}  // namespace kiln::obs
