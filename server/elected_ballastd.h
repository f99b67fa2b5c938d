// ElectedBallastd: one ballastd process among coordinators that share a
// store (docs/control-plane.md, "Two coordinators"). On PostgreSQL it leads
// while it holds the store's lease (Store::Lead) and serves as a Ballastd;
// otherwise it stands by as a StandbyServer on the same addresses, naming
// the leader, and polls the lease. On SQLite (one coordinator) it is a
// Ballastd and nothing more.
//
// Terms: taking the lease loads the jobs from the store exactly as a
// restart does (Coordinator::Create), so running jobs continue, and the
// lease is renewed while they load, however long that takes; losing it
// (another took it, or it could not renew within the lease) shuts the
// Ballastd down and stands by again. A leader serves only while
// less than a lease has passed since it sent its last successful renewal
// (BallastdOptions::leading), which is before any standby can take the
// lease; the database refuses the writes of a deposed one (its epoch).
//
// Thread-safe. Its own thread renews or polls the lease every fifth of it.
#ifndef BALLAST_SERVER_ELECTED_BALLASTD_H_
#define BALLAST_SERVER_ELECTED_BALLASTD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ballastd.h"
#include "server/standby_server.h"
#include "server/store.h"

namespace ballast::server {

class ElectedBallastd {
 public:
  // Opens the store; on SQLite starts a Ballastd (FAILED_PRECONDITION when
  // another ballastd uses the file). On PostgreSQL binds the addresses as a
  // standby, tries once to lead (starting a Ballastd on them when it does),
  // and starts the lease thread. INVALID_ARGUMENT for a bad option (as
  // Ballastd::Start), UNAVAILABLE for an address or a store it cannot open.
  static absl::StatusOr<std::unique_ptr<ElectedBallastd>> Start(BallastdOptions options);
  // Shutdown().
  ~ElectedBallastd();
  ElectedBallastd(const ElectedBallastd&) = delete;
  ElectedBallastd& operator=(const ElectedBallastd&) = delete;

  // Stops the lease thread, then whatever serves. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // The bound addresses, HOST:PORT, the same in every term.
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& http_address() const { return http_address_; }
  // Whether it leads now.
  bool leading() const ABSL_LOCKS_EXCLUDED(mu_);
  // OK while it runs; the error that ended it otherwise (the ports could not
  // be bound again for a new term). main exits on it.
  absl::Status failure() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until failure() is not OK or Shutdown is called.
  void WaitForFailure() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ElectedBallastd() = default;
  // One round: renews or takes the lease, or learns who holds it, and
  // changes term when that changed.
  void Round() ABSL_LOCKS_EXCLUDED(mu_);
  void LeaseLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool StoppingOrFailed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Standby -> leader: frees the ports and starts a Ballastd on them.
  absl::Status TakeOver(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the StandbyServer on the ports.
  absl::Status StandBy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leader -> standby, saying why.
  absl::Status StepDown(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The serving deadline, on steady_clock's nanoseconds; 0: not leading.
  bool LeaseFresh() const;

  BallastdOptions options_;
  std::unique_ptr<Store> store_;
  // Unique per process: host, pid and a random part.
  std::string holder_;
  std::string grpc_address_;
  std::string http_address_;
  std::atomic<int64_t> serve_until_ns_{0};

  mutable absl::Mutex mu_;
  // One of the two serves, in turn.
  std::unique_ptr<Ballastd> ballastd_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<StandbyServer> standby_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Why the last renewal failed, logged once per kind.
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // No renewal before this: a term failed to start.
  absl::Time resting_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread lease_thread_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_ELECTED_BALLASTD_H_
