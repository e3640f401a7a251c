// MetricsServer on prometheus-cpp's Exposer (civetweb). The Exposer throws when it cannot bind;
// that is turned into a catalog error here, with a probe that tells "port in use" apart.
#include "kiln/obs/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

namespace kiln::obs {
namespace {

// True when binding a TCP socket to address:port fails with EADDRINUSE (IPv4 addresses only;
// anything else is reported with the server's own error).
bool PortInUse(const std::string& address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) return false;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  // Same option civetweb sets, so a port in TIME_WAIT is not mistaken for one in use.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  bool in_use =
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsServerOptions& options,
                                                              KilnMetrics* metrics) {
  if (options.port < 0 || options.port > 65535) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "metrics port {} is not a TCP port (0..65535; 0 picks a free one)",
                     options.port);
  }
  if (options.bind_address.empty() || options.bind_address.find(':') != std::string::npos) {
    return MakeError(ErrorCode::kMetricsServerFailed,
                     "metrics bind address '{}' is not an IPv4 address", options.bind_address);
  }
  if (metrics == nullptr) metrics = &Metrics();
  std::string listen = fmt::format("{}:{}", options.bind_address, options.port);
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    if (options.port != 0 && PortInUse(options.bind_address, options.port)) {
      return MakeError(ErrorCode::kMetricsPortInUse,
                       "cannot serve metrics on {}: port {} is already in use", listen,
                       options.port);
    }
    return MakeError(ErrorCode::kMetricsServerFailed, "cannot serve metrics on {}: {}", listen,
                     e.what());
  }
  std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return MakeError(ErrorCode::kMetricsServerFailed,
                     "metrics server on {} started but reports no listening port", listen);
  }
  server->port_ = ports.front();
  server->bind_address_ = options.bind_address;
  server->exposer_->RegisterCollectable(metrics->shared_registry());
  return server;
}

MetricsServer::~MetricsServer() = default;

std::string MetricsServer::Url() const {
  std::string host = bind_address_ == "0.0.0.0" ? "127.0.0.1" : bind_address_;
  return fmt::format("http://{}:{}/metrics", host, port_);
}

StatusOr<std::unique_ptr<MetricsExport>> MetricsExport::Start(const MetricsExportOptions& options,
                                                              KilnMetrics* metrics) {
  std::unique_ptr<MetricsExport> out(new MetricsExport());
  out->metrics_ = metrics != nullptr ? metrics : &Metrics();
  out->file_ = options.file;
  if (options.port) {
    KILN_ASSIGN_OR_RETURN(
        out->server_, MetricsServer::Start({options.bind_address, *options.port}, out->metrics_));
  }
  KILN_RETURN_IF_ERROR(out->Flush());
  return out;
}

Status MetricsExport::Flush() {
  if (file_.empty()) return OkStatus();
  return metrics_->WriteTextfile(file_);
}

Status MetricsExport::Finish() {
  metrics_->SetUp(false);
  return Flush();
}

}  // namespace kiln::obs
