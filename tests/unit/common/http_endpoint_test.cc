// HttpEndpoint's limits (a trickled head is cut at its deadline, an idle
// connection at its timeout, a connection past a cap is refused at once) and
// what routes see of a request, over raw loopback sockets so that the test
// controls every byte and every pause.
#include "common/http_endpoint.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ballast {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

class HttpEndpointTest : public ::testing::Test {
 protected:
  void Start(const HttpLimits& limits, const std::function<void(HttpRoutes*)>& routes = nullptr) {
    absl::StatusOr<std::unique_ptr<HttpEndpoint>> started = HttpEndpoint::Start(
        "127.0.0.1", 0, &metrics_, [] { return absl::OkStatus(); }, nullptr, routes, {}, false,
        limits);
    ASSERT_TRUE(started.ok()) << started.status();
    endpoint_ = *std::move(started);
  }

  // A connection from `source` (any 127/8 address), -1 when refused.
  int Connect(const char* source = "127.0.0.1") {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source, &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(endpoint_->port());
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      close(fd);
      return -1;
    }
    fds_.push_back(fd);
    return fd;
  }

  static void Send(int fd, const std::string& bytes) {
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // What arrives within `wait`, until the peer closes; *closed says whether it did.
  static std::string Receive(int fd, std::chrono::milliseconds wait, bool* closed = nullptr) {
    std::string out;
    const auto end = Clock::now() + wait;
    if (closed != nullptr) *closed = false;
    while (Clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[4096];
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        if (closed != nullptr) *closed = true;
        break;
      }
      out.append(buffer, n);
    }
    return out;
  }

  void TearDown() override {
    for (int fd : fds_) close(fd);
  }

  MetricsRegistry metrics_;
  std::unique_ptr<HttpEndpoint> endpoint_;
  std::vector<int> fds_;
};

TEST_F(HttpEndpointTest, AHeadTrickledInIsCutAtItsDeadline) {
  HttpLimits limits;
  limits.head_deadline = absl::Milliseconds(500);
  Start(limits);
  const int fd = Connect();
  const auto start = Clock::now();
  bool closed = false;
  // A byte every 100 ms would never end a 4 KiB head; the deadline counts
  // from the first byte, not per read.
  for (int i = 0; i < 30 && !closed; ++i) {
    send(fd, i == 0 ? "G" : "x", 1, MSG_NOSIGNAL);
    Receive(fd, std::chrono::milliseconds(100), &closed);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1500));
}

TEST_F(HttpEndpointTest, AnIdleConnectionIsClosedAfterTheIdleTimeout) {
  HttpLimits limits;
  limits.idle_timeout = absl::Milliseconds(300);
  Start(limits);
  const int fd = Connect();
  bool closed = false;
  EXPECT_EQ(Receive(fd, std::chrono::milliseconds(3000), &closed), "");
  EXPECT_TRUE(closed);
  // Between keep-alive requests too.
  const int again = Connect();
  Send(again, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(Receive(again, std::chrono::milliseconds(3000), &closed), StartsWith("HTTP/1.1 200"));
  EXPECT_TRUE(closed);
}

TEST_F(HttpEndpointTest, ConnectionsPastACapAreRefusedAtOnceAndOthersStillServed) {
  HttpLimits limits;
  limits.max_connections_per_address = 3;
  limits.max_connections = 5;
  Start(limits);
  for (int i = 0; i < 3; ++i) ASSERT_GE(Connect("127.0.0.2"), 0);
  const auto start = Clock::now();
  const int fourth = Connect("127.0.0.2");
  bool closed = false;
  EXPECT_THAT(Receive(fourth, std::chrono::milliseconds(2000), &closed),
              StartsWith("HTTP/1.1 503"));
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1000));
  // Another address is below its cap, and the total (5) has room for it.
  const int other = Connect("127.0.0.3");
  Send(other, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(Receive(other, std::chrono::milliseconds(2000)), StartsWith("HTTP/1.1 200"));
  ASSERT_GE(Connect("127.0.0.4"), 0);
  ASSERT_GE(Connect("127.0.0.6"), 0);
  // The total (3 + 2, the closed one gone) is reached: the next is refused
  // whatever its address.
  EXPECT_THAT(Receive(Connect("127.0.0.5"), std::chrono::milliseconds(2000)),
              StartsWith("HTTP/1.1 503"));
}

TEST_F(HttpEndpointTest, HealthzAnswersAtOnceBesideHundredsOfIdleAndSlowConnections) {
  Start(HttpLimits{});
  for (int i = 0; i < 400; ++i) {
    const int fd = Connect(i < 200 ? "127.0.0.2" : "127.0.0.3");
    ASSERT_GE(fd, 0);
    if (i % 2 == 0) send(fd, "GET /heal", 9, MSG_NOSIGNAL);
  }
  for (int i = 0; i < 20; ++i) {
    const auto start = Clock::now();
    const int fd = Connect();
    Send(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    EXPECT_THAT(Receive(fd, std::chrono::milliseconds(2000)), HasSubstr("\r\n\r\nok\n"));
    // cpp-httplib's 16 threads answered after seconds here (issue 40).
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  }
}

TEST_F(HttpEndpointTest, RoutesSeeTheDecodedRequestAndStreamsArriveInChunks) {
  Start(HttpLimits{}, [](HttpRoutes* routes) {
    routes->Get(R"(/echo/([^/]+))", [](const HttpRequest& request, HttpResponse& response) {
      response.set_header("X-Seen", "yes");
      response.set_content(
          absl::StrCat(request.matches[1], "|", request.get_param_value("q"), "|",
                       request.get_param_value("r", 1), "|", request.get_param_value_count("r"),
                       "|", request.get_header_value("x-token")),
          "text/plain");
    });
    routes->Get("/count", [](const HttpRequest&, HttpResponse& response) {
      auto left = std::make_shared<int>(3);
      response.set_chunked_content_provider(
          "text/event-stream",
          [left](std::string* chunk) {
            absl::StrAppend(chunk, "n", (*left)--, ";");
            return *left > 0;
          },
          [] {});
    });
  });
  const int fd = Connect();
  Send(fd,
       "GET /echo/a%20b?q=x+y%21&r=1&r=2 HTTP/1.1\r\nHost: x\r\nX-Token: t\r\n\r\n"
       "HEAD /echo/z HTTP/1.1\r\nHost: x\r\n\r\n"
       "POST /echo/z HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
       "DELETE /echo/z HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n"
       "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
       "GET /count HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = Receive(fd, std::chrono::milliseconds(5000));
  EXPECT_THAT(all, HasSubstr("X-Seen: yes"));
  EXPECT_THAT(all, HasSubstr("\r\n\r\na b|x y!|2|2|t"));
  // HEAD: the length of "z|||0|", and no body before the next response.
  EXPECT_THAT(all, HasSubstr("Content-Length: 6"));
  // Before routing: a request that could change state needs the bearer
  // header, and then finds that nothing does (common/http_security.h).
  EXPECT_THAT(all, HasSubstr("\r\n\r\nHTTP/1.1 403"));
  EXPECT_THAT(all, HasSubstr("needs 'Authorization: Bearer TOKEN'"));
  EXPECT_THAT(all, HasSubstr("HTTP/1.1 405"));
  EXPECT_THAT(all, HasSubstr("Allow: GET, HEAD"));
  EXPECT_THAT(all, HasSubstr("DELETE: nothing here changes state"));
  // Every answer, the stream's too, carries the security headers.
  const std::vector<absl::string_view> answers = absl::StrSplit(all, "\r\n\r\n");
  EXPECT_EQ(std::count_if(answers.begin(), answers.end(),
                          [](absl::string_view head) {
                            return absl::StrContains(head, "\r\nX-Content-Type-Options: nosniff");
                          }),
            6);
  EXPECT_THAT(all, HasSubstr("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(all, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(all, HasSubstr("3\r\nn3;\r\n3\r\nn2;\r\n3\r\nn1;\r\n0\r\n\r\n"));
}

TEST_F(HttpEndpointTest, AnswersOutsideARouteTakeTheErrorFormatOfTheirPath) {
  Start(HttpLimits{}, [](HttpRoutes* routes) {
    routes->Get("/api/x", [](const HttpRequest&, HttpResponse& response) {
      response.set_content("x", "text/plain");
    });
    routes->SetErrorFormat("/api/", [](int status, absl::string_view message) {
      return absl::StrCat("{\"api\": ", status, ", \"said\": \"", message, "\"}");
    });
    routes->SetErrorFormat("/api/deeper/", [](int status, absl::string_view) {
      return absl::StrCat("{\"deeper\": ", status, "}");
    });
  });
  const int fd = Connect();
  Send(fd,
       "GET /api/none HTTP/1.1\r\nHost: x\r\n\r\n"
       "GET /api/deeper/none HTTP/1.1\r\nHost: x\r\n\r\n"
       "GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n"
       "POST /api/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
       "DELETE /api/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
       "Connection: close\r\n\r\n");
  const std::string all = Receive(fd, std::chrono::milliseconds(5000));
  EXPECT_THAT(all,
              HasSubstr("{\"api\": 404, \"said\": \"not found: no route for GET /api/none\"}"));
  EXPECT_THAT(all, HasSubstr("{\"deeper\": 404}"));  // the longest prefix
  EXPECT_THAT(all, HasSubstr("{\"error\":\"not found: no route for GET /elsewhere\"}"));
  EXPECT_THAT(all, HasSubstr("{\"api\": 403, \"said\": \""));
  EXPECT_THAT(all, HasSubstr("{\"api\": 405, \"said\": \"DELETE: nothing here changes state"));
  EXPECT_EQ(std::count(all.begin(), all.end(), '{'), 5);
  EXPECT_THAT(all, HasSubstr("Content-Type: application/json"));
}

// A POST route (the OpenAI-compatible API's exception to GET-only): reached
// only with a bearer header, its body read within the route's own limit and
// the upload timeout, which the head deadline does not cut; a body past the
// limit is refused by its Content-Length, before it is read.
TEST_F(HttpEndpointTest, APostRouteGetsItsBodyWithinItsOwnLimitAndTimeout) {
  HttpLimits limits;
  limits.head_deadline = absl::Milliseconds(300);
  limits.transfer_timeout = absl::Milliseconds(300);
  limits.upload_timeout = absl::Seconds(5);
  constexpr uint64_t kLimit = 200 * 1024;
  Start(limits, [](HttpRoutes* routes) {
    routes->Post("/upload", kLimit, [](const HttpRequest& request, HttpResponse& response) {
      response.set_content(absl::StrCat("got ", request.body.size(), " bytes"), "text/plain");
    });
  });
  const std::string body(150 * 1024, 'b');
  const std::string head = absl::StrCat(
      "POST /upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: ",
      body.size(), "\r\nConnection: close\r\n\r\n");
  // Sent in pieces over a second: longer than the head deadline and the
  // transfer timeout, within the upload timeout.
  int fd = Connect();
  Send(fd, head);
  for (size_t at = 0; at < body.size(); at += body.size() / 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Send(fd, body.substr(at, body.size() / 5));
  }
  EXPECT_THAT(Receive(fd, std::chrono::milliseconds(5000)), HasSubstr("got 153600 bytes"));

  // Past the limit: 413 as soon as the head is in.
  fd = Connect();
  Send(fd, absl::StrCat("POST /upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                        "Content-Length: ",
                        kLimit + 1, "\r\n\r\n"));
  bool closed = false;
  const std::string refused = Receive(fd, std::chrono::milliseconds(3000), &closed);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(refused, HasSubstr("X-Content-Type-Options: nosniff"));
  EXPECT_TRUE(closed);

  // Without the bearer header the upload limit does not apply: 403 for
  // 64 KiB or less, a closed connection past it, the body never routed.
  fd = Connect();
  Send(fd, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
  EXPECT_THAT(Receive(fd, std::chrono::milliseconds(3000)), StartsWith("HTTP/1.1 403"));
  fd = Connect();
  Send(fd, absl::StrCat("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: ", 100 * 1024,
                        "\r\n\r\n"));
  EXPECT_THAT(Receive(fd, std::chrono::milliseconds(3000)), StartsWith("HTTP/1.1 413"));
  // Another method on the route's path is still 405.
  fd = Connect();
  Send(fd,
       "PUT /upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: 0\r\n"
       "Connection: close\r\n\r\n");
  EXPECT_THAT(Receive(fd, std::chrono::milliseconds(3000)), StartsWith("HTTP/1.1 405"));
}

}  // namespace
}  // namespace ballast
