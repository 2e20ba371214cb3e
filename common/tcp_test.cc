#include "common/tcp.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace baton {
namespace {

// To an address, and to a name (a worker's --host may be either).
TEST(TcpTest, FramesCrossAConnectionWhole) {
  for (const char* host : {"127.0.0.1", "localhost"}) {
    auto listening = ListenTcp(host);
    ASSERT_TRUE(listening.ok()) << listening.status();
    auto client = ConnectTcp(host, listening->second, absl::Seconds(2));
    ASSERT_TRUE(client.ok()) << client.status();
    auto server = AcceptTcp(listening->first.get());
    ASSERT_TRUE(server.ok()) << server.status();
    SetIoTimeout(server->get(), absl::Seconds(2));
    const std::string big(1 << 20, 'x');
    for (const std::string& sent : {std::string(), std::string("step"), big}) {
      ASSERT_TRUE(WriteFrame(client->get(), sent).ok());
      std::string got;
      ASSERT_TRUE(ReadFrame(server->get(), &got).ok());
      std::printf("%s:%d: frame of %zu bytes read back as %zu\n", host, listening->second, sent.size(), got.size());
      EXPECT_EQ(got, sent);
    }
  }
}

TEST(TcpTest, AnOversizedFrameIsRefusedBeforeItsBody) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ScopedFd a(fds[0]), b(fds[1]);
  ASSERT_TRUE(WriteFrame(a.get(), std::string(100, 'y')).ok());
  std::string got;
  const absl::Status s = ReadFrame(b.get(), &got, /*max_bytes=*/99);
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsResourceExhausted(s));
}

TEST(TcpTest, ATruncatedFrameTimesOutAndAClosedOneSaysSo) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ScopedFd a(fds[0]), b(fds[1]);
  SetIoTimeout(b.get(), absl::Milliseconds(100));
  const char partial[] = {10, 0, 0, 0, 'a', 'b'};  // 10 bytes promised, 2 sent
  ASSERT_EQ(::write(a.get(), partial, sizeof(partial)), static_cast<ssize_t>(sizeof(partial)));
  std::string got;
  absl::Status s = ReadFrame(b.get(), &got);
  std::printf("truncated: %s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_NE(s.message().find("timed out"), std::string::npos);
  // The same 2 of 10 bytes, then the end of the stream: inside the frame.
  int more[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, more), 0);
  ScopedFd c(more[0]), d(more[1]);
  ASSERT_EQ(::write(c.get(), partial, sizeof(partial)), static_cast<ssize_t>(sizeof(partial)));
  c.reset();
  s = ReadFrame(d.get(), &got);
  std::printf("closed inside a frame: %s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_NE(s.message().find("closed"), std::string::npos);
}

TEST(TcpTest, AStreamClosedBetweenFramesEndsCleanly) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ScopedFd a(fds[0]), b(fds[1]);
  SetIoTimeout(b.get(), absl::Milliseconds(100));
  ASSERT_TRUE(WriteFrame(a.get(), "last").ok());
  a.reset();
  std::string got;
  ASSERT_TRUE(ReadFrame(b.get(), &got).ok());
  EXPECT_EQ(got, "last");
  const absl::Status s = ReadFrame(b.get(), &got);
  std::printf("closed between frames: %s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
}

TEST(TcpTest, ARefusedConnectionIsToldApart) {
  int port = 0;
  {
    auto listening = ListenTcp("127.0.0.1");
    ASSERT_TRUE(listening.ok());
    port = listening->second;
  }  // closed: nothing listens there now
  auto refused = ConnectTcp("127.0.0.1", port, absl::Seconds(2));
  ASSERT_FALSE(refused.ok());
  std::printf("%s\n", refused.status().ToString().c_str());
  EXPECT_TRUE(IsConnectionRefused(refused.status()));
  auto bad = ConnectTcp("not-a-host", 1, absl::Seconds(2));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_FALSE(IsConnectionRefused(bad.status()));
  EXPECT_FALSE(SplitHostPort("no-port").ok());
  auto v6 = SplitHostPort("[::1]:80");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  EXPECT_EQ(v6->second, "80");
}

}  // namespace
}  // namespace baton
