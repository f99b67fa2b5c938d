#include "server/elected_ballastd.h"

#include <unistd.h>

#include <chrono>
#include <future>
#include <iostream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ballast::server {
namespace {

int64_t SteadyNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A term's server binds the ports the last one just freed; gRPC may take a
// moment to let go of them.
template <typename T, typename StartFn>
absl::StatusOr<T> StartOnSamePorts(StartFn start) {
  absl::StatusOr<T> started = start();
  for (int tries = 1; tries < 50 && absl::IsUnavailable(started.status()) &&
                      absl::StrContains(started.status().message(), "cannot listen");
       ++tries) {
    absl::SleepFor(absl::Milliseconds(100));
    started = start();
  }
  return started;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ElectedBallastd>> ElectedBallastd::Start(BallastdOptions options) {
  if (options.leader_lease_ms < 1000 || options.leader_lease_ms > 600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--leader-lease-ms: ", options.leader_lease_ms, "; allowed 1000..600000"));
  }
  if (absl::Status s = CheckBallastdOptions(&options); !s.ok()) return s;
  std::unique_ptr<ElectedBallastd> e(new ElectedBallastd());
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options.store_url);
  if (!store.ok()) return store.status();
  e->store_ = std::move(*store);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  e->holder_ =
      absl::StrCat(host, ":", getpid(), ":", absl::Hex(std::random_device{}(), absl::kZeroPad8));
  options.store = e->store_.get();
  e->options_ = options;

  if (!e->store_->Shared()) {
    // One coordinator: it leads for good, once no other process holds the file.
    if (absl::Status s =
            e->store_->Lead(e->holder_, options.listen, options.leader_lease_ms).status();
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<Ballastd>> d = Ballastd::Start(options);
    if (!d.ok()) return d.status();
    e->grpc_address_ = (*d)->grpc_address();
    e->http_address_ = (*d)->http_address();
    absl::MutexLock lock(&e->mu_);
    e->ballastd_ = std::move(*d);
    return e;
  }

  absl::StatusOr<std::unique_ptr<StandbyServer>> standby = StandbyServer::Start(options);
  if (!standby.ok()) return standby.status();
  e->grpc_address_ = (*standby)->grpc_address();
  e->http_address_ = (*standby)->http_address();
  // Each later term binds exactly these (port 0 was resolved above).
  e->options_.listen = e->grpc_address_;
  e->options_.http = e->http_address_;
  if (e->options_.advertise.empty()) e->options_.advertise = e->grpc_address_;
  e->options_.leading = [raw = e.get()] { return raw->LeaseFresh(); };
  {
    absl::MutexLock lock(&e->mu_);
    e->standby_ = std::move(*standby);
  }
  e->Round();
  if (absl::Status s = e->failure(); !s.ok()) return s;
  e->lease_thread_ = std::thread([raw = e.get()] { raw->LeaseLoop(); });
  return e;
}

ElectedBallastd::~ElectedBallastd() { Shutdown(); }

void ElectedBallastd::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (lease_thread_.joinable()) lease_thread_.join();
  absl::MutexLock lock(&mu_);
  // Its calls end as a Ballastd's do at shutdown ("shutting down"), not
  // as a lapsed lease's.
  if (ballastd_ != nullptr) {
    ballastd_->Shutdown();
    // Stopped on purpose: a standby, or this ballastd started again, takes
    // over at once rather than after the lease.
    if (store_->Shared()) {
      absl::Status s = store_->Resign(holder_);
      std::cerr << "ballastd: "
                << (s.ok() ? "lease released"
                           : absl::StrCat("cannot release the lease: ", s.message()))
                << std::endl;
    }
  }
  serve_until_ns_ = 0;
  ballastd_.reset();
  standby_.reset();
}

bool ElectedBallastd::LeaseFresh() const {
  return SteadyNs(std::chrono::steady_clock::now()) < serve_until_ns_.load();
}

bool ElectedBallastd::leading() const {
  absl::MutexLock lock(&mu_);
  return ballastd_ != nullptr && (!store_->Shared() || LeaseFresh());
}

absl::Status ElectedBallastd::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

void ElectedBallastd::WaitForFailure() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &ElectedBallastd::StoppingOrFailed));
}

bool ElectedBallastd::StoppingOrFailed() const { return stopping_ || !failure_.ok(); }

void ElectedBallastd::LeaseLoop() {
  const absl::Duration period = absl::Milliseconds(options_.leader_lease_ms / 5);
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) return;
      if (!failure_.ok()) return;
    }
    Round();
  }
}

void ElectedBallastd::Round() {
  {
    // After a term that failed to start, the lease is left to expire: a
    // standby that can serve takes it.
    absl::MutexLock lock(&mu_);
    if (absl::Now() < resting_until_) return;
  }
  const auto sent = std::chrono::steady_clock::now();
  absl::StatusOr<LeaderLease> lease =
      store_->Lead(holder_, options_.advertise, options_.leader_lease_ms);
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  absl::Status changed;
  if (!lease.ok()) {
    const std::string error(lease.status().message());
    if (error.substr(0, 60) != last_error_.substr(0, 60)) {
      std::cerr << "ballastd: cannot reach the lease: " << error << std::endl;
    }
    last_error_ = error;
    if (ballastd_ != nullptr && !LeaseFresh()) {
      changed = StepDown(absl::StrCat("its lease ran out unrenewed (", error, ")"));
    }
  } else if (lease->mine) {
    last_error_.clear();
    if (ballastd_ != nullptr && epoch_ != lease->epoch) {
      changed = StepDown("its lease lapsed, and it took it again at a new epoch");
    }
    // The database started the lease after `sent`: the leader stops serving
    // before a standby may take it, with a tenth to spare for clock drift.
    serve_until_ns_ = SteadyNs(sent) + options_.leader_lease_ms * 900000;
    if (changed.ok() && ballastd_ == nullptr) changed = TakeOver(lease->epoch);
  } else {
    last_error_.clear();
    if (ballastd_ != nullptr) {
      changed =
          StepDown(absl::StrCat("deposed: ", lease->address, " leads at epoch ", lease->epoch));
    }
    if (standby_ != nullptr) standby_->SetLeader(*lease);
  }
  if (!changed.ok()) {
    std::cerr << "ballastd: " << changed.message() << std::endl;
    failure_ = changed;
  }
}

absl::Status ElectedBallastd::TakeOver(int64_t epoch) {
  const absl::Time start = absl::Now();
  const std::string previous = standby_ != nullptr ? standby_->leader_address() : "";
  standby_.reset();
  // Loading the jobs may outlast a lease (a large store, a table another
  // session holds locked). The lease is renewed meanwhile, every fifth of
  // it: were it left to lapse, a standby would take it while this one still
  // loads, and each would depose the other in turn for as long as loading
  // takes longer than a lease.
  std::future<absl::StatusOr<std::unique_ptr<Ballastd>>> starting =
      std::async(std::launch::async, [this] {
        return StartOnSamePorts<std::unique_ptr<Ballastd>>(
            [this] { return Ballastd::Start(options_); });
      });
  const auto period = std::chrono::milliseconds(options_.leader_lease_ms / 5);
  while (starting.wait_for(period) != std::future_status::ready) {
    const auto sent = std::chrono::steady_clock::now();
    absl::StatusOr<LeaderLease> lease =
        store_->Lead(holder_, options_.advertise, options_.leader_lease_ms);
    // Anything else (another epoch, an unreachable store) is the next
    // Round's to act on, once the term has started.
    if (lease.ok() && lease->mine && lease->epoch == epoch) {
      serve_until_ns_ = SteadyNs(sent) + options_.leader_lease_ms * 900000;
    }
  }
  absl::StatusOr<std::unique_ptr<Ballastd>> d = starting.get();
  if (!d.ok()) {
    // The store failed it (loading the jobs): stand by, and leave the lease
    // to expire, for another coordinator or for a later try of this one.
    std::cerr << "ballastd: cannot start leading at epoch " << epoch << ": " << d.status().message()
              << "; letting the lease expire" << std::endl;
    serve_until_ns_ = 0;
    resting_until_ = absl::Now() + absl::Milliseconds(2 * options_.leader_lease_ms);
    return StandBy();
  }
  ballastd_ = std::move(*d);
  epoch_ = epoch;
  std::cerr << "ballastd: leading at epoch " << epoch << " as " << options_.advertise
            << (previous.empty() || previous == options_.advertise
                    ? ""
                    : absl::StrCat(", after ", previous))
            << " (jobs loaded in " << absl::FormatDuration(absl::Now() - start) << ")" << std::endl;
  return absl::OkStatus();
}

absl::Status ElectedBallastd::StepDown(const std::string& why) {
  serve_until_ns_ = 0;
  std::cerr << "ballastd: stepping down to standby: " << why << std::endl;
  ballastd_->Shutdown();
  ballastd_.reset();
  return StandBy();
}

absl::Status ElectedBallastd::StandBy() {
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StartOnSamePorts<std::unique_ptr<StandbyServer>>(
          [&] { return StandbyServer::Start(options_); });
  if (!standby.ok()) return standby.status();
  standby_ = std::move(*standby);
  return absl::OkStatus();
}

}  // namespace ballast::server
