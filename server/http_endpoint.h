// The HTTP side of ballastd: GET /metrics (Prometheus text format 0.0.4) and
// GET /healthz (200 "ok" while the store answers, 503 otherwise). Serves on
// its own threads from Start until destruction.
#ifndef BALLAST_SERVER_HTTP_ENDPOINT_H_
#define BALLAST_SERVER_HTTP_ENDPOINT_H_

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

namespace ballast::server {

class HttpEndpoint {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving.
  // UNAVAILABLE when the address cannot be bound. `metrics` must outlive it;
  // `healthy` is called per /healthz request, from the server's threads.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& host, int port,
                                                             const MetricsRegistry* metrics,
                                                             std::function<absl::Status()> healthy);
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

}  // namespace ballast::server

#endif  // BALLAST_SERVER_HTTP_ENDPOINT_H_
