#include "client/event_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/job_format.h"

namespace ballast::client {

namespace {

// A stream that lived this long was a working connection, even without
// events, so the reconnect window starts over when it breaks.
constexpr absl::Duration kHealthyStream = absl::Seconds(5);
constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);

// Codes after which reopening the stream can help: the coordinator went
// away, restarted, or dropped the call.
bool Reconnectable(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<v1::JobState> FollowEvents(
    Connection& connection, const FollowOptions& options,
    const std::function<void(const v1::JobEvent&)>& on_event,
    const std::function<void(const std::string&)>& on_notice) {
  Interrupt* interrupt = connection.interrupt();
  int64_t last_seq = options.after_seq;
  if (options.stop_at_seq > 0 && last_seq >= options.stop_at_seq) return v1::JOB_STATE_UNSPECIFIED;
  std::optional<absl::Time> outage_since;
  absl::Duration backoff = kMinBackoff;
  bool batched = true;

  while (true) {
    std::unique_ptr<grpc::ClientContext> context = connection.StreamContext();
    Interrupt::Scope scope(interrupt, context.get());
    v1::WatchJobRequest request;
    request.set_job_id(options.job_id);
    request.set_after_seq(last_seq);
    const absl::Time opened = absl::Now();
    bool got_event = false;
    std::optional<v1::JobState> end;
    // Reads `reader` to its end or to the job's; `events_of` lists a message's events.
    auto follow = [&](auto reader, auto message, auto events_of) -> grpc::Status {
      while (!end && reader->Read(&message)) {
        for (const v1::JobEvent& event : events_of(message)) {
          // A coordinator may resend what it already sent; each event counts once.
          if (event.seq() <= last_seq) continue;
          last_seq = event.seq();
          if (!got_event) connection.Answered();
          got_event = true;
          on_event(event);
          if (event.has_state_change() && IsTerminal(event.state_change().to())) {
            end = event.state_change().to();
          } else if (options.stop_at_seq > 0 && last_seq >= options.stop_at_seq) {
            end = v1::JOB_STATE_UNSPECIFIED;
          }
          if (end) break;
        }
      }
      if (end) context->TryCancel();
      return reader->Finish();
    };
    const grpc::Status finished =
        batched
            ? follow(
                  connection.stub().WatchJobBatched(context.get(), request), v1::WatchJobBatch(),
                  [](const v1::WatchJobBatch& batch) -> const auto& { return batch.events(); })
            : follow(connection.stub().WatchJob(context.get(), request), v1::JobEvent(),
                     [](const v1::JobEvent& event) { return absl::MakeConstSpan(&event, 1); });
    if (end) return *end;
    // A coordinator from before WatchJobBatched: its WatchJob, one event to a message.
    if (batched && finished.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      batched = false;
      continue;
    }
    absl::Status status = ToAbsl(finished);
    if (interrupt->triggered()) return absl::CancelledError("interrupted");
    if (status.ok()) {
      // The stream ended without a terminal event: its events may have been
      // pruned, or the coordinator closed it while shutting down.
      absl::StatusOr<v1::Job> job = connection.GetJob(options.job_id);
      if (job.ok() && IsTerminal(job->state())) return job->state();
      status = job.ok() ? absl::UnavailableError("the event stream closed early") : job.status();
    }
    if (!Reconnectable(status.code())) return status;
    const std::string lost_from = connection.address();
    // A standby's refusal names the leader: the watch resumes there, after
    // the last event it saw.
    connection.Failed(*context, finished);

    const absl::Time now = absl::Now();
    if (!outage_since || got_event || now - opened >= kHealthyStream) {
      outage_since = now;
      backoff = kMinBackoff;
      on_notice(absl::StrCat("lost the event stream from ", lost_from, " (",
                             Printable(status.message()), "); reconnecting for up to ",
                             absl::FormatDuration(options.reconnect_window)));
    }
    const absl::Time give_up = *outage_since + options.reconnect_window;
    auto gone = [&] {
      return absl::UnavailableError(absl::StrCat(
          "coordinator ", connection.options().address, " unreachable for ",
          absl::FormatDuration(options.reconnect_window), " (", status.message(), ")"));
    };
    if (now >= give_up) return gone();
    if (!interrupt->SleepFor(std::min(backoff, give_up - now))) {
      return absl::CancelledError("interrupted");
    }
    backoff = std::min(backoff * 2, kMaxBackoff);
    if (!connection.WaitForConnected(give_up)) {
      if (interrupt->triggered()) return absl::CancelledError("interrupted");
      return gone();
    }
  }
}

}  // namespace ballast::client
