#include "common/frame_conn.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// The first error OpenSSL queued (and the queue emptied), or `fallback`.
std::string TakeSslError(const char* fallback) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

BioPtr PemBio(const std::string& pem) { return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// A context with `tls`'s certificate, key and CA, verifying the peer.
absl::StatusOr<SSL_CTX*> MakeContext(const Credentials& tls, bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(TakeSslError("SSL_CTX_new"));
  auto fail = [ctx](const std::string& what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat("step channel TLS: ", what, ": ", TakeSslError("failed")));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (server) SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // The certificate, then any chain behind it in the same PEM text.
  BioPtr cert_bio = PemBio(tls.tls_cert);
  X509* cert = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) return fail("the certificate");
  const int used = SSL_CTX_use_certificate(ctx, cert);
  X509_free(cert);
  if (used != 1) return fail("the certificate");
  while (X509* extra = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      return fail("the certificate chain");
    }
  }
  ERR_clear_error();  // the end of the PEM text
  BioPtr key_bio = PemBio(tls.tls_key);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) return fail("the private key");
  const int keyed = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (keyed != 1 || SSL_CTX_check_private_key(ctx) != 1) return fail("the private key");
  BioPtr ca_bio = PemBio(tls.tls_ca);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int cas = 0;
  while (X509* ca = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    cas += X509_STORE_add_cert(store, ca) == 1;
    X509_free(ca);
  }
  ERR_clear_error();
  if (cas == 0) return fail("the CA");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), nullptr);
  return ctx;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Make(const Credentials& tls, Side side) {
  if (!tls.tls()) return nullptr;
  auto ctx = MakeContext(tls, side == Side::kServer);
  if (!ctx.ok()) return ctx.status();
  return std::shared_ptr<const TlsContext>(new TlsContext(*ctx));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

struct FrameConn::Tls {
  SSL* ssl = nullptr;  // holds a reference to its context
  ~Tls() { SSL_free(ssl); }
  // A session over `fd` in `context`, not yet handshaken.
  static absl::StatusOr<std::unique_ptr<Tls>> Over(int fd, SSL_CTX* context) {
    auto state = std::make_unique<Tls>();
    state->ssl = SSL_new(context);
    if (state->ssl == nullptr || SSL_set_fd(state->ssl, fd) != 1) return absl::InternalError(TakeSslError("SSL_new"));
    return state;
  }
  // Moves bytes as recv and send do (common/tcp.h's ByteIo).
  ssize_t Io(char* data, size_t n, bool write) {
    size_t moved = 0;
    errno = 0;
    const int ok = write ? SSL_write_ex(ssl, data, n, &moved) : SSL_read_ex(ssl, data, n, &moved);
    if (ok == 1) return static_cast<ssize_t>(moved);
    const int saved = errno;
    switch (SSL_get_error(ssl, ok)) {
      case SSL_ERROR_ZERO_RETURN:  // the peer's close_notify
        ERR_clear_error();
        return 0;
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE:  // a blocking socket's timeout
        ERR_clear_error();
        errno = EAGAIN;
        return -1;
      case SSL_ERROR_SYSCALL:
        ERR_clear_error();
        if (saved == 0) return 0;  // the end of the stream without close_notify
        errno = saved;
        return -1;
      default:
        ERR_clear_error();
        errno = EPROTO;
        return -1;
    }
  }
};

FrameConn::FrameConn(ScopedFd fd) : fd_(std::move(fd)) {}

FrameConn::FrameConn(ScopedFd fd, std::unique_ptr<Tls> tls) : fd_(std::move(fd)), tls_(std::move(tls)) {}

FrameConn::~FrameConn() = default;

absl::StatusOr<std::unique_ptr<FrameConn>> FrameConn::Server(ScopedFd fd, const TlsContext* tls) {
  if (tls == nullptr) return std::make_unique<FrameConn>(std::move(fd));
  auto state = Tls::Over(fd.get(), tls->ctx_);
  if (!state.ok()) return state.status();
  errno = 0;
  if (SSL_accept((*state)->ssl) != 1) {
    return absl::PermissionDeniedError(absl::StrCat("step channel TLS handshake: ", TakeSslError("no handshake")));
  }
  return std::unique_ptr<FrameConn>(new FrameConn(std::move(fd), std::move(*state)));
}

absl::StatusOr<std::unique_ptr<FrameConn>> FrameConn::Client(ScopedFd fd, const std::string& host,
                                                             const TlsContext* tls) {
  if (tls == nullptr) return std::make_unique<FrameConn>(std::move(fd));
  auto made = Tls::Over(fd.get(), tls->ctx_);
  if (!made.ok()) return made.status();
  std::unique_ptr<Tls> state = std::move(*made);
  // The worker's certificate must name the host dialled: an IP address
  // among its IP names, a name among its DNS names.
  unsigned char ip[16];
  X509_VERIFY_PARAM* param = SSL_get0_param(state->ssl);
  const bool numeric = inet_pton(AF_INET, host.c_str(), ip) == 1 || inet_pton(AF_INET6, host.c_str(), ip) == 1;
  if ((numeric ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
               : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size())) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("step channel TLS: cannot check a certificate for ", host));
  }
  if (!numeric) SSL_set_tlsext_host_name(state->ssl, host.c_str());
  errno = 0;
  if (SSL_connect(state->ssl) != 1) {
    const long verified = SSL_get_verify_result(state->ssl);
    return absl::PermissionDeniedError(
        absl::StrCat("step channel TLS handshake with ", host, ": ",
                     verified != X509_V_OK ? X509_verify_cert_error_string(verified) : TakeSslError("no handshake")));
  }
  return std::unique_ptr<FrameConn>(new FrameConn(std::move(fd), std::move(state)));
}

absl::Status FrameConn::Write(const std::string& bytes) {
  if (tls_ == nullptr) return WriteFrame(fd_.get(), bytes);
  return WriteFrame([this](char* data, size_t n) { return tls_->Io(data, n, /*write=*/true); }, bytes);
}

absl::Status FrameConn::Read(std::string* bytes, size_t max_bytes) {
  if (tls_ == nullptr) return ReadFrame(fd_.get(), bytes, max_bytes);
  return ReadFrame([this](char* data, size_t n) { return tls_->Io(data, n, /*write=*/false); }, bytes, max_bytes);
}

void FrameConn::Shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

}  // namespace baton
