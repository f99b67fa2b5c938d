// The HTTP side of ballastd and ballast-worker: GET /metrics (Prometheus
// text format 0.0.4) and GET /healthz (200 "ok" while the process is
// healthy by its own measure, 503 with the reason otherwise). Serves on its
// own threads from Start until destruction.
#ifndef BALLAST_COMMON_HTTP_ENDPOINT_H_
#define BALLAST_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

class HttpEndpoint {
 public:
  // Threads serving requests; a route that holds one for long (an event
  // stream) must leave some for /metrics and /healthz.
  static constexpr int kThreads = 16;

  // Binds host:port (port 0 picks a free one) and starts serving.
  // UNAVAILABLE when the address cannot be bound. `metrics` must outlive it;
  // `healthy` is called per /healthz request, from the server's threads.
  // With a `token`, /metrics answers 401 unless the request carries
  // "Authorization: Bearer TOKEN" (it names jobs and shows their losses);
  // /healthz stays open for probes, and says nothing but ok or why not.
  // `add_routes`, when set, adds the caller's routes (ballastd's dashboard
  // and JSON API) before serving starts.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& host, int port, const MetricsRegistry* metrics,
      std::function<absl::Status()> healthy, const std::string& token,
      const std::function<void(httplib::Server*)>& add_routes = nullptr);
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
