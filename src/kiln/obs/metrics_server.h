// Serves a metrics registry over HTTP (/metrics, Prometheus text format) for long-running kiln
// commands; short ones write a textfile instead (KilnMetrics::WriteTextfile).
#pragma once

#include <memory>
#include <string>

#include "kiln/core/status.h"
#include "kiln/obs/metrics.h"

namespace prometheus {
class Exposer;
}

namespace kiln::obs {

struct MetricsServerOptions {
  std::string bind_address = "0.0.0.0";  // all interfaces, like node-exporter
  int port = 0;                          // 0: the kernel picks a free port
};

class MetricsServer {
 public:
  // Starts serving `metrics` (the process-wide Metrics() when null). Errors: MetricsPortInUse
  // when another process holds the port, MetricsServerFailed otherwise (bad address, privileges).
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsServerOptions& options,
                                                        KilnMetrics* metrics = nullptr);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "http://ADDRESS:PORT/metrics" (127.0.0.1 when bound to all interfaces).
  std::string Url() const;

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bind_address_;
  int port_ = 0;
};

}  // namespace kiln::obs
