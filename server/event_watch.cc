#include "server/event_watch.h"

#include <limits>
#include <utility>

#include "server/job_entry.h"

namespace ballast::server {
namespace {

// Stored events read per query when replaying.
constexpr int kReplayChunk = 1000;

bool TerminalEvent(const v1::JobEvent& e) {
  return e.has_state_change() && Terminal(e.state_change().to());
}

}  // namespace

EventWatch::EventWatch(Store* store, std::string job_id, int64_t after_seq, bool done,
                       std::shared_ptr<EventFanout> fanout, EventFanout::Joined joined)
    : store_(store),
      job_id_(std::move(job_id)),
      last_seq_(after_seq),
      replay_through_(joined.published_seq),
      done_(done),
      fanout_(std::move(fanout)),
      mailbox_(std::move(joined.mailbox)) {}

EventWatch::~EventWatch() { fanout_->Leave(mailbox_.get()); }

void EventWatch::Deliver(std::vector<v1::JobEvent> events, std::vector<v1::JobEvent>* out) {
  for (v1::JobEvent& e : events) {
    if (done_ || e.seq() <= last_seq_) continue;
    last_seq_ = e.seq();
    done_ = TerminalEvent(e);
    out->push_back(std::move(e));
  }
}

absl::Status EventWatch::ReadStored(int64_t through, std::vector<v1::JobEvent>* out) {
  while (last_seq_ < through && !done_) {
    absl::StatusOr<std::vector<v1::JobEvent>> chunk =
        store_->ReadEvents(job_id_, last_seq_, kReplayChunk);
    if (!chunk.ok()) return chunk.status();
    if (chunk->empty()) break;
    const size_t before = out->size();
    std::vector<v1::JobEvent> upto;
    for (v1::JobEvent& e : *chunk) {
      if (e.seq() <= through) upto.push_back(std::move(e));
    }
    Deliver(std::move(upto), out);
    if (out->size() == before) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> EventWatch::Next(std::vector<v1::JobEvent>* out, absl::Duration wait) {
  if (done_) return false;
  if (!replayed_) {
    replayed_ = true;
    if (absl::Status s = ReadStored(replay_through_, out); !s.ok()) return s;
    if (!out->empty() || done_) return !done_;
  }
  std::vector<v1::JobEvent> live;
  switch (mailbox_->Take(&live, wait)) {
    case Mailbox<v1::JobEvent>::State::kReady:
      Deliver(std::move(live), out);
      break;
    case Mailbox<v1::JobEvent>::State::kOverflow:
      // Fell behind: everything we missed is in the store (stored before it
      // was published), and anything newer lands in the mailbox again.
      if (absl::Status s = ReadStored(std::numeric_limits<int64_t>::max(), out); !s.ok()) {
        return s;
      }
      break;
    case Mailbox<v1::JobEvent>::State::kClosed:
      return absl::UnavailableError("ballastd is shutting down; watch again with after_seq");
    case Mailbox<v1::JobEvent>::State::kTimeout:
      break;
  }
  return !done_;
}

}  // namespace ballast::server
