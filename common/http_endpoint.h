// The HTTP side of ballastd and ballast-worker: GET /metrics (Prometheus
// text format 0.0.4) and GET /healthz (200 "ok" while the process is
// healthy by its own measure, 503 with the reason otherwise). Serves on its
// own threads from Start until destruction. ballastd's dashboard, its token
// check and TLS share this server, which is why /metrics is served here and
// not by prometheus-cpp-pull's Exposer: an Exposer takes a port of its own.
#ifndef BALLAST_COMMON_HTTP_ENDPOINT_H_
#define BALLAST_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace ballast {

// Splits a --listen / --http value, "HOST:PORT" ("[::1]:80" for IPv6).
// INVALID_ARGUMENT names `flag` and the allowed form.
absl::Status SplitHostPort(const std::string& address, const std::string& flag, std::string* host,
                           int* port);

// True for a host only this machine reaches: 127.0.0.0/8, ::1, localhost.
// An empty host or 0.0.0.0 is every interface.
bool IsLoopbackHost(const std::string& host);

// An authorize_metrics that admits "Bearer TOKEN" only; nullptr (every
// request) for an empty token.
std::function<absl::Status(const std::string& authorization)> BearerTokenCheck(
    const std::string& token);

// `{"error": MESSAGE}` and a newline: the body of every error answer of
// ballastd's JSON API. Bytes that are not UTF-8 become U+FFFD.
std::string JsonErrorBody(absl::string_view message);

// PEM files for HTTPS; both empty serves plain HTTP.
struct HttpsFiles {
  std::string cert;
  std::string key;
};

class HttpEndpoint {
 public:
  // Threads serving requests; a route that holds one for long (an event
  // stream) must leave some for /metrics and /healthz.
  static constexpr int kThreads = 16;

  // Binds host:port (port 0 picks a free one) and starts serving.
  // UNAVAILABLE when the address cannot be bound. `metrics` must outlive it;
  // `healthy` is called per /healthz request, from the server's threads.
  // /metrics names jobs and shows their losses: with `authorize_metrics`,
  // a request whose Authorization header (empty when absent) it refuses
  // gets the refusal's message, with 401 for UNAUTHENTICATED (no or a bad
  // token) and 403 for PERMISSION_DENIED (a valid token without the role).
  // Every answer carries SecurityHeaders, and a request in any method but
  // GET or HEAD is refused before routing (common/http_security.h): 403 when
  // CheckStateChangingRequest refuses it, else 405, as no route changes
  // state. /healthz stays open for probes,
  // and says nothing but ok or why not.
  // With `https`, HTTPS on the same address (INVALID_ARGUMENT when the
  // files do not load). `add_routes`, when set, adds the caller's routes (ballastd's dashboard
  // and JSON API) before serving starts. With `loopback_hosts_only` (a server
  // without auth) a request whose Host is not a loopback name gets 403 on
  // every path: see CheckLoopbackHost.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& host, int port, const MetricsRegistry* metrics,
      std::function<absl::Status()> healthy,
      std::function<absl::Status(const std::string& authorization)> authorize_metrics,
      const std::function<void(httplib::Server*)>& add_routes = nullptr,
      const HttpsFiles& https = {}, bool loopback_hosts_only = false);
  // Stops serving and joins the server thread.
  ~HttpEndpoint();

  // The bound port.
  int port() const { return port_; }

 private:
  HttpEndpoint() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace ballast

#endif  // BALLAST_COMMON_HTTP_ENDPOINT_H_
