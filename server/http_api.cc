#include "server/http_api.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http_endpoint.h"
#include "common/http_security.h"
#include "common/proto_json.h"
#include "server/dashboard_assets.h"

namespace ballast::server {
namespace {

constexpr char kJson[] = "application/json";
// A stream ends after this long and the browser reconnects from the last
// event it saw (EventSource's Last-Event-ID, or ?after=), so a stream never
// holds a thread for a whole job.
constexpr absl::Duration kStreamLife = absl::Seconds(25);
// A stream with no event for this long sends a comment, which keeps
// proxies from closing it and finds a reader that left.
constexpr absl::Duration kStreamKeepAlive = absl::Seconds(1);

// Open event streams, in total and per holder (a tenant), against
// kMaxEventStreams and kMaxEventStreamsPerTenant.
class EventStreamSlots {
 public:
  // Counts a stream for `holder` ("": only the total applies); empty when
  // admitted, else why not.
  std::string Take(const std::string& holder) {
    absl::MutexLock lock(&mu_);
    if (total_ >= kMaxEventStreams) {
      return absl::StrCat(kMaxEventStreams, " event streams are open; retry shortly");
    }
    if (!holder.empty() && per_holder_[holder] >= kMaxEventStreamsPerTenant) {
      return absl::StrCat("tenant ", holder, " has ", kMaxEventStreamsPerTenant,
                          " event streams open; close one or retry shortly");
    }
    ++total_;
    if (!holder.empty()) ++per_holder_[holder];
    return "";
  }

  void Give(const std::string& holder) {
    absl::MutexLock lock(&mu_);
    --total_;
    if (!holder.empty() && --per_holder_[holder] == 0) per_holder_.erase(holder);
  }

 private:
  absl::Mutex mu_;
  int total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> per_holder_ ABSL_GUARDED_BY(mu_);
};

void Error(HttpResponse& response, int status, const std::string& message) {
  response.status = status;
  response.set_content(JsonErrorBody(message), kJson);
}

// A non-negative integer query parameter, `fallback` when absent; false
// (with a 400 written) when it is not one or is above `max`.
bool IntParam(const HttpRequest& request, HttpResponse& response, const char* name,
              int64_t fallback, int64_t max, int64_t* out) {
  *out = fallback;
  if (!request.has_param(name)) return true;
  const std::string value = request.get_param_value(name);
  if (!absl::SimpleAtoi(value, out) || *out < 0 || *out > max) {
    Error(response, 400, absl::StrCat(name, "=", value, " is not an integer in 0..", max));
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Principal> JobReader(const Authenticator& auth, const std::string& authorization) {
  absl::StatusOr<Principal> who = auth.Authenticate(authorization);
  if (who.ok() && who->role == v1::ROLE_WORKER) {
    return absl::PermissionDeniedError("a worker token cannot read jobs");
  }
  return who;
}

std::vector<v1::JobEvent> EventsNow(EventWatch& watch, int64_t limit) {
  std::vector<v1::JobEvent> events;
  while (static_cast<int64_t>(events.size()) < limit) {
    const size_t before = events.size();
    absl::StatusOr<bool> more = watch.Next(&events, absl::ZeroDuration());
    if (!more.ok() || !*more || events.size() == before) break;
  }
  if (static_cast<int64_t>(events.size()) > limit) events.resize(limit);
  return events;
}

void AddHttpApi(HttpRoutes* server, Coordinator* coordinator, const Authenticator* auth) {
  auto authorized = [auth](const HttpRequest& request,
                           HttpResponse& response) -> std::optional<Principal> {
    absl::StatusOr<Principal> who = JobReader(*auth, request.get_header_value("Authorization"));
    if (!who.ok()) {
      Error(response, HttpStatusOf(who.status()), std::string(who.status().message()));
      return std::nullopt;
    }
    return *who;
  };

  for (const DashboardAsset& asset : DashboardAssets()) {
    server->Get(asset.path, [&asset](const HttpRequest&, HttpResponse& response) {
      response.set_header("Cache-Control", "no-cache");
      response.set_content(asset.body.data(), asset.body.size(), asset.content_type);
    });
  }

  server->Get("/api/v1/jobs", [=](const HttpRequest& request, HttpResponse& response) {
    const std::optional<Principal> who = authorized(request, response);
    if (!who) return;
    v1::ListJobsRequest list;
    int64_t limit = 0;
    if (!IntParam(request, response, "limit", 100, 1000, &limit)) return;
    list.set_page_size(static_cast<int32_t>(limit));
    for (size_t i = 0; i < request.get_param_value_count("state"); ++i) {
      const std::string name = request.get_param_value("state", i);
      v1::JobState state;
      if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(name)), &state) ||
          state == v1::JOB_STATE_UNSPECIFIED) {
        Error(response, 400,
              absl::StrCat("state=", name,
                           " is not a job state (queued, "
                           "scheduled, running, ..., cancelled)"));
        return;
      }
      list.add_states(state);
    }
    absl::StatusOr<v1::ListJobsResponse> jobs = coordinator->ListJobs(list, who->JobScope());
    if (!jobs.ok()) return Error(response, HttpStatusOf(jobs.status()), jobs.status().ToString());
    response.set_content(ToJson(*jobs), kJson);
  });

  server->Get(R"(/api/v1/jobs/([^/]+))", [=](const HttpRequest& request, HttpResponse& response) {
    const std::optional<Principal> who = authorized(request, response);
    if (!who) return;
    absl::StatusOr<v1::Job> job = coordinator->GetJob(request.matches[1], who->JobScope());
    if (!job.ok()) {
      return Error(response, HttpStatusOf(job.status()), std::string(job.status().message()));
    }
    response.set_content(ToJson(*job), kJson);
  });

  server->Get(R"(/api/v1/jobs/([^/]+)/ranks)", [=](const HttpRequest& request,
                                                   HttpResponse& response) {
    const std::optional<Principal> who = authorized(request, response);
    if (!who) return;
    absl::StatusOr<std::vector<Coordinator::RankStats>> ranks =
        coordinator->JobRankStats(request.matches[1], who->JobScope());
    if (!ranks.ok()) {
      return Error(response, HttpStatusOf(ranks.status()), std::string(ranks.status().message()));
    }
    nlohmann::json out = nlohmann::json::array();
    for (const Coordinator::RankStats& r : *ranks) {
      out.push_back({{"rank", r.rank},
                     {"steps", r.steps},
                     {"step_seconds_mean", r.steps > 0 ? r.step_seconds / r.steps : 0},
                     {"peak_memory_bytes", r.peak_memory_bytes},
                     {"communicated_bytes", r.communicated_bytes},
                     {"replica_communicated_bytes", r.replica_communicated_bytes},
                     {"collective_wait_seconds", r.collective_wait_seconds}});
    }
    response.set_content(nlohmann::json({{"ranks", out}}).dump(), kJson);
  });

  server->Get(R"(/api/v1/jobs/([^/]+)/events)", [=](const HttpRequest& request,
                                                    HttpResponse& response) {
    const std::optional<Principal> who = authorized(request, response);
    if (!who) return;
    int64_t after = 0;
    int64_t limit = 0;
    if (!IntParam(request, response, "after", 0, INT64_MAX, &after) ||
        !IntParam(request, response, "limit", 1000, 10000, &limit)) {
      return;
    }
    absl::StatusOr<std::unique_ptr<EventWatch>> watch =
        coordinator->WatchJob(request.matches[1], after, who->JobScope());
    if (!watch.ok()) {
      return Error(response, HttpStatusOf(watch.status()), std::string(watch.status().message()));
    }
    std::vector<std::string> parts;
    const std::vector<v1::JobEvent> events = EventsNow(**watch, limit);
    for (const v1::JobEvent& e : events) parts.push_back(ToJson(e));
    response.set_content(absl::StrCat("{\"events\":[", absl::StrJoin(parts, ","), "]}"), kJson);
  });

  auto streams = std::make_shared<EventStreamSlots>();
  server->Get(R"(/api/v1/jobs/([^/]+)/stream)", [=](const HttpRequest& request,
                                                    HttpResponse& response) {
    const std::optional<Principal> who = authorized(request, response);
    if (!who) return;
    int64_t after = 0;
    if (!IntParam(request, response, "after", 0, INT64_MAX, &after)) return;
    // EventSource sends the last id it saw when it reconnects.
    if (const std::string last = request.get_header_value("Last-Event-ID"); !last.empty()) {
      if (!absl::SimpleAtoi(last, &after) || after < 0) {
        return Error(response, 400, absl::StrCat("Last-Event-ID: ", last, " is not a seq"));
      }
    }
    absl::StatusOr<std::unique_ptr<EventWatch>> watch =
        coordinator->WatchJob(request.matches[1], after, who->JobScope());
    if (!watch.ok()) {
      return Error(response, HttpStatusOf(watch.status()), std::string(watch.status().message()));
    }
    // On a ballastd with tokens a tenant's streams count against its own cap
    // too; an open one has one caller, everyone.
    const std::string holder = auth->open() ? "" : who->tenant;
    if (std::string refused = streams->Take(holder); !refused.empty()) {
      return Error(response, 503, refused);
    }
    std::shared_ptr<EventWatch> shared(std::move(*watch));
    const absl::Time end = absl::Now() + kStreamLife;
    response.set_header("Cache-Control", "no-cache");
    response.set_chunked_content_provider(
        "text/event-stream",
        [shared, end, last_sent = absl::Now()](std::string* chunk) mutable {
          std::vector<v1::JobEvent> batch;
          absl::StatusOr<bool> more = shared->Next(&batch, absl::ZeroDuration());
          for (const v1::JobEvent& e : batch) {
            absl::StrAppend(chunk, "id: ", e.seq(), "\ndata: ", ToJson(e), "\n\n");
          }
          // The job ended: say so, so that the page stops reconnecting.
          if (more.ok() && !*more) *chunk += "event: end\ndata: {}\n\n";
          const absl::Time now = absl::Now();
          if (chunk->empty() && now - last_sent >= kStreamKeepAlive) *chunk = ": keep-alive\n\n";
          if (!chunk->empty()) last_sent = now;
          return more.ok() && *more && now < end;
        },
        [streams, holder] { streams->Give(holder); });
  });

  // Anything else under /api/ is a 404 that says so, never an empty page.
  server->Get(R"(/api/.*)", [](const HttpRequest& request, HttpResponse& response) {
    Error(response, 404,
          absl::StrCat("no such API path: ", request.path, " (see docs/http-api.md)"));
  });
}

}  // namespace ballast::server
