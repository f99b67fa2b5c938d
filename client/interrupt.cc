#include "client/interrupt.h"

#include <grpcpp/client_context.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>

namespace ballast::client {

void Interrupt::Trigger() {
  absl::MutexLock lock(&mu_);
  triggered_ = true;
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
}

bool Interrupt::triggered() const {
  absl::MutexLock lock(&mu_);
  return triggered_;
}

bool Interrupt::SleepFor(absl::Duration d) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&triggered_), d);
  return !triggered_;
}

Interrupt::Scope::Scope(Interrupt* interrupt, grpc::ClientContext* context)
    : interrupt_(interrupt), context_(context) {
  if (interrupt_ == nullptr) return;
  absl::MutexLock lock(&interrupt_->mu_);
  if (interrupt_->triggered_) context_->TryCancel();
  interrupt_->contexts_.push_back(context_);
}

Interrupt::Scope::~Scope() {
  if (interrupt_ == nullptr) return;
  absl::MutexLock lock(&interrupt_->mu_);
  auto& contexts = interrupt_->contexts_;
  contexts.erase(std::remove(contexts.begin(), contexts.end(), context_), contexts.end());
}

namespace {

sigset_t SigintSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

SigintRouter::SigintRouter(Interrupt* interrupt) : interrupt_(interrupt) {
  sigset_t set = SigintSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this] { Run(); });
}

SigintRouter::~SigintRouter() {
  stop_ = true;
  thread_.join();
}

void SigintRouter::Run() {
  const sigset_t set = SigintSet();
  // sigtimedwait rather than sigwait so the destructor can stop the thread.
  const timespec poll = {0, 100'000'000};
  int received = 0;
  while (!stop_) {
    if (sigtimedwait(&set, nullptr, &poll) != SIGINT) continue;
    if (++received == 1) {
      interrupt_->Trigger();
    } else {
      // The user insists: leave the cursor on a fresh line and go.
      (void)!write(STDOUT_FILENO, "\n", 1);
      std::_Exit(130);
    }
  }
}

}  // namespace ballast::client
