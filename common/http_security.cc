#include "common/http_security.h"

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

int HttpStatusOfRefusal(const absl::Status& refusal) {
  switch (refusal.code()) {
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
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

}  // namespace ballast
