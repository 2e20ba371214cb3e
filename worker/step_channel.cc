#include "worker/step_channel.h"

#include <poll.h>

#include <fstream>

#include <grpcpp/support/status.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace baton {
namespace {

std::string RandomSecret(size_t n) {
  std::string secret(n, '\0');
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(secret.data(), static_cast<std::streamsize>(n));
  return urandom ? secret : std::string();
}

// Compares without stopping at the first difference.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status WriteReply(FrameConn& conn, const baton::v1::StepChannelReply& reply) {
  return conn.Write(reply.SerializeAsString());
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepChannelServer>> StepChannelServer::Listen(const std::string& host, int64_t epoch,
                                                                             const Credentials& tls, Handler handler) {
  auto listening = ListenTcp(host);
  if (!listening.ok()) return listening.status();
  std::string secret = RandomSecret(kSecretBytes);
  if (secret.empty()) return absl::InternalError("no randomness for the step channel's secret (/dev/urandom)");
  auto context = TlsContext::Make(tls, TlsContext::Side::kServer);
  if (!context.ok()) return context.status();
  return std::unique_ptr<StepChannelServer>(new StepChannelServer(std::move(listening->first), listening->second,
                                                                  epoch, std::move(secret), std::move(*context),
                                                                  std::move(handler)));
}

StepChannelServer::StepChannelServer(ScopedFd listener, int port, int64_t epoch, std::string secret,
                                     std::shared_ptr<const TlsContext> tls, Handler handler)
    : listener_(std::move(listener)),
      port_(port),
      epoch_(epoch),
      secret_(std::move(secret)),
      tls_(std::move(tls)),
      handler_(std::move(handler)) {}

std::vector<int> StepChannelServer::fds() {
  if (conn_ != nullptr) return {conn_->fd()};
  if (listener_.valid()) return {listener_.get()};
  return {};
}

void StepChannelServer::Ready(int fd, short) {
  if (fd == listener_.get()) {
    auto conn = AcceptTcp(fd);
    if (!conn.ok()) return;
    if (Admit(std::move(*conn))) listener_.reset();  // one controller per mesh
    return;
  }
  if (conn_ != nullptr && fd == conn_->fd() && !Answer()) {
    conn_.reset();
    attached_ = false;
  }
}

bool StepChannelServer::Admit(ScopedFd fd) {
  // Whoever connects holds the step thread until its hello is read (its
  // TLS handshake included).
  SetIoTimeout(fd.get(), kHelloTimeout);
  auto accepted = FrameConn::Server(std::move(fd), tls_.get());
  if (!accepted.ok()) {
    Logf("step channel of mesh epoch %lld: refused a connection: %s", static_cast<long long>(epoch_),
         accepted.status().ToString().c_str());
    return false;
  }
  std::unique_ptr<FrameConn> conn = std::move(*accepted);
  std::string bytes;
  baton::v1::StepChannelHello hello;
  if (!conn->Read(&bytes, 1024).ok() || !hello.ParseFromString(bytes)) return false;
  baton::v1::StepChannelReply reply;
  if (hello.epoch() != epoch_ || !SameSecret(hello.secret(), secret_)) {
    reply.set_code(static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
    reply.set_message(absl::StrCat("not mesh epoch ", epoch_, "'s step channel secret"));
    WriteReply(*conn, reply).IgnoreError();
    Logf("step channel of mesh epoch %lld: refused a connection with a wrong epoch or secret",
         static_cast<long long>(epoch_));
    return false;
  }
  // Attached before the answer goes: a controller that has read it finds
  // the channel attached (tests/step_channel_test asks at once).
  attached_ = true;
  if (!WriteReply(*conn, reply).ok()) {
    attached_ = false;
    return false;
  }
  SetIoTimeout(conn->fd(), kStepFrameTimeout);
  conn_ = std::move(conn);
  return true;
}

bool StepChannelServer::Answer() {
  std::string bytes;
  if (absl::Status read = conn_->Read(&bytes); !read.ok()) {
    if (!absl::IsOutOfRange(read)) {  // not a controller that closed between calls
      Logf("step channel of mesh epoch %lld dropped: %s", static_cast<long long>(epoch_), read.ToString().c_str());
    }
    return false;
  }
  baton::v1::RunStepRequest request;
  baton::v1::StepChannelReply reply;
  if (!request.ParseFromString(bytes)) {
    reply.set_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    reply.set_message("a step channel frame that is not a RunStepRequest");
  } else {
    handler_(request, [this] { return HungUp(); }, &reply);
  }
  return WriteReply(*conn_, reply).ok();
}

bool StepChannelServer::HungUp() const {
  pollfd p{conn_->fd(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace baton
