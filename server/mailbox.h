// Mailbox: a queue between one producer side (the coordinator, under its
// lock) and one reader (a gRPC stream's thread). Push never blocks, so a slow
// reader never holds up the coordinator or other readers; a bounded mailbox
// that fills up drops what does not fit and says so, and the reader catches
// up from the store. Thread-safe.
#ifndef BALLAST_SERVER_MAILBOX_H_
#define BALLAST_SERVER_MAILBOX_H_

#include <cstddef>
#include <deque>
#include <limits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::server {

template <typename T>
class Mailbox {
 public:
  enum class State {
    kReady,     // items were taken
    kTimeout,   // nothing arrived in time
    kOverflow,  // items were dropped since the last Take; pending ones are discarded too
    kClosed,    // no more items will come
  };

  explicit Mailbox(size_t capacity = std::numeric_limits<size_t>::max()) : capacity_(capacity) {}

  // Appends items in order; what does not fit is dropped and flags an
  // overflow. One wake-up per call, however many items.
  void Push(const std::vector<T>& items) {
    absl::MutexLock lock(&mu_);
    if (closed_ || items.empty()) return;
    for (const T& item : items) {
      if (items_.size() >= capacity_) {
        overflow_ = true;
        items_.clear();
      } else {
        items_.push_back(item);
      }
    }
    cv_.Signal();
  }
  void Push(T item) { Push(std::vector<T>{std::move(item)}); }

  // Puts an item back in front, for one whose delivery failed.
  void PushFront(T item) {
    absl::MutexLock lock(&mu_);
    if (!closed_) items_.push_front(std::move(item));
  }

  // Waits up to `wait` for items and moves them all to *out.
  State Take(std::vector<T>* out, absl::Duration wait) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + wait;
    while (items_.empty() && !overflow_ && !closed_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (overflow_) {
      overflow_ = false;
      items_.clear();
      return State::kOverflow;
    }
    if (closed_) return State::kClosed;
    if (items_.empty()) return State::kTimeout;
    out->insert(out->end(), std::make_move_iterator(items_.begin()),
                std::make_move_iterator(items_.end()));
    items_.clear();
    return State::kReady;
  }

  // Ends the mailbox: the reader gets kClosed. Returns the items not yet
  // taken, for a successor mailbox.
  std::vector<T> Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
    std::vector<T> pending(std::make_move_iterator(items_.begin()),
                           std::make_move_iterator(items_.end()));
    items_.clear();
    return pending;
  }

 private:
  const size_t capacity_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool overflow_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_MAILBOX_H_
