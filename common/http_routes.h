// What a route on HttpEndpoint (common/http_endpoint.h) sees: the request,
// the response it fills, and the table that picks a route by path. The
// server behind them (Boost.Beast) stays in http_endpoint.cc, so routes are
// written against these types only. Their members keep the names of
// cpp-httplib's, the server the routes were first written for.
#ifndef BALLAST_COMMON_HTTP_ROUTES_H_
#define BALLAST_COMMON_HTTP_ROUTES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace ballast {

// `{"error": MESSAGE}` and a newline: the body of every error answer of
// ballastd's JSON API. Bytes that are not UTF-8 become U+FFFD.
std::string JsonErrorBody(absl::string_view message);

struct HttpRequest {
  std::string method;
  // Percent-decoded, without the query.
  std::string path;
  // The route's regex groups: matches[0] is the whole path, matches[1] the
  // first group.
  std::vector<std::string> matches;
  // The query's parameters, decoded; a name may repeat.
  std::multimap<std::string, std::string> params;
  // Lower-case names; a repeated header keeps its last value.
  std::map<std::string, std::string> headers;
  // The peer's IP address.
  std::string remote_addr;
  // The request's body: empty but for a POST route's (HttpRoutes::Post).
  std::string body;

  bool has_param(const std::string& name) const { return params.count(name) > 0; }
  // The id-th value of `name`, empty when there are fewer.
  std::string get_param_value(const std::string& name, size_t id = 0) const;
  size_t get_param_value_count(const std::string& name) const { return params.count(name); }
  // Empty when absent; `name` in any case.
  std::string get_header_value(const std::string& name) const;
};

// One part of an event stream: appends what to send now to *chunk (nothing
// is fine) and returns whether more will follow. Called on the server's
// handler threads, once per HttpEndpoint::kStreamTick; it must not block,
// since every open stream shares those threads.
using HttpStreamStep = std::function<bool(std::string* chunk)>;

struct HttpResponse {
  int status = 200;
  // Content-Type among them.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Set for a chunked stream, which is sent instead of `body`.
  HttpStreamStep stream;
  // Called once when the stream ends, by its end, the peer's or shutdown.
  std::function<void()> stream_done;

  // Empty when absent; `name` in any case.
  std::string get_header_value(const std::string& name) const;
  // Replaces a header of that name.
  void set_header(const std::string& name, const std::string& value);
  void set_content(std::string content, const std::string& content_type);
  void set_content(const char* data, size_t size, const std::string& content_type);
  void set_chunked_content_provider(const std::string& content_type, HttpStreamStep step,
                                    std::function<void()> done);
};

class HttpRoutes {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;

  // `pattern` (a std::regex) must match the whole path. The first route
  // added that matches a request's method and path serves it; GET routes
  // serve HEAD too.
  void Get(const std::string& pattern, Handler handler);
  // A route that changes state. HttpEndpoint lets a POST through only to a
  // path that one of these matches, and only once CheckStateChangingRequest
  // passed (common/http_security.h); its body may hold up to
  // `max_body_bytes`, read before the handler runs.
  void Post(const std::string& pattern, uint64_t max_body_bytes, Handler handler);

  // The most bytes of body a request for `method` and `path` may send: the
  // POST route's max_body_bytes, else `fallback`.
  uint64_t BodyLimit(const std::string& method, const std::string& path, uint64_t fallback) const;
  // Whether a POST route matches `path`.
  bool HasPost(const std::string& path) const;

  // The body of an error answered outside a route for a path under `prefix`:
  // the refusals before routing (403, 405, 413) and 404 when no route
  // matches. An API with an error shape of its own (the OpenAI-compatible
  // one's error object) sets it for its paths; elsewhere it is
  // JsonErrorBody's. The longest matching prefix wins.
  using ErrorFormat = std::function<std::string(int http_status, absl::string_view message)>;
  void SetErrorFormat(std::string prefix, ErrorFormat format);

  // Sets `response` to the error `http_status` with `message`, in the format
  // of `path`'s API (SetErrorFormat), as JSON.
  void AnswerError(const std::string& path, int http_status, absl::string_view message,
                   HttpResponse& response) const;

  // Runs the route for `request` (filling its matches), or answers 404
  // when none matches. Only GET, HEAD and the POSTs of Post routes come
  // here: HttpEndpoint refuses everything else before routing.
  void Serve(HttpRequest& request, HttpResponse& response) const;

 private:
  struct Route {
    // "GET" or "POST".
    std::string method;
    std::regex pattern;
    uint64_t max_body_bytes = 0;
    Handler handler;
  };
  // The POST route for `path`, or nullptr.
  const Route* FindPost(const std::string& path) const;
  std::vector<Route> routes_;
  std::vector<std::pair<std::string, ErrorFormat>> error_formats_;
};

}  // namespace ballast

#endif  // BALLAST_COMMON_HTTP_ROUTES_H_
