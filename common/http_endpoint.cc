#include "common/http_endpoint.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/http_security.h"

namespace ballast {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

// A request head above this closes the connection; a body above kBodyBytes
// too, but for a POST route's up to its own limit (HttpRoutes::Post).
constexpr uint32_t kHeadBytes = 16 * 1024;
constexpr uint64_t kBodyBytes = 64 * 1024;
// How long accepting pauses when the process is out of file descriptors.
constexpr auto kAcceptPause = std::chrono::milliseconds(50);

std::chrono::nanoseconds Chrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

// %XX escapes (and '+' for a space, in a query) decoded; a malformed escape
// stays as it is.
std::string DecodeUrl(absl::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && HexDigit(text[i + 1]) >= 0 &&
        HexDigit(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexDigit(text[i + 1]) * 16 + HexDigit(text[i + 2])));
      i += 2;
    } else {
      out.push_back(plus_is_space && text[i] == '+' ? ' ' : text[i]);
    }
  }
  return out;
}

// Open connections, in total and per IP address, against HttpLimits' caps.
class ConnectionCount {
 public:
  ConnectionCount(int max_total, int max_per_address)
      : max_total_(max_total), max_per_address_(max_per_address) {}

  // False, counting nothing, when either cap is reached.
  bool Admit(const std::string& address) {
    absl::MutexLock lock(&mu_);
    if (total_ >= max_total_) return false;
    int& mine = per_address_[address];
    if (mine >= max_per_address_) return false;
    ++mine;
    ++total_;
    return true;
  }

  void Release(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = per_address_.find(address);
    if (--it->second == 0) per_address_.erase(it);
    --total_;
  }

 private:
  const int max_total_;
  const int max_per_address_;
  absl::Mutex mu_;
  int total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> per_address_ ABSL_GUARDED_BY(mu_);
};

// The listening socket, the threads and what every connection shares.
class BeastServer {
 public:
  BeastServer(const HttpLimits& limits, int max_connections, bool loopback_hosts_only)
      : limits(limits),
        count(max_connections, limits.max_connections_per_address),
        loopback_hosts_only_(loopback_hosts_only) {}

  // Binds and starts the threads; UNAVAILABLE when the address cannot be bound.
  absl::Status Listen(const std::string& host, int port);
  int port() const { return acceptor_.local_endpoint().port(); }
  // Closes every connection and joins the threads.
  void Stop();

  // The route for `request`, within the rules of common/http_security.h:
  // the checks before routing, and the security headers on whatever answers.
  void Answer(HttpRequest& request, HttpResponse& response) const {
    if (!Refuse(request, response)) routes.Serve(request, response);
    AddSecurityHeaders(response);
  }

  // The most body bytes the request with this head may send: a POST route's
  // limit once the request passed the checks before routing, else
  // kBodyBytes. An upload is read only for a request that may upload.
  uint64_t BodyLimit(const HttpRequest& head) const {
    HttpResponse refusal;
    if (Refuse(head, refusal)) return kBodyBytes;
    return routes.BodyLimit(head.method, head.path, kBodyBytes);
  }

  static void AddSecurityHeaders(HttpResponse& response) {
    for (const auto& [name, value] : SecurityHeaders(response.get_header_value("Content-Type"))) {
      response.set_header(name, value);
    }
  }

  HttpRoutes routes;
  const HttpLimits limits;
  ConnectionCount count;
  std::optional<ssl::context> tls;
  net::io_context io{HttpEndpoint::kIoThreads};
  net::thread_pool handlers{HttpEndpoint::kHandlerThreads};

 private:
  // A request that might change state is checked before any route sees it,
  // and then refused for its method unless a POST route takes its path: a
  // route added later is reached only through the check (docs/security.md).
  // True when `response` holds the refusal.
  bool Refuse(const HttpRequest& request, HttpResponse& response) const;
  void Accept();
  void Admit(tcp::socket socket);

  const bool loopback_hosts_only_;

  tcp::acceptor acceptor_{net::make_strand(io)};
  net::steady_timer accept_pause_{acceptor_.get_executor()};
  std::vector<std::thread> io_threads_;
};

// One connection: requests read one at a time, each route run on the
// handler threads, its response (or event stream) written back. Waiting for
// bytes holds no thread; every wait has a deadline (HttpLimits).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(BeastServer* server, Stream stream, std::string address)
      : server_(server), stream_(std::move(stream)), address_(std::move(address)) {}
  ~Session() {
    EndStream();
    ReleaseSlot();
  }

  void Start() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      AwaitRequest();
    } else {
      Transport().expires_after(Chrono(server_->limits.head_deadline));
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->AwaitRequest();
                              });
    }
  }

 private:
  beast::tcp_stream& Transport() { return beast::get_lowest_layer(stream_); }

  // Idle until a request's first byte; then its head has head_deadline.
  void AwaitRequest() {
    if (buffer_.size() > 0) return ReadHead();
    Transport().expires_after(Chrono(server_->limits.idle_timeout));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return;
                              self->buffer_.commit(n);
                              self->ReadHead();
                            });
  }

  void ReadHead() {
    parser_.emplace();
    parser_->header_limit(kHeadBytes);
    // Beast would weigh a Content-Length against a limit while it reads the
    // head, and close without a word; ReadBody holds each request to its own
    // limit, and says so. (Not boost::none: Boost 1.74 compares a length
    // with it as greater, and refuses every body.)
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    Transport().expires_after(Chrono(server_->limits.head_deadline));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              if (!ec) self->ReadBody();
                            });
  }

  // The body, within the limit for this request: an upload has
  // upload_timeout, any other body transfer_timeout.
  void ReadBody() {
    ReadRequestHead();
    if (parser_->is_done()) return Dispatch();
    const uint64_t limit = server_->BodyLimit(request_);
    const boost::optional<uint64_t> length = parser_->content_length();
    if (length && *length > limit) return RefuseBody(limit);
    parser_->body_limit(limit);
    Transport().expires_after(Chrono(limit > kBodyBytes ? server_->limits.upload_timeout
                                                        : server_->limits.transfer_timeout));
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Dispatch();
                     });
  }

  // 413 for a body over its limit, unread; the connection closes after it.
  void RefuseBody(uint64_t limit) {
    Transport().expires_never();
    response_ = HttpResponse{};
    server_->routes.AnswerError(request_.path, 413,
                                absl::StrCat("the body is larger than the ", limit, " bytes ",
                                             request_.method, " ", request_.path, " takes"),
                                response_);
    BeastServer::AddSecurityHeaders(response_);
    keep_alive_ = false;
    head_only_ = false;
    Reply();
  }

  // The request's head into request_ (its body comes in Dispatch).
  void ReadRequestHead() {
    const http::request<http::string_body>& head = parser_->get();
    request_ = HttpRequest{};
    keep_alive_ = head.keep_alive();
    head_only_ = head.method() == http::verb::head;
    version_ = head.version();
    request_.method = std::string(head.method_string());
    const absl::string_view target(head.target().data(), head.target().size());
    const size_t question = target.find('?');
    request_.path = DecodeUrl(target.substr(0, question), false);
    if (question != absl::string_view::npos) {
      for (absl::string_view pair :
           absl::StrSplit(target.substr(question + 1), '&', absl::SkipEmpty())) {
        const size_t equals = pair.find('=');
        request_.params.emplace(
            DecodeUrl(pair.substr(0, equals), true),
            equals == absl::string_view::npos ? "" : DecodeUrl(pair.substr(equals + 1), true));
      }
    }
    for (const auto& field : head) {
      request_.headers[absl::AsciiStrToLower(absl::string_view(
          field.name_string().data(), field.name_string().size()))] = std::string(field.value());
    }
    request_.remote_addr = address_;
  }

  // Runs the route on the handler threads, and answers back on this
  // connection's strand.
  void Dispatch() {
    Transport().expires_never();
    request_.body = std::move(parser_->get().body());
    response_ = HttpResponse{};
    net::post(server_->handlers, [self = this->shared_from_this()] {
      self->server_->Answer(self->request_, self->response_);
      net::post(self->stream_.get_executor(), [self] { self->Reply(); });
    });
  }

  void Reply() {
    if (response_.stream) return StartStream();
    reply_.emplace();
    reply_->version(version_);
    reply_->result(response_.status);
    for (const auto& [name, value] : response_.headers) reply_->set(name, value);
    reply_->keep_alive(keep_alive_);
    const size_t size = response_.body.size();
    reply_->body() = std::move(response_.body);
    reply_->prepare_payload();
    if (head_only_) {
      reply_->body().clear();
      reply_->content_length(size);
    }
    Transport().expires_after(Chrono(server_->limits.transfer_timeout));
    http::async_write(stream_, *reply_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (!ec) self->Next();
                      });
  }

  // After a response: the next request, or the end of the connection.
  void Next() {
    Transport().expires_never();
    reply_.reset();
    if (!keep_alive_) {
      // The slot is free before the peer can see the end: a client that
      // reconnects on EOF is counted once, not twice.
      ReleaseSlot();
      beast::error_code ignored;
      Transport().socket().shutdown(tcp::socket::shutdown_send, ignored);
      return;
    }
    AwaitRequest();
  }

  void StartStream() {
    // A stream's end ends its connection: a reader reconnects anyway
    // (EventSource does), and the connection's count and the stream's slot
    // are free before it does.
    keep_alive_ = false;
    stream_head_.emplace();
    stream_head_->version(version_);
    stream_head_->result(response_.status);
    for (const auto& [name, value] : response_.headers) stream_head_->set(name, value);
    stream_head_->keep_alive(keep_alive_);
    stream_head_->chunked(true);
    stream_head_writer_.emplace(*stream_head_);
    Transport().expires_after(Chrono(server_->limits.transfer_timeout));
    http::async_write_header(stream_, *stream_head_writer_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               if (ec) return;
                               self->Transport().expires_never();
                               self->Step();
                             });
  }

  // One step of the stream on the handler threads, its part written here.
  void Step() {
    net::post(server_->handlers, [self = this->shared_from_this()] {
      std::string part;
      const bool more = self->response_.stream(&part);
      net::post(self->stream_.get_executor(), [self, part = std::move(part), more]() mutable {
        self->WritePart(std::move(part), more);
      });
    });
  }

  void WritePart(std::string part, bool more) {
    chunk_.clear();
    if (!part.empty()) chunk_ = absl::StrCat(absl::Hex(part.size()), "\r\n", part, "\r\n");
    if (!more) {
      chunk_ += "0\r\n\r\n";
      EndStream();
    }
    if (chunk_.empty()) return Tick();
    Transport().expires_after(Chrono(server_->limits.transfer_timeout));
    net::async_write(stream_, net::buffer(chunk_),
                     [self = this->shared_from_this(), more](beast::error_code ec, size_t) {
                       if (ec) return;
                       if (!more) return self->Next();
                       self->Transport().expires_never();
                       self->Tick();
                     });
  }

  void Tick() {
    tick_.expires_after(Chrono(HttpEndpoint::kStreamTick));
    tick_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (!ec) self->Step();
    });
  }

  void ReleaseSlot() {
    if (slot_released_) return;
    slot_released_ = true;
    server_->count.Release(address_);
  }

  void EndStream() {
    if (!response_.stream_done) return;
    std::function<void()> done = std::move(response_.stream_done);
    response_.stream_done = nullptr;
    done();
  }

  BeastServer* const server_;
  Stream stream_;
  const std::string address_;
  bool slot_released_ = false;
  net::steady_timer tick_{stream_.get_executor()};
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  HttpResponse response_;
  bool keep_alive_ = false;
  bool head_only_ = false;
  unsigned version_ = 11;
  std::optional<http::response<http::string_body>> reply_;
  std::optional<http::response<http::empty_body>> stream_head_;
  std::optional<http::response_serializer<http::empty_body>> stream_head_writer_;
  std::string chunk_;
};

bool BeastServer::Refuse(const HttpRequest& request, HttpResponse& response) const {
  absl::Status refusal =
      loopback_hosts_only_ ? CheckLoopbackHost(request.get_header_value("Host")) : absl::OkStatus();
  if (refusal.ok() && IsSafeMethod(request.method)) return false;
  if (refusal.ok()) {
    refusal = CheckStateChangingRequest(request.get_header_value("Authorization"),
                                        request.get_header_value("Origin"),
                                        request.get_header_value("Host"), tls.has_value());
  }
  // The one exception to GET and HEAD only: a POST route's own paths, behind
  // the check above.
  if (refusal.ok() && request.method == "POST" && routes.HasPost(request.path)) return false;
  const std::string message =
      refusal.ok() ? absl::StrCat(request.method, ": nothing here changes state; GET and HEAD only")
                   : std::string(refusal.message());
  routes.AnswerError(request.path, refusal.ok() ? 405 : 403, message, response);
  if (refusal.ok()) response.set_header("Allow", "GET, HEAD");
  return true;
}

absl::Status BeastServer::Listen(const std::string& host, int port) {
  const auto unavailable = [&] {
    return absl::UnavailableError(
        absl::StrCat("--http: cannot listen on ", host, ":", port, " (in use or not local)"));
  };
  beast::error_code ec;
  tcp::resolver resolver(io);
  const tcp::resolver::results_type found = resolver.resolve(
      host.empty() ? "0.0.0.0" : host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty()) return unavailable();
  const tcp::endpoint endpoint = *found.begin();
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return unavailable();
  Accept();
  for (int i = 0; i < HttpEndpoint::kIoThreads; ++i) {
    io_threads_.emplace_back([this] { io.run(); });
  }
  return absl::OkStatus();
}

void BeastServer::Accept() {
  acceptor_.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of file descriptors (or the like): the backlog waits a moment.
      accept_pause_.expires_after(kAcceptPause);
      accept_pause_.async_wait([this](beast::error_code ec) {
        if (!ec) Accept();
      });
      return;
    }
    Admit(std::move(socket));
    Accept();
  });
}

void BeastServer::Admit(tcp::socket socket) {
  beast::error_code ec;
  const tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return;
  std::string address = peer.address().to_string();
  if (!count.Admit(address)) {
    // Refused at once, never queued. A TLS client gets no answer it could read.
    if (!tls) {
      constexpr absl::string_view kWhy = "too many connections; retry shortly\n";
      std::string refusal = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n";
      for (const auto& [name, value] : SecurityHeaders("text/plain")) {
        absl::StrAppend(&refusal, name, ": ", value, "\r\n");
      }
      absl::StrAppend(&refusal, "Content-Length: ", kWhy.size(), "\r\nConnection: close\r\n\r\n",
                      kWhy);
      net::write(socket, net::buffer(refusal), ec);
    }
    socket.shutdown(tcp::socket::shutdown_both, ec);
    return;
  }
  if (tls) {
    std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
        this, beast::ssl_stream<beast::tcp_stream>(std::move(socket), *tls), std::move(address))
        ->Start();
  } else {
    std::make_shared<Session<beast::tcp_stream>>(this, beast::tcp_stream(std::move(socket)),
                                                 std::move(address))
        ->Start();
  }
}

void BeastServer::Stop() {
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
    accept_pause_.cancel();
  });
  // Routes and stream steps finish first: they may still post to the I/O threads.
  handlers.stop();
  handlers.join();
  io.stop();
  for (std::thread& t : io_threads_) t.join();
}

}  // namespace

class HttpEndpoint::Server : public BeastServer {
  using BeastServer::BeastServer;
};

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

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& host, int port, const MetricsRegistry* metrics,
    std::function<absl::Status()> healthy,
    std::function<absl::Status(const std::string& authorization)> authorize_metrics,
    const std::function<void(HttpRoutes*)>& add_routes, const HttpsFiles& https,
    bool loopback_hosts_only, const HttpLimits& limits) {
  if (https.cert.empty() != https.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: HTTPS needs both, a certificate and its private key");
  }
  // Past the process's file limit an accept fails and the backlog waits;
  // the cap refuses before that, keeping files for the rest of the process.
  int max_connections = limits.max_connections;
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    const rlim_t room =
        files.rlim_cur > 2 * kReservedFiles ? files.rlim_cur - kReservedFiles : files.rlim_cur / 2;
    max_connections = static_cast<int>(std::min<rlim_t>(max_connections, room));
  }
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  endpoint->server_ = std::make_unique<Server>(limits, max_connections, loopback_hosts_only);
  Server& server = *endpoint->server_;
  if (!https.cert.empty()) {
    server.tls.emplace(ssl::context::tls_server);
    boost::system::error_code ec;
    server.tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                            ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                            ssl::context::no_tlsv1_1);
    server.tls->use_certificate_chain_file(https.cert, ec);
    if (!ec) server.tls->use_private_key_file(https.key, ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", https.cert, " and --tls-key ",
                                                     https.key, ": cannot load them for HTTPS"));
    }
  }
  server.routes.Get("/metrics", [metrics, authorize = std::move(authorize_metrics)](
                                    const HttpRequest& request, HttpResponse& response) {
    if (authorize) {
      if (absl::Status s = authorize(request.get_header_value("Authorization")); !s.ok()) {
        response.status = HttpStatusOf(s);
        response.set_content(
            absl::StrCat(s.message(), " (Prometheus: authorization.credentials_file)\n"),
            "text/plain");
        return;
      }
    }
    response.set_content(metrics->Encode(), kMetricsContentType);
  });
  server.routes.Get(
      "/healthz", [healthy = std::move(healthy)](const HttpRequest&, HttpResponse& response) {
        const absl::Status s = healthy();
        response.status = s.ok() ? 200 : 503;
        response.set_content(s.ok() ? "ok\n" : absl::StrCat(s.message(), "\n"), "text/plain");
      });
  if (add_routes) add_routes(&server.routes);
  if (absl::Status s = server.Listen(host, port); !s.ok()) return s;
  endpoint->port_ = server.port();
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() { server_->Stop(); }

}  // namespace ballast
