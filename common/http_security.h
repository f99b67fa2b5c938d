// The rules that keep a browser from being turned against the person who
// uses ballastd's dashboard (docs/security.md): the headers every HTTP answer
// carries, the status a refused credential gets, and the check that a
// request which would change state passes before any route sees it. Plain
// strings in and out, so that any HTTP server can apply them in one place.
#ifndef BALLAST_COMMON_HTTP_SECURITY_H_
#define BALLAST_COMMON_HTTP_SECURITY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ballast {

using HttpHeaderList = std::vector<std::pair<std::string, std::string>>;

// The dashboard's pages, scripts and styles: only ballastd's own files, no
// inline script or style, no plugins, never inside another site's frame.
inline constexpr char kDashboardContentSecurityPolicy[] =
    "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'";
// Everything else (JSON, event streams, /metrics): a document that loads
// nothing, should a browser ever render one.
inline constexpr char kDataContentSecurityPolicy[] = "default-src 'none'; frame-ancestors 'none'";

// The headers for an answer of `content_type` (as sent, parameters and all):
// a Content-Security-Policy (the dashboard's for HTML, JavaScript and CSS,
// the data one otherwise), X-Frame-Options: DENY and
// X-Content-Type-Options: nosniff. Every answer gets them, errors too.
HttpHeaderList SecurityHeaders(absl::string_view content_type);

// The HTTP status of a failed status, for every route: 401 for
// UNAUTHENTICATED (no token, or one that is not valid), 403 for
// PERMISSION_DENIED (a valid token without the role), 404 NOT_FOUND (another
// tenant's job too), 400 INVALID_ARGUMENT and OUT_OF_RANGE, 503 UNAVAILABLE
// (a stream cap); 500 for anything else.
int HttpStatusOf(const absl::Status& status);

// GET and HEAD, the methods that change nothing; every route served today is
// one of them.
bool IsSafeMethod(absl::string_view method);

// The check before any request that may change state (any method but GET
// and HEAD). OK only when
//   - it carries `Authorization: Bearer ...` (ballastd reads no cookie, so a
//     browser can never send a credential on its own), and
//   - its Origin, when the browser sends one, is the server's own:
//     `http[s]://` + the Host header it was sent to. "null" is no origin.
// Whether the token is valid is the route's business, as for any request.
// PERMISSION_DENIED saying which rule failed otherwise.
absl::Status CheckStateChangingRequest(absl::string_view authorization, absl::string_view origin,
                                       absl::string_view host, bool https);

// For a server that anyone who reaches it may use (ballastd without a token,
// which listens on loopback only): OK when the request's Host header names a
// loopback address, `localhost`, 127.0.0.0/8 or [::1], with any port or none.
// A page whose own name an attacker points at 127.0.0.1 (DNS rebinding) is
// same-origin with the server to the browser, but sends its own name as the
// Host: PERMISSION_DENIED, naming it.
absl::Status CheckLoopbackHost(absl::string_view host);

}  // namespace ballast

#endif  // BALLAST_COMMON_HTTP_SECURITY_H_
