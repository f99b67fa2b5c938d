// Ctrl-C for a CLI whose work is blocking gRPC calls: SIGINT cancels the
// calls in flight so each command can restore the terminal and exit 130.
#ifndef BALLAST_CLIENT_INTERRUPT_H_
#define BALLAST_CLIENT_INTERRUPT_H_

#include <atomic>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class ClientContext;
}

namespace ballast::client {

// A one-way "the user asked to stop" flag that cancels registered calls.
// Thread-safe.
class Interrupt {
 public:
  // Marks the interrupt and TryCancel()s every registered call.
  void Trigger();
  // True once Trigger() ran.
  bool triggered() const;
  // Sleeps for `d`, waking early on Trigger(). Returns false when interrupted.
  bool SleepFor(absl::Duration d) const;

  // Registers `context` for cancellation while alive; cancels it at once when
  // the interrupt already fired. `interrupt` may be null (nothing happens).
  class Scope {
   public:
    Scope(Interrupt* interrupt, grpc::ClientContext* context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Interrupt* interrupt_;
    grpc::ClientContext* context_;
  };

 private:
  mutable absl::Mutex mu_;
  bool triggered_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

// Routes SIGINT to `interrupt` from a helper thread, so no gRPC call runs in
// a signal handler. A second SIGINT ends the process at once with 130.
// Construct it in main before any other thread starts: it blocks SIGINT in
// the calling thread, and threads started later inherit that mask.
class SigintRouter {
 public:
  explicit SigintRouter(Interrupt* interrupt);
  // Joins the helper thread.
  ~SigintRouter();
  SigintRouter(const SigintRouter&) = delete;
  SigintRouter& operator=(const SigintRouter&) = delete;

 private:
  void Run();

  Interrupt* interrupt_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_INTERRUPT_H_
