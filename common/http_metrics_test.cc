#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/http_server.h"
#include "common/json.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace baton {
namespace {

// The whole answer to one "GET path" on 127.0.0.1:port.
std::string Get(int port, const std::string& path, const std::string& method = "GET") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(HttpMetricsTest, ServesRegistryInPrometheusTextFormat) {
  prometheus::Registry registry;
  auto& steps = prometheus::BuildCounter().Name("baton_test_steps_total").Help("steps").Register(registry);
  steps.Add({{"job", "job-1"}}).Increment(7);
  auto server = HttpServer::Start("127.0.0.1", 0, {{"/metrics", [&] { return MetricsResponse(registry); }},
                                                   {"/", [] { return HttpResponse{200, "text/html", "<p>hi</p>"}; }}});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string metrics = Get((*server)->port(), "/metrics");
  std::printf("GET /metrics on port %d:\n%s\n", (*server)->port(), metrics.c_str());
  EXPECT_NE(metrics.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_NE(metrics.find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics.find("# TYPE baton_test_steps_total counter"), std::string::npos);
  EXPECT_NE(metrics.find("baton_test_steps_total{job=\"job-1\"} 7"), std::string::npos);
  EXPECT_NE(Get((*server)->port(), "/").find("<p>hi</p>"), std::string::npos);
  const std::string missing = Get((*server)->port(), "/etc/passwd");
  std::printf("GET /etc/passwd: %s\n", missing.substr(0, missing.find('\r')).c_str());
  EXPECT_NE(missing.find("HTTP/1.1 404"), std::string::npos);
  EXPECT_NE(Get((*server)->port(), "/metrics", "POST").find("HTTP/1.1 405"), std::string::npos);
}

TEST(HttpMetricsTest, BusyPortIsAnErrorNotACrash) {
  auto first = HttpServer::Start("127.0.0.1", 0, {});
  ASSERT_TRUE(first.ok());
  auto second = HttpServer::Start("127.0.0.1", (*first)->port(), {});
  std::printf("second server on port %d: %s\n", (*first)->port(), second.status().ToString().c_str());
  EXPECT_FALSE(second.ok());
}

TEST(HttpMetricsTest, JsonQuoteEscapes) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n\x01\xc3\xa9"), "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"");
}

}  // namespace
}  // namespace baton
