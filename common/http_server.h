// A small HTTP server for what a cluster scrapes and looks at: Prometheus
// metrics, the status page and its JSON. GNU libmicrohttpd (Debian's
// libmicrohttpd-dev) does the HTTP; handlers answer GET requests for exact
// paths. (Not civetweb: Debian builds it with 100 KiB thread stacks, smaller
// than a worker's static TLS with LibTorch and OpenBLAS loaded, so its
// threads cannot start there.)
#ifndef BATON_COMMON_HTTP_SERVER_H_
#define BATON_COMMON_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct MHD_Daemon;

namespace baton {

class ConnectionShares;

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Called on one of the server's threads (concurrently with other requests).
using HttpHandler = std::function<HttpResponse()>;

class HttpServer {
 public:
  // Serves `routes` (exact paths such as "/metrics") on host:port; port 0
  // lets the OS choose. Other paths get 404, other methods 405.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host, int port,
                                                           std::map<std::string, HttpHandler> routes);
  ~HttpServer();  // stops serving; waits for requests in flight
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  explicit HttpServer(std::map<std::string, HttpHandler> routes);
  HttpResponse Answer(const std::string& method, const std::string& path) const;
  friend struct HttpServerAccess;

  const std::map<std::string, HttpHandler> routes_;
  std::unique_ptr<ConnectionShares> shares_;  // before daemon_: the daemon's callbacks use it
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

// Opens the daemon's HTTP port when `port` >= 0 (nullptr when < 0: off) and
// logs where it serves; an error when it cannot listen.
absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpIfAsked(const std::string& daemon, const std::string& host,
                                                             int port, std::map<std::string, HttpHandler> routes);

}  // namespace baton

#endif  // BATON_COMMON_HTTP_SERVER_H_
