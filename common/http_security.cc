#include "common/http_security.h"

#include <arpa/inet.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ballast {
namespace {

// The types that a browser runs or lays out as part of the dashboard.
bool IsPageContent(absl::string_view content_type) {
  const absl::string_view type = content_type.substr(0, content_type.find(';'));
  return absl::EqualsIgnoreCase(type, "text/html") ||
         absl::EqualsIgnoreCase(type, "text/javascript") ||
         absl::EqualsIgnoreCase(type, "application/javascript") ||
         absl::EqualsIgnoreCase(type, "text/css");
}

}  // namespace

HttpHeaderList SecurityHeaders(absl::string_view content_type) {
  return {{"Content-Security-Policy", IsPageContent(content_type) ? kDashboardContentSecurityPolicy
                                                                  : kDataContentSecurityPolicy},
          {"X-Frame-Options", "DENY"},
          {"X-Content-Type-Options", "nosniff"}};
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

bool IsSafeMethod(absl::string_view method) { return method == "GET" || method == "HEAD"; }

absl::Status CheckStateChangingRequest(absl::string_view authorization, absl::string_view origin,
                                       absl::string_view host, bool https) {
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::PermissionDeniedError(
        "a request that changes state needs 'Authorization: Bearer TOKEN' (cookies are never "
        "read)");
  }
  // Browsers send Origin with every such request, same-origin ones too; a
  // client without one is no browser, and the bearer header is its own.
  if (origin.empty()) return absl::OkStatus();
  const std::string own = absl::StrCat(https ? "https://" : "http://", host);
  if (host.empty() || !absl::EqualsIgnoreCase(origin, own)) {
    return absl::PermissionDeniedError(
        absl::StrCat("a cross-site request is refused: Origin ", origin, " is not ", own));
  }
  return absl::OkStatus();
}

absl::Status CheckLoopbackHost(absl::string_view host) {
  absl::string_view name = host;
  if (absl::ConsumePrefix(&name, "[")) {
    name = name.substr(0, name.find(']'));  // [::1]:PORT
  } else if (const size_t colon = name.rfind(':'); colon != absl::string_view::npos) {
    name = name.substr(0, colon);
  }
  in_addr v4;
  in6_addr v6;
  const std::string text(name);
  if (absl::EqualsIgnoreCase(name, "localhost") ||
      (inet_pton(AF_INET, text.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
      (inet_pton(AF_INET6, text.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6))) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("Host: '", host,
                   "' is not a loopback name; ballastd without a token answers only requests "
                   "addressed to localhost, 127.0.0.1 or [::1]"));
}

}  // namespace ballast
