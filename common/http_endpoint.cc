#include "common/http_endpoint.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/http_security.h"

namespace ballast {

absl::Status SplitHostPort(const std::string& address, const std::string& flag, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  int value = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &value) || value < 0 || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", address, "' is not HOST:PORT with PORT in 0..65535 (0 picks a free port)"));
  }
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = value;
  return absl::OkStatus();
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

std::function<absl::Status(const std::string& authorization)> BearerTokenCheck(
    const std::string& token) {
  if (token.empty()) return nullptr;
  return [expected = absl::StrCat("Bearer ", token)](const std::string& authorization) {
    if (authorization == expected) return absl::OkStatus();
    return absl::UnauthenticatedError("missing or wrong token: send 'Authorization: Bearer TOKEN'");
  };
}

std::string JsonErrorBody(absl::string_view message) {
  // A path or parameter echoed back may be any bytes: never throw on them.
  return nlohmann::json({{"error", std::string(message)}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& host, int port, const MetricsRegistry* metrics,
    std::function<absl::Status()> healthy,
    std::function<absl::Status(const std::string& authorization)> authorize_metrics,
    const std::function<void(httplib::Server*)>& add_routes, const HttpsFiles& https,
    bool loopback_hosts_only) {
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  if (https.cert.empty() != https.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: HTTPS needs both, a certificate and its private key");
  }
  if (https.cert.empty()) {
    endpoint->server_ = std::make_unique<httplib::Server>();
  } else {
    auto server = std::make_unique<httplib::SSLServer>(https.cert.c_str(), https.key.c_str());
    if (!server->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", https.cert, " and --tls-key ",
                                                     https.key, ": cannot load them for HTTPS"));
    }
    endpoint->server_ = std::move(server);
  }
  httplib::Server& server = *endpoint->server_;
  // A scraper that stalls must not pin a thread forever.
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  // Live dashboards hold a thread each for their event streams (capped by
  // the routes that serve them); scrapes and probes keep the rest.
  server.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  // Every answer, errors and streams too, carries the security headers.
  server.set_post_routing_handler([](const httplib::Request&, httplib::Response& response) {
    for (const auto& [name, value] : SecurityHeaders(response.get_header_value("Content-Type"))) {
      response.set_header(name, value);
    }
  });
  // No route changes state yet. A request that might is checked before any
  // route sees it, and then refused for its method: a route added later is
  // reached only through the check (docs/security.md).
  server.set_pre_routing_handler([https = !https.cert.empty(), loopback_hosts_only](
                                     const httplib::Request& request, httplib::Response& response) {
    absl::Status refusal = loopback_hosts_only ? CheckLoopbackHost(request.get_header_value("Host"))
                                               : absl::OkStatus();
    if (refusal.ok() && IsSafeMethod(request.method)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (refusal.ok()) {
      refusal = CheckStateChangingRequest(request.get_header_value("Authorization"),
                                          request.get_header_value("Origin"),
                                          request.get_header_value("Host"), https);
    }
    response.status = refusal.ok() ? 405 : 403;
    if (refusal.ok()) response.set_header("Allow", "GET, HEAD");
    const std::string message =
        refusal.ok()
            ? absl::StrCat(request.method, ": nothing here changes state; GET and HEAD only")
            : std::string(refusal.message());
    response.set_content(JsonErrorBody(message), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.Get("/metrics", [metrics, authorize = std::move(authorize_metrics)](
                             const httplib::Request& request, httplib::Response& response) {
    if (authorize) {
      if (absl::Status s = authorize(request.get_header_value("Authorization")); !s.ok()) {
        response.status = HttpStatusOfRefusal(s);
        response.set_content(
            absl::StrCat(s.message(), " (Prometheus: authorization.credentials_file)\n"),
            "text/plain");
        return;
      }
    }
    response.set_content(metrics->Encode(), kMetricsContentType);
  });
  server.Get("/healthz", [healthy = std::move(healthy)](const httplib::Request&,
                                                        httplib::Response& response) {
    const absl::Status s = healthy();
    response.status = s.ok() ? 200 : 503;
    response.set_content(s.ok() ? "ok\n" : absl::StrCat(s.message(), "\n"), "text/plain");
  });
  if (add_routes) add_routes(&server);
  const int bound = port == 0                         ? server.bind_to_any_port(host)
                    : server.bind_to_port(host, port) ? port
                                                      : -1;
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--http: cannot listen on ", host, ":", port, " (in use or not local)"));
  }
  endpoint->port_ = bound;
  endpoint->thread_ = std::thread([&server] { server.listen_after_bind(); });
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ballast
