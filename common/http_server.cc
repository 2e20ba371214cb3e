#include "common/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace baton {
namespace {

// Bounds: a scrape or a page load is small; nothing waits long. Connections
// cost no thread (epoll), only a descriptor: a client that opens many and
// sends slowly takes at most kMaxConnectionsPerClient of them and is dropped
// after kConnectionTimeoutS of silence. Once the server is crowded (3/4 of
// kMaxConnections held) a client already holding kCrowdedShare is refused
// more, so the last quarter stays for clients holding few: 9 addresses
// holding 64 slow connections each no longer fill it (tests/service/
// hostile_test); it takes kMaxConnections / kCrowdedShare of them.
constexpr unsigned kThreads = 2;
constexpr unsigned kConnectionTimeoutS = 5;
constexpr unsigned kMaxConnections = 512;
constexpr unsigned kMaxConnectionsPerClient = 64;
constexpr int kCrowded = kMaxConnections * 3 / 4;
constexpr int kCrowdedShare = 8;

// libmicrohttpd's complaints (a refused connection, a client gone), at most
// one line a second.
void LogHttpError(void*, const char* format, va_list args) {
  static std::atomic<int64_t> last_ms{0};
  const int64_t now = absl::ToUnixMillis(absl::Now());
  int64_t last = last_ms.load();
  if (now - last < 1000 || !last_ms.compare_exchange_strong(last, now)) return;
  char buf[512];
  std::vsnprintf(buf, sizeof(buf), format, args);
  Logf("http: %s", buf);
}

// A client: its IPv4 address, or its IPv6 /64 (one host's share of a
// network that hands out whole /64s).
std::string ClientOf(const sockaddr* addr) {
  if (addr == nullptr) return "";
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    return std::string(reinterpret_cast<const char*>(&in->sin_addr), sizeof(in->sin_addr));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    return std::string(reinterpret_cast<const char*>(&in6->sin6_addr), 8);
  }
  return "";
}

}  // namespace

// The connections each client holds, for the accept policy.
class ConnectionShares {
 public:
  bool Admit(const sockaddr* addr) {
    const std::string client = ClientOf(addr);
    absl::MutexLock lock(&mu_);
    const auto it = held_.find(client);
    const int mine = it == held_.end() ? 0 : it->second;
    if (mine >= static_cast<int>(kMaxConnectionsPerClient)) return false;
    return total_ < kCrowded || mine < kCrowdedShare;
  }
  void Opened(const std::string& client) {
    absl::MutexLock lock(&mu_);
    ++held_[client];
    ++total_;
  }
  void Closed(const std::string& client) {
    absl::MutexLock lock(&mu_);
    if (auto it = held_.find(client); it != held_.end() && --it->second <= 0) held_.erase(it);
    --total_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

HttpServer::HttpServer(std::map<std::string, HttpHandler> routes)
    : routes_(std::move(routes)), shares_(std::make_unique<ConnectionShares>()) {}

struct HttpServerAccess {
  static MHD_Result Accept(void* self, const sockaddr* addr, socklen_t) {
    return static_cast<HttpServer*>(self)->shares_->Admit(addr) ? MHD_YES : MHD_NO;
  }
  static void Notify(void* self, MHD_Connection* conn, void** socket_context, MHD_ConnectionNotificationCode code) {
    ConnectionShares& shares = *static_cast<HttpServer*>(self)->shares_;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      const MHD_ConnectionInfo* info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
      auto* client = new std::string(ClientOf(info == nullptr ? nullptr : info->client_addr));
      shares.Opened(*client);
      *socket_context = client;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != nullptr) {
      auto* client = static_cast<std::string*>(*socket_context);
      shares.Closed(*client);
      delete client;
      *socket_context = nullptr;
    }
  }

  // libmicrohttpd's request callback: answers once the request is complete
  // (GET and HEAD carry no body; a body sent anyway is read and ignored).
  static MHD_Result Handle(void* self, MHD_Connection* conn, const char* url, const char* method, const char*,
                           const char*, size_t* upload_size, void** request_state) {
    static int first_call;
    if (*request_state == nullptr) {  // headers only so far
      *request_state = &first_call;
      return MHD_YES;
    }
    if (*upload_size != 0) {
      *upload_size = 0;
      return MHD_YES;
    }
    const HttpResponse r = static_cast<const HttpServer*>(self)->Answer(method == nullptr ? "" : method,
                                                                         url == nullptr ? "" : url);
    MHD_Response* response =
        MHD_create_response_from_buffer(r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, "Content-Type", r.content_type.c_str());
    MHD_add_response_header(response, "Cache-Control", "no-store");
    MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
    const MHD_Result queued = MHD_queue_response(conn, static_cast<unsigned>(r.status), response);
    MHD_destroy_response(response);
    return queued;
  }
};

HttpResponse HttpServer::Answer(const std::string& method, const std::string& path) const {
  auto it = routes_.find(path);
  if (it == routes_.end()) return HttpResponse{404, "text/plain; charset=utf-8", absl::StrCat("no page at ", path, "\n")};
  if (method != "GET" && method != "HEAD") return HttpResponse{405, "text/plain; charset=utf-8", "only GET\n"};
  try {
    return it->second();
  } catch (const std::exception& e) {
    return HttpResponse{500, "text/plain; charset=utf-8", absl::StrCat(e.what(), "\n")};
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, int port,
                                                              std::map<std::string, HttpHandler> routes) {
  const std::string listen = absl::StrCat(host, ":", port);
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("bad HTTP port in ", listen));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve HTTP host ", host, ": ", gai_strerror(e)));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, found->ai_addr, found->ai_addrlen);
  const bool ipv6 = found->ai_family == AF_INET6;
  ::freeaddrinfo(found);

  std::unique_ptr<HttpServer> server(new HttpServer(std::move(routes)));
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
  if (ipv6) flags |= MHD_USE_IPv6;
  server->daemon_ = MHD_start_daemon(flags, static_cast<uint16_t>(port), &HttpServerAccess::Accept, server.get(),
                                     &HttpServerAccess::Handle, server.get(), MHD_OPTION_SOCK_ADDR,
                                     reinterpret_cast<sockaddr*>(&addr), MHD_OPTION_NOTIFY_CONNECTION,
                                     &HttpServerAccess::Notify, server.get(),
                                     MHD_OPTION_THREAD_POOL_SIZE, kThreads, MHD_OPTION_CONNECTION_TIMEOUT,
                                     kConnectionTimeoutS, MHD_OPTION_CONNECTION_LIMIT, kMaxConnections,
                                     MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxConnectionsPerClient,
                                     MHD_OPTION_EXTERNAL_LOGGER, &LogHttpError, nullptr, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", listen, " (in use, or not an address here)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info == nullptr ? port : info->port;
  if (server->port_ == 0) return absl::UnavailableError(absl::StrCat("HTTP server on ", listen, " has no port"));
  return server;
}

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpIfAsked(const std::string& daemon, const std::string& host,
                                                             int port, std::map<std::string, HttpHandler> routes) {
  if (port < 0) return std::unique_ptr<HttpServer>();
  const bool page = routes.count("/") > 0;
  auto server = HttpServer::Start(host, port, std::move(routes));
  if (!server.ok()) return server.status();
  Logf("%s HTTP (metrics%s) on %s:%d", daemon.c_str(), page ? ", status page" : "", host.c_str(), (*server)->port());
  return server;
}

}  // namespace baton
