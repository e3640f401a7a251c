// Serves a metrics registry over HTTP (/metrics, Prometheus text format) for long-running kiln
// commands; short ones write a textfile instead (KilnMetrics::WriteTextfile). One thread polls
// every connection, so clients that connect and send nothing cannot keep the scraper waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "kiln/core/status.h"
#include "kiln/obs/metrics.h"

namespace kiln::obs {

struct MetricsServerOptions {
  std::string bind_address = "0.0.0.0";  // all interfaces, like node-exporter
  int port = 0;                          // 0: the kernel picks a free port
  // Idle or slow clients must not starve the scraper. The server answers every connection from
  // one event loop (an idle one costs a socket, not a worker); a connection has io_timeout to
  // send its request and take the answer, then it is closed; past max_connections the oldest
  // still-silent connection is closed to make room for the new one.
  std::chrono::milliseconds io_timeout{3000};
  int max_connections = 256;
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
  void Loop();

  KilnMetrics* metrics_ = nullptr;
  MetricsServerOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes the loop to stop it
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::string bind_address_;
  int port_ = 0;
};

// What a kiln command does with --metrics-port / --metrics-file, in one object:
//   KILN_ASSIGN_OR_RETURN(auto metrics, obs::MetricsExport::Start({opts.port, "0.0.0.0",
//   opts.file}));
//   ... the work ...
//   KILN_RETURN_IF_ERROR(metrics->Finish());
struct MetricsExportOptions {
  std::optional<int> port;  // serve /metrics when set (0: a free port)
  std::string bind_address = "0.0.0.0";
  std::string file;  // node-exporter textfile; empty: none
};

class MetricsExport {
 public:
  // Starts the server and writes the textfile once, so a bad port or path fails before the
  // work starts rather than after it.
  static StatusOr<std::unique_ptr<MetricsExport>> Start(const MetricsExportOptions& options,
                                                        KilnMetrics* metrics = nullptr);
  MetricsExport(const MetricsExport&) = delete;
  MetricsExport& operator=(const MetricsExport&) = delete;

  const MetricsServer* server() const { return server_.get(); }  // null without a port
  Status Flush();   // rewrites the textfile (no-op without one)
  Status Finish();  // kiln_up 0 and the final textfile; the server serves until destruction

 private:
  MetricsExport() = default;
  KilnMetrics* metrics_ = nullptr;
  std::unique_ptr<MetricsServer> server_;
  std::string file_;
};

}  // namespace kiln::obs
