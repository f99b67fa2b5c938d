// ballastd's dashboard and JSON API, on its --http address beside /metrics
// and /healthz (docs/http-api.md):
//   GET /                                the dashboard (server/dashboard/)
//   GET /api/v1/jobs[?state=S&limit=N]   the jobs, newest first
//   GET /api/v1/jobs/ID                  one job, with its spec
//   GET /api/v1/jobs/ID/ranks            per-rank step time, memory, bytes
//   GET /api/v1/jobs/ID/events[?after=SEQ&limit=N]
//   GET /api/v1/jobs/ID/stream[?after=SEQ]   server-sent events, live
// Objects are the API's protobuf messages in proto3 JSON (int64 as strings).
// Errors are {"error": "..."} with 400 (a bad parameter), 401 (no or a wrong
// token, when ballastd has auth: `Authorization: Bearer TOKEN`, as gRPC),
// 403 (a valid token without the role: a worker's), 404 (an unknown job or
// path, or another tenant's job, alike to the byte) or 503 (too many live
// streams, in total or for the tenant). Methods other than GET and HEAD
// never reach these routes (HttpEndpoint refuses them first,
// common/http_security.h).
#ifndef BALLAST_SERVER_HTTP_API_H_
#define BALLAST_SERVER_HTTP_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/http_routes.h"
#include "server/authenticator.h"
#include "server/coordinator.h"

namespace ballast::server {

// Event streams open at once, in total and for one tenant (on a ballastd
// with tokens), so that one tenant cannot take every stream. Beyond either
// a stream is refused with 503. An open stream holds no thread (its steps
// run every HttpEndpoint::kStreamTick), only a connection and a mailbox.
inline constexpr int kMaxEventStreams = 1024;
inline constexpr int kMaxEventStreamsPerTenant = 64;

// Adds the routes above. `coordinator` and `auth` must outlive the server.
void AddHttpApi(HttpRoutes* server, Coordinator* coordinator, const Authenticator* auth);

// The rule of the gRPC JobService for HTTP routes too: who calls, and the
// jobs of whose tenant it sees. UNAUTHENTICATED without a valid token;
// PERMISSION_DENIED for a worker's, which reads no jobs.
absl::StatusOr<Principal> JobReader(const Authenticator& auth, const std::string& authorization);

// The events `watch` holds now, at most `limit`, without waiting for more.
std::vector<v1::JobEvent> EventsNow(EventWatch& watch, int64_t limit);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_HTTP_API_H_
