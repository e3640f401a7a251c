// MetricsServer: a small HTTP/1.x server on one poll() loop. Every connection has a deadline for
// its request and its answer, and the number of open connections is capped by closing the oldest
// silent one, so no set of idle or slow clients can keep a scrape from being answered.
#include "kiln/obs/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

namespace kiln::obs {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestBytes = 16 * 1024;  // a request line and headers; no body is read

struct Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::string in;   // the request so far
  std::string out;  // the answer, once the request is complete
  size_t sent = 0;
  bool answering() const { return !out.empty(); }
};

std::string Answer(int status, std::string_view reason, std::string_view content_type,
                   const std::string& body, bool head) {
  std::string r = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
      status, reason, content_type, body.size());
  if (!head) r += body;
  return r;
}

// The answer to one complete request (only the request line matters).
std::string Respond(const std::string& request, KilnMetrics* metrics) {
  const std::string line = request.substr(0, request.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    return Answer(400, "Bad Request", "text/plain", "bad request line\n", false);
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    return Answer(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false);
  }
  if (path == "/metrics") {
    return Answer(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics->Serialize(),
                  head);
  }
  if (path == "/") {
    return Answer(200, "OK", "text/html",
                  "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n", head);
  }
  return Answer(404, "Not Found", "text/plain", "not found: the metrics are at /metrics\n", head);
}

// Reads what the client sent; false when the connection is to be closed.
bool ReadRequest(Connection& c, KilnMetrics* metrics) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) {
        c.out = Respond(c.in, metrics);
        return true;
      }
      if (c.in.size() > kMaxRequestBytes) {
        c.out = Answer(431, "Request Header Fields Too Large", "text/plain", "too large\n", false);
        return true;
      }
      continue;
    }
    if (n == 0) return false;  // closed before a whole request
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

// Sends what is left of the answer; false when done (or failed): the connection is closed.
bool WriteAnswer(Connection& c) {
  while (c.sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsServerOptions& options,
                                                              KilnMetrics* metrics) {
  if (options.port < 0 || options.port > 65535) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "metrics port {} is not a TCP port (0..65535; 0 picks a free one)",
                     options.port);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.bind_address.c_str(), &addr.sin_addr) != 1) {
    return MakeError(ErrorCode::kMetricsServerFailed,
                     "metrics bind address '{}' is not an IPv4 address (four numbers 0..255)",
                     options.bind_address);
  }
  if (options.max_connections < 1 || options.max_connections > 65536 ||
      options.io_timeout.count() < 1) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "the metrics server needs 1..65536 connections and a positive I/O timeout "
                     "({} connections, {} ms)",
                     options.max_connections, options.io_timeout.count());
  }
  if (metrics == nullptr) metrics = &Metrics();
  const std::string listen = fmt::format("{}:{}", options.bind_address, options.port);
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) {
    return MakeError(ErrorCode::kMetricsServerFailed, "cannot serve metrics on {}: socket: {}",
                     listen, std::strerror(errno));
  }
  int one = 1;
  // A port left in TIME_WAIT by an earlier run is free to use again.
  ::setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) {
      return MakeError(ErrorCode::kMetricsPortInUse,
                       "cannot serve metrics on {}: port {} is already in use", listen,
                       options.port);
    }
    return MakeError(ErrorCode::kMetricsServerFailed, "cannot serve metrics on {}: bind: {}",
                     listen, std::strerror(err));
  }
  if (::listen(server->listen_fd_, 128) != 0) {
    return MakeError(ErrorCode::kMetricsServerFailed, "cannot serve metrics on {}: listen: {}",
                     listen, std::strerror(errno));
  }
  socklen_t len = sizeof(addr);
  if (::getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return MakeError(ErrorCode::kMetricsServerFailed, "metrics server on {}: getsockname: {}",
                     listen, std::strerror(errno));
  }
  server->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return MakeError(ErrorCode::kMetricsServerFailed, "metrics server on {}: eventfd: {}", listen,
                     std::strerror(errno));
  }
  server->port_ = ntohs(addr.sin_port);
  server->bind_address_ = options.bind_address;
  server->options_ = options;
  server->metrics_ = metrics;
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

void MetricsServer::Loop() {
  std::list<Connection> conns;  // oldest first
  auto close_conn = [&](std::list<Connection>::iterator it) {
    ::close(it->fd);
    return conns.erase(it);
  };
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> polled;
  while (!stop_.load()) {
    Clock::time_point now = Clock::now();
    Clock::time_point wake = now + std::chrono::seconds(1);
    fds.clear();
    polled.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({wake_fd_, POLLIN, 0});
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      fds.push_back({it->fd, static_cast<short>(it->answering() ? POLLOUT : POLLIN), 0});
      polled.push_back(it);
      wake = std::min(wake, it->deadline);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
    if (ready < 0 && errno != EINTR) break;
    if (stop_.load()) break;
    now = Clock::now();
    for (size_t i = 0; i < polled.size(); ++i) {
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      Connection& c = *polled[i];
      bool keep = ev & (POLLERR | POLLNVAL) ? false : true;
      if (keep && !c.answering()) keep = ReadRequest(c, metrics_);
      if (keep && c.answering()) keep = WriteAnswer(c);
      if (!keep) close_conn(polled[i]);
    }
    // Past its deadline: a client that sent no request in time, or does not take the answer.
    for (auto it = conns.begin(); it != conns.end();) {
      it = it->deadline <= now ? close_conn(it) : std::next(it);
    }
    if (fds[0].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN: all taken; EMFILE and the like: try on the next round
        if (static_cast<int>(conns.size()) >= options_.max_connections) {
          // Room for the newcomer: the oldest connection that has not even sent its request.
          auto victim = std::find_if(conns.begin(), conns.end(),
                                     [](const Connection& c) { return !c.answering(); });
          close_conn(victim != conns.end() ? victim : conns.begin());
        }
        conns.push_back({fd, now + options_.io_timeout, {}, {}, 0});
      }
    }
  }
  for (auto it = conns.begin(); it != conns.end();) it = close_conn(it);
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

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
    MetricsServerOptions so;
    so.bind_address = options.bind_address;
    so.port = *options.port;
    KILN_ASSIGN_OR_RETURN(out->server_, MetricsServer::Start(so, out->metrics_));
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
