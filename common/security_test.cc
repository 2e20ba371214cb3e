#include "common/security.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

std::string File(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  chmod(path.c_str(), 0600);
  return path;
}

// Configurations that would leave a role open, or TLS off, are refused.
TEST(SecurityTest, HalfConfiguredCredentialsAreRefused) {
  int refused = 0;
  for (const auto& [client, worker, ok] : {std::tuple{"", "", true}, std::tuple{"c", "w", true},
                                           std::tuple{"", "w", false}, std::tuple{"c", "", false},
                                           std::tuple{"same", "same", false}}) {
    const absl::Status s = Authenticator::Validate(client, worker);
    std::printf("client \"%s\", worker \"%s\": %s\n", client, worker, s.ToString().c_str());
    EXPECT_EQ(s.ok(), ok);
    refused += !s.ok();
  }
  auto empty = LoadToken(File("empty.token", " \n"), "BATON_UNUSED");
  std::printf("empty token file: %s\n", empty.status().ToString().c_str());
  EXPECT_FALSE(empty.ok());
  auto good = LoadToken(File("good.token", "abc123\n"), "BATON_UNUSED");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, "abc123");
  const std::string open_to_all = File("shared.token", "abc123");
  chmod(open_to_all.c_str(), 0644);
  auto shared = LoadToken(open_to_all, "BATON_UNUSED");
  std::printf("token file others can read: %s\n", shared.status().ToString().c_str());
  EXPECT_TRUE(absl::IsPermissionDenied(shared.status()));
  Credentials c;
  const absl::Status tls = LoadTls(File("empty-ca.pem", ""), File("cert.pem", "x"), File("key.pem", "y"), &c);
  std::printf("empty CA file: %s\n", tls.ToString().c_str());
  EXPECT_FALSE(tls.ok());
  EXPECT_FALSE(c.tls());
  EXPECT_FALSE(LoadTls("a", "", "", &c).ok());  // all three or none
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("127.example.com"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_EQ(refused, 3);
}

}  // namespace
}  // namespace baton
