#include "common/http_security.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace ballast {
namespace {

using ::testing::HasSubstr;

std::map<std::string, std::string> AsMap(const HttpHeaderList& headers) {
  return {headers.begin(), headers.end()};
}

TEST(HttpSecurityTest, PagesGetTheDashboardPolicyAndEverythingElseTheDataOne) {
  for (const char* type :
       {"text/html; charset=utf-8", "TEXT/HTML", "text/javascript; charset=utf-8",
        "application/javascript", "text/css; charset=utf-8"}) {
    EXPECT_EQ(AsMap(SecurityHeaders(type))["Content-Security-Policy"],
              kDashboardContentSecurityPolicy)
        << type;
  }
  for (const char* type : {"application/json", "text/event-stream", "text/plain",
                           "text/plain; version=0.0.4", "", "text/htmlx", "image/svg+xml"}) {
    EXPECT_EQ(AsMap(SecurityHeaders(type))["Content-Security-Policy"], kDataContentSecurityPolicy)
        << type;
  }
  for (const char* type : {"text/html", "application/json", ""}) {
    std::map<std::string, std::string> headers = AsMap(SecurityHeaders(type));
    EXPECT_EQ(headers.size(), 3u);
    EXPECT_EQ(headers["X-Frame-Options"], "DENY");
    EXPECT_EQ(headers["X-Content-Type-Options"], "nosniff");
  }
  // The page policy admits no inline script or style: neither keyword is in it.
  EXPECT_THAT(std::string(kDashboardContentSecurityPolicy),
              ::testing::Not(HasSubstr("unsafe-inline")));
}

TEST(HttpSecurityTest, ABadCredentialIs401AndAMissingRole403) {
  EXPECT_EQ(HttpStatusOf(absl::UnauthenticatedError("no token")), 401);
  EXPECT_EQ(HttpStatusOf(absl::PermissionDeniedError("an admin token")), 403);
  EXPECT_EQ(HttpStatusOf(absl::NotFoundError("job j not found")), 404);
  EXPECT_EQ(HttpStatusOf(absl::InvalidArgumentError("limit")), 400);
  EXPECT_EQ(HttpStatusOf(absl::UnavailableError("streams")), 503);
  EXPECT_EQ(HttpStatusOf(absl::InternalError("?")), 500);
}

TEST(HttpSecurityTest, OnlyGetAndHeadAreSafe) {
  EXPECT_TRUE(IsSafeMethod("GET"));
  EXPECT_TRUE(IsSafeMethod("HEAD"));
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get", ""}) {
    EXPECT_FALSE(IsSafeMethod(method)) << method;
  }
}

TEST(HttpSecurityTest, AStateChangingRequestNeedsTheBearerHeaderAndItsOwnOrigin) {
  const std::string host = "127.0.0.1:9090";
  EXPECT_TRUE(CheckStateChangingRequest("Bearer t", "", host, false).ok());
  EXPECT_TRUE(CheckStateChangingRequest("Bearer t", "http://127.0.0.1:9090", host, false).ok());
  EXPECT_TRUE(
      CheckStateChangingRequest("Bearer t", "HTTP://LocalHost:9090", "localhost:9090", false).ok());
  EXPECT_TRUE(CheckStateChangingRequest("Bearer t", "https://b.example", "b.example", true).ok());

  for (const auto& [authorization, origin, own, https] :
       std::vector<std::tuple<std::string, std::string, std::string, bool>>{
           {"", "", host, false},
           {"Bearer ", "", host, false},
           {"Basic dTpw", "", host, false},
           {"t", "", host, false},
       }) {
    const absl::Status s = CheckStateChangingRequest(authorization, origin, own, https);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << authorization;
    EXPECT_THAT(s.message(), HasSubstr("needs 'Authorization: Bearer TOKEN'"));
  }
  for (const auto& [origin, own, https] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"http://evil.example", host, false},
           {"null", host, false},
           {"http://127.0.0.1:9091", host, false},
           {"https://127.0.0.1:9090", host, false},  // another scheme is another origin
           {"http://127.0.0.1:9090", host, true},
           {"http://127.0.0.1:9090.evil.example", host, false},
           {"http://", "", false},  // no Host header: no origin is its own
       }) {
    const absl::Status s = CheckStateChangingRequest("Bearer t", origin, own, https);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << origin;
    EXPECT_THAT(s.message(), HasSubstr("a cross-site request is refused: Origin " + origin));
  }
}

TEST(HttpSecurityTest, OnlyLoopbackNamesAreLoopbackHosts) {
  for (const char* host : {"localhost", "LOCALHOST:9090", "127.0.0.1", "127.0.0.1:9090",
                           "127.255.0.9:1", "[::1]:9090", "[::1]"}) {
    EXPECT_TRUE(CheckLoopbackHost(host).ok()) << host;
  }
  for (const char* host : {"evil.example", "evil.example:9090", "127.0.0.1.evil.example",
                           "127.0.0.1.evil.example:9090", "localhost.evil.example", "10.0.0.1:9090",
                           "0.0.0.0:9090", "[::2]:9090", "[::ffff:127.0.0.1]:80", "", ":9090",
                           "127.1:9090", "::1"}) {  // an IPv6 Host is bracketed
    const absl::Status s = CheckLoopbackHost(host);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << host;
    EXPECT_THAT(s.message(), HasSubstr("is not a loopback name")) << host;
  }
}

}  // namespace
}  // namespace ballast
