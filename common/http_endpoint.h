// The HTTP side of ballastd and ballast-worker: GET /metrics (Prometheus
// text format 0.0.4) and GET /healthz (200 "ok" while the process is
// healthy by its own measure, 503 with the reason otherwise). Serves on its
// own threads from Start until destruction. ballastd's dashboard, its token
// check and TLS share this server, which is why /metrics is served here and
// not by prometheus-cpp-pull's Exposer: an Exposer takes a port of its own.
//
// The server is Boost.Beast on Asio, event-driven: a connection holds a
// thread only while its route runs, never while it waits for bytes, so idle
// and slow clients (a slowloris) cost memory, not the probes' and scrapes'
// turn (issue 40; cpp-httplib's thread per connection starved at 100 idle
// connections). HttpLimits bounds what a client may hold; docs/limits.md
// lists the figures.
#ifndef BALLAST_COMMON_HTTP_ENDPOINT_H_
#define BALLAST_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/http_routes.h"
#include "common/metrics.h"

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

// PEM files for HTTPS; both empty serves plain HTTP.
struct HttpsFiles {
  std::string cert;
  std::string key;
};

// What one client may hold. A connection beyond a cap is answered 503 and
// closed at once (closed without a word on HTTPS, before its handshake),
// never queued; a deadline that passes closes the connection.
struct HttpLimits {
  // The whole request head, from its first byte (or from accept, for the
  // TLS handshake): a client sending a byte now and then is cut off here.
  absl::Duration head_deadline = absl::Seconds(2);
  // A connection with no request under way, before its first request or
  // between keep-alive ones.
  absl::Duration idle_timeout = absl::Seconds(10);
  // A request body, and each write of a response or of a stream's part.
  absl::Duration transfer_timeout = absl::Seconds(10);
  // The body of a request that may send more than the 64 KiB every request
  // may (an upload to a POST route with a larger max_body_bytes), from the
  // end of its head: the head deadline never cuts an upload short, and
  // this bounds how long one may hold its connection and its memory.
  absl::Duration upload_timeout = absl::Minutes(5);
  // Open connections, in total (further capped by RLIMIT_NOFILE, less
  // kReservedFiles) and from one IP address.
  int max_connections = 4096;
  int max_connections_per_address = 256;
};

class HttpEndpoint {
 public:
  // Threads doing the sockets' I/O, and threads running routes (a route may
  // wait on the store's lock; a stream's step never waits).
  static constexpr int kIoThreads = 2;
  static constexpr int kHandlerThreads = 8;
  // How often an open event stream's step runs.
  static constexpr absl::Duration kStreamTick = absl::Milliseconds(200);
  // File descriptors kept for the rest of the process (the store, gRPC,
  // workers' channels) when RLIMIT_NOFILE caps max_connections.
  static constexpr int kReservedFiles = 256;

  // Binds host:port (port 0 picks a free one) and starts serving.
  // UNAVAILABLE when the address cannot be bound. `metrics` must outlive it;
  // `healthy` is called per /healthz request, from the server's threads.
  // /metrics names jobs and shows their losses: with `authorize_metrics`,
  // a request whose Authorization header (empty when absent) it refuses
  // gets the refusal's message, with 401 for UNAUTHENTICATED (no or a bad
  // token) and 403 for PERMISSION_DENIED (a valid token without the role).
  // /healthz stays open for probes, and says nothing but ok or why not.
  // Every answer a route gives, errors and event streams too, carries
  // SecurityHeaders; a request in any method but GET or HEAD is checked
  // before routing (common/http_security.h): 403 when
  // CheckStateChangingRequest refuses it, else 405 with `Allow: GET, HEAD`
  // unless it is a POST to a path of a POST route (HttpRoutes::Post: the
  // OpenAI-compatible API's, docs/openai-api.md). A body larger than 64 KiB
  // is read only for such a POST that passed the check, up to the route's
  // max_body_bytes (413 and the connection closed beyond it).
  // With `https`, HTTPS on the same address (INVALID_ARGUMENT when the
  // files do not load). `add_routes`, when set, adds the caller's routes
  // (ballastd's dashboard and JSON API) before serving starts. With
  // `loopback_hosts_only` (a server without auth) a request whose Host is not
  // a loopback name gets 403 on every path, before its method is looked at:
  // see CheckLoopbackHost. `limits` bound what each client may hold.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& host, int port, const MetricsRegistry* metrics,
      std::function<absl::Status()> healthy,
      std::function<absl::Status(const std::string& authorization)> authorize_metrics,
      const std::function<void(HttpRoutes*)>& add_routes = nullptr, const HttpsFiles& https = {},
      bool loopback_hosts_only = false, const HttpLimits& limits = {});
  // Stops serving: closes every connection and joins the threads.
  ~HttpEndpoint();

  // The bound port.
  int port() const { return port_; }

 private:
  class Server;
  HttpEndpoint() = default;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

}  // namespace ballast

#endif  // BALLAST_COMMON_HTTP_ENDPOINT_H_
