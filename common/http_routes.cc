#include "common/http_routes.h"

#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ballast {

std::string HttpRequest::get_param_value(const std::string& name, size_t id) const {
  auto [begin, end] = params.equal_range(name);
  if (static_cast<size_t>(std::distance(begin, end)) <= id) return "";
  return std::next(begin, static_cast<std::ptrdiff_t>(id))->second;
}

std::string HttpRequest::get_header_value(const std::string& name) const {
  auto it = headers.find(absl::AsciiStrToLower(name));
  return it == headers.end() ? "" : it->second;
}

std::string HttpResponse::get_header_value(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

void HttpResponse::set_header(const std::string& name, const std::string& value) {
  for (auto& [key, old] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) {
      old = value;
      return;
    }
  }
  headers.emplace_back(name, value);
}

void HttpResponse::set_content(std::string content, const std::string& content_type) {
  body = std::move(content);
  set_header("Content-Type", content_type);
}

void HttpResponse::set_content(const char* data, size_t size, const std::string& content_type) {
  set_content(std::string(data, size), content_type);
}

void HttpResponse::set_chunked_content_provider(const std::string& content_type,
                                                HttpStreamStep step, std::function<void()> done) {
  set_header("Content-Type", content_type);
  stream = std::move(step);
  stream_done = std::move(done);
}

void HttpRoutes::Get(const std::string& pattern, Handler handler) {
  routes_.push_back(Route{"GET", std::regex(pattern), 0, std::move(handler)});
}

void HttpRoutes::Post(const std::string& pattern, uint64_t max_body_bytes, Handler handler) {
  routes_.push_back(Route{"POST", std::regex(pattern), max_body_bytes, std::move(handler)});
}

const HttpRoutes::Route* HttpRoutes::FindPost(const std::string& path) const {
  for (const Route& route : routes_) {
    if (route.method == "POST" && std::regex_match(path, route.pattern)) return &route;
  }
  return nullptr;
}

uint64_t HttpRoutes::BodyLimit(const std::string& method, const std::string& path,
                               uint64_t fallback) const {
  const Route* route = method == "POST" ? FindPost(path) : nullptr;
  return route == nullptr ? fallback : route->max_body_bytes;
}

bool HttpRoutes::HasPost(const std::string& path) const { return FindPost(path) != nullptr; }

void HttpRoutes::Serve(HttpRequest& request, HttpResponse& response) const {
  // HEAD is served by the GET route, without its body.
  const std::string method = request.method == "HEAD" ? "GET" : request.method;
  for (const Route& route : routes_) {
    std::smatch match;
    if (route.method != method || !std::regex_match(request.path, match, route.pattern)) continue;
    request.matches.assign(match.begin(), match.end());
    route.handler(request, response);
    return;
  }
  AnswerError(request.path, 404,
              absl::StrCat("not found: no route for ", request.method, " ", request.path),
              response);
}

void HttpRoutes::SetErrorFormat(std::string prefix, ErrorFormat format) {
  error_formats_.emplace_back(std::move(prefix), std::move(format));
}

void HttpRoutes::AnswerError(const std::string& path, int http_status, absl::string_view message,
                             HttpResponse& response) const {
  const ErrorFormat* format = nullptr;
  size_t longest = 0;
  for (const auto& [prefix, candidate] : error_formats_) {
    if (absl::StartsWith(path, prefix) && (format == nullptr || prefix.size() > longest)) {
      format = &candidate;
      longest = prefix.size();
    }
  }
  response.status = http_status;
  response.set_content(format != nullptr ? (*format)(http_status, message) : JsonErrorBody(message),
                       "application/json");
}

std::string JsonErrorBody(absl::string_view message) {
  // A path or parameter echoed back may be any bytes: never throw on them.
  return nlohmann::json({{"error", std::string(message)}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace ballast
