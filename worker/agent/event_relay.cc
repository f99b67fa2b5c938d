#include "worker/agent/event_relay.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/rank_event_bound.h"

namespace ballast::agent {
namespace {

constexpr size_t kMaxBatchBytes = 1 << 20;

}  // namespace

EventRelay::EventRelay(CoordinatorConnection* coordinator, EventRelayOptions options)
    : coordinator_(coordinator),
      options_(options),
      next_report_id_(absl::ToUnixMicros(absl::Now())) {
  sender_ = std::thread([this] { SendLoop(); });
}

EventRelay::~EventRelay() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (active_call_ != nullptr) active_call_->TryCancel();
  }
  sender_.join();
}

void EventRelay::SetWorkerId(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  worker_id_ = worker_id;
}

void EventRelay::Add(v1::RankEvent event) {
  BoundRankEvent(&event);
  absl::MutexLock lock(&mu_);
  const size_t in_flight = in_flight_ ? in_flight_->events_size() : 0;
  while (!queue_.empty() && queue_.size() + in_flight >= options_.max_buffered) DropOneLocked();
  queue_.push_back(std::move(event));
}

void EventRelay::DropOneLocked() {
  // Step metrics are the cheapest loss: the next step's supersede them, and
  // metrics.jsonl in the output folder keeps every one.
  auto victim = std::find_if(queue_.begin(), queue_.end(), [](const v1::RankEvent& e) {
    return e.training().has_step_metrics();
  });
  if (victim == queue_.end()) victim = queue_.begin();
  const RankKey key{victim->job_id(), victim->attempt(), victim->rank()};
  if (dropped_unreported_[key]++ == 0) {
    std::cerr << "ballast-worker: event buffer full (" << options_.max_buffered
              << " events) while the coordinator is unreachable; dropping the oldest step "
                 "metrics of job "
              << victim->job_id() << "\n";
  }
  ++dropped_total_;
  queue_.erase(victim);
}

void EventRelay::FillBatchLocked() {
  v1::ReportEventsRequest batch;
  batch.set_report_id(next_report_id_++);
  for (const auto& [key, count] : dropped_unreported_) {
    v1::RankEvent* note = batch.add_events();
    note->set_job_id(std::get<0>(key));
    note->set_attempt(std::get<1>(key));
    note->set_rank(std::get<2>(key));
    v1::LogLine* log = note->mutable_training()->mutable_log();
    log->set_rank(std::get<2>(key));
    log->set_level("warning");
    log->set_text(absl::StrCat("ballast-worker dropped ", count,
                               " events (oldest step metrics first) while the coordinator was "
                               "unreachable; metrics.jsonl has every step"));
  }
  dropped_unreported_.clear();
  // Bytes as well as events: a batch of exits with 4 KiB stderr tails must
  // stay far below the coordinator's 4 MiB message limit. With each event
  // within kMaxRankEventBytes (Add), a batch is under 1.25 MiB.
  size_t bytes = 0;
  while (!queue_.empty() && static_cast<size_t>(batch.events_size()) < options_.max_batch &&
         bytes < kMaxBatchBytes) {
    bytes += queue_.front().ByteSizeLong();
    *batch.add_events() = std::move(queue_.front());
    queue_.pop_front();
  }
  in_flight_ = std::move(batch);
}

bool EventRelay::ReadyToSend() const {
  return stopping_ || (!worker_id_.empty() && (in_flight_ || !queue_.empty()));
}

bool EventRelay::Drained() const { return !in_flight_ && queue_.empty(); }

void EventRelay::SendLoop() {
  absl::Duration backoff = options_.min_backoff;
  for (;;) {
    v1::ReportEventsRequest request;
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &EventRelay::ReadyToSend));
      if (stopping_) return;
      if (!in_flight_) FillBatchLocked();
      in_flight_->set_worker_id(worker_id_);
      request = *in_flight_;
      active_call_ = &context;
    }
    coordinator_->Prepare(&context, options_.rpc_timeout);
    context.set_wait_for_ready(!coordinator_->several());
    v1::ReportEventsResponse response;
    const grpc::Status status = coordinator_->stub()->ReportEvents(&context, request, &response);
    if (!status.ok()) coordinator_->Failed(context, status);

    absl::MutexLock lock(&mu_);
    active_call_ = nullptr;
    if (status.ok() && response.acked_report_id() == request.report_id()) {
      in_flight_.reset();
      backoff = options_.min_backoff;
      continue;
    }
    last_error_ = status.ok() ? absl::StrCat("acked report ", response.acked_report_id(),
                                             " for report ", request.report_id())
                              : absl::StrCat(static_cast<int>(status.error_code()), ": ",
                                             status.error_message());
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    if (stopping_) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status EventRelay::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithDeadline(absl::Condition(this, &EventRelay::Drained), deadline)) {
    return absl::OkStatus();
  }
  const size_t left = queue_.size() + (in_flight_ ? in_flight_->events_size() : 0);
  return absl::DeadlineExceededError(
      absl::StrCat(left, " events not acknowledged by the coordinator; last error: ",
                   last_error_.empty() ? "none (not registered)" : last_error_));
}

size_t EventRelay::Unacknowledged() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + (in_flight_ ? in_flight_->events_size() : 0);
}

int64_t EventRelay::Dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_total_;
}

}  // namespace ballast::agent
