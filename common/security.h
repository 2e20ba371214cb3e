// Who may call what: bearer tokens on every gRPC call and optional mutual
// TLS, through one channel builder and one server-side check.
//
// Two credentials, so that neither can do the other's work:
//   client token   users (the `baton` CLI, the SDK): the Controller service
//   worker token   the fleet itself: workers -> Registry (registration,
//                  heartbeats, rendezvous) and controller -> Worker
// A token travels as "authorization: Bearer <token>" metadata; it is read
// from a file or an environment variable (never a flag value, which `ps`
// shows) and never logged. A server checks it at the start of every RPC:
// none -> UNAUTHENTICATED, a wrong one (or the other role's) ->
// PERMISSION_DENIED. The grpc.health.v1 service stays open for probes.
//
// TLS (server and client certificates signed by one CA, each side verifying
// the other) wraps the same channels when a CA, certificate and key are given.
#ifndef BATON_COMMON_SECURITY_H_
#define BATON_COMMON_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

enum class Role { kClient, kWorker };

// What a process presents when it calls, and its TLS material (PEM text).
struct Credentials {
  std::string token;
  std::string tls_ca, tls_cert, tls_key;
  bool use_tls = false;  // set by LoadTls when the files are given (never empty then)
  bool tls() const { return use_tls; }
};

// The token in `file` if given, else in environment variable `env` (a file
// path in `env`_FILE, or the token itself in `env`), else "". A token file
// must be a regular file of at most 4 KiB; surrounding whitespace is
// dropped. Errors name the file, never its contents.
absl::StatusOr<std::string> LoadToken(const std::string& file, const std::string& env);
// Reads the three PEM files (all or none).
absl::Status LoadTls(const std::string& ca_file, const std::string& cert_file, const std::string& key_file,
                     Credentials* credentials);
// Client credentials from the environment: BATON_TOKEN_FILE / BATON_TOKEN,
// BATON_TLS_CA / BATON_TLS_CERT / BATON_TLS_KEY (file paths).
absl::StatusOr<Credentials> ClientCredentialsFromEnvironment();

// A channel to `address` that sends `credentials.token` on every call, over
// TLS when configured.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Credentials& credentials,
                                           const grpc::ChannelArguments& args);
// Server credentials: TLS requiring and verifying a client certificate when
// configured, else plaintext.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const Credentials& credentials);

// The server-side check. With no token configured it lets every call in
// (a daemon on loopback for development; binding another address without
// tokens is refused at startup unless explicitly allowed).
class Authenticator {
 public:
  Authenticator() = default;
  // Both or neither (Validate says which is wrong).
  Authenticator(std::string client_token, std::string worker_token)
      : client_token_(std::move(client_token)), worker_token_(std::move(worker_token)) {}
  // A daemon's tokens must be both set and different, or both unset: one
  // alone would leave the other role open.
  static absl::Status Validate(const std::string& client_token, const std::string& worker_token);
  bool enabled() const { return !client_token_.empty() || !worker_token_.empty(); }
  // OK when the call carries the token of `role`.
  grpc::Status Check(const grpc::ServerContextBase* ctx, Role role) const;

 private:
  std::string client_token_, worker_token_;
};

// The metadata key naming the worker a controller's call is for. A worker
// refuses a call for another name (a port reused by another worker after a
// restart), and workers of one process may share an address and a
// connection: the name says which of them a call is for.
inline constexpr char kAddresseeMetadata[] = "x-baton-worker";
// OK when the call names no worker, or `name`.
grpc::Status CheckAddressee(const grpc::ServerContextBase* ctx, const std::string& name);

// Whether `host` is a loopback address (127.x.x.x, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

}  // namespace baton

#endif  // BATON_COMMON_SECURITY_H_
