#include "common/security.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_root.h"
#include "grpcpp/support/client_interceptor.h"

namespace baton {
namespace {

constexpr int64_t kMaxTokenBytes = 4096;
constexpr int64_t kMaxPemBytes = 1 << 20;
constexpr char kBearer[] = "Bearer ";

// Constant time in the length of `want`: a wrong token reveals nothing by
// how long it took to refuse.
bool SameSecret(const std::string& got, const std::string& want) {
  unsigned char diff = got.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got[i] : 0));
  return diff == 0;
}

// Adds the bearer token to every call of a channel.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : header_(absl::StrCat(kBearer, token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel (which owns the factory)
};

}  // namespace

absl::StatusOr<std::string> LoadToken(const std::string& file, const std::string& env) {
  std::string path = file;
  if (path.empty()) {
    if (const char* p = std::getenv((env + "_FILE").c_str()); p != nullptr) path = p;
  }
  std::string token;
  if (!path.empty()) {
    auto text = ReadRegularFile(path, {.limit = kMaxTokenBytes, .private_to_user = true});
    if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("token file: ", text.status().message()));
    token = std::string(absl::StripAsciiWhitespace(*text));
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  } else if (const char* t = std::getenv(env.c_str()); t != nullptr) {
    token = std::string(absl::StripAsciiWhitespace(t));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat("the token ", path.empty() ? "in $" + env : "in " + path,
                                                     " holds a character that is not printable ASCII"));
    }
  }
  return token;
}

absl::Status LoadTls(const std::string& ca_file, const std::string& cert_file, const std::string& key_file,
                     Credentials* credentials) {
  const int given = !ca_file.empty() + !cert_file.empty() + !key_file.empty();
  if (given == 0) return absl::OkStatus();
  if (given != 3) return absl::InvalidArgumentError("TLS needs a CA, a certificate and a key (all three)");
  for (const auto& [path, out] : {std::pair{&ca_file, &credentials->tls_ca}, std::pair{&cert_file, &credentials->tls_cert},
                                  std::pair{&key_file, &credentials->tls_key}}) {
    auto text = ReadRegularFile(*path, {.limit = kMaxPemBytes, .private_to_user = out == &credentials->tls_key});
    if (!text.ok()) return text.status();
    if (text->empty()) return absl::InvalidArgumentError(absl::StrCat("TLS file ", *path, " is empty"));
    *out = *text;
  }
  credentials->use_tls = true;
  return absl::OkStatus();
}

absl::StatusOr<Credentials> ClientCredentialsFromEnvironment() {
  Credentials c;
  auto token = LoadToken("", "BATON_TOKEN");
  if (!token.ok()) return token.status();
  c.token = *token;
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  if (auto s = LoadTls(env("BATON_TLS_CA"), env("BATON_TLS_CERT"), env("BATON_TLS_KEY"), &c); !s.ok()) return s;
  return c;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Credentials& credentials,
                                           const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> transport;
  if (credentials.tls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = credentials.tls_ca;
    ssl.pem_cert_chain = credentials.tls_cert;
    ssl.pem_private_key = credentials.tls_key;
    transport = grpc::SslCredentials(ssl);
  } else {
    transport = grpc::InsecureChannelCredentials();
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!credentials.token.empty()) interceptors.push_back(std::make_unique<TokenInterceptorFactory>(credentials.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, transport, args, std::move(interceptors));
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const Credentials& credentials) {
  if (!credentials.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = credentials.tls_ca;
  ssl.pem_key_cert_pairs.push_back({credentials.tls_key, credentials.tls_cert});
  return grpc::SslServerCredentials(ssl);
}

grpc::Status Authenticator::Check(const grpc::ServerContextBase* ctx, Role role) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        role == Role::kClient
                            ? "no bearer token: this controller needs its client token (BATON_TOKEN_FILE, or "
                              "--token_file)"
                            : "no bearer token: this service needs the fleet's worker token");
  }
  const std::string header(it->second.data(), it->second.size());
  const std::string got = absl::StartsWith(header, kBearer) ? header.substr(sizeof(kBearer) - 1) : "";
  const std::string& want = role == Role::kClient ? client_token_ : worker_token_;
  const std::string& other = role == Role::kClient ? worker_token_ : client_token_;
  if (!want.empty() && SameSecret(got, want)) return grpc::Status::OK;
  if (!other.empty() && SameSecret(got, other)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        role == Role::kClient ? "a worker token cannot drive the controller's jobs and meshes"
                                              : "a client token cannot act as a worker of the fleet");
  }
  // A role without a token of its own is closed, not open.
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong bearer token");
}

absl::Status Authenticator::Validate(const std::string& client_token, const std::string& worker_token) {
  if (client_token.empty() != worker_token.empty()) {
    return absl::InvalidArgumentError(
        "give both a client and a worker token (or neither): one alone would leave the other role open");
  }
  if (!client_token.empty() && client_token == worker_token) {
    return absl::InvalidArgumentError("the client and worker tokens must differ: each role needs its own");
  }
  return absl::OkStatus();
}

grpc::Status CheckAddressee(const grpc::ServerContextBase* ctx, const std::string& name) {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kAddresseeMetadata);
  if (it == metadata.end()) return grpc::Status::OK;
  const std::string wanted(it->second.data(), it->second.size());
  if (wanted == name) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrCat("this is worker ", name, ", not ", wanted.substr(0, 128),
                                   " (its address is another worker's now)"));
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  int a, b, c, d;
  char tail;
  return std::sscanf(host.c_str(), "%d.%d.%d.%d%c", &a, &b, &c, &d, &tail) == 4 && a == 127;
}

}  // namespace baton
